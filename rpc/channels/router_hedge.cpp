// A router's hedged calls (router_options::hedge, hedge_methods; docs/design.md 5.12): the
// caller's call stays here while copies of it go out, a first one at once and, if no answer
// came within the delay, a second one to another replica. The first answer completes the
// caller's call and the other copy is cancelled.
#include "ordo/rpc/router.hpp"

#include <array>

#include "rpc/channels/router_state.hpp"
#include "rpc/connection/call_watch.hpp"

namespace ordo {
namespace {

using clock_type = std::chrono::steady_clock;

// One hedged call: the caller's call and what became of its copies. On the router's executor.
struct hedge_group : std::enable_shared_from_this<hedge_group> {
    std::unique_ptr<detail::pending_call> caller;
    std::shared_ptr<router::state*> owner;  // the router's state while it lives (else null)
    std::array<net::cancellation_signal, 2> signals;  // one per copy: ordo.cancel for the loser
    int outstanding = 0;                              // copies sent and not ended
    int sent = 0;                                     // copies sent
    bool done = false;                                // the caller has its answer
    clock_type::time_point deadline = clock_type::time_point::max();
    std::weak_ptr<detail::replica> first_at;
    net::steady_timer timer;

    hedge_group(net::any_io_executor ex) : timer(std::move(ex)) {}

    void cancel_others(int but) {
        for (int i = 0; i < sent; ++i)
            if (i != but)
                signals[static_cast<std::size_t>(i)].emit(net::cancellation_type::terminal);
    }
    void finish(std::error_code ec, call_outcome out) {
        done = true;
        timer.cancel();
        if (caller->slot.is_connected()) caller->slot.clear();
        auto c = std::move(caller);
        c->complete(ec, std::move(out));
    }
    void ended(int which, std::error_code ec, call_outcome out, router::state* s);
};

// A copy of a hedged call: its end goes to its group.
class hedge_copy final : public detail::pending_call {
  public:
    hedge_copy(std::shared_ptr<hedge_group> g, int which) : g_(std::move(g)), which_(which) {}
    void complete(std::error_code ec, call_outcome out) override {
        g_->ended(which_, ec, std::move(out), *g_->owner);
    }

  private:
    std::shared_ptr<hedge_group> g_;
    int which_;
};

void hedge_group::ended(int which, std::error_code ec, call_outcome out, router::state* s) {
    --outstanding;
    if (done) return;  // the loser, cancelled or late
    if (ec && outstanding > 0)
        return;  // the other copy may still answer: its answer is the caller's
    if (!ec && which == 1 && s) ++s->c.hedge_wins;
    cancel_others(which);
    finish(ec, std::move(out));
}

// A copy of g's call, counted as sent.
std::unique_ptr<detail::pending_call> make_copy(const std::shared_ptr<hedge_group>& g, int which) {
    auto c = std::make_unique<hedge_copy>(g, which);
    c->method = g->caller->method;
    c->params = g->caller->params.copy();
    c->options = g->caller->options;
    c->slot = g->signals[static_cast<std::size_t>(which)].slot();
    ++g->outstanding;
    ++g->sent;
    return c;
}

}  // namespace

std::chrono::milliseconds router::state::hedge_delay(const detail::pending_call& call) {
    if (!o.idempotent_methods.count(call.method)) return {};
    const auto own = o.hedge_methods.find(call.method);
    const hedge_policy& p = own != o.hedge_methods.end() ? own->second : o.hedge;
    if (!p.on()) return {};
    if (!p.p95) return p.after;
    auto it = hedge_latency.find(call.method);
    if (it == hedge_latency.end() || it->second.h.count() < 100) return p.after;
    auto& t = it->second;
    // Taken again every 32 answers: not a scan of the histogram per call.
    if (t.at_count == 0 || t.h.count() >= t.at_count + 32) {
        t.p95 = t.h.at(0.95);
        t.at_count = t.h.count();
    }
    return std::max(p.after, std::chrono::ceil<std::chrono::milliseconds>(t.p95));
}

void router::state::note_hedge_latency(const std::string& method, clock_type::duration took) {
    if (!o.idempotent_methods.count(method)) return;
    const auto own = o.hedge_methods.find(method);
    if (!(own != o.hedge_methods.end() ? own->second : o.hedge).p95) return;
    hedge_latency[method].h.record(took);
}

void router::state::send_hedged(replica& r, std::unique_ptr<detail::pending_call> call,
                                std::chrono::milliseconds timeout,
                                std::chrono::milliseconds delay) {
    const auto now = clock_type::now();
    auto g = std::make_shared<hedge_group>(ex);
    g->owner = anchor;
    g->first_at = shared(&r);
    if (timeout.count() > 0) g->deadline = now + timeout;
    g->caller = std::move(call);
    // The caller's cancellation cancels every copy, and so the call.
    if (g->caller->slot.is_connected())
        g->caller->slot.assign([w = std::weak_ptr<hedge_group>(g)](net::cancellation_type) {
            if (auto g = w.lock(); g && !g->done) {
                g->timer.cancel();
                g->cancel_others(-1);
            }
        });
    send_again(r, make_copy(g, 0), timeout);
    // A second copy is worth sending only while the deadline leaves time for its answer.
    if (g->done || now + delay >= g->deadline) return;
    g->timer.expires_after(delay);
    g->timer.async_wait([g](std::error_code ec) {
        state* sp = *g->owner;
        if (ec || !sp || g->done || g->outstanding == 0) return;
        state& s = *sp;
        auto first = g->first_at.lock();
        replica* to = first ? s.place.elsewhere(*first) : nullptr;
        if (!to || s.closed) return;
        const auto now = clock_type::now();
        if (!s.budget.withdraw(now)) {
            ++s.c.over_budget;
            return;
        }
        ++s.c.hedged;
        const auto left = g->deadline == clock_type::time_point::max()
                              ? std::chrono::milliseconds(0)
                              : detail::time_left(g->deadline);
        s.send_again(*to, make_copy(g, 1), left);
    });
}

}  // namespace ordo
