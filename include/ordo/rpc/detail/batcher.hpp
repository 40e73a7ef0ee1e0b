// The batch handler machinery: batcher_core (queueing, timing, stats) and the typed batcher.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

#include "ordo/rpc/batch_handler.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/rpc/detail/type_traits.hpp"
#include "ordo/error.hpp"
#include "ordo/net.hpp"
#include "ordo/rpc/stream_call.hpp"

namespace ordo::detail {

struct running_batch;

/// One call waiting in, or running as part of, a batch.
struct batch_element {
    explicit batch_element(net::any_io_executor ex)
        : done_event(ex, std::chrono::steady_clock::time_point::max()) {}
    virtual ~batch_element() = default;
    net::steady_timer done_event;
    bool done = false;
    errc error = errc{};  ///< set on failure
    std::string error_text;
    buffer result;  ///< the packed result on success
    std::chrono::steady_clock::time_point arrived{};
    running_batch* in = nullptr;  ///< its batch while it runs (on home)
};

/// A batch that runs (on home). When every caller has left it, or (a streaming batch) its
/// batcher stops, `signal` cancels it: the handler's stop token, and Asio cancellation where it
/// awaits (passed over to where it runs by run_offloaded).
struct running_batch {
    std::size_t size = 0;
    std::size_t left = 0;
    bool cancelled = false;
    net::cancellation_signal signal;
};

template <class Arg>
struct typed_element final : batch_element {
    typed_element(net::any_io_executor ex, Arg a)
        : batch_element(std::move(ex)), arg(std::move(a)) {}
    Arg arg;
};

class stream_room;

/// One caller of a streaming batch handler: what its batch gave it that it has not sent yet.
/// The caller's coroutine (on its connection's loop) and the batch (on home, or a worker) both
/// touch it: the fields below are under `mu`.
struct stream_element : batch_element {
    using batch_element::batch_element;
    std::mutex mu;
    std::deque<buffer> items;
    bool ended = false;     ///< the batch gave it stream_end or an error
    bool gone = false;      ///< the caller left (cancelled, or its peer died)
    std::size_t taken = 0;  ///< items the caller took and has not sent yet (out of credit)
    std::size_t queued_bytes = 0;  ///< of `items`
    /// It sent nothing for a second while it held max_buffered items and another caller would
    /// gain (stream_batch::wait_room): the batch no longer waits for it, and it fails once it
    /// holds a window's worth (stream_batch::item); cleared when it has caught up.
    bool left_behind = false;
    std::shared_ptr<stream_room> room;  ///< its batch's, once the batch has started
};

template <class Arg>
struct typed_stream_element final : stream_element {
    typed_stream_element(net::any_io_executor ex, Arg a)
        : stream_element(std::move(ex)), arg(std::move(a)) {}
    Arg arg;
};

/// Where a streaming batch waits for its callers to take their items. Wake-ups are counted,
/// so that one between the batch's look and its wait is not lost. Any thread.
class stream_room {
  public:
    std::uint64_t seen() const {
        std::lock_guard lk(mu_);
        return bumps_;
    }
    /// A caller took items, or left.
    void bump();
    /// Completes once bump() has been called after `seen` was read (at once if it was).
    auto wait(std::uint64_t seen) {
        return net::async_initiate<const net::use_awaitable_t<>&, void()>(
            [this, seen](auto handler) {
                std::unique_lock lk(mu_);
                if (bumps_ != seen) {
                    lk.unlock();
                    post_handler(std::move(handler));
                    return;
                }
                waiter_ = park(std::move(handler));
            },
            net::use_awaitable);
    }

  private:
    mutable std::mutex mu_;
    std::uint64_t bumps_ = 0;
    std::unique_ptr<parked> waiter_;
};

/// One running streaming batch, untyped: the callers still open and what each step gives
/// them (batch_writer<T> is its typed face).
class stream_batch {
  public:
    /// Items a caller may hold unsent (its reader out of credit), queued here or taken by its
    /// connection, before the batch waits.
    static constexpr std::size_t max_buffered = 16;

    /// `queued`, if given: how many calls wait for a next batch (batcher_core::queued_now).
    stream_batch(std::string name, std::vector<std::shared_ptr<stream_element>> callers,
                 const std::atomic<std::size_t>* queued = nullptr);
    ~stream_batch();
    stream_batch(const stream_batch&) = delete;
    stream_batch& operator=(const stream_batch&) = delete;

    /// Empty once the batch is closed.
    const std::vector<std::size_t>& open() noexcept {
        if (closed_ && !open_.empty()) open_.clear();
        return open_;
    }
    /// Throws std::system_error: errc::cancelled once the batch is closed, errc::remote_error
    /// when a step does not have `n` entries.
    void check_size(std::size_t n) const;
    /// The batcher stops (any thread): every caller still open ends with `code` and `text`, and
    /// the handler's later steps throw errc::cancelled.
    void close(errc code, const std::string& text);
    bool closed() const noexcept { return closed_; }
    void item(std::size_t k, buffer packed);
    void end(std::size_t k);
    void fail(std::size_t k, errc code, std::string text);
    /// Wakes the callers of this step and leaves out, from now on, those that ended or left.
    void commit();
    /// Completes when no open caller holds max_buffered items or more, but for those left
    /// behind: one that holds them and sends none for a second while another caller would gain
    /// (stream_element::left_behind).
    net::awaitable<void> wait_room();
    /// The handler failed: every caller still open fails with `text`.
    void fail_open(errc code, const std::string& text);

  private:
    stream_element& at(std::size_t k) { return *callers_[open_[k]]; }

    std::string name_;
    std::vector<std::shared_ptr<stream_element>> callers_;
    std::vector<std::size_t> open_;
    std::shared_ptr<stream_room> room_ = std::make_shared<stream_room>();
    const std::atomic<std::size_t>* queued_;
    std::atomic<bool> closed_{false};
};

/// Queueing, timing, cancellation and statistics of one batch handler; the typed part runs
/// the user's function (run_batch). Its state lives on one executor (home: a strand on
/// batch_options::run_on, else the first caller's); callers on other executors talk to it by
/// posting, and get their outcome posted back to theirs.
class batcher_core : public std::enable_shared_from_this<batcher_core> {
  public:
    /// `streams`: a streaming batch handler's (stop() closes its running batches).
    batcher_core(std::string name, batch_options o, bool streams = false)
        : name_(std::move(name)), o_(o), streams_(streams) {}
    virtual ~batcher_core() = default;

    /// Queues `e` and waits for its result, which it appends to `out`; throws std::system_error
    /// with the element's (or the whole batch's) error. Cancelling the awaiting coroutine
    /// removes the call if its batch has not started, or discards its result.
    net::awaitable<void> submit(std::shared_ptr<batch_element> e, buffer& out);
    /// The same for a streaming batch handler: sends what the batch gives `e` through `out`
    /// until the batch ends it; throws its error, if any. Cancelling the awaiting coroutine
    /// leaves the batch (a running batch skips it from then on).
    net::awaitable<void> submit_stream(std::shared_ptr<stream_element> e, stream_out& out);
    /// Fails every queued call with errc::shutting_down, and later ones at once; closes the
    /// running streaming batches (their callers end with errc::cancelled, their writers report
    /// closed) and cancels them. Running plain batches finish. Any thread.
    void stop();
    /// Fixes the home executor before any call (a server over several loops gives its own),
    /// unless batch_options::run_on or an earlier call already chose one.
    void set_home(const net::any_io_executor& ex) { home(ex); }
    void set_max_batch_size(std::size_t n);
    void set_max_wait(std::chrono::milliseconds w);
    /// A copy, readable from any thread.
    batch_stats stats() const;
    /// Calls whose coroutine has not yet taken its outcome.
    std::size_t waiters() const noexcept { return waiters_.load(); }
    /// Completes when waiters() is 0 (at once if it is); cancellable. Any executor.
    net::awaitable<void> async_wait_idle();
    const std::string& name() const noexcept { return name_; }

  protected:
    using batch = std::vector<std::shared_ptr<batch_element>>;
    /// Runs the handler on `b` and sets each element's result or error; `stop` is requested
    /// when the batch is cancelled.
    virtual net::awaitable<void> run_batch(batch& b, std::stop_token stop) = 0;
    void fail_all(batch& b, errc code, const std::string& text);
    /// A running streaming batch, while its handler runs (any thread): closed at stop().
    void track(stream_batch* sb);
    void untrack(stream_batch* sb);
    /// Calls queued for a next batch (any thread; a streaming batch reads it).
    const std::atomic<std::size_t>* queued_now() const noexcept { return &queued_now_; }

  private:
    net::any_io_executor home(const net::any_io_executor& caller);
    template <class F>
    void at_home(F f);
    void enqueue(const std::shared_ptr<batch_element>& e);
    void withdraw(const std::shared_ptr<batch_element>& e);
    static void finish(const std::shared_ptr<batch_element>& e);
    void maybe_run();
    void arm_wait();
    net::awaitable<void> run(batch b, std::shared_ptr<running_batch> rb);
    net::awaitable<void> run_here(batch& b, std::stop_token stop);
    void publish();
    void set_queued(std::size_t n) {
        stats_.queued = n;
        queued_now_.store(n, std::memory_order_relaxed);
    }

    std::string name_;
    batch_options o_;
    bool streams_;
    std::vector<std::shared_ptr<batch_element>> queue_;
    std::vector<std::shared_ptr<running_batch>> running_batches_;  // on home
    std::mutex streams_mutex_;                                     // guards running_streams_
    std::vector<stream_batch*> running_streams_;
    std::unique_ptr<net::steady_timer> wait_timer_;
    mutable std::mutex mutex_;  // guards ex_ (set once) and published_
    net::any_io_executor ex_;
    std::size_t running_ = 0;
    std::atomic<std::size_t> waiters_{0};
    std::atomic<std::size_t> queued_now_{0};  // queue_.size(), for any thread
    std::atomic<bool> stopped_{false};
    batch_stats stats_;      // on home
    batch_stats published_;  // a copy for stats(), under mutex_
};

template <class V>
struct is_element : std::false_type {};
template <class T>
struct is_element<element<T>> : std::true_type {
    using value_type = T;
};

template <class Arg, class F>
class batcher final : public batcher_core {
  public:
    batcher(std::string name, batch_options o, F f)
        : batcher_core(std::move(name), o), f_(std::move(f)) {}

  private:
    template <class Results>
    void distribute(batch& b, Results& results) {
        if (results.size() != b.size())
            return fail_all(b, errc::remote_error,
                            "batch handler " + name() + " returned " +
                                std::to_string(results.size()) + " results for " +
                                std::to_string(b.size()) + " calls");
        for (std::size_t i = 0; i < b.size(); ++i) {
            auto& r = results[i];
            if constexpr (is_element<std::decay_t<decltype(r)>>::value) {
                if (auto* err = std::get_if<element_error>(&r)) {
                    b[i]->error = err->code;
                    b[i]->error_text = err->message;
                    continue;
                }
                msgpack::pack(b[i]->result, std::get<0>(r));
            } else {
                msgpack::pack(b[i]->result, r);
            }
        }
    }

    net::awaitable<void> run_batch(batch& b, std::stop_token stop) override {
        std::vector<Arg> args;
        args.reserve(b.size());
        for (auto& e : b) args.push_back(std::move(static_cast<typed_element<Arg>&>(*e).arg));
        try {
            constexpr bool takes_stop = std::is_invocable_v<F&, std::vector<Arg>, std::stop_token>;
            auto call = [&] {
                if constexpr (takes_stop)
                    return f_(std::move(args), std::move(stop));
                else
                    return f_(std::move(args));
            };
            using R = decltype(call());
            if constexpr (is_awaitable<R>::value) {
                auto results = co_await call();
                distribute(b, results);
            } else {
                auto results = call();
                distribute(b, results);
            }
        } catch (const std::exception& e) {
            fail_all(b, errc::remote_error,
                     "batch handler " + name() + " failed for a batch of " +
                         std::to_string(b.size()) + " calls: " + e.what());
        }
    }

    F f_;
};

/// A streaming batch handler: f(batch_writer<T>&, std::vector<Arg>) -> net::awaitable<void>.
template <class Arg, class T, class F>
class stream_batcher final : public batcher_core {
  public:
    stream_batcher(std::string name, batch_options o, F f)
        : batcher_core(std::move(name), o, true), f_(std::move(f)) {}

  private:
    net::awaitable<void> run_batch(batch& b, std::stop_token stop) override {
        std::vector<Arg> args;
        std::vector<std::shared_ptr<stream_element>> callers;
        args.reserve(b.size());
        callers.reserve(b.size());
        for (auto& e : b) {
            auto c = std::static_pointer_cast<typed_stream_element<Arg>>(e);
            args.push_back(std::move(c->arg));
            callers.push_back(std::move(c));
        }
        stream_batch sb(name(), std::move(callers), queued_now());
        track(&sb);
        struct untrack_at_end {
            stream_batcher* self;
            stream_batch* sb;
            ~untrack_at_end() { self->untrack(sb); }
        } tracked{this, &sb};
        batch_writer<T> w(sb);
        std::string failure;
        try {
            if constexpr (std::is_invocable_v<F&, batch_writer<T>&, std::vector<Arg>,
                                              std::stop_token>)
                co_await f_(w, std::move(args), std::move(stop));
            else
                co_await f_(w, std::move(args));
        } catch (const std::exception& e) {
            failure = e.what();
        } catch (...) {
            failure = "unknown exception";
        }
        // Callers still open when the handler returns end normally (batcher_core::run); those
        // a stop closed have ended already.
        if (!failure.empty())
            sb.fail_open(errc::remote_error, "batch handler " + name() + " failed: " + failure);
    }

    F f_;
};

template <class F>
struct batch_stream_sig : batch_stream_sig<decltype(&F::operator())> {};
template <class R, class T, class V>
struct batch_stream_sig<R (*)(batch_writer<T>&, V)> {
    using item = T;
    using arg = typename std::decay_t<V>::value_type;
    using result = R;
};
template <class C, class R, class T, class V>
struct batch_stream_sig<R (C::*)(batch_writer<T>&, V) const>
    : batch_stream_sig<R (*)(batch_writer<T>&, V)> {};
template <class C, class R, class T, class V>
struct batch_stream_sig<R (C::*)(batch_writer<T>&, V)>
    : batch_stream_sig<R (*)(batch_writer<T>&, V)> {};
// Those that take the batch's std::stop_token last.
template <class C, class R, class T, class V>
struct batch_stream_sig<R (C::*)(batch_writer<T>&, V, std::stop_token) const>
    : batch_stream_sig<R (*)(batch_writer<T>&, V)> {};
template <class C, class R, class T, class V>
struct batch_stream_sig<R (C::*)(batch_writer<T>&, V, std::stop_token)>
    : batch_stream_sig<R (*)(batch_writer<T>&, V)> {};

template <class F>
struct batch_arg;
template <class F>
struct batch_arg : batch_arg<decltype(&F::operator())> {};
template <class R, class V>
struct batch_arg<R (*)(V)> {
    using type = typename std::decay_t<V>::value_type;
};
template <class C, class R, class V>
struct batch_arg<R (C::*)(V) const> : batch_arg<R (*)(V)> {};
template <class C, class R, class V>
struct batch_arg<R (C::*)(V)> : batch_arg<R (*)(V)> {};
template <class R, class V>
struct batch_arg<R (*)(V, std::stop_token)> : batch_arg<R (*)(V)> {};
template <class C, class R, class V>
struct batch_arg<R (C::*)(V, std::stop_token) const> : batch_arg<R (*)(V)> {};
template <class C, class R, class V>
struct batch_arg<R (C::*)(V, std::stop_token)> : batch_arg<R (*)(V)> {};

/// Converts a call's params to the batch argument: the single parameter, or all of them into a
/// tuple.
template <class Arg>
Arg convert_batch_arg(const msgpack::object& params, const std::string& method) {
    const auto& arr = params.via.array;
    try {
        if constexpr (requires { std::tuple_size<Arg>::value; }) {
            if (arr.size != std::tuple_size_v<Arg>) throw std::runtime_error("arity");
            return params.as<Arg>();
        } else {
            if (arr.size != 1) throw std::runtime_error("arity");
            return arr.ptr[0].as<Arg>();
        }
    } catch (const std::exception&) {
        throw_error(errc::bad_arguments, "bad arguments for batch method " + method +
                                             ": expected (" + type_name(typeid(Arg)) + "), got " +
                                             std::to_string(arr.size) +
                                             " arguments that do not convert");
    }
}

template <class Arg>
net::awaitable<void> submit_batch(std::shared_ptr<batcher_core> core, std::string method,
                                  msgpack::object params, buffer& out) {
    auto e = std::make_shared<typed_element<Arg>>(co_await net::this_coro::executor,
                                                  convert_batch_arg<Arg>(params, method));
    co_await core->submit(std::move(e), out);
}

template <class Arg>
net::awaitable<void> submit_batch_stream(std::shared_ptr<batcher_core> core, std::string method,
                                         msgpack::object params, stream_out& out) {
    auto ex = co_await net::this_coro::executor;
    auto e =
        std::make_shared<typed_stream_element<Arg>>(ex, convert_batch_arg<Arg>(params, method));
    co_await core->submit_stream(std::move(e), out);
}

}  // namespace ordo::detail

namespace ordo {

template <class T>
const std::vector<std::size_t>& batch_writer<T>::open() const {
    return b_->open();
}

template <class T>
bool batch_writer<T>::closed() const noexcept {
    return b_->closed();
}

template <class T>
net::awaitable<void> batch_writer<T>::step(std::vector<stream_step<T>> s) {
    b_->check_size(s.size());
    for (std::size_t k = 0; k < s.size(); ++k) {
        if (auto* v = std::get_if<0>(&s[k])) {
            buffer packed(small_buffer);
            msgpack::pack(packed, *v);
            b_->item(k, std::move(packed));
        } else if (std::holds_alternative<stream_end>(s[k])) {
            b_->end(k);
        } else {
            auto& err = std::get<element_error>(s[k]);
            b_->fail(k, err.code, std::move(err.message));
        }
    }
    b_->commit();
    co_await b_->wait_room();
}

}  // namespace ordo
