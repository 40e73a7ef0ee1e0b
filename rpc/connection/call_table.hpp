// The calls this side of an ordered connection is waiting on (docs/protocol.md, "Calls"): msgid
// allocation and wrap, pending entries keyed by msgid, deadlines and cancellation, the ids of
// withdrawn calls whose late responses are dropped, and failing everything when the connection
// ends. It sends nothing itself: the owner sends requests, and ordo.cancel when told to.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>

#include "ordo/detail/shutdown_hook.hpp"
#include "ordo/rpc/channel.hpp"
#include "ordo/rpc/codec.hpp"
#include "rpc/connection/call_watch.hpp"
#include "lib/fifo.hpp"
#include "rpc/connection/id_table.hpp"

namespace ordo {

struct peer_counters;

namespace detail {

/// What a call table needs from its connection.
class call_table_host {
  public:
    virtual ~call_table_host() = default;
    /// A call was withdrawn (deadline or cancellation) while the remote side may be running
    /// it: send ordo.cancel for `msgid`, on the call's `lane`.
    virtual void send_cancel(std::uint32_t msgid, std::uint16_t lane) = 0;
    /// Held while a deadline or cancellation handler runs: the connection, kept alive.
    virtual std::weak_ptr<void> owner() = 0;
    /// Fails every call of the table (call_table::fail_all), as the connection does when it
    /// ends, with what that means for the rest of it (what waits for ordo.features).
    virtual void fail_all_calls(std::error_code code, const std::string& why) = 0;
};

/// Belongs to the connection's executor. Counts into the peer_counters given (pending_calls,
/// calls_completed). If the executor's context is destroyed first, the waiting calls fail
/// with errc::closed (shutdown_hook).
class call_table final : shutdown_hook {
  public:
    struct options {
        std::uint32_t first_msgid = 0;
        std::chrono::milliseconds default_timeout{0};
        std::size_t max_abandoned_ids = 65536;
    };

    call_table(net::any_io_executor ex, options o, call_table_host& host, peer_counters& c);
    ~call_table();
    call_table(const call_table&) = delete;
    call_table& operator=(const call_table&) = delete;

    /// The next msgid: the one after the last, wrapping at 2^32, skipping ids still pending or
    /// remembered as abandoned (their late responses must not complete a new call).
    std::uint32_t next_id();
    /// Adds `call`, already sent under `msgid` (from next_id()), and starts its deadline (its
    /// own or the default) and its cancellation.
    void add(std::uint32_t msgid, std::unique_ptr<pending_call> call);
    /// Adds a liveness probe under `msgid`: its response only needs to arrive. Probes are not
    /// counted as calls waiting.
    void add_ping(std::uint32_t msgid);

    /// Completes the call a response is for, inline (pending_call::complete_inline: the caller
    /// keeps the connection alive across it). A response to a withdrawn call is dropped; one to
    /// an id no call used throws errc::protocol_error.
    void on_response(message& m);
    /// An item of a streaming call ([msgid, item]), passed to its stream. An item for a withdrawn
    /// call is dropped; one for an id no stream used throws errc::protocol_error.
    void on_item(const message& m, std::size_t wire_bytes);
    /// ordo.in_credit [msgid, items, bytes]: the server takes more of a call's items (a two-way
    /// or client stream). Throws errc::protocol_error when it is malformed or names a call that
    /// writes none.
    void on_in_credit(const message& m);
    /// Completes `call` with an error, counting it as completed (a call that never got in).
    void fail(std::unique_ptr<pending_call> call, std::error_code ec, std::string detail);
    /// Fails every pending call with `ec` and `why` and forgets the abandoned ids.
    void fail_all(std::error_code ec, const std::string& why);

    /// Calls waiting for a response, probes not counted.
    std::size_t waiting() const noexcept { return pending_.size() - pings_; }
    bool contains(std::uint32_t msgid) const noexcept { return pending_.contains(msgid); }
    std::size_t abandoned() const noexcept { return abandoned_order_.size(); }
    /// Told of every call as it ends, before its caller (null: none). Not owned.
    void observe(call_observer* o) noexcept { observer_ = o; }

  private:
    struct entry {
        std::unique_ptr<pending_call> call;
        call_watch watch;
        bool is_ping = false;
    };

    void on_shutdown() noexcept override;
    void withdraw(std::uint32_t msgid, errc why);
    void abandon(std::uint32_t msgid);
    void count();
    // Tells the observer of the call's end, then completes the call unless the observer took it.
    void end_observed(pending_call* released, std::error_code ec, call_outcome& out, bool now);

    net::any_io_executor ex_;
    options o_;
    call_table_host& host_;
    peer_counters& c_;
    id_table<entry> pending_;
    std::unordered_set<std::uint32_t> abandoned_;
    fifo<std::uint32_t> abandoned_order_;
    std::uint32_t next_id_;
    std::size_t pings_ = 0;
    call_observer* observer_ = nullptr;
};

}  // namespace detail
}  // namespace ordo
