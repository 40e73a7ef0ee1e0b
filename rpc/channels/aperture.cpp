#include "rpc/channels/aperture.hpp"

// The aperture's steady spells, and the trials of one replica fewer or one more that move it.
// Where a router's calls go is rpc/channels/router.cpp.
#include <algorithm>
#include <cmath>
#include <iterator>

namespace ordo::detail {

// A steady spell of the aperture has ended (enough calls sent in it were answered, over long
// enough): now and then, a trial begins.
void aperture::end_spell(clock_type::time_point now) {
    const double mean = std::chrono::duration<double>(sum_).count() / double(count_);
    since_ = now;
    sum_ = {};
    count_ = 0;
    // Calls three times as fast or as slow as in the last spell: the load or the replicas
    // changed, and what did not pay before may now.
    if (mean > 3 * last_ || 3 * mean < last_) backoff_ = wait_ = 1;
    last_ = mean;
    if (--wait_ > 0) return;
    wait_ = backoff_;
    start_trial(now);
}

// A trial of one replica fewer or one more. Its eight slots alternate between the two sizes
// (old, new, new, old; twice), so that both meet the same moments of the machine and a drift
// weighs on both alike. Spells one after the other did not: on this machine the mean of 20 ms
// at one size varied from 90 to 210 us a call from one spell to the next, and a trial needed
// four spells (80 ms) to be judged. A slot lasts four times the calls' recent mean, and at
// least 5 ms, so that most calls sent in it are answered within it. (Those of the last slot
// still in flight when the trial ends do not count: that errs towards the old size.)
void aperture::start_trial(clock_type::time_point now) {
    const std::size_t n = host_.usable();
    const std::size_t at = std::min(size_, n);
    const bool can_up = at < n;
    const bool can_down = at > 1;
    if (!can_up && !can_down) return;
    up_ = can_up && (up_ || !can_down);
    before_ = size_;
    target_ = up_ ? at + 1 : at - 1;
    trial_ = true;
    ++trials_;
    ++trial_number_;
    slot_ = 0;
    since_ = slot_since_ = now;
    count_ = 0;
    slot_time_ = std::max<clock_type::duration>(
        spell_time / 4,
        std::chrono::duration_cast<clock_type::duration>(
            std::chrono::duration<double>(4 * last_)));
    // A call counts for at most three times the recent mean: one that a busy machine held for
    // milliseconds does not decide a slot. (Uncapped, router_test's calls that no size speeds
    // up moved the aperture in 4 runs of 20 with three busy loops on this machine's two cores,
    // each time by a few such calls; capped, in none of 50.)
    cap_ = std::chrono::duration_cast<clock_type::duration>(
        std::chrono::duration<double>(3 * last_));
    std::fill(std::begin(sums_), std::end(sums_), clock_type::duration{});
    std::fill(std::begin(counts_), std::end(counts_), 0);
}

void aperture::end_slot(clock_type::time_point now) {
    count_ = 0;
    slot_since_ = now;
    if (++slot_ == trial_slots) return end_trial(now);
    size_ = tries(slot_) ? target_ : before_;
}

// The new size is kept only if its calls were faster than the old size's in each of the four
// pairs of slots, and 10% faster in the whole. (In each half of the trial was not enough: with
// three busy processes on this machine's two cores, timer-bound calls whose time no size
// changes moved the aperture in three runs of three.) One that does not pay waits twice as
// long before the next trial, which goes the other way.
void aperture::end_trial(clock_type::time_point now) {
    const std::size_t n = host_.usable();
    trial_ = false;
    slot_ = 0;
    since_ = now;
    sum_ = {};
    count_ = 0;
    // The slots pair up as they ran, old then new: 0 and 1, 3 and 2, 4 and 5, 7 and 6.
    bool each = true;
    clock_type::duration sum[2]{};
    std::uint64_t count[2]{};
    for (std::uint8_t old_slot : {0, 3, 4, 7}) {
        const std::uint8_t new_slot = old_slot & 1 ? old_slot - 1 : old_slot + 1;
        const auto a = counts_[old_slot], b = counts_[new_slot];
        if (a == 0 || b == 0) {
            each = false;
            break;
        }
        // The new slot's mean below the old one's, cross-multiplied.
        const double new_time = double(sums_[new_slot].count()) * double(a);
        each = each && new_time < double(sums_[old_slot].count()) * double(b);
        sum[0] += sums_[old_slot];
        sum[1] += sums_[new_slot];
        count[0] += a;
        count[1] += b;
    }
    auto mean = [&](int k) {
        return std::chrono::duration<double>(sum[k]).count() / double(count[k]);
    };
    const double old_mean = each ? mean(0) : 0, new_mean = each ? mean(1) : 0;
    if (!each || new_mean > 0.9 * old_mean) {
        size_ = before_;
        backoff_ = std::min(backoff_ * 2, max_backoff);
        wait_ = backoff_;
        up_ = !up_;
        return;
    }
    const std::size_t from = std::min(before_, n), to = std::min(target_, n);
    if (from == to) {  // replicas left meanwhile: nothing changes
        size_ = before_;
        wait_ = backoff_;
        return;
    }
    ++changes_;
    host_.event("aperture " + std::to_string(from) + " -> " + std::to_string(to) +
                " replicas: calls took " + std::to_string(std::lround(new_mean * 1e6)) +
                " us against " + std::to_string(std::lround(old_mean * 1e6)) + " us");
    size_ = target_ >= n ? all : target_;  // replicas added later join
    last_ = new_mean;
    backoff_ = wait_ = 1;
    // On that way at once, while it can go on.
    if (up_ ? target_ < n : target_ > 1) start_trial(now);
}

// A call without a key, sent since the trial began, was answered. One sent in the trial
// before, or when steady, does not count.
void aperture::trial_took(std::uint8_t tag, clock_type::duration took,
                          clock_type::time_point arrived) {
    if (tag >> 3 != (trial_number_ & 31)) return;
    const std::uint8_t slot = tag & 7;
    sums_[slot] += std::min(took, cap_);
    ++counts_[slot];
    if (++count_ >= slot_calls && arrived - slot_since_ >= slot_time_)
        end_slot(arrived);
}

}  // namespace ordo::detail
