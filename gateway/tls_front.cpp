// The gateway's HTTPS front (gateway/tls_front.hpp): accepted with ordo's tls:// listener
// (its handshake timeout and caps on unfinished handshakes included), relayed byte for byte to
// civetweb's loopback port, each direction ending as the other side ends it.
#include "gateway/tls_front.hpp"

#include <list>
#include <mutex>
#include <thread>

#include "ordo/error.hpp"
#include "ordo/transport.hpp"

namespace ordo::gw {

struct tls_front::state {
    net::io_context io;
    std::unique_ptr<listener> l;
    std::uint16_t plain_port = 0;
    std::uint16_t bound = 0;
    std::function<void(const std::string&)> on_event;
    std::thread thread;
    bool stopped = false;  // on io's thread
    // The relayed connections, closed by stop() (on io's thread). Coroutines refer to this
    // state by pointer: stop() ends io's thread first, and io, destroyed last, destroys what
    // was left of them.
    std::list<std::weak_ptr<transport>> open;

    net::awaitable<void> accept_loop() {
        while (!stopped) {
            std::unique_ptr<transport> t;
            try {
                t = co_await l->async_accept();
            } catch (const std::system_error&) {
                if (stopped) co_return;
                continue;  // the listener retries, as ordo's server does
            }
            net::co_spawn(io, relay(std::shared_ptr<transport>(std::move(t))), net::detached);
        }
    }

    net::awaitable<void> relay(std::shared_ptr<transport> outside) {
        std::shared_ptr<transport> inside;
        try {
            inside = co_await async_connect_transport("tcp://127.0.0.1:" +
                                                      std::to_string(plain_port));
        } catch (const std::system_error& e) {
            if (on_event) on_event("ordo gateway: https connection from " +
                                   outside->remote_address() + " not relayed: " + e.what());
            outside->close();
            co_return;
        }
        if (stopped) co_return;
        open.remove_if([](const std::weak_ptr<transport>& w) { return w.expired(); });
        open.push_back(outside);
        open.push_back(inside);
        net::co_spawn(io, pump(inside, outside), net::detached);
        co_await pump(outside, inside);
    }

    // Copies `from` to `to` until `from` ends; then ends `to`'s sending side. An error on
    // either side closes both.
    net::awaitable<void> pump(std::shared_ptr<transport> from, std::shared_ptr<transport> to) {
        std::vector<char> chunk(16 * 1024);
        for (;;) {
            std::error_code ec;
            const std::size_t n = co_await from->async_read_some(net::buffer(chunk), ec);
            if (n > 0) {
                std::error_code wec;
                co_await to->async_write(net::buffer(chunk.data(), n), wec);
                if (wec) ec = wec;
            }
            if (ec == net::error::eof) {
                to->shutdown_send();
                co_return;
            }
            if (ec) {
                from->close();
                to->close();
                co_return;
            }
        }
    }
};

tls_front::tls_front(const std::string& tls_url, std::uint16_t plain_port,
                     std::function<void(const std::string&)> on_event)
    : s_(std::make_unique<state>()) {
    s_->plain_port = plain_port;
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

void tls_front::stop() {
    if (!s_->thread.joinable()) return;
    net::post(s_->io, [s = s_.get()] {
        s->stopped = true;
        s->l->close();
        for (auto& w : s->open)
            if (auto t = w.lock()) t->close();
        s->open.clear();
        s->io.stop();
    });
    s_->thread.join();
}

}  // namespace ordo::gw
