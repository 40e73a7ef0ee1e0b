// pending_call: one call in flight, type-erased, as a channel_impl receives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/detail/params_buffer.hpp"
#include "ordo/detail/recycle.hpp"
#include "ordo/net.hpp"

namespace ordo::detail {

class stream_core;

/// What the owner of a connection's call_observer notes of a call it starts there, and reads
/// back when the call ends (pending_call::noted). Opaque to everyone else.
struct observer_note {
    std::chrono::steady_clock::time_point sent{};
    std::uint16_t mark = 0;  ///< the observer's, as it set it
};

/// One call in flight, type-erased. A channel completes it exactly once, on the channel's
/// executor, with complete() or complete_inline().
class pending_call {
  public:
    pending_call() = default;
    /// With its method and options built in place (what a call with a callback does).
    pending_call(std::string_view m, call_options&& o) : method(m), options(std::move(o)) {}
    /// With its method, and the default options made in place (a call given none).
    explicit pending_call(std::string_view m) : method(m) {}
    virtual ~pending_call() = default;
    /// A pending call is made and freed once per call: its memory is recycled on the thread
    /// (detail::recycled_new), not returned to malloc each time. Not for over-aligned types.
    static void* operator new(std::size_t size) { return recycled_new(size); }
    static void operator delete(void* p, std::size_t size) noexcept { recycled_delete(p, size); }
    /// Never runs the caller's handler inline: posts it to the handler's executor. Safe
    /// anywhere, the call's own initiation included.
    virtual void complete(std::error_code ec, call_outcome out) = 0;
    /// Runs the caller's handler before returning when the handler's executor is the channel's
    /// (saving a post per call), else behaves as complete(). For channels completing a call from
    /// their read path: never from inside the call's initiation, and with the channel kept alive
    /// across it (the handler may drop the last reference). An exception thrown by the handler
    /// is rethrown from the handler's executor, as if the handler had been posted.
    virtual void complete_inline(std::error_code ec, call_outcome&& out) {
        complete(ec, std::move(out));
    }
    /// True if complete*() copes with a borrowed outcome (copies what it keeps before it
    /// returns); else the channel makes the outcome own its memory first.
    virtual bool takes_borrowed() const noexcept { return false; }

    std::string method;
    params_buffer params;  ///< the encoded params array
    call_options options;
    net::cancellation_slot slot;  ///< the caller's, if any: a channel installs its handler here
    /// 0 for a call as made; 1, 2 as a router sends it again (a replica died or was overloaded).
    std::uint8_t attempt = 0;
    /// The lane it goes on (docs/protocol.md "Lanes"): 0, the default lane, or an id from
    /// detail::lane_id(); set by a channel on a lane (channel::lane).
    std::uint16_t lane = 0;
    /// A call the connection makes for itself (ordo.features): its end is not told to the
    /// connection's call_observer, which only hears of calls its owner started.
    bool own = false;
    /// Its connection leaves `params` as they are once written, instead of freeing them: a
    /// router that may send the call again elsewhere (a replica lost or overloaded) keeps them.
    bool keep_params = false;
    /// A streaming call (ordo::stream): where its items go. Sent as ordo.stream.
    std::shared_ptr<stream_core> stream;
    /// Written by whoever starts the call on a connection it observes (a router, which is told
    /// through its call_observer), and read back when the call ends: kept with the call, the
    /// cheapest place (no lookup, no table entry to grow). Nothing else reads or writes it.
    observer_note noted;
};

/// Told of each call of one connection as it ends, before its caller hears: how a router books
/// its replicas' calls (rpc/channels/router.cpp) without a wrapper per call. Runs on the
/// connection's executor, where the call completes.
class call_observer {
  public:
    virtual ~call_observer() = default;
    /// `call` (with the note its starter wrote, pending_call::noted) ended with `ec` and `out`
    /// (whose detail it may amend). It may take `call` (to send it again): its caller then hears
    /// nothing now. `now`: the caller is about to hear inline (pending_call::complete_inline).
    virtual void ended(std::unique_ptr<pending_call>& call, std::error_code ec, call_outcome& out,
                       bool now) = 0;
};



}  // namespace ordo::detail
