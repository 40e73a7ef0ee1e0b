// What a router's calls did: per replica, calls answered and failed and their latencies; per
// method, the recent time from send to answer, which the waiting queue judges deadlines by.
// The router's event counts (router_counters) are kept where the events happen.
#pragma once

#include <chrono>
#include <string>
#include <unordered_map>

#include "ordo/rpc/detail/pending_call.hpp"
#include "rpc/channels/replica.hpp"

namespace ordo::detail {

class accounting {
  public:
    using duration = std::chrono::steady_clock::duration;

    /// `sent` was answered by `r` after `took`.
    void answered(replica& r, const pending_call& sent, duration took, bool shadow) {
        ++r.completed;
        r.latency.record(took);
        // Only a waiting call with a deadline is judged by the estimate: calls without one pay
        // no lookup.
        if (!shadow && sent.options.timeout.count() > 0) {
            auto& e = estimates_[sent.method];
            e += (std::chrono::duration_cast<std::chrono::microseconds>(took) - e) / 8;
        }
    }
    /// A call that `r` ran, or was to run, ended with an error.
    void failed(replica& r) { ++r.errors; }

    /// How much of its deadline a waiting call of `method` needs left to be worth sending:
    /// twice the method's recent time (a call with less would time out on the replica, taking
    /// the room of one that could finish: the overload collapse of EDF). Zero if unknown.
    std::chrono::microseconds needed(const std::string& method) const {
        auto it = estimates_.find(method);
        return it == estimates_.end() ? std::chrono::microseconds(0) : 2 * it->second;
    }

  private:
    std::unordered_map<std::string, std::chrono::microseconds> estimates_;  // moving averages
};

}  // namespace ordo::detail
