// handler_entry, one registered handler type-erased, and what runs a typed handler inside one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ordo/codec.hpp"
#include "ordo/detail/handler_shapes.hpp"
#include "ordo/detail/type_traits.hpp"
#include "ordo/net.hpp"

namespace ordo {

class peer;

namespace detail {

class method_counters;
class stream_out;

/// One registered handler. `sync` runs to completion; `async` is a coroutine. Either packs the
/// result into `out` or throws (std::system_error with an ordo::errc keeps its code; anything
/// else becomes errc::remote_error with the exception's message).
struct handler_entry {
    std::string signature;  ///< e.g. "(int)", for error messages
    bool concurrent = false;
    std::function<void(peer&, const msgpack::object& params, buffer& out)> sync;
    /// `params` is a view: the caller keeps its memory alive until the coroutine ends.
    std::function<net::awaitable<void>(peer&, msgpack::object params, buffer& out)> async;
    /// A streaming handler: writes its items to `out` (ordo::writer); the final response is
    /// the dispatcher's.
    std::function<net::awaitable<void>(peer&, msgpack::object params, stream_out& out)> stream;
    /// Its counters (ordo.stats), set by handlers when registered; kept across re-registration.
    std::shared_ptr<method_counters> counters;
};

template <class T>
void pack_result(buffer& out, const T& v) {
    msgpack::pack(out, v);
}
inline void pack_nil(buffer& out) {
    msgpack::packer<buffer>(out).pack_nil();
}

template <class F>
net::awaitable<void> run_async_handler(F f, std::string method, std::string signature, peer& p,
                                       msgpack::object params, buffer& out) {
    auto values = convert_args<F>(params, method, signature);
    using T = typename is_awaitable<typename fn_traits<F>::result>::value_type;
    if constexpr (std::is_void_v<T>) {
        co_await invoke_handler(f, p, values);
        pack_nil(out);
    } else {
        T r = co_await invoke_handler(f, p, values);
        pack_result(out, r);
    }
}

template <class R>
struct body_result {
    using type = R;
};
template <class T, class E>
struct body_result<net::awaitable<T, E>> {
    using type = T;
};

/// The body of `f` on `ex` (handler_options::run_on): arguments converted here, the result
/// packed here once the body is done there. Cancellation is not passed over to `ex` (Asio 1.22
/// would signal it from this thread into the other).
template <class F>
net::awaitable<void> run_handler_on(F f, net::any_io_executor ex, std::string method,
                                    std::string signature, peer& p, msgpack::object params,
                                    buffer& out) {
    auto values = convert_args<F>(params, method, signature);
    using raw = typename fn_traits<F>::result;
    constexpr bool coro = is_awaitable<raw>::value;
    using T = typename body_result<raw>::type;
    auto token = net::bind_cancellation_slot(net::cancellation_slot(), net::use_awaitable);
    // The function object is kept by co_spawn until the coroutine ends, and with it the
    // arguments it holds.
    auto body = [f = std::move(f), values = std::move(values), &p]() mutable -> net::awaitable<T> {
        if constexpr (coro)
            co_return co_await invoke_handler(f, p, values);
        else
            co_return invoke_handler(f, p, values);
    };
    if constexpr (std::is_void_v<T>) {
        co_await net::co_spawn(ex, std::move(body), token);
        pack_nil(out);
    } else {
        T r = co_await net::co_spawn(ex, std::move(body), token);
        pack_result(out, r);
    }
}

}  // namespace detail
}  // namespace ordo
