// ordo::sync_client: blocking calls for programs without an event loop.
#pragma once

#include "ordo/config.hpp"

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ordo/call.hpp"
#include "ordo/detail/params_buffer.hpp"
#include "ordo/error.hpp"

namespace ordo {

/// A channel (see async_connect) driven by an io_context on one thread of its own, with
/// blocking calls. No Asio in this header: the typed edge packs arguments and converts the
/// result; the rest is in rpc/sync_client.cpp.
///
/// Any thread may call at once; a thread's calls and notifications are sent in the order it
/// makes them (on an ordered channel they arrive in that order, as async_connect says). Never
/// call it from a thread that must not block. Not copyable, not movable.
class sync_client {
  public:
    /// Connects to `url` (anything async_connect takes, its parameters included: `timeout_ms`
    /// sets the default deadline of calls) and starts the thread. Throws ordo::rpc_error as
    /// async_connect does (refused, bad address, ...); no thread is left behind then.
    explicit sync_client(std::string_view url);
    /// Fails calls still waiting with errc::closed (their handlers are asked to cancel), closes
    /// the connection after sending what is queued (at most 2 s), and joins the thread.
    ~sync_client();
    sync_client(const sync_client&) = delete;
    sync_client& operator=(const sync_client&) = delete;

    /// Calls `method` with `args...` and blocks until the result arrives, converted to R
    /// (void: none; ordo::value: the raw msgpack value). A trailing ordo::call_options
    /// (`ordo::timeout(50ms)`) sets this call's deadline. Throws ordo::rpc_error: the remote
    /// error (method_not_found, remote_error...), timed_out, peer_lost, bad_result, closed.
    template <class R = value, class... Args>
    R call(std::string_view method, const Args&... args) {
        if constexpr (ends_with_options<Args...>()) {
            constexpr std::size_t n = sizeof...(Args);
            const auto all = std::forward_as_tuple(args...);
            return convert<R>(method,
                              call_raw(method, pack_first(all, std::make_index_sequence<n - 1>()),
                                       std::get<n - 1>(all)));
        } else {
            return convert<R>(method,
                              call_raw(method, detail::pack_params(args...), call_options{}));
        }
    }

    /// Sends a one-way message; returns once the channel has taken it (not when it is
    /// delivered). Throws ordo::rpc_error when it cannot be taken (overloaded, peer_lost,
    /// closed).
    template <class... Args>
    void notify(std::string_view method, const Args&... args) {
        notify_raw(method, detail::pack_params(args...));
    }

    /// The remote side's address, as a URL.
    const std::string& remote_address() const noexcept;

  private:
    template <class... Args>
    static constexpr bool ends_with_options() {
        if constexpr (sizeof...(Args) == 0)
            return false;
        else
            return std::is_same_v<
                std::decay_t<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>>,
                call_options>;
    }

    template <class Tuple, std::size_t... I>
    static detail::params_buffer pack_first(const Tuple& all, std::index_sequence<I...>) {
        return detail::pack_params(std::get<I>(all)...);
    }

    template <class R>
    R convert(std::string_view method, value v) const {
        if constexpr (std::is_void_v<R>) {
            return;
        } else if constexpr (std::is_same_v<R, value>) {
            return v;
        } else {
            try {
                try {
                    return v.get().as<R>();
                } catch (const std::exception&) {
                    detail::throw_bad_result(typeid(R), v.get());
                }
            } catch (const rpc_error& e) {
                throw rpc_error(e.code(), std::string(method), remote_address(), e.detail());
            }
        }
    }

    value call_raw(std::string_view method, detail::params_buffer params, call_options o);
    void notify_raw(std::string_view method, detail::params_buffer params);

    struct state;
    std::unique_ptr<state> s_;
};

}  // namespace ordo
