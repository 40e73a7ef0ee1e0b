// What the other side of an ordered connection reads, asked with ordo.features (docs/protocol.md
// "Call context", "Lanes"), and what waits for the answer: the part of peer::state that sends
// calls with their context. The first call that carries a context (or goes on a named lane)
// asks; until the answer, that call and everything sent after it on this connection is held
// here, in order, and then sent in the form the answer allows. Its operations are
// rpc/connection/negotiation.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ordo/rpc/detail/message_heads.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/context/context.hpp"

namespace ordo::detail {

struct negotiation {
    negotiation(peer::state& st, bool timeout_on_every_call)
        : s(st), every_call_timed(timeout_on_every_call), context_always(timeout_on_every_call) {}

    peer::state& s;
    const bool every_call_timed;  // the peer has a default timeout

    // Whether the other side reads a request's context.
    enum class support : std::uint8_t { unknown, asking, yes, no };
    support context = support::unknown;

    struct held_message {
        std::string lane;          // the lane it goes on (docs/protocol.md "Lanes")
        std::string bytes;         // as it goes out; empty for a call with a context
        std::string notification;  // a notification's method (told undelivered if dropped)
        bool request = false;      // a call (msgid): not sent if withdrawn meanwhile
        std::uint32_t msgid = 0;
        // A call with a context, encoded once the answer says how; a notification's params.
        std::string method;
        std::string params;
        metadata meta;
        std::chrono::steady_clock::time_point deadline{};  // {}: none
    };
    std::vector<held_message> held;
    std::size_t held_bytes = 0;  // bounded by comm_options::max_buffer_bytes, as output is
    bool holding = false;        // !held.empty(), read by every notification
    // Every call takes the way with a context: one is held (holding), or the peer has a default
    // timeout (every call has a deadline). One byte for peer::start_call to read.
    bool context_always;
    void set_holding(bool on) {
        holding = on;
        context_always = on || every_call_timed;
    }
    buffer scratch{small_buffer};  // a request with its context, encoded (send_request)
    packed_metadata meta_pairs;    // the metadata sent last, checked and encoded

    // Holds a message (throws errc::overloaded over the bound).
    void hold(held_message h);
    void hold_bytes(std::string_view bytes, std::string_view notification, std::string_view params,
                    std::string_view lane = {});
    // Tells on_undelivered of the held notifications from `from` on (counted, guarded).
    void report_held(std::vector<held_message>& waiting, std::size_t from, std::error_code ec,
                     const std::string& why);
    // peer::start_call's way for a call with a context; takes `call` (released by the caller:
    // no unique_ptr to destroy there on the common path).
    [[gnu::cold]] void start_call(pending_call* call);
    // A request with its context (or held behind what waits): `params` the encoded array.
    void send_request(std::uint32_t id, std::string_view method, std::string_view params,
                      const call_options& opts, std::uint16_t lane = 0);
    void ask();
    // Asks if a call with `opts` has a context to send; the answer is unknown.
    void ask_if_context(const call_options& opts);
    void answered(std::error_code ec, const call_outcome& out);
};

}  // namespace ordo::detail
