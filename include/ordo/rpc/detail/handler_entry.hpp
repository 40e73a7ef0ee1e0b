// handler_entry, one registered handler type-erased, and what runs a typed handler inside one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ordo/identity.hpp"
#include "ordo/net.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/rpc/concurrency.hpp"
#include "ordo/rpc/detail/handler_shapes.hpp"
#include "ordo/rpc/detail/type_traits.hpp"

namespace ordo {

class peer;

namespace detail {

class method_counters;
class stream_out;
class stream_in;
class admission;

/// One registered handler. `sync` runs to completion; `async` is a coroutine. Either packs the
/// result into `out` or throws (std::system_error with an ordo::errc keeps its code; anything
/// else becomes errc::remote_error with the exception's message).
struct handler_entry {
    std::string signature;  ///< e.g. "(int)", for error messages
    bool concurrent = false;
    /// For a serial handler whose runner keeps a connection's order itself (the Python
    /// binding: its loop runs a connection's handlers one at a time, in order): up to this many
    /// of a connection's messages are handed to it without waiting for the one before, so that
    /// they cross to the runner together; the next waits as for any serial handler (queued, and
    /// reading pauses once the queue is full). 0: serial as usual.
    std::uint32_t pipeline = 0;
    std::function<void(peer&, const msgpack::object& params, buffer& out)> sync;
    /// `params` is a view: the caller keeps its memory alive until the coroutine ends.
    std::function<net::awaitable<void>(peer&, msgpack::object params, buffer& out)> async;
    /// A streaming handler: writes its items to `out` (ordo::writer); the final response is
    /// the dispatcher's.
    std::function<net::awaitable<void>(peer&, msgpack::object params, stream_out& out)> stream;
    /// A handler that reads items its caller writes (ordo::reader): a client stream (`out`
    /// null: it packs its result into `result`) or a two-way stream (its items go to `out`; the
    /// final response is the dispatcher's).
    std::function<net::awaitable<void>(peer&, msgpack::object params, stream_in& in,
                                       stream_out* out, buffer& result)>
        reads;
    /// With `reads`: the handler writes items too (a two-way stream).
    bool writes_items = false;
    /// Who may call it (handler_options::allow); null: everyone.
    std::function<bool(const identity&)> allow;
    /// Its counters (ordo.stats), set by handlers when registered; kept across re-registration.
    std::shared_ptr<method_counters> counters;
    /// How many of its calls run at once (handler_options::concurrency), and the limit that
    /// handlers makes of it when registered (null: none).
    concurrency_limit concurrency;
    std::shared_ptr<admission> limit;
    /// Set by handlers when registered: `sync`, no `stream`, no `allow`. The dispatcher runs
    /// such a handler straight from the read, for a message with nothing queued ahead of it.
    bool direct = false;
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

/// A body that runs elsewhere (handler_options::run_on), given its call's stop token.
using offload_body = std::function<net::awaitable<void>(std::stop_token)>;

/// Runs `body` on a strand of `ex` (of the awaiting coroutine's executor when `ex` is empty) and
/// completes on the awaiting coroutine's executor once the body has ended; rethrows what the
/// body threw. Cancelling the awaiting coroutine (ordo.cancel, a deadline, the connection
/// ending) requests stop on the body's token at once, and emits terminal Asio cancellation into
/// the body on its strand (where it runs: Asio's signals are not thread-safe). The wait still
/// lasts until the body ends, and then throws errc::cancelled whatever the body did: a
/// cancelled body's answer is never sent. rpc/dispatch/offload.cpp.
net::awaitable<void> run_offloaded(net::any_io_executor ex, offload_body body);

/// The body of `f` on `ex` (handler_options::run_on; empty: on this loop, for a handler that
/// takes a std::stop_token): arguments converted here, the result packed here once the body is
/// done there.
template <class F>
net::awaitable<void> run_handler_on(F f, net::any_io_executor ex, std::string method,
                                    std::string signature, peer& p, msgpack::object params,
                                    buffer& out) {
    auto values = convert_args<F>(params, method, signature);
    using raw = typename fn_traits<F>::result;
    constexpr bool coro = is_awaitable<raw>::value;
    using T = typename body_result<raw>::type;
    // The body borrows this frame's f and values: run_offloaded returns only once it has ended.
    std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> r;
    co_await run_offloaded(std::move(ex), [&](std::stop_token st) -> net::awaitable<void> {
        if constexpr (std::is_void_v<T>) {
            if constexpr (coro)
                co_await invoke_handler(f, p, values, st);
            else
                invoke_handler(f, p, values, st);
            r.emplace(true);
        } else if constexpr (coro) {
            r.emplace(co_await invoke_handler(f, p, values, st));
        } else {
            r.emplace(invoke_handler(f, p, values, st));
        }
    });
    if constexpr (std::is_void_v<T>)
        pack_nil(out);
    else
        pack_result(out, *r);
}

}  // namespace detail
}  // namespace ordo
