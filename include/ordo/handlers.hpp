// Handler registration: plain functions, lambdas and coroutines, typed at registration and
// reduced to one type-erased entry each.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ordo/batch.hpp"
#include "ordo/codec.hpp"
#include "ordo/error.hpp"
#include "ordo/interface.hpp"
#include "ordo/net.hpp"

namespace ordo {

class peer;

struct handler_options {
    /// false (default): serial. The handler runs to completion before the next message of that
    /// peer is dispatched. true: started in order, but the next message is dispatched while it is
    /// suspended.
    bool concurrent = false;
};

namespace detail {

/// One registered handler. `sync` runs to completion; `async` is a coroutine. Either packs the
/// result into `out` or throws (std::system_error with an ordo::errc keeps its code; anything
/// else becomes errc::remote_error with the exception's message).
struct handler_entry {
    std::string signature;  ///< e.g. "(int)", for error messages
    bool concurrent = false;
    std::function<void(peer&, const msgpack::object& params, buffer& out)> sync;
    /// `params` is a view: the caller keeps its memory alive until the coroutine ends.
    std::function<net::awaitable<void>(peer&, msgpack::object params, buffer& out)> async;
};

/// A readable name for T ("int", "std::string", ...).
std::string type_name(const std::type_info& t);

[[noreturn]] void throw_bad_arguments(std::string_view method, const std::string& signature,
                                      const std::string& what);

template <class F>
struct fn_traits : fn_traits<decltype(&F::operator())> {};
template <class R, class... A>
struct fn_traits<R (*)(A...)> {
    using result = R;
    using args = std::tuple<A...>;
};
template <class R, class... A>
struct fn_traits<R(A...)> : fn_traits<R (*)(A...)> {};
template <class C, class R, class... A>
struct fn_traits<R (C::*)(A...)> : fn_traits<R (*)(A...)> {};
template <class C, class R, class... A>
struct fn_traits<R (C::*)(A...) const> : fn_traits<R (*)(A...)> {};
template <class C, class R, class... A>
struct fn_traits<R (C::*)(A...) noexcept> : fn_traits<R (*)(A...)> {};
template <class C, class R, class... A>
struct fn_traits<R (C::*)(A...) const noexcept> : fn_traits<R (*)(A...)> {};

template <class T>
T convert_arg(const msgpack::object& o, std::size_t index, std::string_view method,
              const std::string& signature) {
    try {
        return o.as<T>();
    } catch (const std::exception&) {
        throw_bad_arguments(method, signature,
                            "argument " + std::to_string(index + 1) + " does not convert to " +
                                type_name(typeid(T)));
    }
}

// Handler arguments after an optional leading peer&.
template <class Tuple>
struct handler_shape;
template <class... A>
struct handler_shape<std::tuple<A...>> {
    static constexpr bool takes_peer = false;
    using values = std::tuple<std::decay_t<A>...>;
};
template <class... A>
struct handler_shape<std::tuple<peer&, A...>> {
    static constexpr bool takes_peer = true;
    using values = std::tuple<std::decay_t<A>...>;
};

template <class Values>
struct signature_of;
template <class... V>
struct signature_of<std::tuple<V...>> {
    static std::string get() {
        std::string s = "(";
        ((s += (s.size() > 1 ? ", " : "") + type_name(typeid(V))), ...);
        return s + ")";
    }
};

template <class Values, std::size_t... I>
Values convert_params(const msgpack::object& params, std::string_view method,
                      const std::string& signature, std::index_sequence<I...>) {
    const auto& arr = params.via.array;
    if (arr.size != sizeof...(I))
        throw_bad_arguments(method, signature,
                            "got " + std::to_string(arr.size) + " arguments, expected " +
                                std::to_string(sizeof...(I)));
    return Values{
        convert_arg<std::tuple_element_t<I, Values>>(arr.ptr[I], I, method, signature)...};
}

template <class F>
decltype(auto) invoke_handler(F& f, peer& p, auto& values) {
    using shape = handler_shape<typename fn_traits<F>::args>;
    if constexpr (shape::takes_peer)
        return std::apply([&](auto&... v) -> decltype(auto) { return f(p, std::move(v)...); },
                          values);
    else
        return std::apply([&](auto&... v) -> decltype(auto) { return f(std::move(v)...); }, values);
}

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
    using shape = handler_shape<typename fn_traits<F>::args>;
    using values_t = typename shape::values;
    auto values = convert_params<values_t>(params, method, signature,
                                           std::make_index_sequence<std::tuple_size_v<values_t>>());
    using T = typename is_awaitable<typename fn_traits<F>::result>::value_type;
    if constexpr (std::is_void_v<T>) {
        co_await invoke_handler(f, p, values);
        pack_nil(out);
    } else {
        T r = co_await invoke_handler(f, p, values);
        pack_result(out, r);
    }
}

template <class F>
handler_entry make_handler_entry(std::string method, F f, handler_options o) {
    using traits = fn_traits<F>;
    using shape = handler_shape<typename traits::args>;
    using values_t = typename shape::values;
    handler_entry e;
    e.signature = signature_of<values_t>::get();
    e.concurrent = o.concurrent;
    if constexpr (is_awaitable<typename traits::result>::value) {
        e.async = [f, method, sig = e.signature](peer& p, msgpack::object params, buffer& out) {
            return run_async_handler(f, method, sig, p, params, out);
        };
    } else {
        e.sync = [f, method, sig = e.signature](peer& p, const msgpack::object& params,
                                                buffer& out) mutable {
            auto values = convert_params<values_t>(
                params, method, sig, std::make_index_sequence<std::tuple_size_v<values_t>>());
            if constexpr (std::is_void_v<typename traits::result>) {
                invoke_handler(f, p, values);
                pack_nil(out);
            } else {
                pack_result(out, invoke_handler(f, p, values));
            }
        };
    }
    return e;
}

}  // namespace detail

/// A table of handlers by method name. Registering a name again replaces its handler (for
/// messages dispatched afterwards).
class handlers {
  public:
    /// Registers `f` for `name`. f is a function, a lambda (not generic) or a coroutine returning
    /// net::awaitable<T>; it may take `ordo::peer&` first (the calling peer, to call back over
    /// the same ordered stream). Arguments are converted with msgpack-c: a mismatch answers
    /// errc::bad_arguments naming the method and the expected signature; an exception answers
    /// an error with its message (errc::remote_error, or the ordo::errc of a system_error).
    template <class F>
    handlers& on(std::string name, F f, handler_options o = {}) {
        auto e = detail::make_handler_entry(name, std::move(f), o);
        map_.insert_or_assign(std::move(name), std::move(e));
        return *this;
    }

    /// Registers `f` for an interface method, checking at compile time that f takes its
    /// arguments and returns (or co_returns) its result type.
    template <class R, class... A, class F>
    handlers& on(const method<R(A...)>& m, F f, handler_options o = {}) {
        using traits = detail::fn_traits<F>;
        using shape = detail::handler_shape<typename traits::args>;
        static_assert(std::is_same_v<typename shape::values, std::tuple<std::decay_t<A>...>>,
                      "handler arguments do not match the interface method's");
        using ret = typename traits::result;
        if constexpr (detail::is_awaitable<ret>::value)
            static_assert(
                std::is_convertible_v<typename detail::is_awaitable<ret>::value_type, R> ||
                    std::is_void_v<R>,
                "handler result does not match the interface method's");
        else
            static_assert(std::is_convertible_v<ret, R> || std::is_void_v<R>,
                          "handler result does not match the interface method's");
        return on(m.name(), std::move(f), o);
    }

    /// Registers a batch handler for `name`: callers make single calls with one argument (or
    /// several, taken as a tuple); `f` takes std::vector<Arg> and returns, or co_returns,
    /// std::vector<R> or std::vector<ordo::element<R>> of the same length (an element_error fails
    /// only its call). A throw, or a result of the wrong length, fails every call of that batch
    /// with a message naming the handler and the sizes. Calls from every peer are gathered;
    /// batches run when full or max_wait after their first call. From one ordered peer, calls
    /// keep their order inside and across batches (with max_concurrent_batches 1). A cancelled
    /// call, or one whose peer died, leaves a batch that has not started.
    template <class F>
    batch_handle on_batch(std::string name, batch_options o, F f) {
        using Arg = typename detail::batch_arg<F>::type;
        auto core = std::make_shared<detail::batcher<Arg, F>>(name, o, std::move(f));
        detail::handler_entry e;
        e.signature = "(" + detail::type_name(typeid(Arg)) + ") [batch]";
        e.concurrent = true;
        e.async = [core, name](peer&, msgpack::object params, buffer& out) {
            return detail::submit_batch<Arg>(core, name, params, out);
        };
        map_.insert_or_assign(std::move(name), std::move(e));
        batchers_.push_back(core);
        return batch_handle(core);
    }

    /// Fails the calls queued in every batch handler with errc::shutting_down (server stop).
    void stop_batches() const {
        for (const auto& b : batchers_) b->stop();
    }
    /// Calls still waiting for their batch outcome, over all batch handlers.
    std::size_t batch_waiters() const {
        std::size_t n = 0;
        for (const auto& b : batchers_) n += b->waiters();
        return n;
    }

    /// The entry for `name`, or null.
    const detail::handler_entry* find(std::string_view name) const {
        auto it = map_.find(name);
        return it == map_.end() ? nullptr : &it->second;
    }

  private:
    std::map<std::string, detail::handler_entry, std::less<>> map_;
    std::vector<std::shared_ptr<detail::batcher_core>> batchers_;
};

}  // namespace ordo
