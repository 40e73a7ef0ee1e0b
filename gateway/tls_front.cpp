// The gateway's HTTPS front (gateway/tls_front.hpp): accepted with ordo's tls:// listener
// (its handshake timeout and caps on unfinished handshakes included), relayed byte for byte to
// civetweb's loopback port. The client's end of stream is passed on; civetweb's closes the
// client's connection (civetweb never half-closes and waits). civetweb serves only requests
// that come through here (relays()): a local process that finds its loopback port is refused.
#include "gateway/tls_front.hpp"

#include <list>
#include <mutex>
#include <set>
#include <thread>

#include <asio/connect.hpp>
#include <asio/write.hpp>
#include <asio/ip/tcp.hpp>

#include "ordo/error.hpp"
#include "ordo/comm/transport.hpp"

namespace ordo::gw {

using tcp = net::ip::tcp;

struct tls_front::state {
    net::io_context io;  // first: destroyed last, with what is left of the coroutines
    std::unique_ptr<listener> l;
    std::uint16_t plain_port = 0;
    std::uint16_t bound = 0;
    std::size_t max_relays = 0;
    std::function<void(const std::string&)> on_event;
    std::thread thread;
    bool stopped = false;  // on io's thread
    // The relayed connections, closed by stop() (on io's thread). Coroutines refer to this
    // state by pointer: stop() ends io's thread first.
    struct relay_pair {
        std::shared_ptr<transport> outside;
        tcp::socket inside;
        std::uint16_t inside_port = 0;
        int pumps = 0;  // running; the last to end forgets the pair
    };
    std::list<relay_pair> relays;
    // The inside connections' local ports, read by civetweb's threads (relays()).
    mutable std::mutex ports_mu;
    std::set<std::uint16_t> ports;

    void event(const std::string& line) const {
        if (on_event) on_event(line);
    }

    net::awaitable<void> accept_loop() {
        while (!stopped) {
            std::unique_ptr<transport> t;
            try {
                t = co_await l->async_accept();
            } catch (const std::system_error&) {
                if (stopped) co_return;
                continue;  // the listener goes on, as ordo's server's does
            }
            if (relays.size() >= max_relays) {
                event("ordo gateway: https connection from " + t->remote_address() +
                      " refused: " + std::to_string(max_relays) + " already relayed");
                t->close();
                continue;
            }
            relays.push_back({std::shared_ptr<transport>(std::move(t)), tcp::socket(io), 0});
            net::co_spawn(io, relay(std::prev(relays.end())), net::detached);
        }
    }

    net::awaitable<void> relay(std::list<relay_pair>::iterator it) {
        relay_pair& r = *it;
        auto [ec] = co_await r.inside.async_connect(
            tcp::endpoint(net::ip::address_v4::loopback(), plain_port), use_tuple);
        if (!ec) {
            std::error_code ignored;
            r.inside_port = r.inside.local_endpoint(ignored).port();
            {
                std::lock_guard lk(ports_mu);
                ports.insert(r.inside_port);
            }
            r.pumps = 2;
            net::co_spawn(io, inward(it), net::detached);
            net::co_spawn(io, outward(it), net::detached);
            co_return;
        }
        if (!stopped)
            event("ordo gateway: https connection from " + r.outside->remote_address() +
                  " not relayed: " + ec.message());
        close_pair(r);
        forget_if_done(it);
    }

    // Ends both connections (a direction still waiting then ends too).
    static void close_pair(relay_pair& r) {
        r.outside->close();
        std::error_code ignored;
        r.inside.close(ignored);
    }
    // Once neither direction runs, the pair is forgotten.
    void forget_if_done(std::list<relay_pair>::iterator it) {
        if (it->pumps > 0 || stopped) return;
        if (it->inside_port) {
            std::lock_guard lk(ports_mu);
            ports.erase(it->inside_port);
        }
        relays.erase(it);
    }

    // Client -> civetweb. Its end of stream ends civetweb's reading side (civetweb answers
    // what it read, then closes: outward() ends the pair); an error ends the pair.
    net::awaitable<void> inward(std::list<relay_pair>::iterator it) {
        relay_pair& r = *it;
        std::vector<char> chunk(16 * 1024);
        for (;;) {
            std::error_code ec;
            const std::size_t n = co_await r.outside->async_read_some(net::buffer(chunk), ec);
            if (n > 0) {
                auto [wec, ignored] = co_await net::async_write(
                    r.inside, net::buffer(chunk.data(), n), use_tuple);
                if (wec) ec = wec;
            }
            if (ec) {
                std::error_code ignored;
                if (ec == net::error::eof)
                    r.inside.shutdown(tcp::socket::shutdown_send, ignored);
                else
                    close_pair(r);
                --r.pumps;
                forget_if_done(it);
                co_return;
            }
        }
    }

    // civetweb -> client, until civetweb closes (or fails): then the pair ends.
    net::awaitable<void> outward(std::list<relay_pair>::iterator it) {
        relay_pair& r = *it;
        std::vector<char> chunk(16 * 1024);
        for (;;) {
            auto [ec, n] = co_await r.inside.async_read_some(net::buffer(chunk), use_tuple);
            if (n > 0) {
                std::error_code wec;
                co_await r.outside->async_write(net::buffer(chunk.data(), n), wec);
                if (wec) ec = wec;
            }
            if (ec) {
                if (ec == net::error::eof) r.outside->shutdown_send();
                close_pair(r);
                --r.pumps;
                forget_if_done(it);
                co_return;
            }
        }
    }
};

tls_front::tls_front(const std::string& tls_url, std::uint16_t plain_port, std::size_t max_relays,
                     std::function<void(const std::string&)> on_event)
    : s_(std::make_unique<state>()) {
    s_->plain_port = plain_port;
    s_->max_relays = max_relays;
    s_->on_event = on_event;
    transport_options to;
    to.on_refused = std::move(on_event);
    s_->l = listen(s_->io.get_executor(), tls_url, to);
    const std::string& local = s_->l->local_address();
    s_->bound = static_cast<std::uint16_t>(std::stoi(local.substr(local.rfind(':') + 1)));
    net::co_spawn(s_->io, s_->accept_loop(), net::detached);
    s_->thread = std::thread([s = s_.get()] { s->io.run(); });
}

tls_front::~tls_front() {
    stop();
}

std::uint16_t tls_front::port() const noexcept {
    return s_->bound;
}

bool tls_front::relays(std::uint16_t loopback_port) const {
    std::lock_guard lk(s_->ports_mu);
    return s_->ports.count(loopback_port) > 0;
}

void tls_front::stop() {
    if (!s_->thread.joinable()) return;
    net::post(s_->io, [s = s_.get()] {
        s->stopped = true;
        s->l->close();
        for (auto& r : s->relays) {
            r.outside->close();
            std::error_code ignored;
            r.inside.close(ignored);
        }
        s->io.stop();
    });
    s_->thread.join();
}

}  // namespace ordo::gw
