// What call sites hold: ordo::channel, and the asynchronous call operation on it.
// The typed edge (argument packing, result conversion, completion tokens) is here; everything
// else happens in a channel_impl (an ordered peer now; pools and routers later).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_future.hpp>

#include "ordo/codec.hpp"
#include "ordo/error.hpp"
#include "ordo/net.hpp"

namespace ordo {

/// Per-call options; pass as the last argument before the completion token (if any).
struct call_options {
    /// Deadline for the whole call. 0: the channel's default (none unless configured). On
    /// expiry the call fails with errc::timed_out, its pending entry is removed and ordo.cancel
    /// tells the remote side to cancel the handler.
    std::chrono::milliseconds timeout{0};
    /// Affinity key, read by routers (ordo::router): calls with one key go to one replica, in
    /// the order made, while its replica lives. Ordered peers and pools ignore it.
    std::string key;
};

/// call_options with a timeout: `co_await c.inc(41, ordo::timeout(50ms))`.
inline call_options timeout(std::chrono::milliseconds t) {
    return call_options{t, {}};
}

/// call_options with an affinity key: `co_await c.inc(1, ordo::key("user-42"))`. Both:
/// `call_options{.timeout = 50ms, .key = "user-42"}`.
inline call_options key(std::string k) {
    return call_options{std::chrono::milliseconds(0), std::move(k)};
}

/// A msgpack value that owns its memory: the result type of untyped calls.
using value = msgpack::object_handle;

/// What a channel completes a call with, before conversion to the caller's type.
struct call_outcome {
    msgpack::object_handle message;  ///< owns the response's memory
    msgpack::object result;          ///< the result, on success
    std::string detail;              ///< on failure: the remote message or the local reason
    /// `result` lives in the connection's read zone (`message` is empty): valid during
    /// complete*() only. Given only to calls whose takes_borrowed() is true.
    bool borrowed = false;
};

namespace detail {

/// A call's packed params array: what msgpack::packer needs (write) plus data() and size().
/// The first 112 bytes live in the object itself, so the params of most calls cost no
/// allocation of their own (msgpack's sbuffer always allocated, and a call made two).
class params_buffer {
  public:
    params_buffer() noexcept = default;
    params_buffer(params_buffer&& o) noexcept { take(o); }
    params_buffer& operator=(params_buffer&& o) noexcept {
        if (this != &o) {
            clear();
            take(o);
        }
        return *this;
    }
    params_buffer(const params_buffer&) = delete;
    params_buffer& operator=(const params_buffer&) = delete;

    void write(const char* p, std::size_t n) {
        if (n == 0) return;
        if (n > cap_ - size_) grow(n);
        std::memcpy(data() + size_, p, n);
        size_ += n;
    }
    const char* data() const noexcept { return heap_ ? heap_.get() : inline_; }
    char* data() noexcept { return heap_ ? heap_.get() : inline_; }
    std::size_t size() const noexcept { return size_; }
    /// Empties it and frees what it allocated.
    void clear() noexcept {
        heap_.reset();
        cap_ = sizeof inline_;
        size_ = 0;
    }
    params_buffer copy() const {
        params_buffer c;
        c.write(data(), size_);
        return c;
    }

  private:
    void grow(std::size_t n) {
        const std::size_t c = std::max(cap_ * 2, size_ + n);
        std::unique_ptr<char[]> h(new char[c]);
        std::memcpy(h.get(), data(), size_);
        heap_ = std::move(h);
        cap_ = c;
    }
    void take(params_buffer& o) noexcept {
        if (o.heap_) {
            heap_ = std::move(o.heap_);
            cap_ = o.cap_;
        } else {
            std::memcpy(inline_, o.inline_, o.size_);
        }
        size_ = o.size_;
        o.clear();
    }

    char inline_[112];
    std::unique_ptr<char[]> heap_;
    std::size_t size_ = 0;
    std::size_t cap_ = sizeof inline_;
};

/// One call in flight, type-erased. A channel completes it exactly once, on the channel's
/// executor, with complete() or complete_inline().
class pending_call {
  public:
    virtual ~pending_call() = default;
    /// Never runs the caller's handler inline: posts it to the handler's executor. Safe
    /// anywhere, the call's own initiation included.
    virtual void complete(std::error_code ec, call_outcome out) = 0;
    /// Runs the caller's handler before returning when the handler's executor is the channel's
    /// (saving a post per call), else behaves as complete(). For channels completing a call from
    /// their read path: never from inside the call's initiation, and with the channel kept alive
    /// across it (the handler may drop the last reference). An exception thrown by the handler
    /// is rethrown from the handler's executor, as if the handler had been posted.
    virtual void complete_inline(std::error_code ec, call_outcome out) {
        complete(ec, std::move(out));
    }
    /// True if complete*() copes with a borrowed outcome (copies what it keeps before it
    /// returns); else the channel makes the outcome own its memory first.
    virtual bool takes_borrowed() const noexcept { return false; }

    std::string method;
    params_buffer params;  ///< the encoded params array
    call_options options;
    net::cancellation_slot slot;  ///< the caller's, if any: a channel installs its handler here
    /// 0 for a call as made; 1 when a router sends it again after its replica died.
    std::uint8_t attempt = 0;
};

}  // namespace detail

/// The interface of everything a channel can stand for. Implementations: ordo::peer.
class channel_impl {
  public:
    virtual ~channel_impl();
    /// Sends `call` and completes it when its response arrives, its deadline passes, it is
    /// cancelled through its slot, or the connection ends. Called on get_executor().
    virtual void start_call(std::unique_ptr<detail::pending_call> call) = 0;
    /// Sends a one-way message. Called on get_executor(). Throws std::system_error
    /// (errc::overloaded, or the close reason once the connection has ended).
    virtual void notify_raw(std::string_view method, std::string_view params) = 0;
    /// The remote side's address, as a URL.
    virtual const std::string& remote_address() const noexcept = 0;
    virtual net::any_io_executor get_executor() const = 0;
};

namespace detail {

template <class R>
struct call_signature {
    using type = void(std::error_code, R);
};
template <>
struct call_signature<void> {
    using type = void(std::error_code);
};

template <class T>
struct is_use_awaitable : std::false_type {};
template <class E>
struct is_use_awaitable<net::use_awaitable_t<E>> : std::true_type {};

template <class T>
struct is_token_type : std::false_type {};
template <class E>
struct is_token_type<net::use_awaitable_t<E>> : std::true_type {};
template <class T>
struct is_token_type<net::experimental::as_tuple_t<T>> : std::true_type {};
template <class T>
struct is_token_type<net::redirect_error_t<T>> : std::true_type {};
template <>
struct is_token_type<net::experimental::deferred_t> : std::true_type {};
template <class A>
struct is_token_type<net::use_future_t<A>> : std::true_type {};
template <class T, class E>
struct is_token_type<net::executor_binder<T, E>> : std::true_type {};
template <class T, class S>
struct is_token_type<net::cancellation_slot_binder<T, S>> : std::true_type {};

template <class R>
struct handler_args {
    template <class F>
    static constexpr bool invocable = std::is_invocable_v<F, std::error_code, R>;
};
template <>
struct handler_args<void> {
    template <class F>
    static constexpr bool invocable = std::is_invocable_v<F, std::error_code>;
};

/// A completion token for a call yielding R: one of Asio's tokens, or a callback taking
/// (std::error_code, R) (or (std::error_code) for void).
template <class T, class R>
inline constexpr bool is_completion_token_v =
    is_token_type<std::decay_t<T>>::value || handler_args<R>::template invocable<std::decay_t<T>>;

template <class T>
inline constexpr bool is_call_options_v = std::is_same_v<std::decay_t<T>, call_options>;

/// Converts a successful outcome to R; throws std::system_error(errc::bad_result) if it does not
/// convert.
template <class R>
R convert_result(call_outcome& out) {
    if constexpr (std::is_same_v<R, value>) {
        return value(out.result, std::move(out.message.zone()));
    } else {
        try {
            return out.result.as<R>();
        } catch (const std::exception& e) {
            throw_error(errc::bad_result, std::string("result does not convert: ") + e.what());
        }
    }
}

template <class R, class Handler>
class call_op final : public pending_call {
  public:
    call_op(Handler h, const net::any_io_executor& channel_ex)
        : handler_(std::move(h)),
          ex_(net::get_associated_executor(handler_, channel_ex)),
          inline_ok_(same_executor(ex_, channel_ex)) {}

    void complete(std::error_code ec, call_outcome out) override {
        finish(false, ec, std::move(out));
    }
    void complete_inline(std::error_code ec, call_outcome out) override {
        finish(inline_ok_, ec, std::move(out));
    }
    bool takes_borrowed() const noexcept override { return true; }

  private:
    // Handlers with an executor of their own kind (use_future's, a strand) are always posted.
    template <class E>
    static bool same_executor(const E& a, const net::any_io_executor& b) {
        if constexpr (std::is_same_v<E, net::any_io_executor>)
            return a == b;
        else
            return false;
    }

    void finish(bool now, std::error_code ec, call_outcome out) {
        // Typed results are converted here, before the read zone is reused; raw ones are kept.
        if constexpr (std::is_same_v<R, call_outcome> || std::is_same_v<R, value>) {
            if (out.borrowed) {
                out.message = msgpack::clone(out.result);
                out.result = out.message.get();
                out.borrowed = false;
            }
        }
        if constexpr (std::is_same_v<R, call_outcome>) {
            deliver(now, ec, std::move(out));
        } else if constexpr (std::is_void_v<R>) {
            deliver(now, ec);
        } else {
            R r{};
            if (!ec) {
                try {
                    r = convert_result<R>(out);
                } catch (const std::system_error& e) {
                    ec = e.code();
                }
            }
            deliver(now, ec, std::move(r));
        }
    }

    template <class... A>
    void deliver(bool now, std::error_code ec, A... a) {
        if (!now) {
            net::post(ex_, [h = std::move(handler_), ec, ... a = std::move(a)]() mutable {
                std::move(h)(ec, std::move(a)...);
            });
            return;
        }
        Handler h = std::move(handler_);
        try {
            std::move(h)(ec, std::move(a)...);
        } catch (...) {
            net::post(ex_, [e = std::current_exception()] { std::rethrow_exception(e); });
        }
    }

    Handler handler_;
    net::associated_executor_t<Handler, net::any_io_executor> ex_;
    bool inline_ok_;
};

/// True when `ex` is a plain io_context executor and the calling thread is running its
/// io_context (so work for `ex` may run now). Strands and other executors: false (dispatch).
inline bool running_in(const net::any_io_executor& ex) {
    // Asio 1.22's any_executor::target<T>() casts without checking the type: check it here.
    if (!ex || ex.target_type() != typeid(net::io_context::executor_type)) return false;
    return ex.target<net::io_context::executor_type>()->running_in_this_thread();
}

/// The call as an Asio asynchronous operation with signature void(error_code, R).
template <class R, class Token>
auto async_call_op(std::shared_ptr<channel_impl> ch, std::string method, params_buffer params,
                   call_options o, Token&& token) {
    return net::async_initiate<Token, typename call_signature<R>::type>(
        [](auto handler, std::shared_ptr<channel_impl> ch, std::string method, params_buffer params,
           call_options o) {
            using H = decltype(handler);
            auto slot = net::get_associated_cancellation_slot(handler);
            auto ex = ch->get_executor();
            auto op = std::make_unique<call_op<R, H>>(std::move(handler), ex);
            op->slot = slot;
            op->method = std::move(method);
            op->params = std::move(params);
            op->options = std::move(o);
            if (running_in(ex))  // the common case: no trip through the executor
                ch->start_call(std::move(op));
            else
                net::dispatch(ex, [ch = std::move(ch), op = std::move(op)]() mutable {
                    ch->start_call(std::move(op));
                });
        },
        token, std::move(ch), std::move(method), std::move(params), o);
}

/// The coroutine form: throws ordo::rpc_error carrying the code, method, peer and detail.
template <class R>
net::awaitable<R> call_awaitable(std::shared_ptr<channel_impl> ch, std::string method,
                                 params_buffer params, call_options o) {
    auto [ec, out] =
        co_await async_call_op<call_outcome>(ch, method, std::move(params), o, use_tuple);
    if (ec) throw rpc_error(ec, method, ch->remote_address(), out.detail);
    if constexpr (!std::is_void_v<R>) {
        try {
            co_return convert_result<R>(out);
        } catch (const std::system_error& e) {
            throw rpc_error(e.code(), method, ch->remote_address(), e.what());
        }
    }
}

template <class R, class Token>
auto call(std::shared_ptr<channel_impl> ch, std::string method, params_buffer params, call_options o,
          Token&& token) {
    if constexpr (is_use_awaitable<std::decay_t<Token>>::value)
        return call_awaitable<R>(std::move(ch), std::move(method), std::move(params), o);
    else
        return async_call_op<R>(std::move(ch), std::move(method), std::move(params), o,
                                std::forward<Token>(token));
}

template <class... Args>
params_buffer pack_params(const Args&... args) {
    params_buffer b;
    msgpack::packer<params_buffer> p(b);
    p.pack_array(sizeof...(Args));
    (p.pack(args), ...);
    return b;
}

}  // namespace detail

/// What call sites hold: a shared handle to an ordered peer (and, later, a pool or a router).
/// Copies share the same connection. Calls may be started from any thread: they are dispatched
/// to the channel's executor and complete on the caller's (the completion handler's associated
/// executor). notify() must be called on the channel's executor.
class channel {
  public:
    channel() = default;
    explicit channel(std::shared_ptr<channel_impl> impl) : impl_(std::move(impl)) {}

    /// Calls `method` with `args...`, optionally followed by call_options and then by a
    /// completion token.
    /// - No token: yields net::awaitable<R>; failures throw ordo::rpc_error.
    /// - A token (use_awaitable, as_tuple(...), redirect_error(...), deferred, use_future, a
    ///   callback): an Asio asynchronous operation with signature void(std::error_code, R)
    ///   (void(std::error_code) for R = void); `use_awaitable` alone still throws rpc_error.
    /// Cancellation (the token's cancellation slot, e.g. `||` with a timer) removes the pending
    /// entry, completes with errc::cancelled and sends ordo.cancel to the remote side.
    /// R must be default-constructible and convertible from msgpack; ordo::value keeps the raw
    /// result.
    template <class R = value, class... Ts>
    auto async_call(std::string_view method, Ts&&... ts) const {
        constexpr std::size_t n = sizeof...(Ts);
        auto all = std::forward_as_tuple(std::forward<Ts>(ts)...);
        // Nested, so that last_t and nth_t are only formed for packs long enough.
        if constexpr (n == 0) {
            return call_with<R>(method, call_options{}, net::use_awaitable, all,
                                std::make_index_sequence<0>());
        } else if constexpr (detail::is_completion_token_v<last_t<Ts...>, R>) {
            if constexpr (n >= 2) {
                if constexpr (detail::is_call_options_v<nth_t<n - 2, Ts...>>)
                    return call_with<R>(method, std::get<n - 2>(all), std::get<n - 1>(all), all,
                                        std::make_index_sequence<n - 2>());
                else
                    return call_with<R>(method, call_options{}, std::get<n - 1>(all), all,
                                        std::make_index_sequence<n - 1>());
            } else {
                return call_with<R>(method, call_options{}, std::get<0>(all), all,
                                    std::make_index_sequence<0>());
            }
        } else if constexpr (detail::is_call_options_v<last_t<Ts...>>) {
            return call_with<R>(method, std::get<n - 1>(all), net::use_awaitable, all,
                                std::make_index_sequence<n - 1>());
        } else {
            return call_with<R>(method, call_options{}, net::use_awaitable, all,
                                std::make_index_sequence<n>());
        }
    }

    /// Sends a one-way message. On an ordered channel it is delivered in order with the calls.
    /// Throws std::system_error when it cannot be taken (errc::overloaded, or the close reason).
    template <class... Args>
    void notify(std::string_view method, const Args&... args) const {
        auto params = detail::pack_params(args...);
        impl_->notify_raw(method, std::string_view(params.data(), params.size()));
    }

    const std::string& remote_address() const noexcept { return impl_->remote_address(); }
    net::any_io_executor get_executor() const { return impl_->get_executor(); }
    const std::shared_ptr<channel_impl>& impl() const noexcept { return impl_; }
    explicit operator bool() const noexcept { return impl_ != nullptr; }

  private:
    template <std::size_t I, class... Ts>
    using nth_t = std::tuple_element_t<I, std::tuple<Ts...>>;
    template <class... Ts>
    using last_t = nth_t<sizeof...(Ts) - 1, Ts...>;

    template <class R, class Token, class Tuple, std::size_t... I>
    auto call_with(std::string_view method, call_options o, Token&& token, Tuple& all,
                   std::index_sequence<I...>) const {
        return detail::call<R>(impl_, std::string(method), detail::pack_params(std::get<I>(all)...),
                               o, std::forward<Token>(token));
    }

    std::shared_ptr<channel_impl> impl_;
};

}  // namespace ordo
