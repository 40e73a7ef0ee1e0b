// ordo::server's limits: idle_timeout (closing quiet connections), the memory budget
// (saying it is used up, closing connections whose output does not drain, giving memory back
// after a burst), and refusing connections (beyond max_connections, or out of descriptors: the
// spare one) with a word of why.
#include "ordo/rpc/server.hpp"

#include <fcntl.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cerrno>

#include "lib/escaped.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "rpc/server/server_state.hpp"

namespace ordo {

void server::state::keep_spare() {
    if (spare_fd < 0) spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void server::state::give_back_memory() {
#ifdef __GLIBC__
    ::malloc_trim(0);
#endif
}

bool server::state::out_of_descriptors(const std::error_code& ec) {
    // Asio reports errno values in a category of its own, which does not compare equal
    // to std::errc.
    const bool sys = ec.category() == std::system_category() ||
                     ec.category() == net::error::get_system_category();
    return sys && (ec.value() == EMFILE || ec.value() == ENFILE);
}

// idle_timeout: every quarter of it, closes the connections of `lp` that have been quiet
// for it. Runs on lp's executor.
net::awaitable<void> server::state::sweep_idle(std::shared_ptr<state> s, loop& lp) {
    using clock = std::chrono::steady_clock;
    const auto limit = s->o.idle_timeout;
    auto& tick = *lp.sweep_tick;
    while (!s->stopping) {
        tick.expires_after(std::max(std::chrono::milliseconds(10), limit / 4));
        co_await tick.async_wait(use_tuple);
        if (s->stopping) break;
        const auto now = clock::now();
        for (auto& e : lp.peers) {
            const auto& pc = e.p->counters();
            const auto& cc = e.p->comm();
            const std::uint64_t bytes = cc.bytes_sent + cc.bytes_received;
            if (bytes != e.bytes || pc.pending_calls != 0 || pc.running_handlers != 0 ||
                pc.queued_messages != 0) {
                e.bytes = bytes;
                e.quiet_since = now;
            } else if (now - e.quiet_since >= limit && !e.idle_closed && e.p->is_open()) {
                e.idle_closed = true;
                e.p->close(errc::closed, "ordo: the server closed the connection after " +
                                             std::to_string(limit.count()) +
                                             " ms without traffic (idle_timeout)");
            }
        }
    }
}

// While the memory budget is used up: says so (once each time, from the home loop), and
// closes the connections of `lp` whose output has not been written for output_grace. The
// rest of the budget's policy works without it, inside each connection
// (comm_options::budget). Runs on lp's executor.
net::awaitable<void> server::state::watch_budget(std::shared_ptr<state> s, loop& lp) {
    using clock = std::chrono::steady_clock;
    constexpr std::size_t output_floor = 32 * 1024;
    const auto grace = std::max(s->o.output_grace, std::chrono::milliseconds(1));
    auto& b = *s->o.peer.comm.budget;
    auto& tick = *lp.budget_tick;
    bool told = false;
    std::size_t peak = 0;  // the most charged since memory was last given back
    while (!s->stopping) {
        tick.expires_after(std::max(std::chrono::milliseconds(10), grace / 4));
        co_await tick.async_wait(use_tuple);
        if (s->stopping) break;
        if (lp.home) {
            peak = std::max(peak, b.used());
            if (peak >= (std::size_t{64} << 20) && b.used() < peak / 4) {
                // A burst has passed: give what it freed back to the system (glibc keeps
                // freed memory otherwise, and the process's RSS stays at the burst's peak).
                give_back_memory();
                peak = b.used();
            }
        }
        if (!b.over()) {
            told = false;
            continue;
        }
        if (!told && lp.home) {
            s->event(server_event::kind::over_budget, {}, errc::overloaded,
                     "ordo: the server's memory budget is used up (" + std::to_string(b.used()) +
                         " of " + std::to_string(b.limit()) +
                         " bytes): large messages wait, connections with queued messages "
                         "or unread output stop reading");
        }
        told = true;
        const auto now = clock::now();
        std::vector<std::shared_ptr<peer>> stuck;  // closed after the walk: it may erase
        for (auto& e : lp.peers) {
            const auto& cc = e.p->comm();
            if (cc.write_since != clock::time_point{} && now - cc.write_since >= grace &&
                cc.buffered_bytes > output_floor && e.p->is_open())
                stuck.push_back(e.p);
        }
        for (auto& p : stuck)
            p->abort(errc::overloaded,
                     "ordo: the server's memory budget is used up (" + std::to_string(b.used()) +
                         " of " + std::to_string(b.limit()) + " bytes) and " +
                         std::to_string(p->comm().buffered_bytes) + " bytes of output to " +
                         p->remote_address() + " have not been written for " +
                         std::to_string(grace.count()) +
                         " ms (output_grace): the peer does not read; closed");
    }
}

// A connection not served (beyond max_connections, or no descriptors left): told why,
// then closed. At most max_refusing are told at once; beyond that a connection is closed
// without a word. Runs on the server's executor; the telling runs on the transport's.
void server::state::refuse(std::unique_ptr<transport> t, errc code, std::string why) {
    const std::string remote = t->remote_address();
    ++refused;
    // A flood of refusals is said a few times a second per address, then summed up.
    report(server_event::kind::refused, address_group(remote), remote, make_error_code(code), why);
    if (refusing >= max_refusing) {
        t->close();
        return keep_spare();
    }
    ++refusing;
    auto te = t->get_executor();
    net::co_spawn(te, say_closing(shared_from_this(), std::move(t), code, std::move(why)),
                  detail::rethrow_escaped{});
}

// Writes ordo.closing [code, reason], ends the sending side, and reads what the peer still
// sends (discarded, for up to a second) so that closing does not reset the connection
// before the peer has read the reason.
net::awaitable<void> server::state::say_closing(std::shared_ptr<state> s,
                                                std::unique_ptr<transport> t, errc code,
                                                std::string why) {
    using namespace net::experimental::awaitable_operators;
    buffer b(small_buffer);
    encode_notification(b, "ordo.closing", static_cast<int>(code), why);
    std::error_code ec;
    co_await t->async_write(net::buffer(b.data(), b.size()), ec);
    if (!ec) {
        t->shutdown_send();
        net::steady_timer limit(t->get_executor(), std::chrono::seconds(1));
        co_await (drain(*t) || limit.async_wait(use_tuple));
    }
    t->close();
    net::dispatch(s->ex, [s] {
        --s->refusing;
        s->keep_spare();
    });
}

net::awaitable<void> server::state::drain(transport& t) {
    char sink[1024];
    for (int i = 0; i < 64; ++i) {
        std::error_code ec;
        co_await t.async_read_some(net::buffer(sink, sizeof sink), ec);
        if (ec) co_return;
    }
}

}  // namespace ordo
