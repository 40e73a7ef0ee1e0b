// least_loaded's adaptive aperture (router_options::aperture): how many of a router's replicas,
// in its order, take calls without a key. It learns only from the times of answered calls, and
// reads no clock: whoever feeds it gives the times, so a test can drive it with made-up ones.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ordo::detail {

class aperture {
  public:
    using clock_type = std::chrono::steady_clock;
    static constexpr std::size_t all = std::size_t(-1);
    // A spell: at least this many calls answered, over at least this long; trials that do not
    // pay wait up to max_backoff spells.
    static constexpr std::uint64_t spell_calls = 64;
    static constexpr std::chrono::milliseconds spell_time{20};
    static constexpr unsigned max_backoff = 64;
    // A trial: this many slots, each ended by at least this many answers (of calls sent in any
    // of its slots).
    static constexpr std::uint8_t trial_slots = 8;
    static constexpr std::uint64_t slot_calls = 16;

    /// What the aperture asks of its router: the replicas that take calls without a key now,
    /// and where a change is told (router::on_event).
    class host {
      public:
        virtual std::size_t usable() const = 0;
        virtual void event(const std::string& line) = 0;

      protected:
        ~host() = default;
    };

    /// Counts calls answered from `start` on.
    aperture(host& h, clock_type::time_point start) : host_(h), since_(start) {}

    /// How many replicas calls without a key go to now (all: every one). During a trial it
    /// changes from slot to slot.
    std::size_t size() const noexcept { return size_; }
    /// The size chosen: size() outside a trial, the size a trial started from during one.
    std::size_t chosen() const noexcept { return trial_ ? before_ : size_; }
    /// What a call sent now carries (the trial's slot and number), to give back to answered().
    std::uint8_t tag() const noexcept {
        static_assert(trial_slots == 8, "a tag holds the slot in its low 3 bits");
        return static_cast<std::uint8_t>(slot_ | ((trial_number_ & 31) << 3));
    }
    /// A call without a key, sent at `sent` carrying `tag`, was answered at `arrived`. Calls
    /// sent before the current spell or trial began do not count. (Inline: it runs once per
    /// answered call, and a steady spell only adds.)
    void answered(std::uint8_t tag, clock_type::time_point sent, clock_type::time_point arrived) {
        if (sent < since_) return;
        const auto took = std::max(arrived - sent, clock_type::duration::zero());
        if (trial_) return trial_took(tag, took, arrived);
        sum_ += took;
        // The first spell needs only its calls: a mean to size the first trial's slots.
        if (++count_ >= spell_calls && (arrived - since_ >= spell_time || last_ == 0))
            end_spell(arrived);
    }

    std::uint64_t trials() const noexcept { return trials_; }
    std::uint64_t changes() const noexcept { return changes_; }

  private:
    // The size of a slot's calls: the halves of a trial go old, new, new, old, so that a drift
    // in the calls' times weighs on both sizes alike.
    static constexpr bool tries(std::uint8_t slot) noexcept { return ((slot + 1) >> 1) & 1; }
    void end_spell(clock_type::time_point now);
    void start_trial(clock_type::time_point now);
    void end_slot(clock_type::time_point now);
    void end_trial(clock_type::time_point now);
    void trial_took(std::uint8_t tag, clock_type::duration took, clock_type::time_point arrived);

    host& host_;
    std::size_t size_ = all;    // of the order's replicas that take calls; all: every one
    std::size_t before_ = all;  // the size a trial started from (the size chosen)
    std::size_t target_ = all;  // and the size it tries
    bool trial_ = false;
    bool up_ = false;                // which way the next trial goes, when both can
    std::uint8_t slot_ = 0;          // the trial's slot now (0 when steady)
    std::uint8_t trial_number_ = 0;  // counts trials, modulo 32
    // The spell's or trial's start (calls sent before it do not count), and the slot's.
    clock_type::time_point since_, slot_since_;
    clock_type::duration slot_time_{};  // how long the trial's slots last
    clock_type::duration cap_{};        // what one call counts for at most in a trial
    clock_type::duration sum_{};        // send to response, of the spell's calls
    std::uint64_t count_ = 0;           // the spell's, or the slot's
    // A trial's calls, by the slot they were sent in.
    clock_type::duration sums_[trial_slots]{};
    std::uint64_t counts_[trial_slots]{};
    double last_ = 0;  // the mean of the last spell (or of a kept size's trial), in seconds
    unsigned wait_ = 1, backoff_ = 1;  // spells until the next trial; its doubling
    std::uint64_t trials_ = 0, changes_ = 0;
};

}  // namespace ordo::detail
