// Call traits: a call's completion signature, and which trailing arguments are tokens or options.
#pragma once

#include "ordo/config.hpp"

#include <system_error>
#include <type_traits>

#include <asio/bind_executor.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_future.hpp>

#include "ordo/rpc/call.hpp"
#include "ordo/net.hpp"

namespace ordo::detail {

template <class R>
struct call_signature {
    using type = void(std::error_code, R);
};
template <>
struct call_signature<void> {
    using type = void(std::error_code);
};
struct call_sink;
template <>
struct call_signature<call_sink> {
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

/// A callback rather than one of Asio's tokens: its own handler, for which async_initiate
/// would only run the initiation at once.
template <class T, class R>
inline constexpr bool is_plain_handler_v =
    !is_token_type<std::decay_t<T>>::value && handler_args<R>::template invocable<std::decay_t<T>>;

template <class T>
inline constexpr bool is_call_options_v = std::is_same_v<std::decay_t<T>, call_options>;

}  // namespace ordo::detail
