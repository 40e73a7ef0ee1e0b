// Text from the network on its way into a log line: no byte of it may end the line or steer
// the terminal that shows it.
#pragma once

#include <string>
#include <string_view>

namespace ordo::detail {

/// `s` with every control character (below 0x20, and DEL) written as \n, \r, \t or \xNN, and
/// backslashes doubled, so that one event is one line whatever a peer put in a method name or
/// a reason. Other bytes (UTF-8 included) are kept.
inline std::string printable(std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(s.size());
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else {
            out += ch;
        }
    }
    return out;
}

}  // namespace ordo::detail
