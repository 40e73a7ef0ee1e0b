// A TCP relay on loopback that delays every byte by a fixed time each way: a long path without
// tc netem (not in this kernel), for tests and benchmarks of credit over a round trip.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include <asio/ip/tcp.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include "ordo/ordo.hpp"
#include "support/running_loop.hpp"

namespace ordo::test {

// A TCP relay on 127.0.0.1 that holds every chunk it reads for `delay` before writing it on,
// in each direction. It reads as fast as it can up to `max_held` bytes held per direction (what
// a path of that delay holds at several GB/s), then waits for the writes.
class delay_relay {
    using tcp = net::ip::tcp;

  public:
    delay_relay(std::uint16_t target, std::chrono::milliseconds delay)
        : target_(target), delay_(delay), acceptor_(loop_.io, {net::ip::address_v4::loopback(), 0}) {
        net::co_spawn(loop_.io, accept_loop(), net::detached);
    }
    // Closes the acceptor on its loop and waits for that, before the acceptor goes.
    ~delay_relay() {
        net::post(loop_.io, net::use_future([this] {
            std::error_code ignored;
            acceptor_.close(ignored);
        })).get();
    }
    std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

  private:
    struct chunk {
        std::string bytes;
        std::chrono::steady_clock::time_point due;
    };
    struct direction {
        std::deque<chunk> held;
        std::size_t held_bytes = 0;
        bool ended = false;
        std::unique_ptr<net::steady_timer> ready;  // wakes the writer, and a paused reader
    };
    static constexpr std::size_t max_held = std::size_t{256} << 20;

    net::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, in] = co_await acceptor_.async_accept(use_tuple);
            if (ec) co_return;
            auto out = std::make_shared<tcp::socket>(loop_.io);
            co_await out->async_connect({net::ip::address_v4::loopback(), target_},
                                        net::use_awaitable);
            auto a = std::make_shared<tcp::socket>(std::move(in));
            a->set_option(tcp::no_delay(true));
            out->set_option(tcp::no_delay(true));
            pipe(a, out);
            pipe(out, a);
        }
    }
    void pipe(std::shared_ptr<tcp::socket> from, std::shared_ptr<tcp::socket> to) {
        auto d = std::make_shared<direction>();
        d->ready = std::make_unique<net::steady_timer>(loop_.io);
        net::co_spawn(loop_.io, read_side(from, d), net::detached);
        net::co_spawn(loop_.io, write_side(to, d), net::detached);
    }
    net::awaitable<void> read_side(std::shared_ptr<tcp::socket> s, std::shared_ptr<direction> d) {
        for (;;) {
            while (d->held_bytes >= max_held) {
                d->ready->expires_after(std::chrono::milliseconds(1));
                co_await d->ready->async_wait(use_tuple);
            }
            std::string b(256 * 1024, '\0');
            auto [ec, n] = co_await s->async_read_some(net::buffer(b), use_tuple);
            if (ec) break;
            b.resize(n);
            d->held_bytes += n;
            d->held.push_back({std::move(b), std::chrono::steady_clock::now() + delay_});
            d->ready->cancel();
        }
        d->ended = true;
        d->ready->cancel();
    }
    net::awaitable<void> write_side(std::shared_ptr<tcp::socket> s, std::shared_ptr<direction> d) {
        for (;;) {
            if (d->held.empty()) {
                if (d->ended) break;
                d->ready->expires_at(std::chrono::steady_clock::time_point::max());
                co_await d->ready->async_wait(use_tuple);
                continue;
            }
            net::steady_timer wait(loop_.io, d->held.front().due);
            co_await wait.async_wait(use_tuple);
            chunk c = std::move(d->held.front());
            d->held.pop_front();
            auto [ec, n] = co_await net::async_write(*s, net::buffer(c.bytes), use_tuple);
            d->held_bytes -= c.bytes.size();
            if (ec) break;
        }
        std::error_code ignored;
        s->shutdown(tcp::socket::shutdown_send, ignored);
    }

    std::uint16_t target_;
    std::chrono::milliseconds delay_;
    running_loop loop_;
    tcp::acceptor acceptor_;
};

}  // namespace ordo::test
