// What the files of detail::session share: rpc/session/session.cpp (the session, a plain one
// whole), rpc/session/session_resume.cpp (counts, acks, the resend buffer, windows,
// reconnection) and rpc/session/session_handshake.cpp (ordo.hello, its answers, a resume taking
// a connection over).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "rpc/session/session.hpp"

namespace ordo::detail {

// Routes one connection's callbacks to the session that owns the connection now: cleared when
// the connection is dropped, retargeted when another session takes it over (a resume).
struct session::link {
    session* s;
};

// Windows are clamped to a day: a window is a time to wait for a network, not a storage period
// (and a huge one would overflow the clock arithmetic).
inline constexpr std::chrono::milliseconds longest_window = std::chrono::hours(24);

// How much longer than the window it granted a server keeps a detached session: a quarter of
// the window, at least one second and at most a minute. Both sides count on their own steady
// clocks from when each saw the connection fail; the caller may see it later than the server
// (a reset reaches one side first), and its ordo.hello needs a connection and a round trip.
inline std::chrono::steady_clock::duration server_margin(std::chrono::milliseconds window) {
    using std::chrono::milliseconds;
    return std::clamp<milliseconds>(window / 4, milliseconds(1000), milliseconds(60'000));
}

inline bool read_u64(const msgpack::object& o, std::uint64_t& v) {
    if (o.type != msgpack::type::POSITIVE_INTEGER) return false;
    v = o.via.u64;
    return true;
}

}  // namespace ordo::detail
