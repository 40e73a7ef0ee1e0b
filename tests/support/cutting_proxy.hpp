// A TCP forwarder on loopback that cuts the connections it forwards at exact byte counts, or on
// demand, or refuses them: for tests of sessions that must survive a lost connection (tc netem
// needs privileges the tests do not have). Header-only test support, without gtest (benchmarks
// use it too): a failure of the proxy itself aborts the process with a message on stderr.
#pragma once

#include <sys/ioctl.h>
#if __has_include(<linux/sockios.h>)
#include <linux/sockios.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <iterator>
#include <list>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <cstdio>
#include <cstdlib>

#include <asio/executor_work_guard.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

#include "ordo/net.hpp"

namespace ordo::test {

/// What a cutting_proxy does to the connections it forwards.
///
/// The cut point of a connection is the moment its byte budget is spent: the proxy has then
/// written exactly that many bytes, both directions together, to the two peers, and the kernel
/// has sent them (it waits up to 100 ms for a peer that does not read; bytes still unsent then are
/// lost to the reset, as on a real network). A read chunk that crosses the budget is split: only
/// its first bytes are forwarded, so a cut can fall in the middle of a message.
struct cut_options {
    /// Seeds the draw of the budgets. Connections draw in accept order, so the same seed and the
    /// same order of connections give the same cut points.
    std::uint64_t seed = 1;
    /// Each forwarded connection is cut after a uniformly random number of forwarded bytes (both
    /// directions counted together) in [min_bytes, max_bytes]; max_bytes == 0: never cut by
    /// count. min_bytes > max_bytes is read as min_bytes == max_bytes. A budget of 0 cuts the
    /// connection as soon as its upstream side is connected.
    std::size_t min_bytes = 0, max_bytes = 0;
    /// At the cut point:
    /// - reset: both sockets are closed with SO_LINGER {on, 0}; each peer reads what it was sent
    ///   before the cut, then ECONNRESET.
    /// - stall_then_reset: nothing more is read or forwarded either way for `stall` (the peers'
    ///   bytes wait in their own kernels, as behind a dead link); then as reset.
    /// - drop_upstream_direction: bytes from the client are read and discarded (a client's FIN
    ///   too), bytes from the server are still forwarded, for `stall`; then as reset.
    enum class how { reset, stall_then_reset, drop_upstream_direction } mode = how::reset;
    /// How long stall_then_reset and drop_upstream_direction last before the reset.
    std::chrono::milliseconds stall{200};
    /// After this many cuts (cut_all()'s included), connections reaching their budget are
    /// forwarded without cutting. cut_all() itself always cuts.
    std::size_t max_cuts = SIZE_MAX;
};

/// Listens on 127.0.0.1, port 0, and forwards each accepted connection over a fresh connection of
/// its own to the target, cutting it as `cut_options` says.
///
/// Runs its own io_context on its own std::thread; all its state lives there. The public
/// functions may be called from any thread but that one (which only runs the proxy's own code).
/// A peer's EOF is passed on as a shutdown of the other side's sending direction, a peer's reset
/// or error as a reset of the whole connection. An upstream connection that fails (the target is
/// down) resets the client's connection; that is not a cut. Not copyable, not movable.
class cutting_proxy {
  public:
    /// Resolves the target now (throws std::system_error if it cannot), binds and listens, and
    /// starts the proxy's thread. The target need not be listening yet.
    cutting_proxy(std::string target_host, std::uint16_t target_port, cut_options o = {})
        : options_(o),
          rng_(o.seed),
          acceptor_(io_, tcp::endpoint(net::ip::address_v4::loopback(), 0)),
          port_(acceptor_.local_endpoint().port()) {
        tcp::resolver resolver(io_);
        targets_ = resolver.resolve(target_host, std::to_string(target_port),
                                    tcp::resolver::numeric_service);
        net::co_spawn(io_, accept_loop(), [](std::exception_ptr e) { report(e, "accept loop"); });
        thread_ = std::thread([this] { io_.run(); });
    }

    /// Stops accepting, resets every live connection (not counted as cuts), waits for all of the
    /// proxy's coroutines to end and joins its thread. Bounded: nothing the proxy waits on
    /// outlives the reset, but for its 1 ms drain polls and 10 ms accept back-off.
    ~cutting_proxy() {
        net::post(io_, [this] { stop(); });
        work_.reset();
        thread_.join();
    }

    cutting_proxy(const cutting_proxy&) = delete;
    cutting_proxy& operator=(const cutting_proxy&) = delete;

    /// The port the proxy listens on, on 127.0.0.1.
    std::uint16_t port() const noexcept { return port_; }
    /// "tcp://127.0.0.1:<port>".
    std::string url() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
    /// Connections cut so far: counted at the cut point (when a stall or drop begins, before its
    /// reset), and by cut_all().
    std::size_t cuts() const noexcept { return cuts_.load(); }
    /// Connections accepted so far, refused ones included.
    std::size_t connections() const noexcept { return connections_.load(); }
    /// Connections accepted and reset at once while refusing.
    std::size_t refused() const noexcept { return refused_.load(); }

    /// Resets every live connection now, wherever it is: forwarding, connecting upstream, or
    /// stalled (a connection already counted as cut is not counted again). Returns once done: a
    /// connection accepted before the call is then reset, and cuts() counts it. Bytes forwarded
    /// before the call but still unsent by the kernel are lost; no budget is involved.
    void cut_all() {
        std::promise<void> done;
        auto finished = done.get_future();
        net::post(io_, [this, &done] {
            for (auto& c : live_) {
                if (c.closed) continue;
                if (c.state == phase::forwarding) ++cuts_;
                reset(c);
            }
            done.set_value();
        });
        finished.wait();
    }

    /// While true, connections accepted are reset at once (SO_LINGER {on, 0}), as a server that
    /// is down but whose port is reachable; live connections are left alone (cut_all() cuts them).
    /// Applies to every connection accepted after the call returns, and to any accepted by the
    /// kernel but not yet by the proxy.
    void set_refusing(bool refusing) noexcept { refusing_.store(refusing); }

  private:
    using tcp = net::ip::tcp;
    using clock_type = std::chrono::steady_clock;
    using how = cut_options::how;

    static constexpr std::size_t unlimited = SIZE_MAX;  // a budget never spent
    static constexpr std::size_t dropped = SIZE_MAX;    // an allowance: read and discard
    static constexpr std::size_t chunk = 16384;

    // forwarding: within the budget; the others are the fault under way after the cut point.
    enum class phase { forwarding, stalled, dropping, resetting };

    // One forwarded connection; in live_, used on the proxy's thread only.
    struct connection {
        connection(net::io_context& io, tcp::socket client, std::size_t b)
            : down(std::move(client)),
              up(io),
              budget(b),
              changed(io, clock_type::time_point::max()),
              pause(io) {}
        tcp::socket down;        // the accepted connection, to the client
        tcp::socket up;          // ours, to the target
        std::size_t budget;      // bytes still to forward before the cut point
        std::size_t writes = 0;  // writes under way: the cut point waits for them
        phase state = phase::forwarding;
        bool closed = false;        // both sockets closed; every coroutine of the connection ends
        net::steady_timer changed;  // never expires; cancelled to wake who waits for a new state
        net::steady_timer pause;    // the stall
    };

    // Accepts until stop(); each connection gets an entry in live_ and a coroutine that erases it
    // at its end.
    net::awaitable<void> accept_loop() {
        using namespace std::chrono_literals;
        net::steady_timer backoff(io_);
        while (!stopping_) {
            auto [ec, socket] = co_await acceptor_.async_accept(use_tuple);
            if (stopping_) co_return;
            if (ec) {
                // Out of descriptors and the like: try again shortly rather than spin.
                backoff.expires_after(10ms);
                co_await backoff.async_wait(use_tuple);
                continue;
            }
            ++connections_;
            if (refusing_.load()) {
                ++refused_;
                std::error_code ignored;
                socket.set_option(net::socket_base::linger(true, 0), ignored);
                socket.close(ignored);
                continue;
            }
            auto& c = live_.emplace_back(io_, std::move(socket), draw_budget());
            net::co_spawn(io_, run_connection(c),
                          [this, it = std::prev(live_.end())](std::exception_ptr e) {
                              report(e, "a forwarded connection");
                              reset(*it);
                              live_.erase(it);
                          });
        }
    }

    std::size_t draw_budget() {
        if (options_.max_bytes == 0) return unlimited;
        const std::size_t lo = std::min(options_.min_bytes, options_.max_bytes);
        return std::uniform_int_distribution<std::size_t>(lo, options_.max_bytes)(rng_);
    }

    net::awaitable<void> run_connection(connection& c) {
        using namespace net::experimental::awaitable_operators;
        std::error_code ec = net::error::host_not_found;
        // One endpoint at a time, so that a connection reset meanwhile is not reopened.
        for (const auto& target : targets_) {
            if (c.closed) co_return;
            std::error_code ignored;
            c.up.close(ignored);
            std::tie(ec) = co_await c.up.async_connect(target.endpoint(), use_tuple);
            if (!ec) break;
        }
        if (c.closed) co_return;
        if (ec) {
            reset(c);  // the target is down: the client sees a reset
            co_return;
        }
        std::error_code ignored;
        c.down.set_option(tcp::no_delay(true), ignored);
        c.up.set_option(tcp::no_delay(true), ignored);
        maybe_cut(c);  // a budget of 0
        co_await (forward(c) && fault(c));
    }

    // Both directions; closes the connection cleanly when both have ended by EOF.
    net::awaitable<void> forward(connection& c) {
        using namespace net::experimental::awaitable_operators;
        co_await (pump(c, true) && pump(c, false));
        close(c);
    }

    // How many of `n` bytes read in one direction may be forwarded now: 0 means wait for a new
    // state, `dropped` means discard them.
    static std::size_t allowance(const connection& c, bool client_to_server, std::size_t n) {
        switch (c.state) {
            case phase::forwarding: return std::min(n, c.budget);
            case phase::dropping: return client_to_server ? dropped : n;
            default: return 0;
        }
    }

    // Moves one direction's bytes until EOF (passed on as a shutdown), an error (passed on as a
    // reset of the connection) or the connection's close.
    net::awaitable<void> pump(connection& c, bool client_to_server) {
        tcp::socket& from = client_to_server ? c.down : c.up;
        tcp::socket& to = client_to_server ? c.up : c.down;
        std::vector<char> buf(chunk);
        for (;;) {
            // A stalled connection, or one whose budget is spent, reads nothing: the peer's bytes
            // wait in its kernel, as behind a dead network.
            while (!c.closed && allowance(c, client_to_server, 1) == 0)
                co_await c.changed.async_wait(use_tuple);
            if (c.closed) co_return;
            auto [ec, n] = co_await from.async_read_some(net::buffer(buf), use_tuple);
            if (c.closed) co_return;
            if (ec == net::error::eof) {
                // A FIN is passed on when a byte would be.
                while (!c.closed && allowance(c, client_to_server, 1) == 0)
                    co_await c.changed.async_wait(use_tuple);
                if (!c.closed && allowance(c, client_to_server, 1) != dropped) {
                    std::error_code ignored;
                    to.shutdown(tcp::socket::shutdown_send, ignored);
                }
                co_return;
            }
            if (ec) {
                reset(c);
                co_return;
            }
            std::span<const char> rest(buf.data(), n);
            while (!rest.empty()) {
                const std::size_t k = allowance(c, client_to_server, rest.size());
                if (k == dropped) break;
                if (k == 0) {
                    co_await c.changed.async_wait(use_tuple);
                    if (c.closed) co_return;
                    continue;
                }
                // Spent before the write, so that the other direction cannot spend it too.
                if (c.state == phase::forwarding && c.budget != unlimited) c.budget -= k;
                ++c.writes;
                auto [wec, written] =
                    co_await net::async_write(to, net::buffer(rest.data(), k), use_tuple);
                --c.writes;
                if (c.closed) co_return;
                if (wec) {
                    reset(c);
                    co_return;
                }
                rest = rest.subspan(written);
                maybe_cut(c);
            }
        }
    }

    // At the cut point (budget spent, no write under way) the fault begins.
    void maybe_cut(connection& c) {
        if (c.closed || c.state != phase::forwarding || c.budget != 0 || c.writes != 0) return;
        if (cuts_.load() >= options_.max_cuts) {
            c.budget = unlimited;
        } else {
            ++cuts_;
            c.state = options_.mode == how::reset              ? phase::resetting
                      : options_.mode == how::stall_then_reset ? phase::stalled
                                                               : phase::dropping;
        }
        c.changed.cancel();
    }

    // Waits for the cut point, then carries out the fault; ends when the connection closes.
    net::awaitable<void> fault(connection& c) {
        while (!c.closed && c.state == phase::forwarding) co_await c.changed.async_wait(use_tuple);
        if (c.closed) co_return;
        if (c.state != phase::resetting) {
            c.pause.expires_after(options_.stall);
            co_await c.pause.async_wait(use_tuple);
            if (c.closed) co_return;
            c.state = phase::resetting;
            c.changed.cancel();
        }
        co_await drain(c);
        reset(c);
    }

    // Waits, up to 1 s, until the kernel has sent every byte the proxy wrote on the connection:
    // a reset discards unsent bytes, which the budget counted as forwarded. They stay unsent only
    // while a peer does not read (for a moment, on a busy machine; for good, if it stopped).
    net::awaitable<void> drain(connection& c) {
#ifdef SIOCOUTQNSD
        using namespace std::chrono_literals;
        net::steady_timer tick(io_);
        const auto deadline = clock_type::now() + 1s;
        while (!c.closed && (unsent(c.down) > 0 || unsent(c.up) > 0) &&
               clock_type::now() < deadline) {
            tick.expires_after(1ms);
            co_await tick.async_wait(use_tuple);
        }
#else
        (void)c;
        co_return;
#endif
    }

#ifdef SIOCOUTQNSD
    static int unsent(tcp::socket& s) noexcept {
        int n = 0;
        if (!s.is_open() || ::ioctl(s.native_handle(), SIOCOUTQNSD, &n) != 0) return 0;
        return n;
    }
#endif

    // Closes both sockets with SO_LINGER {on, 0}: each peer gets an RST.
    void reset(connection& c) noexcept {
        if (c.closed) return;
        std::error_code ignored;
        for (tcp::socket* s : {&c.down, &c.up}) {
            if (s->is_open()) s->set_option(net::socket_base::linger(true, 0), ignored);
            s->close(ignored);
        }
        end(c);
    }

    void close(connection& c) noexcept {
        if (c.closed) return;
        std::error_code ignored;
        c.down.close(ignored);
        c.up.close(ignored);
        end(c);
    }

    void end(connection& c) noexcept {
        c.closed = true;
        c.changed.cancel();
        c.pause.cancel();
    }

    void stop() {
        stopping_ = true;
        std::error_code ignored;
        acceptor_.close(ignored);
        for (auto& c : live_) reset(c);
    }

    // The error sink of the proxy's coroutines, which report their failures with error codes:
    // an exception here is a bug of the proxy, and stops the process loudly (the proxy also
    // serves benchmarks, which have no test framework to report to).
    static void report(std::exception_ptr e, const char* where) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            std::fprintf(stderr, "cutting_proxy: %s threw: %s\n", where, x.what());
        } catch (...) {
            std::fprintf(stderr, "cutting_proxy: %s threw\n", where);
        }
        std::abort();
    }

    cut_options options_;
    std::mt19937_64 rng_;  // the budgets, drawn in accept order
    net::io_context io_{1};
    net::executor_work_guard<net::io_context::executor_type> work_ = net::make_work_guard(io_);
    tcp::acceptor acceptor_;
    std::uint16_t port_;
    tcp::resolver::results_type targets_;
    std::list<connection> live_;  // stable addresses: each connection's coroutine holds a reference
    bool stopping_ = false;
    std::atomic<bool> refusing_{false};
    std::atomic<std::size_t> cuts_{0}, connections_{0}, refused_{0};
    std::thread thread_;  // last: started when everything else exists
};

}  // namespace ordo::test
