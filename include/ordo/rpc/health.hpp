// Whether a server serves: the states the reserved methods ordo.health and ordo.health_watch
// answer (docs/protocol.md, "Health"), set with server::set_health.
#pragma once

#include "ordo/config.hpp"

#include <cstdint>
#include <optional>
#include <string_view>

namespace ordo {

enum class health_state : std::uint8_t {
    serving,      ///< takes calls
    not_serving,  ///< up, but should not be sent calls (set by the application)
    draining,     ///< server::async_drain began: serves what it has, takes nothing new
};

/// "serving", "not_serving", "draining": the words on the wire.
const char* to_string(health_state s) noexcept;
/// The state those words name, or nothing.
std::optional<health_state> health_from_string(std::string_view s) noexcept;

}  // namespace ordo
