// The time of the read whose messages this thread is passing on: a clock read that a call
// started by a handler of one of those messages can use instead of its own.
#pragma once

#include <chrono>

namespace ordo::detail {

/// While a batched_comm passes on the messages of one read (deliver_some), the time that read
/// completed (counters::last_receive); else the zero time_point.
extern thread_local std::chrono::steady_clock::time_point delivering_read_at;

/// delivering_read_at while a read is being passed on, else the clock. Latencies measured
/// from it and to a response's read time (last_receive) are on the same read-time scale.
inline std::chrono::steady_clock::time_point read_time_or_now() noexcept {
    const auto t = delivering_read_at;
    return t != std::chrono::steady_clock::time_point{} ? t : std::chrono::steady_clock::now();
}

/// Sets delivering_read_at for a scope, and restores what it was.
class delivering_read_scope {
  public:
    explicit delivering_read_scope(std::chrono::steady_clock::time_point t) noexcept
        : saved_(delivering_read_at) {
        delivering_read_at = t;
    }
    ~delivering_read_scope() { delivering_read_at = saved_; }
    delivering_read_scope(const delivering_read_scope&) = delete;
    delivering_read_scope& operator=(const delivering_read_scope&) = delete;

  private:
    std::chrono::steady_clock::time_point saved_;
};

}  // namespace ordo::detail
