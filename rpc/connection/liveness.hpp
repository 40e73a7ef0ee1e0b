// The dead-peer watchdog of an ordered connection (docs/protocol.md, "Liveness"): while anyone
// waits on the remote side (this side's calls pending, or its handlers running) and nothing has
// arrived for heartbeat_interval, it sends ordo.ping; when nothing at all has arrived for
// liveness_timeout, it declares the peer lost. Idle connections cost no timer wake-ups.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "ordo/net.hpp"

namespace ordo::detail {

/// What the watchdog asks of its connection.
class liveness_host {
  public:
    virtual ~liveness_host() = default;
    /// Calls waiting for a response (probes not counted) and handlers running.
    virtual std::size_t calls_waiting() const = 0;
    virtual std::size_t handlers_running() const = 0;
    /// When bytes last arrived.
    virtual std::chrono::steady_clock::time_point last_receive() const = 0;
    /// Sends a probe; false if it could not be taken (the silence check decides then).
    virtual bool send_ping() = 0;
    /// Ends the connection: the peer is lost, for `reason`.
    virtual void lost(std::string reason) = 0;
    /// Held while the timer's handler runs: the connection, kept alive.
    virtual std::weak_ptr<void> owner() = 0;
    virtual bool is_open() const = 0;
};

/// Belongs to the connection's executor.
class liveness {
  public:
    using clock = std::chrono::steady_clock;

    /// `timeout` 0: off. `heartbeat` 0: a quarter of timeout.
    liveness(net::any_io_executor ex, std::chrono::milliseconds timeout,
             std::chrono::milliseconds heartbeat, liveness_host& host);

    /// Work may have started (a call was made, a handler started): arms the watchdog if it is
    /// not armed. Cheap when it is: called on every call.
    void note_work() {
        if (armed_ || timeout_.count() <= 0 || !host_.is_open()) return;
        start();
    }
    /// The connection ended.
    void stop() { timer_.cancel(); }

    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    std::chrono::milliseconds heartbeat() const noexcept { return heartbeat_; }

  private:
    void start();
    void arm(clock::time_point at);
    void check();

    std::chrono::milliseconds timeout_;
    std::chrono::milliseconds heartbeat_;
    liveness_host& host_;
    net::steady_timer timer_;
    bool armed_ = false;
    clock::time_point work_since_{};
    clock::time_point last_ping_{};
};

}  // namespace ordo::detail
