// The untyped half of a coroutine call (detail::call_awaitable in ordo/rpc/detail/async_call.hpp),
// compiled once here so that call sites instantiate only a small coroutine and their result's
// conversion.
#include "ordo/rpc/detail/async_call.hpp"

namespace ordo::detail {

net::awaitable<std::tuple<std::error_code>> sink_call(std::shared_ptr<channel_impl> ch,
                                                      std::string method, params_buffer params,
                                                      call_options o, call_sink& sink) {
    // Not a coroutine: the awaitable is the operation's own, so a call costs no extra frame.
    return async_call_op<call_sink>(std::move(ch), std::move(method), std::move(params),
                                    std::move(o), use_tuple, &sink);
}

void throw_call_error(std::error_code ec, const std::string& method, const channel_impl& ch,
                      const call_sink& sink) {
    throw rpc_error(ec, method, ch.remote_address(), sink.detail,
                    std::chrono::milliseconds(sink.retry_after_ms));
}

}  // namespace ordo::detail
