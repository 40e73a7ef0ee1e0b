// Fuzz target 6: the gateway's HTTP/1.1 reader (gateway/http.cpp, over Node's http_parser),
// with small limits so that short inputs reach them. The input is what a client sends on one
// connection, fed in pieces of varying size as reads would deliver it; every request it yields
// is taken and the reader moved on, as the gateway does (an NDJSON body's lines as they come). A request must stay within the limits
// it was read with, a failure must carry a status the gateway answers (400, 413, 431) and a
// reason; anything else (a crash, a leak, a hang, a request over a limit) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "gateway/http.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    constexpr std::size_t max_head = 512, max_body = 256;
    std::string_view in(reinterpret_cast<const char*>(data), size);
    ordo::gw::http_reader r(max_head, max_body);
    // Pieces of 1 to 16 bytes, sized by the input's own bytes: the same input always splits
    // the same way.
    std::size_t piece = 1;
    for (int guard = 0; !in.empty() && guard < 1 << 20; ++guard) {
        const std::string_view part = in.substr(0, piece);
        const std::size_t took = r.feed(part);
        in.remove_prefix(took);
        piece = 1 + (static_cast<unsigned char>(part.front()) & 15);
        if (r.body_streams()) {
            // An NDJSON body, taken line by line as the gateway takes it (gateway/uploads.cpp):
            // the line not yet ended stays within max_body.
            auto& body = r.request().body;
            if (const auto nl = body.rfind('\n'); nl != std::string_view::npos) body.erase(0, nl + 1);
            if (body.size() > max_body) std::abort();
        }
        if (r.failed()) {
            const int st = r.error_status();
            if ((st != 400 && st != 413 && st != 431) || r.error_reason().empty()) std::abort();
            break;
        }
        if (r.ready()) {
            const auto& req = r.request();
            if (req.body.size() > max_body || req.method.empty()) std::abort();
            r.next();
        } else if (took < part.size()) {
            std::abort();  // it stops short only at a request's end or a failure
        }
    }
    return 0;
}
