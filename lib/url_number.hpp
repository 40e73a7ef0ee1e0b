// Private: numbers written in URLs (ports, parameter values), read one way everywhere: whole
// decimal digits, no sign, no spaces, nothing after them.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace ordo::detail {

/// `text` as an unsigned decimal number; nothing if it is empty, has anything but digits or does
/// not fit a std::size_t.
std::optional<std::size_t> parse_unsigned(std::string_view text) noexcept;

/// `text`, the value of URL parameter `key` in `url`, as an unsigned decimal number. Throws
/// std::system_error with errc::bad_address reading
/// `ordo: invalid address "<url>": parameter <key> must be a number, not "<text>"`.
std::size_t number_parameter(std::string_view url, std::string_view key, std::string_view text);

/// The same for a non-negative decimal fraction ("0.25", "3", "1e-3"); the error reads
/// `... parameter <key> must be a non-negative number, not "<text>"`.
double fraction_parameter(std::string_view url, std::string_view key, std::string_view text);

}  // namespace ordo::detail
