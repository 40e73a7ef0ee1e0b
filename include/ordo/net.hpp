// The one door to Asio. Every Asio name used by ordo goes through ordo::net, so that a build on
// Boost.Asio (Boost >= 1.79) is a change of this file alone. Asio is compiled once, inside
// libordo (ASIO_SEPARATE_COMPILATION); users get the defines from the meson dependency, the
// pkg-config file or the CMake target ordo::ordo, and ordo/config.hpp sets any that are missing.
#pragma once

#include "ordo/config.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/buffer.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/dispatch.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#if defined(__clang__)
// GCC 12 and clang 14 mangle the six explicit specializations that Asio 1.22 compiles separately
// (any_io_executor::require and ::prefer, from asio/impl/any_io_executor.ipp) differently: they
// disagree on the constraint in the signature. A clang program could not link the ones in a
// GCC-built libordo, so under clang each translation unit compiles its own, inline.
namespace asio {
template <>
inline any_io_executor any_io_executor::require(const execution::blocking_t::never_t& p,
                                                int) const {
    return static_cast<const base_type&>(*this).require(p);
}
template <>
inline any_io_executor any_io_executor::prefer(const execution::blocking_t::possibly_t& p,
                                               int) const {
    return static_cast<const base_type&>(*this).prefer(p);
}
template <>
inline any_io_executor any_io_executor::prefer(const execution::outstanding_work_t::tracked_t& p,
                                               int) const {
    return static_cast<const base_type&>(*this).prefer(p);
}
template <>
inline any_io_executor any_io_executor::prefer(const execution::outstanding_work_t::untracked_t& p,
                                               int) const {
    return static_cast<const base_type&>(*this).prefer(p);
}
template <>
inline any_io_executor any_io_executor::prefer(const execution::relationship_t::fork_t& p,
                                               int) const {
    return static_cast<const base_type&>(*this).prefer(p);
}
template <>
inline any_io_executor any_io_executor::prefer(const execution::relationship_t::continuation_t& p,
                                               int) const {
    return static_cast<const base_type&>(*this).prefer(p);
}
}  // namespace asio
#endif

namespace ordo {
namespace net = ::asio;

/// Completion token used throughout ordo's coroutine code: yields (error_code, values...) instead
/// of throwing.
inline constexpr auto use_tuple = net::experimental::as_tuple(net::use_awaitable);
}  // namespace ordo
