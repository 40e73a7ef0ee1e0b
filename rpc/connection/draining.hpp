// How an ordered connection leaves (docs/protocol.md "Draining"), the part of peer::state that
// knows why no more calls may start: the other side said it is going away (ordo.goaway), or
// ended its sending side (a half-close), and this side closes once nothing is pending either
// way. Its operations are in rpc/connection/peer.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "ordo/rpc/peer.hpp"

namespace ordo::detail {

struct draining {
    draining(peer::state& st, const net::any_io_executor& ex) : s(st), eof_probe(ex) {}

    peer::state& s;

    // ---- ordo.goaway ----
    bool told_goaway = false;   // this side said it is going away (a server draining)
    bool heard_goaway = false;  // the other side said so
    bool left = false;          // and this side closed the connection once nothing was pending
    bool leave_posted = false;
    std::chrono::milliseconds goaway_grace{0};
    std::string goaway_reason;  // as the other side said it
    std::string goaway_why;     // "the server is going away: <reason>": how calls fail after
    std::vector<goaway_fn> goaway_fns;

    // The other side's ordo.goaway: what it sent is served, this side's calls are answered,
    // and then this side leaves (leave_when_idle).
    void remote_going_away(std::chrono::milliseconds grace, std::string reason);
    // Once nothing is pending either way, this side closes the connection (the server may then
    // finish its drain early). Checked on the next turn of the executor: a caller resumed by
    // the last response may make another call at once, which is still sent and waited for.
    void leave_when_idle();

    // ---- half-close ----
    bool heard_eof = false;  // the other side ended its sending side
    std::string eof_why;
    net::steady_timer eof_probe;  // the probes after the first (probe_after_eof)

    // End of stream from the other side: what it sent is served to its end; probes find a
    // peer that closed altogether. False if the connection is to end as lost instead.
    bool finished_sending();
    // The probes after the first, each this long after the one before.
    static constexpr std::chrono::milliseconds eof_probe_gaps[] = {
        std::chrono::milliseconds(5), std::chrono::milliseconds(15),
        std::chrono::milliseconds(80)};
    void probe_after_eof(std::size_t k);

    // Whether calls are refused because this side left or the other side stopped sending, and
    // why they fail then.
    bool refuses_calls() const noexcept { return left || heard_eof; }
    const std::string& why() const noexcept { return heard_eof ? eof_why : goaway_why; }
};

}  // namespace ordo::detail
