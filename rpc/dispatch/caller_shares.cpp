// A server's concurrency limit shared among its callers (caller_shares, ordo/rpc/concurrency.hpp;
// docs/protocol.md "Overload"): detail::admission's enter, wait and leave for a shared limit.
//
// While no call waits, a call takes a slot as it would from a plain limit (enter's fast path:
// two atomic adds). Once the limit is reached, calls wait in their caller's queue, and every slot
// that frees goes to the waiting caller with the fewest calls running for its weight. The count
// of waiting calls and the count of slots taken are read on both sides in sequentially
// consistent order: a call that starts to wait sees a slot freed before, or the call that frees
// it sees the wait, so no slot is left free while a call waits.
#include <algorithm>

#include "lib/address_group.hpp"
#include "ordo/rpc/detail/stream_core.hpp"
#include "rpc/dispatch/admission.hpp"

namespace ordo::detail {

namespace {

// How many callers concurrency_stats::callers lists before "other".
constexpr std::size_t listed_callers = 8;

std::string key_of(const identity& who) {
    if (!who.subject.empty()) return who.subject;
    if (!who.cert_subject.empty()) return who.cert_subject;
    if (who.unix_peer) return "uid " + std::to_string(who.unix_peer->uid);
    std::string group = address_group(who.address);
    return group.empty() ? who.address : group;
}

// a's share is smaller than b's: fewer running for its weight; the older waiting call first.
bool before(const admission::caller& a, const admission::caller& b) {
    const auto wa = static_cast<std::uint64_t>(a.weight), wb = static_cast<std::uint64_t>(b.weight);
    const std::uint64_t ra = a.running() + 1;
    const std::uint64_t rb = b.running() + 1;
    if (ra * wb != rb * wa) return ra * wb < rb * wa;
    return a.waiting.front()->seq < b.waiting.front()->seq;
}

// How far over its weight a caller is: what it runs and waits for, per weight (as a fraction
// compared by cross-multiplying).
bool further_over(const admission::caller& a, const admission::caller& b) {
    const auto wa = static_cast<std::uint64_t>(a.weight), wb = static_cast<std::uint64_t>(b.weight);
    const std::uint64_t ua = a.running() + a.waiting.size();
    const std::uint64_t ub = b.running() + b.waiting.size();
    return ua * wb > ub * wa;
}

}  // namespace

std::size_t admission::caller::running() const noexcept {
    std::size_t n = in_transit.load(std::memory_order_relaxed);
    for (const seat* s : seats) n += s->running.load(std::memory_order_relaxed);
    return n;
}

std::uint64_t admission::caller::served() const noexcept {
    std::uint64_t n = served_before;
    for (const seat* s : seats) n += s->served.load(std::memory_order_relaxed);
    return n;
}

admission::seat::~seat() {
    std::lock_guard lk(owner->share_mu_);
    who->served_before += served.load(std::memory_order_relaxed);
    std::erase(who->seats, this);
}

std::shared_ptr<admission::seat> admission::seat_for(const identity& who) {
    std::string key = key_of(who);
    std::lock_guard lk(share_mu_);
    auto [it, fresh] = callers_.try_emplace(key);
    if (fresh) {
        auto c = std::make_shared<caller>();
        c->key = std::move(key);
        if (auto w = shares_.weights.find(who.subject);
            !who.subject.empty() && w != shares_.weights.end())
            c->weight = std::max(w->second, 1u);
        it->second = std::move(c);
    }
    auto s = std::make_shared<seat>(shared_from_this(), it->second);
    it->second->seats.push_back(s.get());
    if (callers_.size() >= prune_at_) {
        // Forget the callers with no connection and nothing waiting (so nothing running);
        // their figures go on in "other". Bounded: the table holds the callers connected, and
        // as many more.
        for (auto i = callers_.begin(); i != callers_.end();) {
            caller& o = *i->second;
            if (o.seats.empty() && o.waiting.empty() && o.in_transit.load() == 0) {
                gone_.served += o.served_before;
                gone_.queued += o.queued;
                gone_.refused += o.refused;
                i = callers_.erase(i);
            } else {
                ++i;
            }
        }
        prune_at_ = std::max<std::size_t>(64, 2 * callers_.size());
    }
    return s;
}

bool admission::over_share(const caller& c, std::string& words) const {
    std::uint64_t active = 0;  // the weights of the callers running or waiting
    bool others = false;
    for (const auto& [key, o] : callers_) {
        if (o.get() != &c && o->waiting.empty() && o->running() == 0) continue;
        active += o->weight;
        if (o.get() != &c) others = true;
    }
    const std::size_t running = c.running();
    const std::uint64_t uses = running + c.waiting.size();
    const std::uint64_t limit = this->limit();
    words = std::to_string(running) + " running and " +
            std::to_string(c.waiting.size()) + " waiting, weight " + std::to_string(c.weight) +
            " of " + std::to_string(active);
    // Its share is limit · weight / active.
    return others && uses * active >= limit * c.weight;
}

void admission::refuse_locked(ticket& t, std::string why) {
    caller& c = *t.at->who;
    std::string words;
    t.over_share = over_share(c, words);
    t.why = "overloaded: " + std::move(why) + "; caller " + c.key + " has " + words +
            (t.over_share ? ", over its share" : "") + " of the server's limit (" +
            (adaptive() ? "adaptive, now " : "") + std::to_string(limit()) + "); retry after " +
            std::to_string(retry_after_ms()) + " ms";
    t.now = ticket::state::refused;
    ++c.refused;
    refused_.fetch_add(1, std::memory_order_relaxed);
}

admission::verdict admission::enter_slow(seat& s, std::shared_ptr<ticket>& t, std::string& why,
                                         bool& over) {
    std::vector<std::unique_ptr<parked>> wake;
    caller& c = *s.who;
    verdict v;
    {
        std::lock_guard lk(share_mu_);
        // A slot freed while no one could take it goes first to the calls that wait (a fast
        // path's failed take may have hidden it from the call that gave it back).
        pump(false, wake);
        auto mine = std::make_shared<ticket>();
        mine->at = &s;
        mine->seq = seq_++;
        if (waiting_callers_.empty() && take()) {
            // Nobody waits and a slot is free: it runs (counted just below).
            c.in_transit.fetch_add(1, std::memory_order_relaxed);
            mine->now = ticket::state::granted;
        } else if (c.waiting.size() >= shares_.queue) {
            refuse_locked(*mine, "its queue is full (" + std::to_string(shares_.queue) +
                                     " calls, server_options::shares.queue)");
        } else {
            mine->owner = shared_from_this();  // a ticket is let go of outside share_mu_
            if (c.waiting.empty()) waiting_callers_.push_back(&c);
            c.waiting.push_back(mine);
            waiting_.fetch_add(1, std::memory_order_seq_cst);
            // Bounded in all: past the limit's worth of waiting calls, the caller furthest
            // over its share loses its newest one.
            if (waiting_.load(std::memory_order_relaxed) > std::max(limit(), shares_.queue)) {
                caller* far = *std::max_element(
                    waiting_callers_.begin(), waiting_callers_.end(),
                    [](const caller* a, const caller* b) { return further_over(*b, *a); });
                // Refused while still counted among its caller's waiting calls.
                refuse_locked(*far->waiting.back(),
                              std::to_string(waiting_.load()) +
                                  " calls wait for a slot, more than the limit queues, and this "
                                  "caller is the furthest over its share");
                auto lost = std::move(far->waiting.back());
                far->waiting.pop_back();
                if (far->waiting.empty()) std::erase(waiting_callers_, far);
                waiting_.fetch_sub(1, std::memory_order_seq_cst);
                if (lost->parked_at) wake.push_back(std::move(lost->parked_at));
            }
            pump(false, wake);
        }
        switch (mine->now) {
            case ticket::state::granted:
                // Granted at once: counted in its seat here, on its own thread.
                s.count_in();
                c.in_transit.fetch_sub(1, std::memory_order_relaxed);
                v = verdict::run;
                break;
            case ticket::state::waiting:
                ++c.queued;
                waited_.fetch_add(1, std::memory_order_relaxed);
                t = std::move(mine);
                v = verdict::wait;
                break;
            default:
                why = std::move(mine->why);
                over = mine->over_share;
                v = verdict::refuse;
        }
    }
    for (auto& p : wake) p->wake();
    return v;
}

bool admission::pump(bool in_hand, std::vector<std::unique_ptr<parked>>& wake) {
    while (!waiting_callers_.empty()) {
        if (!in_hand && !take()) break;
        in_hand = false;
        auto best = std::min_element(
            waiting_callers_.begin(), waiting_callers_.end(),
            [](const caller* a, const caller* b) { return before(*a, *b); });
        caller& c = **best;
        auto t = std::move(c.waiting.front());
        c.waiting.pop_front();
        if (c.waiting.empty()) waiting_callers_.erase(best);
        waiting_.fetch_sub(1, std::memory_order_seq_cst);
        // Running from now on; its seat counts it once its coroutine resumes (wait).
        c.in_transit.fetch_add(1, std::memory_order_relaxed);
        t->now = ticket::state::granted;
        if (t->parked_at) wake.push_back(std::move(t->parked_at));
    }
    return in_hand;
}

void admission::cancel(ticket& t) {
    std::unique_ptr<parked> p;
    {
        std::lock_guard lk(share_mu_);
        if (t.now != ticket::state::waiting) return;
        caller& c = *t.at->who;
        // The queue's reference is let go of here, not under the lock: the coroutine holds one.
        auto it = std::find_if(c.waiting.begin(), c.waiting.end(),
                               [&](const std::shared_ptr<ticket>& w) { return w.get() == &t; });
        if (it != c.waiting.end()) c.waiting.erase(it);
        if (c.waiting.empty()) std::erase(waiting_callers_, &c);
        waiting_.fetch_sub(1, std::memory_order_seq_cst);
        t.now = ticket::state::cancelled;
        p = std::move(t.parked_at);
    }
    if (p) p->wake();
}

net::awaitable<admission::ticket::state> admission::wait(const std::shared_ptr<ticket>& t) {
    // `t` holds the limit (owner) as long as it lives, and the awaiting coroutine holds `t`:
    // the lambdas take plain pointers (GCC 12 destroys a co_await's temporaries twice, and a
    // lambda holding a shared_ptr would drop it twice).
    admission* self = t->owner.get();
    ticket* tp = t.get();
    try {
        co_await net::async_initiate<const net::use_awaitable_t<>&, void()>(
            [self, tp](auto handler) {
                std::unique_lock lk(self->share_mu_);
                if (tp->now != ticket::state::waiting) {
                    lk.unlock();
                    post_handler(std::move(handler));
                    return;
                }
                auto cs = net::get_associated_cancellation_slot(handler);
                tp->parked_at = park(std::move(handler));
                if (cs.is_connected())
                    cs.assign([self, tp](net::cancellation_type) { self->cancel(*tp); });
            },
            net::use_awaitable);
    } catch (...) {
        // Cancelled before it could wait (the coroutine throws as it starts to): it waits no
        // more, unless it was granted meanwhile.
        self->cancel(*tp);
    }
    ticket::state now;
    {
        std::lock_guard lk(self->share_mu_);
        now = tp->now;
    }
    if (now == ticket::state::granted) {
        tp->at->count_in();
        tp->at->who->in_transit.fetch_sub(1, std::memory_order_relaxed);
    }
    co_return now;
}

void admission::leave_shared(seat& s, clock::time_point since) noexcept {
    if (since != clock::time_point{}) [[unlikely]]
        sample(since, clock::now());
    s.count_out();
    bool held = true;
    // The slot goes straight to the next waiting call, unless the limit has fallen below the
    // calls running (an adaptive limit that shrank, or probes): then it is given back.
    if (waiting_.load(std::memory_order_seq_cst) > 0 &&
        count_.load(std::memory_order_relaxed) - 1 <= limit_.load(std::memory_order_relaxed)) {
        std::vector<std::unique_ptr<parked>> wake;
        {
            std::lock_guard lk(share_mu_);
            held = pump(true, wake);
        }
        for (auto& p : wake) p->wake();
        if (!held) return;
    }
    if (count_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
        delete this;  // nothing waits: a waiting call holds the limit
        return;
    }
    // A call that began to wait as the slot was given back, and did not see it free.
    if (waiting_.load(std::memory_order_seq_cst) > 0) {
        std::vector<std::unique_ptr<parked>> wake;
        {
            std::lock_guard lk(share_mu_);
            pump(false, wake);
        }
        for (auto& p : wake) p->wake();
    }
}

concurrency_stats admission::stats() const {
    concurrency_stats s = plain_stats();
    if (!shared()) return s;
    std::lock_guard lk(share_mu_);
    std::vector<caller_stats> all;
    all.reserve(callers_.size());
    for (const auto& [key, c] : callers_)
        all.push_back(
            {c->key, c->weight, c->running(), c->waiting.size(), c->served(), c->queued, c->refused});
    const auto calls = [](const caller_stats& x) { return x.served + x.refused; };
    std::sort(all.begin(), all.end(), [&](const caller_stats& a, const caller_stats& b) {
        return calls(a) != calls(b) ? calls(a) > calls(b) : a.caller < b.caller;
    });
    caller_stats other = gone_;
    other.caller = "other";
    other.weight = 0;
    for (std::size_t i = listed_callers; i < all.size(); ++i) {
        other.running += all[i].running;
        other.waiting += all[i].waiting;
        other.served += all[i].served;
        other.queued += all[i].queued;
        other.refused += all[i].refused;
    }
    if (all.size() > listed_callers) all.resize(listed_callers);
    if (calls(other) || other.running || other.waiting) all.push_back(std::move(other));
    s.callers = std::move(all);
    return s;
}

}  // namespace ordo::detail
