// Typed interfaces, declared once and shared by callers and servers:
//
//   struct counter : ordo::interface {
//       ordo::method<int(int)> inc{"inc"};
//       ordo::method<void(int)> add{"add"};
//   };
//   auto c = ordo::stub<counter>(ch);
//   int v = co_await c.inc(1);
//   c.add.notify(5);
//   srv.on(counter{}.inc, [](int x) { return x + 1; });   // signature checked at compile time
#pragma once

#include "ordo/config.hpp"

#include <string>
#include <utility>

#include "ordo/rpc/channel.hpp"
#include "ordo/rpc/stream_call.hpp"

namespace ordo {

/// Base of typed interfaces (a marker; it holds nothing).
struct interface {};

namespace detail {
// The channel being bound by stub<I>() while I's members are constructed (this thread only).
inline thread_local const channel* binding_channel = nullptr;

/// What every ordo::method holds: its name and, inside a stub, the channel it calls through.
class method_base {
  public:
    explicit method_base(std::string name)
        : name_(std::move(name)), channel_(binding_channel ? *binding_channel : channel{}) {}

    const std::string& name() const noexcept { return name_; }

  protected:
    const std::shared_ptr<channel_impl>& bound() const {
        if (!channel_)
            throw_error(errc::bad_address,
                        "ordo: method " + name_ + " is not bound to a channel (use ordo::stub)");
        return channel_.impl();
    }

    std::string name_;
    channel channel_;
};
}  // namespace detail

template <class Sig>
class method;

/// One remote method: its name and signature. Inside a stub it is bound to a channel and
/// callable like a local function; elsewhere it only describes (for server::on).
template <class R, class... Args>
class method<R(Args...)> : public detail::method_base {
  public:
    using result_type = R;

    explicit method(std::string name) : method_base(std::move(name)) {}

    /// Calls the method: `co_await c.inc(1)`, `co_await c.inc(1, ordo::timeout(50ms))`.
    /// Throws ordo::rpc_error on failure.
    /// (Overloads, not a default argument for call_options: docs/calls-and-channels.md, "GCC 12
    /// note".)
    net::awaitable<R> operator()(const Args&... args) const {
        return detail::call<R>(bound(), name_, detail::pack_params(args...), call_options{},
                               net::use_awaitable);
    }
    net::awaitable<R> operator()(const Args&... args, call_options o) const {
        return detail::call<R>(bound(), name_, detail::pack_params(args...), std::move(o),
                               net::use_awaitable);
    }

    /// The same call as an Asio operation completed through `token` (signature
    /// void(error_code, R), or void(error_code) for R = void).
    template <class Token>
    requires detail::is_completion_token_v<Token, R>
    auto operator()(const Args&... args, Token&& token) const {
        return detail::call<R>(bound(), name_, detail::pack_params(args...), call_options{},
                               std::forward<Token>(token));
    }
    template <class Token>
    requires detail::is_completion_token_v<Token, R>
    auto operator()(const Args&... args, call_options o, Token&& token) const {
        return detail::call<R>(bound(), name_, detail::pack_params(args...), o,
                               std::forward<Token>(token));
    }

    /// Sends the method as a one-way message (no response; ordered with calls on an ordered
    /// channel). Throws std::system_error when it cannot be taken.
    void notify(const Args&... args) const {
        auto params = detail::pack_params(args...);
        bound()->notify_raw(name_, std::string_view(params.data(), params.size()));
    }
};

/// A streaming method: `auto s = co_await c.count_to(5); while (auto v = co_await s.next())`.
/// The call is sent when the stream is returned; the items follow as the handler writes them.
template <class T, class... Args>
class method<stream<T>(Args...)> : public detail::method_base {
  public:
    using result_type = stream<T>;

    explicit method(std::string name) : method_base(std::move(name)) {}

    /// Starts the call; call_options::timeout bounds the whole stream, window its credit.
    net::awaitable<stream<T>> operator()(const Args&... args) const {
        return detail::open_stream<T>(bound(), name_, detail::pack_params(args...), call_options{});
    }
    net::awaitable<stream<T>> operator()(const Args&... args, call_options o) const {
        return detail::open_stream<T>(bound(), name_, detail::pack_params(args...), std::move(o));
    }
};

/// A client-streaming method: `auto up = co_await c.put(); co_await up.write(x); auto r = co_await
/// up.finish();`. The call is sent when the upload is returned; items go as credit comes.
template <class In, class R, class... Args>
class method<upload<In, R>(Args...)> : public detail::method_base {
  public:
    using result_type = upload<In, R>;

    explicit method(std::string name) : method_base(std::move(name)) {}

    /// Starts the call; call_options::timeout bounds the whole call.
    net::awaitable<upload<In, R>> operator()(const Args&... args) const {
        return detail::open_upload<In, R>(bound(), name_, detail::pack_params(args...),
                                          call_options{});
    }
    net::awaitable<upload<In, R>> operator()(const Args&... args, call_options o) const {
        return detail::open_upload<In, R>(bound(), name_, detail::pack_params(args...),
                                          std::move(o));
    }
};

/// A two-way streaming method: `auto s = co_await c.chat(); co_await s.write(x); s.close();
/// while (auto v = co_await s.next()) ...`. Each direction has its own credit and order.
template <class In, class Out, class... Args>
class method<two_way<In, Out>(Args...)> : public detail::method_base {
  public:
    using result_type = two_way<In, Out>;

    explicit method(std::string name) : method_base(std::move(name)) {}

    /// Starts the call; call_options::timeout bounds the whole call, window the credit this
    /// side grants for the handler's items.
    net::awaitable<two_way<In, Out>> operator()(const Args&... args) const {
        return detail::open_two_way<In, Out>(bound(), name_, detail::pack_params(args...),
                                             call_options{});
    }
    net::awaitable<two_way<In, Out>> operator()(const Args&... args, call_options o) const {
        return detail::open_two_way<In, Out>(bound(), name_, detail::pack_params(args...),
                                             std::move(o));
    }
};

/// An instance of interface I whose methods call through `ch`. Cheap to copy (each method holds
/// a shared handle to the channel).
template <class I>
I stub(const channel& ch) {
    struct scope {
        explicit scope(const channel* c) : saved(detail::binding_channel) {
            detail::binding_channel = c;
        }
        ~scope() { detail::binding_channel = saved; }
        const channel* saved;
    } bind(&ch);
    return I{};
}

}  // namespace ordo
