// detail::call: a call on a channel_impl, as an Asio async operation or a throwing awaitable.
#pragma once

#include "ordo/config.hpp"

#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/dispatch.hpp>

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/channel_impl.hpp"
#include "ordo/rpc/detail/call_op.hpp"
#include "ordo/rpc/detail/call_traits.hpp"
#include "ordo/rpc/detail/params_buffer.hpp"
#include "ordo/error.hpp"
#include "ordo/net.hpp"

namespace ordo::detail {

/// True when `ex` is a plain io_context executor and the calling thread is running its
/// io_context (so work for `ex` may run now). Strands and other executors: false (dispatch).
inline bool running_in(const net::any_io_executor& ex) {
    // Asio 1.22's any_executor::target<T>() casts without checking the type: check it here.
    if (!ex || ex.target_type() != typeid(net::io_context::executor_type)) return false;
    return ex.target<net::io_context::executor_type>()->running_in_this_thread();
}

/// The call as an Asio asynchronous operation with signature void(error_code, R)
/// (void(error_code) for R = void or call_sink; the latter converts into `sink`).
template <class R, class Token>
auto async_call_op(std::shared_ptr<channel_impl> ch, std::string method, params_buffer params,
                   call_options o, Token&& token, call_sink* sink = nullptr) {
    return net::async_initiate<Token, typename call_signature<R>::type>(
        [sink](auto handler, std::shared_ptr<channel_impl> ch, std::string method,
               params_buffer params, call_options o) {
            using H = decltype(handler);
            auto slot = net::get_associated_cancellation_slot(handler);
            auto ex = ch->get_executor();
            auto op = std::make_unique<call_op<R, H>>(std::move(handler), ex, sink);
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
        token, std::move(ch), std::move(method), std::move(params), std::move(o));
}

/// A call with a callback (is_plain_handler_v): the pending call is made first and its method,
/// params (packed by `pack` into it) and options are put in place, rather than moved through
/// async_initiate's layers. What async_call_op does for such a handler, with fewer copies.
/// `o`: call_options, or no_options for a call given none (the defaults are made in place in
/// the pending call rather than moved into it: one call_options less per call).
struct no_options {};
template <class R, class Options, class Handler, class Pack>
void start_with_handler(const std::shared_ptr<channel_impl>& ch, std::string_view method,
                        Options&& o, Handler&& handler, Pack&& pack) {
    using H = std::decay_t<Handler>;
    auto slot = net::get_associated_cancellation_slot(handler);
    std::unique_ptr<call_op<R, H>> op;
    if constexpr (std::is_same_v<std::decay_t<Options>, no_options>)
        op = std::make_unique<call_op<R, H>>(method, std::forward<Handler>(handler),
                                             ch->get_executor());
    else
        op = std::make_unique<call_op<R, H>>(method, static_cast<call_options&&>(o),
                                             std::forward<Handler>(handler), ch->get_executor());
    op->slot = slot;
    pack(op->params);
    const net::any_io_executor* kept = op->channel_executor();
    if (kept ? running_in(*kept) : running_in(ch->get_executor()))
        ch->start_call(std::move(op));
    else
        net::dispatch(ch->get_executor(),
                      [ch, op = std::move(op)]() mutable { ch->start_call(std::move(op)); });
}

/// Starts the call and yields its error code once it has completed: the untyped half of a
/// coroutine call, compiled once in libordo (rpc/channels/call.cpp), so that a call site
/// instantiates only a small coroutine and its result's conversion. The result is converted into
/// `sink` (sink.convert, on the channel's executor, before the response's memory is reused); on
/// failure sink.detail holds the remote message or the local reason. `sink` must outlive the
/// operation (it lives in the awaiting coroutine's frame).
net::awaitable<std::tuple<std::error_code>> sink_call(std::shared_ptr<channel_impl> ch,
                                                      std::string method, params_buffer params,
                                                      call_options o, call_sink& sink);

/// Throws ordo::rpc_error(ec) naming the method, the channel's peer and `detail`, with the
/// server's retry-after hint (rpc_error::retry_after).
[[noreturn]] void throw_call_error(std::error_code ec, const std::string& method,
                                   const channel_impl& ch, const call_sink& sink);

/// sink.convert for a result of type R: converts the outcome into the std::optional<R> at `to`.
template <class R>
void convert_into(call_outcome& out, void* to) {
    auto& r = *static_cast<std::optional<R>*>(to);
    if constexpr (std::is_same_v<R, value>) {
        if (out.borrowed) {  // the read zone is reused after this: keep a copy
            r.emplace(msgpack::clone(out.result));
            return;
        }
    }
    r.emplace(convert_result<R>(out));
}

/// The coroutine form: throws ordo::rpc_error carrying the code, method, peer and detail.
template <class R>
net::awaitable<R> call_awaitable(std::shared_ptr<channel_impl> ch, std::string method,
                                 params_buffer params, call_options o) {
    if constexpr (std::is_void_v<R>) {
        call_sink sink;
        auto [ec] = co_await sink_call(ch, method, std::move(params), std::move(o), sink);
        if (ec) throw_call_error(ec, method, *ch, sink);
    } else {
        std::optional<R> r;  // R need not be default-constructible, as msgpack's as<R>() allows
        call_sink sink{&r, &convert_into<R>, {}, {}};
        auto [ec] = co_await sink_call(ch, method, std::move(params), std::move(o), sink);
        if (sink.thrown) std::rethrow_exception(sink.thrown);
        if (ec) throw_call_error(ec, method, *ch, sink);
        co_return std::move(*r);
    }
}

template <class R, class Token>
auto call(std::shared_ptr<channel_impl> ch, std::string method, params_buffer params,
          call_options o, Token&& token) {
    if constexpr (is_use_awaitable<std::decay_t<Token>>::value)
        return call_awaitable<R>(std::move(ch), std::move(method), std::move(params), std::move(o));
    else
        return async_call_op<R>(std::move(ch), std::move(method), std::move(params), std::move(o),
                                std::forward<Token>(token));
}

}  // namespace ordo::detail
