// The replica_source a caller owns, over a state that Asio handlers still queued may outlive it
// with (they hold the state and find it stopped). Shared by fleet/dns.cpp and
// fleet/file_source.cpp, whose states have start, refresh_now, stop, describe and counters.
#pragma once

#include <memory>

#include "ordo/fleet/sources.hpp"

namespace ordo::detail {

template <class State>
class source_handle final : public replica_source {
  public:
    explicit source_handle(std::shared_ptr<State> s, bool own_name = false)
        : s_(std::move(s)), own_name_(own_name) {}
    ~source_handle() override { s_->stop(); }
    void start(std::function<void(std::vector<member>)> update,
               std::function<void(const std::string&)> problem) override {
        s_->start(std::move(update), std::move(problem));
    }
    void refresh_now() override { s_->refresh_now(); }
    void stop() override { s_->stop(); }
    std::string describe() const override { return s_->describe(); }
    source_counters counters() const override { return s_->counters(); }
    bool resolves_own_name() const override { return own_name_; }

  private:
    std::shared_ptr<State> s_;
    bool own_name_;
};

}  // namespace ordo::detail
