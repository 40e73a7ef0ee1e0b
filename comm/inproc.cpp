// inproc://name: two transports joined by a pair of in-memory byte pipes, no socket. The ends may
// live on different executors (and threads): the pipe is guarded by a mutex, and each end waits
// on its own thread-safe channels, which the other end pokes.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include <asio/experimental/concurrent_channel.hpp>

#include "comm/transports.hpp"
#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

// (Asio 1.22 cannot instantiate a channel of void(error_code) alone: the bool is unused.)
using signal = net::experimental::concurrent_channel<void(std::error_code, bool)>;

struct end_signals {
    explicit end_signals(const net::any_io_executor& ex) : readable(ex, 1), writable(ex, 1) {}
    signal readable;
    signal writable;
};

// The bytes going one way, and how each side left.
struct direction {
    std::string data;
    std::size_t head = 0;      // data[head..] is unread
    bool eof = false;          // the writing end shut down or closed
    bool reset = false;        // the writing end reset: unread bytes are gone
    bool reader_gone = false;  // the reading end closed: writes fail
    std::size_t unread() const { return data.size() - head; }
};

struct pipe {
    explicit pipe(std::size_t cap) : capacity(std::max<std::size_t>(cap, 1)) {}
    std::mutex m;
    direction dir[2];  // dir[i] carries bytes written by end i
    end_signals* ends[2] = {nullptr, nullptr};
    const std::size_t capacity;

    void poke(int end) {
        if (!ends[end]) return;
        ends[end]->readable.try_send(std::error_code{}, true);
        ends[end]->writable.try_send(std::error_code{}, true);
    }
};

class inproc_transport final : public transport {
  public:
    inproc_transport(std::shared_ptr<pipe> p, int side, const net::any_io_executor& ex,
                     std::string remote)
        : transport(std::move(remote)), p_(std::move(p)), side_(side), sig_(ex), ex_(ex) {
        std::lock_guard lock(p_->m);
        p_->ends[side_] = &sig_;
    }

    ~inproc_transport() override {
        close();
        std::lock_guard lock(p_->m);
        p_->ends[side_] = nullptr;
    }

    net::awaitable<std::size_t> async_read_some(net::mutable_buffer b,
                                                std::error_code& ec) override {
        for (;;) {
            {
                std::lock_guard lock(p_->m);
                direction& d = in();
                if (closed_) {
                    ec = net::error::operation_aborted;
                    co_return 0;
                }
                if (d.reset) {
                    ec = net::error::connection_reset;
                    co_return 0;
                }
                if (const std::size_t avail = d.unread(); avail > 0 && b.size() > 0) {
                    const std::size_t n = std::min(avail, b.size());
                    std::memcpy(b.data(), d.data.data() + d.head, n);
                    d.head += n;
                    if (d.head == d.data.size()) {
                        d.data.clear();
                        d.head = 0;
                    } else if (d.head >= p_->capacity) {
                        d.data.erase(0, d.head);
                        d.head = 0;
                    }
                    p_->poke(other());
                    co_return n;
                }
                if (d.eof) {
                    ec = net::error::eof;
                    co_return 0;
                }
            }
            co_await sig_.readable.async_receive(use_tuple);
        }
    }

    net::awaitable<std::size_t> async_write(net::const_buffer b, std::error_code& ec) override {
        std::size_t done = 0;
        for (;;) {
            {
                std::lock_guard lock(p_->m);
                direction& d = out();
                if (closed_) {
                    ec = net::error::operation_aborted;
                    co_return done;
                }
                if (d.reader_gone || d.eof) {
                    ec = in().reset ? net::error::connection_reset : net::error::broken_pipe;
                    co_return done;
                }
                const std::size_t room =
                    p_->capacity > d.unread() ? p_->capacity - d.unread() : 0;
                const std::size_t n = std::min(room, b.size() - done);
                if (n > 0) {
                    d.data.append(static_cast<const char*>(b.data()) + done, n);
                    done += n;
                    p_->poke(other());
                }
                if (done == b.size()) co_return done;
            }
            co_await sig_.writable.async_receive(use_tuple);
        }
    }

    void shutdown_send() noexcept override {
        std::lock_guard lock(p_->m);
        out().eof = true;
        p_->poke(other());
    }

    void close() noexcept override { end(false); }
    void reset() noexcept override { end(true); }

    net::any_io_executor get_executor() override { return ex_; }

  private:
    direction& in() { return p_->dir[other()]; }
    direction& out() { return p_->dir[side_]; }
    int other() const { return 1 - side_; }

    void end(bool with_reset) noexcept {
        {
            std::lock_guard lock(p_->m);
            if (closed_) return;
            closed_ = true;
            out().eof = true;
            out().reset = with_reset;
            in().reader_gone = true;
            p_->poke(other());
        }
        sig_.readable.cancel();
        sig_.writable.cancel();
    }

    std::shared_ptr<pipe> p_;
    const int side_;
    end_signals sig_;
    net::any_io_executor ex_;
    bool closed_ = false;  // touched only from this end's executor, read under the pipe's mutex
};

// Connections made to a name and not yet accepted.
struct acceptor_state {
    std::mutex m;
    std::deque<std::pair<std::shared_ptr<pipe>, std::uint64_t>> pending;
    signal* wake = nullptr;
    bool open = true;
    std::uint64_t next_id = 1;
};

constexpr std::size_t max_backlog = 4096;

std::mutex registry_mutex;
std::map<std::string, std::shared_ptr<acceptor_state>>& registry() {
    static std::map<std::string, std::shared_ptr<acceptor_state>> r;
    return r;
}

class inproc_listener final : public listener {
  public:
    inproc_listener(const net::any_io_executor& ex, const address& a)
        : st_(std::make_shared<acceptor_state>()), wake_(ex, 1), ex_(ex), name_(a.path) {
        local_ = a.to_string();
        st_->wake = &wake_;
        std::lock_guard lock(registry_mutex);
        if (!registry().emplace(name_, st_).second)
            transport_fail("cannot listen on", local_, net::error::address_in_use);
    }

    ~inproc_listener() override {
        close();
        std::lock_guard lock(st_->m);
        st_->wake = nullptr;
    }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        for (;;) {
            {
                std::lock_guard lock(st_->m);
                if (!st_->open)
                    transport_fail("accept failed on", local_, net::error::operation_aborted);
                if (!st_->pending.empty()) {
                    auto [p, id] = std::move(st_->pending.front());
                    st_->pending.pop_front();
                    co_return std::make_unique<inproc_transport>(
                        std::move(p), 1, ex_, local_ + "#" + std::to_string(id));
                }
            }
            co_await wake_.async_receive(use_tuple);
        }
    }

    void close() noexcept override {
        {
            std::lock_guard lock(registry_mutex);
            auto it = registry().find(name_);
            if (it != registry().end() && it->second == st_) registry().erase(it);
        }
        {
            std::lock_guard lock(st_->m);
            if (!st_->open) return;
            st_->open = false;
            // Connections never accepted are refused the way a closed socket refuses them.
            for (auto& [p, id] : st_->pending) {
                std::lock_guard plock(p->m);
                p->dir[1].eof = p->dir[1].reset = true;
                p->dir[0].reader_gone = true;
                p->poke(0);
            }
            st_->pending.clear();
        }
        wake_.cancel();
    }

  private:
    std::shared_ptr<acceptor_state> st_;
    signal wake_;
    net::any_io_executor ex_;
    std::string name_;
};

}  // namespace

net::awaitable<std::unique_ptr<transport>> connect_inproc(const address& a,
                                                          const transport_options& o) {
    auto ex = co_await net::this_coro::executor;
    std::shared_ptr<acceptor_state> st;
    {
        std::lock_guard lock(registry_mutex);
        if (auto it = registry().find(a.path); it != registry().end()) st = it->second;
    }
    if (!st)
        throw std::system_error(net::error::connection_refused,
                                "ordo: cannot connect to " + a.to_string() +
                                    " (no listener of that name in this process)");
    auto p = std::make_shared<pipe>(o.inproc_buffer_bytes);
    // The client's end exists before the server can see the pipe.
    auto t = std::make_unique<inproc_transport>(p, 0, ex, a.to_string());
    {
        std::lock_guard lock(st->m);
        if (!st->open || st->pending.size() >= max_backlog)
            transport_fail("cannot connect to", a.to_string(), net::error::connection_refused);
        st->pending.emplace_back(p, st->next_id++);
        if (st->wake) st->wake->try_send(std::error_code{}, true);
    }
    co_return t;
}

std::unique_ptr<listener> listen_inproc(const net::any_io_executor& ex, const address& a,
                                        const transport_options& o) {
    (void)o;
    return std::make_unique<inproc_listener>(ex, a);
}

}  // namespace ordo::detail
