// ordo::channel_impl: the interface behind every channel, implemented by ordo::peer,
// ordo::pool and ordo::router.
#pragma once

#include "ordo/config.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ordo/rpc/detail/pending_call.hpp"
#include "ordo/net.hpp"

namespace ordo {

/// The interface of everything a channel can stand for. Implementations: ordo::peer (one
/// ordered connection), ordo::pool (a connection per call in flight) and ordo::router (calls
/// spread over replicas).
class channel_impl {
  public:
    virtual ~channel_impl();
    /// Sends `call` and completes it when its response arrives, its deadline passes, it is
    /// cancelled through its slot, or the connection ends. Called on get_executor().
    virtual void start_call(std::unique_ptr<detail::pending_call> call) = 0;
    /// Sends a one-way message. Called on get_executor(). Throws std::system_error
    /// (errc::overloaded, or the close reason once the connection has ended).
    virtual void notify_raw(std::string_view method, std::string_view params) = 0;
    /// notify_raw() on lane `lane` (an id of detail::lane_id(); docs/protocol.md "Lanes").
    /// Those that keep no order between messages (a pool) send it as notify_raw() does.
    virtual void notify_raw_on(std::uint16_t lane, std::string_view method,
                               std::string_view params) {
        (void)lane;
        notify_raw(method, params);
    }
    /// What a channel on a lane stands for (channel::lane): `self` itself, but for a lane's
    /// channel, which gives what it wraps (so that a lane of a lane is a lane of the channel).
    virtual std::shared_ptr<channel_impl> lane_base(const std::shared_ptr<channel_impl>& self) {
        return self;
    }
    /// Stops taking calls and closes, without waiting: calls in flight and waiting fail with
    /// errc::closed. An ordered peer first sends what it has queued. Called on get_executor().
    virtual void close() = 0;
    /// The remote side's address, as a URL.
    virtual const std::string& remote_address() const noexcept = 0;
    virtual net::any_io_executor get_executor() const = 0;
};

}  // namespace ordo
