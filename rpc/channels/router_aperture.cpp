#include "ordo/rpc/router.hpp"

// least_loaded's aperture: its steady spells, and the trials of one replica fewer or one more
// that move it (router_options::aperture). Where calls go is rpc/channels/router.cpp.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "rpc/channels/router_state.hpp"

namespace ordo {

// A steady spell of the aperture has ended (enough calls sent in it were answered, over long
// enough): now and then, a trial begins.
void router::state::end_spell(clock_type::time_point now) {
    const double mean = std::chrono::duration<double>(ap.sum).count() / double(ap.count);
    ap.since = now;
    ap.sum = {};
    ap.count = 0;
    // Calls three times as fast or as slow as in the last spell: the load or the replicas
    // changed, and what did not pay before may now.
    if (mean > 3 * ap.last || 3 * mean < ap.last) ap.backoff = ap.wait = 1;
    ap.last = mean;
    if (--ap.wait > 0) return;
    ap.wait = ap.backoff;
    start_trial(now);
}

// A trial of one replica fewer or one more. Its eight slots alternate between the two sizes
// (old, new, new, old; twice), so that both meet the same moments of the machine and a drift
// weighs on both alike. Spells one after the other did not: on this machine the mean of 20 ms
// at one size varied from 90 to 210 us a call from one spell to the next, and a trial needed
// four spells (80 ms) to be judged. A slot lasts four times the calls' recent mean, and at
// least 5 ms, so that most calls sent in it are answered within it. (Those of the last slot
// still in flight when the trial ends do not count: that errs towards the old size.)
void router::state::start_trial(clock_type::time_point now) {
    const std::size_t n = usable();
    const std::size_t at = std::min(ap.size, n);
    const bool can_up = at < n;
    const bool can_down = at > 1;
    if (!can_up && !can_down) return;
    ap.up = can_up && (ap.up || !can_down);
    ap.before = ap.size;
    ap.target = ap.up ? at + 1 : at - 1;
    ap.trial = true;
    ++c.aperture_trials;
    ++ap.trial_number;
    ap.slot = 0;
    ap.since = ap.slot_since = now;
    ap.count = 0;
    ap.slot_time = std::max<clock_type::duration>(
        aperture_state::spell_time / 4,
        std::chrono::duration_cast<clock_type::duration>(
            std::chrono::duration<double>(4 * ap.last)));
    // A call counts for at most three times the recent mean: one that a busy machine held for
    // milliseconds does not decide a slot. (Uncapped, router_test's calls that no size speeds
    // up moved the aperture in 4 runs of 20 with three busy loops on this machine's two cores,
    // each time by a few such calls; capped, in none of 50.)
    ap.cap = std::chrono::duration_cast<clock_type::duration>(
        std::chrono::duration<double>(3 * ap.last));
    std::fill(std::begin(ap.sums), std::end(ap.sums), clock_type::duration{});
    std::fill(std::begin(ap.counts), std::end(ap.counts), 0);
}

void router::state::end_slot(clock_type::time_point now) {
    ap.count = 0;
    ap.slot_since = now;
    if (++ap.slot == aperture_state::trial_slots) return end_trial(now);
    ap.size = aperture_state::tries(ap.slot) ? ap.target : ap.before;
}

// The new size is kept only if its calls were faster than the old size's in each of the four
// pairs of slots, and 10% faster in the whole. (In each half of the trial was not enough: with
// three busy processes on this machine's two cores, timer-bound calls whose time no size
// changes moved the aperture in three runs of three.) One that does not pay waits twice as
// long before the next trial, which goes the other way.
void router::state::end_trial(clock_type::time_point now) {
    const std::size_t n = usable();
    ap.trial = false;
    ap.slot = 0;
    ap.since = now;
    ap.sum = {};
    ap.count = 0;
    // The slots pair up as they ran, old then new: 0 and 1, 3 and 2, 4 and 5, 7 and 6.
    bool each = true;
    clock_type::duration sum[2]{};
    std::uint64_t count[2]{};
    for (std::uint8_t old_slot : {0, 3, 4, 7}) {
        const std::uint8_t new_slot = old_slot & 1 ? old_slot - 1 : old_slot + 1;
        const auto a = ap.counts[old_slot], b = ap.counts[new_slot];
        if (a == 0 || b == 0) {
            each = false;
            break;
        }
        // The new slot's mean below the old one's, cross-multiplied.
        const double new_time = double(ap.sums[new_slot].count()) * double(a);
        each = each && new_time < double(ap.sums[old_slot].count()) * double(b);
        sum[0] += ap.sums[old_slot];
        sum[1] += ap.sums[new_slot];
        count[0] += a;
        count[1] += b;
    }
    auto mean = [&](int k) {
        return std::chrono::duration<double>(sum[k]).count() / double(count[k]);
    };
    const double old_mean = each ? mean(0) : 0, new_mean = each ? mean(1) : 0;
    if (!each || new_mean > 0.9 * old_mean) {
        ap.size = ap.before;
        ap.backoff = std::min(ap.backoff * 2, aperture_state::max_backoff);
        ap.wait = ap.backoff;
        ap.up = !ap.up;
        return;
    }
    const std::size_t from = std::min(ap.before, n), to = std::min(ap.target, n);
    if (from == to) {  // replicas left meanwhile: nothing changes
        ap.size = ap.before;
        ap.wait = ap.backoff;
        return;
    }
    ++c.aperture_changes;
    event("aperture " + std::to_string(from) + " -> " + std::to_string(to) +
          " replicas: calls took " + std::to_string(std::lround(new_mean * 1e6)) +
          " us against " + std::to_string(std::lround(old_mean * 1e6)) + " us");
    ap.size = ap.target >= n ? aperture_state::all : ap.target;  // replicas added later join
    ap.last = new_mean;
    ap.backoff = ap.wait = 1;
    // On that way at once, while it can go on.
    if (ap.up ? ap.target < n : ap.target > 1) start_trial(now);
}

// A call without a key, sent since the trial began, was answered. One sent in the trial
// before, or when steady, does not count.
void router::state::trial_took(std::uint8_t tag, clock_type::duration took,
                               clock_type::time_point arrived) {
    if (tag >> 3 != (ap.trial_number & 31)) return;
    const std::uint8_t slot = tag & 7;
    ap.sums[slot] += std::min(took, ap.cap);
    ++ap.counts[slot];
    if (++ap.count >= aperture_state::slot_calls && arrived - ap.slot_since >= ap.slot_time)
        end_slot(arrived);
}

}  // namespace ordo
