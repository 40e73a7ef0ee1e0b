// The one door to Asio. Every Asio name used by ordo goes through ordo::net, so that a build on
// Boost.Asio (Boost >= 1.79) is a change of this file alone. Asio is compiled once, inside
// libordo (ASIO_SEPARATE_COMPILATION); users get the defines from the meson dependency or the
// pkg-config file.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/buffer.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

namespace ordo {
namespace net = ::asio;

/// Completion token used throughout ordo's coroutine code: yields (error_code, values...) instead
/// of throwing.
inline constexpr auto use_tuple = net::experimental::as_tuple(net::use_awaitable);
}  // namespace ordo
