#include "rpc/channels/placement.hpp"

#include <cmath>

namespace ordo::detail {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer: spreads FNV's similar outputs
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

std::uint64_t hash_of(std::string_view s) {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return mix(h);
}

}  // namespace

placement::placement(const members& m, const router_options& o, aperture::host& h)
    : reps_(m),
      policy_(o.policy),
      max_concurrent_(std::max<std::size_t>(1, o.max_concurrent)),
      ring_points_(o.ring_points),
      aperture_on_(o.aperture && o.policy == route_policy::least_loaded),
      ap_(h, aperture::clock_type::now()) {}

void placement::admit(replica& r) {
    reweigh(r);
    order_.insert(order_.begin() + std::uniform_int_distribution<std::ptrdiff_t>(
                                       0, std::ptrdiff_t(order_.size()))(rng_),
                  &r);
}

// `r`'s places on the ring (ring_points per unit of weight, at least one), once per URL and
// weight, sorted: a membership change then only takes points off and merges new ones in.
void placement::reweigh(replica& r) {
    const auto n = std::max<std::size_t>(
        1, static_cast<std::size_t>(std::llround(static_cast<double>(ring_points_) * r.weight)));
    auto& s = r.seat;
    s.points_.clear();
    s.points_.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
        s.points_.push_back(hash_of(r.url + "#" + std::to_string(i)));
    std::sort(s.points_.begin(), s.points_.end());
    s.replaced_ = s.in_ring_;
}

void placement::forget(replica& r) {
    if (r.seat.in_ring_) std::erase_if(ring_, [&](const auto& e) { return e.second == &r; });
    r.seat.in_ring_ = false;
    std::erase(order_, &r);
    if (cursor_ >= order_.size()) cursor_ = 0;  // least_loaded's ties count from it
}

// The points of replicas that stopped taking calls (or whose weight changed) come off in one
// pass, those of replicas that started are merged in. Linear in the ring's size (64 points per
// replica by default), with no full sort.
void placement::refresh() {
    bool drop = false;
    for (auto& r : reps_) {
        auto& s = r->seat;
        const bool keep = s.in_ring_ && !s.replaced_ && r->takes_calls() && !r->shadow;
        drop = drop || (s.in_ring_ && !keep);
        s.in_ring_ = keep;
        s.replaced_ = false;
    }
    if (drop) std::erase_if(ring_, [](const auto& e) { return !e.second->seat.in_ring_; });
    const auto old_end = static_cast<std::ptrdiff_t>(ring_.size());
    for (auto& r : reps_) {
        auto& s = r->seat;
        if (s.in_ring_ || !r->takes_calls() || r->shadow) continue;
        for (auto h : s.points_) ring_.emplace_back(h, r.get());
        s.in_ring_ = true;
    }
    if (ring_.size() == static_cast<std::size_t>(old_end)) return;
    std::sort(ring_.begin() + old_end, ring_.end());
    std::inplace_merge(ring_.begin(), ring_.begin() + old_end, ring_.end());
}

void placement::clear() {
    ring_.clear();
}

replica* placement::owner_of(const std::string& key) const {
    if (ring_.empty()) return nullptr;
    auto it = std::lower_bound(ring_.begin(), ring_.end(),
                               std::make_pair(hash_of(key), static_cast<replica*>(nullptr)));
    return (it == ring_.end() ? ring_.front() : *it).second;
}

replica* placement::peek(const pending_call& call) const {
    if (!call.options.key.empty()) {
        replica* r = owner_of(call.options.key);
        return r && has_room(*r) && key_may_go(call.options.key, r) ? r : nullptr;
    }
    for (auto& r : reps_)
        if (!r->shadow && has_room(*r)) return r.get();
    return nullptr;
}

void placement::cool(replica& r, replica::clock_type::time_point until) {
    r.cool_until = std::max(r.cool_until, until);
    r.damp = 0.25;
    if (next_thaw_ == replica::clock_type::time_point{} || until < next_thaw_) next_thaw_ = until;
}

void placement::thaw() {
    const auto now = replica::clock_type::now();
    if (now < next_thaw_) return;
    next_thaw_ = {};
    for (auto& r : reps_) {
        if (!r->cooling()) continue;
        if (r->cool_until <= now) {
            r->cool_until = {};
            r->damp = 1;
            r->cool_turns = 0;
        } else if (next_thaw_ == replica::clock_type::time_point{} || r->cool_until < next_thaw_) {
            next_thaw_ = r->cool_until;
        }
    }
}

replica* placement::elsewhere(const replica& not_this) {
    thaw_if_due();
    replica* best = nullptr;
    for (auto& r : reps_) {
        if (r.get() == &not_this || r->shadow || r->cooling() || !has_room(*r)) continue;
        if (!best || static_cast<double>(r->in_flight) * best->weight <
                         static_cast<double>(best->in_flight) * r->weight)
            best = r.get();
    }
    return best;
}

std::size_t placement::usable() const {
    return std::size_t(std::count_if(reps_.begin(), reps_.end(),
                                     [](const auto& r) { return !r->shadow && r->takes_calls(); }));
}

}  // namespace ordo::detail
