// What every replica source does with what a lookup found (fleet/dns.cpp, fleet/file_source.cpp,
// fleet/etcd.cpp): it counts it, reports problems, and hands a set to the router only when it
// differs from the last one handed. A failed lookup leaves the last good set in place.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ordo/fleet/sources.hpp"

namespace ordo::detail {

class last_good_set {
  public:
    using update_fn = std::function<void(std::vector<member>)>;
    using problem_fn = std::function<void(const std::string&)>;

    /// The router's callbacks (replica_source::start).
    void start(update_fn update, problem_fn problem) {
        update_ = std::move(update);
        problem_ = std::move(problem);
    }
    /// Drops the callbacks: nothing is reported or handed on afterwards.
    void stop() noexcept {
        update_ = nullptr;
        problem_ = nullptr;
    }

    /// Reports `line`, counting nothing. A callback may stop the source: it runs on a copy.
    void say(const std::string& line) const {
        if (auto f = problem_) f(line);
    }
    /// A lookup that failed: counted, and `line` reported as the last error.
    void failed(std::string line) {
        ++counters_.failures;
        counters_.last_error = std::move(line);
        say(counters_.last_error);
    }
    /// An entry the lookup found and left out: counted, and `line` reported as the last error.
    void left_out(std::string line) {
        ++counters_.rejected;
        counters_.last_error = std::move(line);
        say(counters_.last_error);
    }
    /// A lookup that found `set`: counted, and handed to the router when it is not the set
    /// handed last.
    void found(std::vector<member> set) {
        ++counters_.refreshes;
        counters_.members = set.size();
        if (have_set_ && set == last_set_) return;
        have_set_ = true;
        last_set_ = set;
        if (auto f = update_) f(std::move(set));
    }

    /// Whether a set was ever handed on (a failure then leaves it in place).
    bool has_set() const noexcept { return have_set_; }
    const source_counters& counters() const noexcept { return counters_; }

  private:
    update_fn update_;
    problem_fn problem_;
    bool have_set_ = false;
    std::vector<member> last_set_;
    source_counters counters_;
};

}  // namespace ordo::detail
