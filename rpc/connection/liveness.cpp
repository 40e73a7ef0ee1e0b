#include "rpc/connection/liveness.hpp"

#include <algorithm>

namespace ordo::detail {

liveness::liveness(net::any_io_executor ex, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds heartbeat, liveness_host& host)
    : timeout_(timeout),
      heartbeat_(heartbeat.count() > 0 ? heartbeat
                                       : std::max(std::chrono::milliseconds(1), timeout / 4)),
      host_(host),
      timer_(std::move(ex)) {}

void liveness::start() {
    armed_ = true;
    work_since_ = clock::now();
    arm(work_since_ + heartbeat_);
}

void liveness::arm(clock::time_point at) {
    timer_.expires_at(at);
    timer_.async_wait([this, owner = host_.owner()](std::error_code ec) {
        if (ec) return;
        if (auto keep = owner.lock()) check();
    });
}

void liveness::check() {
    armed_ = false;
    const std::size_t calls = host_.calls_waiting();
    const std::size_t handlers = host_.handlers_running();
    if (!host_.is_open() || (calls == 0 && handlers == 0)) return;
    const auto now = clock::now();
    // Silence counts from the last bytes heard, or from when the work began if that is later:
    // a connection idle for an hour is not dead the moment a call starts.
    const auto silent_since = std::max(host_.last_receive(), work_since_);
    const auto silence = now - silent_since;
    if (silence >= timeout_) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silence).count();
        host_.lost("for " + std::to_string(ms) + " ms while " + std::to_string(calls) +
                   " calls were pending and " + std::to_string(handlers) + " handlers running");
        return;
    }
    if (silence >= heartbeat_ && now - last_ping_ >= heartbeat_ && host_.send_ping())
        last_ping_ = now;
    armed_ = true;
    arm(std::min(silent_since + timeout_, now + heartbeat_));
}

}  // namespace ordo::detail
