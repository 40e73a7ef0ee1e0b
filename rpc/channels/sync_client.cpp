#include "ordo/rpc/sync_client.hpp"

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <stdexcept>
#include <thread>

#include "ordo/rpc/channel.hpp"
#include "ordo/rpc/connect.hpp"
#include "ordo/rpc/peer.hpp"
#include "ordo/rpc/pool.hpp"
#include "ordo/rpc/router.hpp"
#include "ordo/rpc/stream_call.hpp"

namespace ordo {

struct sync_client::state {
    // A call a thread is blocked on. Touched on the io thread only (the promise's future aside).
    struct waiting {
        std::string method;
        std::promise<value> done;
        net::cancellation_signal cancel;
        bool finished = false;

        void fail(std::error_code ec, const std::string& peer, const std::string& detail) {
            finished = true;
            done.set_exception(std::make_exception_ptr(rpc_error(ec, method, peer, detail)));
        }
    };

    net::io_context io;
    net::executor_work_guard<net::io_context::executor_type> work{io.get_executor()};
    // Set before any call, then only read:
    std::string remote;
    net::any_io_executor channel_ex;
    // On the io thread only:
    channel ch;
    std::map<std::uint64_t, std::shared_ptr<waiting>> calls;
    std::uint64_t next_id = 0;
    bool closed = false;
    // Set when io.run() has returned.
    std::promise<void> stopped;
    std::thread thread;

    void start_call(std::shared_ptr<waiting> w, detail::params_buffer params, call_options o) {
        if (closed) return w->fail(errc::closed, remote, "the sync_client is being destroyed");
        const std::uint64_t id = next_id++;
        calls.emplace(id, w);
        auto done = [this, w, id](std::error_code ec, call_outcome out) {
            calls.erase(id);
            if (w->finished) return;  // already failed by shutdown()
            if (ec) return w->fail(ec, remote, out.detail);
            w->finished = true;
            w->done.set_value(detail::convert_result<value>(out));
        };
        detail::call<call_outcome>(ch.impl(), w->method, std::move(params), std::move(o),
                                   net::bind_cancellation_slot(w->cancel.slot(), std::move(done)));
    }

    static void end_closed(detail::stream_core& st, std::string why) {
        call_outcome out;
        out.detail = std::move(why);
        st.end(errc::closed, out);
    }

    void start_stream(std::shared_ptr<detail::stream_core> st, detail::params_buffer params,
                      call_options o) {
        if (closed) return end_closed(*st, "the sync_client is being destroyed");
        detail::start_stream(ch.impl(), std::move(st), std::move(params), std::move(o));
    }

    // Fails what is waiting, withdraws it from the channel and closes the channel. Closing it
    // ends open streams too (with errc::closed, as their pending calls) and cancels their
    // handlers on the server.
    void shutdown() {
        closed = true;
        auto pending = std::move(calls);  // cancelling may complete a call (and erase) at once
        calls.clear();
        for (auto& [id, w] : pending) {
            if (w->finished) continue;
            w->fail(errc::closed, remote, "the sync_client was destroyed while the call waited");
            w->cancel.emit(net::cancellation_type::terminal);
        }
        const auto& impl = ch.impl();
        if (impl) impl->close();  // an ordered peer sends what is queued first
        ch = channel();
    }
};

sync_client::sync_client(std::string_view url) : s_(std::make_unique<state>()) {
    state& s = *s_;
    s.thread = std::thread([&s] {
        s.io.run();
        s.stopped.set_value();
    });
    try {
        const std::string u(url);
        s.ch = net::co_spawn(s.io, async_connect(u), net::use_future).get();
        s.remote = s.ch.remote_address();
        s.channel_ex = s.ch.impl()->get_executor();
    } catch (...) {
        s.work.reset();
        s.thread.join();
        throw;
    }
}

sync_client::~sync_client() {
    state& s = *s_;
    net::post(s.io, [&s] { s.shutdown(); });
    s.work.reset();
    // A remote side that does not end its connection is not waited for long.
    if (s.stopped.get_future().wait_for(std::chrono::seconds(2)) != std::future_status::ready)
        s.io.stop();
    s.thread.join();
}

const std::string& sync_client::remote_address() const noexcept {
    return s_->remote;
}

value sync_client::call_raw(std::string_view method, detail::params_buffer params, call_options o) {
    state& s = *s_;
    auto w = std::make_shared<state::waiting>();
    w->method = std::string(method);
    auto result = w->done.get_future();
    net::post(s.io, [&s, w, params = std::move(params), o = std::move(o)]() mutable {
        s.start_call(std::move(w), std::move(params), std::move(o));
    });
    return result.get();
}

void sync_client::notify_raw(std::string_view method, detail::params_buffer params) {
    state& s = *s_;
    std::promise<void> taken;
    auto result = taken.get_future();
    // By reference: this thread waits until the io thread is done with them.
    net::post(s.io, [&] {
        try {
            if (s.closed)
                throw_error(errc::closed, "ordo: notify " + std::string(method) + " to " +
                                              s.remote + ": the sync_client is being destroyed");
            s.ch.impl()->notify_raw(method, std::string_view(params.data(), params.size()));
            taken.set_value();
        } catch (const rpc_error& e) {
            taken.set_exception(std::make_exception_ptr(
                rpc_error(e.code(), std::string(method), s.remote, e.detail())));
        } catch (const std::system_error& e) {
            taken.set_exception(std::make_exception_ptr(
                rpc_error(e.code(), std::string(method), s.remote, e.what())));
        }
    });
    result.get();
}

std::shared_ptr<detail::stream_core> sync_client::stream_raw(std::string_view method,
                                                             detail::params_buffer params,
                                                             call_options o) {
    state& s = *s_;
    const std::uint32_t window = o.window ? o.window : default_stream_window;
    const std::uint64_t bytes = o.window_bytes ? o.window_bytes : default_stream_window_bytes;
    auto st = std::make_shared<detail::stream_state<value>>(std::string(method), s.remote,
                                                            s.channel_ex, window, bytes);
    net::post(s.io, [&s, st, params = std::move(params), o = std::move(o)]() mutable {
        s.start_stream(std::move(st), std::move(params), std::move(o));
    });
    return st;
}

std::shared_ptr<detail::stream_core> sync_client::writing_raw(std::string_view method,
                                                              detail::params_buffer params,
                                                              call_options o, bool upload) {
    state& s = *s_;
    std::shared_ptr<detail::stream_core> st;
    if (upload) {
        st = std::make_shared<detail::upload_state<value>>(std::string(method), s.remote,
                                                           s.channel_ex);
    } else {
        const std::uint32_t window = o.window ? o.window : default_stream_window;
        const std::uint64_t bytes = o.window_bytes ? o.window_bytes : default_stream_window_bytes;
        st = std::make_shared<detail::stream_state<value>>(std::string(method), s.remote,
                                                           s.channel_ex, window, bytes);
        st->set_writes();
        if (o.max_window_bytes > bytes) st->grow_toward(o.max_window_bytes);
    }
    net::post(s.io, [&s, st, params = std::move(params), o = std::move(o)]() mutable {
        s.start_stream(std::move(st), std::move(params), std::move(o));
    });
    return st;
}

// ---- sync_stream_base ----

bool sync_stream_base::write_raw(const detail::params_buffer& item) {
    if (!s_) throw std::logic_error("ordo: write() on a moved-from stream");
    auto& b = s_->item_buffer();
    b.write(item.data(), item.size());
    return s_->write_item_blocking();
}

void sync_stream_base::close_writes() {
    if (s_) s_->close_writes();
}

std::uint64_t sync_stream_base::written() const {
    return s_ ? s_->written() : 0;
}

value sync_stream_base::finish_raw() {
    if (!s_) throw std::logic_error("ordo: finish() on a moved-from upload");
    return static_cast<detail::upload_state<value>&>(*s_).finish_blocking();
}

sync_stream_base::sync_stream_base(std::shared_ptr<detail::stream_core> s) noexcept
    : s_(std::move(s)) {}

sync_stream_base::sync_stream_base(sync_stream_base&& o) noexcept
    : s_(std::move(o.s_)), taken_(o.taken_), failed_(std::move(o.failed_)) {}

sync_stream_base& sync_stream_base::operator=(sync_stream_base&& o) noexcept {
    if (this != &o) {
        cancel();
        s_ = std::move(o.s_);
        taken_ = o.taken_;
        failed_ = std::move(o.failed_);
    }
    return *this;
}

sync_stream_base::~sync_stream_base() {
    cancel();
}

void sync_stream_base::cancel() {
    if (s_) s_->cancel();
}

std::uint64_t sync_stream_base::received() const {
    return s_ ? s_->received() : 0;
}

namespace {
const std::string no_name;
}

const std::string& sync_stream_base::method() const noexcept {
    return s_ ? s_->method() : no_name;
}

const std::string& sync_stream_base::remote_address() const noexcept {
    return s_ ? s_->remote() : no_name;
}

std::optional<value> sync_stream_base::next_raw(std::optional<std::chrono::milliseconds> wait) {
    if (failed_) std::rethrow_exception(failed_);
    if (!s_) throw std::logic_error("ordo: next() on a moved-from sync_stream");
    auto& st = static_cast<detail::stream_state<value>&>(*s_);
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (wait) deadline = std::chrono::steady_clock::now() + *wait;
    std::optional<value> v;
    if (!st.next_until(v, deadline))
        throw rpc_error(errc::timed_out, st.method(), st.remote(),
                        "no stream item came within " + std::to_string(wait->count()) + " ms (" +
                            std::to_string(taken_) + " read so far; the stream stays open)");
    if (v) ++taken_;
    return v;
}

void sync_stream_base::bad_item(const rpc_error& e) {
    // The items that follow have nowhere to go: stop the handler, as a coroutine reader's
    // stream does (rpc/streams/stream_call.cpp, bad_item).
    cancel();
    failed_ = std::make_exception_ptr(
        rpc_error(errc::bad_result, method(), remote_address(),
                  "item " + std::to_string(taken_) + " does not convert: " + e.detail()));
    std::rethrow_exception(failed_);
}

}  // namespace ordo
