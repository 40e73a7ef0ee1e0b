#include "lib/url_number.hpp"

#include <charconv>
#include <string>

#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

[[noreturn]] void bad_parameter(std::string_view url, std::string_view key, std::string_view want,
                                std::string_view text) {
    throw_error(errc::bad_address, "ordo: invalid address \"" + std::string(url) +
                                       "\": parameter " + std::string(key) + " must be " +
                                       std::string(want) + ", not \"" + std::string(text) + "\"");
}

// from_chars, and the whole of `text` must be the number (from_chars stops at the first
// character that does not fit, and would take "12abc" for 12).
template <class Number>
std::optional<Number> parse_whole(std::string_view text) noexcept {
    Number v{};
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
    return v;
}

}  // namespace

std::optional<std::size_t> parse_unsigned(std::string_view text) noexcept {
    return parse_whole<std::size_t>(text);
}

std::size_t number_parameter(std::string_view url, std::string_view key, std::string_view text) {
    const auto v = parse_unsigned(text);
    if (!v) bad_parameter(url, key, "a number", text);
    return *v;
}

double fraction_parameter(std::string_view url, std::string_view key, std::string_view text) {
    const auto v = parse_whole<double>(text);
    // (!(x >= 0) also turns away NaN.)
    if (!v || !(*v >= 0)) bad_parameter(url, key, "a non-negative number", text);
    return *v;
}

}  // namespace ordo::detail
