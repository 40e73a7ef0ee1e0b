// What call sites hold: ordo::channel, and the asynchronous call operation on it.
// The typed edge (argument packing, result conversion, completion tokens) is in ordo/detail/;
// everything else happens in a channel_impl (ordo::peer, ordo::pool or ordo::router).
#pragma once

#include "ordo/config.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/channel_impl.hpp"
#include "ordo/rpc/detail/async_call.hpp"
#include "ordo/rpc/detail/call_traits.hpp"
#include "ordo/rpc/detail/params_buffer.hpp"
#include "ordo/net.hpp"
#include "ordo/rpc/stream_call.hpp"

namespace ordo {

/// What call sites hold: a shared handle to a channel_impl (an ordo::peer, ordo::pool or
/// ordo::router). Copies share it. Calls may be started from any thread: they are dispatched
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
            return call_with<R>(method, detail::no_options{}, net::use_awaitable, all,
                                std::make_index_sequence<0>());
        } else if constexpr (detail::is_completion_token_v<last_t<Ts...>, R>) {
            if constexpr (n >= 2) {
                // The options as given: moved from when the caller passed a temporary (as
                // ordo::timeout(...) is), copied when it passed a name.
                if constexpr (detail::is_call_options_v<nth_t<n - 2, Ts...>>)
                    return call_with<R>(method, std::get<n - 2>(std::move(all)),
                                        std::get<n - 1>(all), all,
                                        std::make_index_sequence<n - 2>());
                else
                    return call_with<R>(method, detail::no_options{}, std::get<n - 1>(all), all,
                                        std::make_index_sequence<n - 1>());
            } else {
                return call_with<R>(method, detail::no_options{}, std::get<0>(all), all,
                                    std::make_index_sequence<0>());
            }
        } else if constexpr (detail::is_call_options_v<last_t<Ts...>>) {
            return call_with<R>(method, std::get<n - 1>(std::move(all)), net::use_awaitable, all,
                                std::make_index_sequence<n - 1>());
        } else {
            return call_with<R>(method, detail::no_options{}, net::use_awaitable, all,
                                std::make_index_sequence<n>());
        }
    }

    /// Calls a streaming method: `auto s = co_await ch.async_stream<int>("count_to", 5);`,
    /// optionally with call_options last (timeout of the whole stream, window of credit). The
    /// items are read with `co_await s.next()` (ordo/rpc/stream_call.hpp).
    template <class T = value, class... Args>
    auto async_stream(std::string_view method, const Args&... args) const {
        if constexpr (sizeof...(Args) > 0) {
            if constexpr (detail::is_call_options_v<last_t<std::decay_t<Args>...>>) {
                auto all = std::forward_as_tuple(args...);
                return stream_with<T>(method, all,
                                      std::make_index_sequence<sizeof...(Args) - 1>());
            } else {
                return detail::open_stream<T>(impl_, std::string(method),
                                              detail::pack_params(args...), call_options{});
            }
        } else {
            return detail::open_stream<T>(impl_, std::string(method), detail::pack_params(),
                                          call_options{});
        }
    }

    /// Sends a one-way message. On an ordered channel it is delivered in order with the calls.
    /// Throws std::system_error when it cannot be taken (errc::overloaded, or the close reason).
    template <class... Args>
    void notify(std::string_view method, const Args&... args) const {
        auto params = detail::pack_params(args...);
        impl_->notify_raw(method, std::string_view(params.data(), params.size()));
    }

    /// A channel on the same connection (or pool, or router) whose calls and notifications go
    /// on lane `name` (docs/protocol.md "Lanes"): in order with one another, and in no order
    /// with other lanes', whose large messages they do not wait behind (nor they behind
    /// theirs); the remote side runs each lane's handlers apart, one serial handler at a time
    /// per lane. "" is the default lane, where every channel starts. Toward a peer that does
    /// not read lanes (a plain msgpack-rpc peer, an older ordo) everything goes on one lane, as
    /// before. Cheap: a handle; close() on it closes what it shares. Throws rpc_error
    /// (bad_arguments) for a name over 64 bytes, or beyond 4,096 lane names in one process.
    channel lane(std::string_view name) const;
    /// Its lane's id (0: the default lane).
    std::uint16_t lane_id() const noexcept;

    const std::string& remote_address() const noexcept { return impl_->remote_address(); }
    net::any_io_executor get_executor() const { return impl_->get_executor(); }
    const std::shared_ptr<channel_impl>& impl() const noexcept { return impl_; }
    explicit operator bool() const noexcept { return impl_ != nullptr; }

  private:
    template <std::size_t I, class... Ts>
    using nth_t = std::tuple_element_t<I, std::tuple<Ts...>>;
    template <class... Ts>
    using last_t = nth_t<sizeof...(Ts) - 1, Ts...>;

    template <class T, class Tuple, std::size_t... I>
    auto stream_with(std::string_view method, Tuple& all, std::index_sequence<I...>) const {
        return detail::open_stream<T>(impl_, std::string(method),
                                      detail::pack_params(std::get<I>(all)...),
                                      std::get<sizeof...(I)>(all));
    }

    // What a call keeps of its options: the caller's temporary itself (moved into the call,
    // once), or a copy of a named one.
    static call_options&& kept(call_options&& o) noexcept { return std::move(o); }
    static call_options kept(const call_options& o) { return o; }
    static detail::no_options kept(detail::no_options o) noexcept { return o; }

    // `o`: the call's call_options as the caller passed them, or detail::no_options when it
    // was given none.
    template <class R, class Options, class Token, class Tuple, std::size_t... I>
    auto call_with(std::string_view method, Options&& o, Token&& token, Tuple& all,
                   std::index_sequence<I...>) const {
        if constexpr (detail::is_plain_handler_v<Token, R>) {
            detail::start_with_handler<R>(impl_, method, kept(std::forward<Options>(o)),
                                          std::forward<Token>(token),
                                          [&](detail::params_buffer& b) {
                                              detail::pack_params_into(b, std::get<I>(all)...);
                                          });
        } else if constexpr (std::is_same_v<std::decay_t<Options>, detail::no_options>) {
            return detail::call<R>(impl_, std::string(method),
                                   detail::pack_params(std::get<I>(all)...), call_options{},
                                   std::forward<Token>(token));
        } else {
            return detail::call<R>(impl_, std::string(method),
                                   detail::pack_params(std::get<I>(all)...),
                                   kept(std::forward<Options>(o)), std::forward<Token>(token));
        }
    }

    std::shared_ptr<channel_impl> impl_;
};

}  // namespace ordo
