// detail::call: a call on a channel_impl, as an Asio async operation or a throwing awaitable.
#pragma once

#include "ordo/config.hpp"

#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/dispatch.hpp>

#include "ordo/call.hpp"
#include "ordo/channel_impl.hpp"
#include "ordo/detail/call_op.hpp"
#include "ordo/detail/call_traits.hpp"
#include "ordo/detail/params_buffer.hpp"
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
        } catch (const rpc_error& e) {
            throw rpc_error(e.code(), method, ch->remote_address(), e.detail());
        }
    }
}

template <class R, class Token>
auto call(std::shared_ptr<channel_impl> ch, std::string method, params_buffer params,
          call_options o, Token&& token) {
    if constexpr (is_use_awaitable<std::decay_t<Token>>::value)
        return call_awaitable<R>(std::move(ch), std::move(method), std::move(params), o);
    else
        return async_call_op<R>(std::move(ch), std::move(method), std::move(params), o,
                                std::forward<Token>(token));
}

}  // namespace ordo::detail
