// A handler's shape (fn_traits, handler_shape, signature_of) and the conversion of its arguments.
#pragma once

#include "ordo/config.hpp"

#include <cstddef>
#include <exception>
#include <stop_token>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <msgpack.hpp>

#include "ordo/rpc/detail/type_traits.hpp"

namespace ordo {

class peer;
template <class T>
class writer;
template <class T>
class reader;

namespace detail {

[[noreturn]] void throw_bad_arguments(std::string_view method, const std::string& signature,
                                      const std::string& what);
// throw_bad_arguments with what is wrong put into words out of line: the conversions below stay
// small enough to be inlined into each handler's call.
[[noreturn, gnu::cold]] void throw_argument_count(std::string_view method,
                                                  const std::string& signature, std::size_t got,
                                                  std::size_t expected);
[[noreturn, gnu::cold]] void throw_argument_type(std::string_view method,
                                                 const std::string& signature, std::size_t index,
                                                 const std::type_info& type);

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
        throw_argument_type(method, signature, index, typeid(T));
    }
}

// The values a handler takes after an optional std::stop_token (the call's: stop is requested
// when the call is cancelled).
template <class... A>
struct after_stop {
    static constexpr bool takes_stop = false;
    using values = std::tuple<std::decay_t<A>...>;
};
template <class... A>
struct after_stop<std::stop_token, A...> {
    static constexpr bool takes_stop = true;
    using values = std::tuple<std::decay_t<A>...>;
};
template <class... A>
struct after_stop<const std::stop_token&, A...> : after_stop<std::stop_token, A...> {};

// Handler arguments after an optional leading peer&, then (handlers that read their caller's
// items) a reader<I>&, then (streaming handlers) a writer<T>&, then an optional
// std::stop_token.
template <class... A>
struct after_reader : after_stop<A...> {
    static constexpr bool reads = false;
    static constexpr bool streams = false;
};
template <class T, class... A>
struct after_reader<writer<T>&, A...> : after_stop<A...> {
    static constexpr bool reads = false;
    static constexpr bool streams = true;  // an ordo::writer<T>& takes its items
    using item = T;
};
template <class I, class... A>
struct after_reader<reader<I>&, A...> : after_stop<A...> {
    static constexpr bool reads = true;  // a client stream: its caller writes items
    static constexpr bool streams = false;
    using in_item = I;
};
template <class I, class T, class... A>
struct after_reader<reader<I>&, writer<T>&, A...> : after_stop<A...> {
    static constexpr bool reads = true;  // a two-way stream
    static constexpr bool streams = true;
    using in_item = I;
    using item = T;
};

template <class Tuple>
struct handler_shape;
template <class... A>
struct handler_shape<std::tuple<A...>> : after_reader<A...> {
    static constexpr bool takes_peer = false;
};
template <class... A>
struct handler_shape<std::tuple<peer&, A...>> : after_reader<A...> {
    static constexpr bool takes_peer = true;
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
    if (arr.size != sizeof...(I)) throw_argument_count(method, signature, arr.size, sizeof...(I));
    return Values{
        convert_arg<std::tuple_element_t<I, Values>>(arr.ptr[I], I, method, signature)...};
}

/// The arguments of a call, as the handler's values tuple F's shape declares; throws
/// errc::bad_arguments naming the method, its signature and what did not fit.
template <class F>
typename handler_shape<typename fn_traits<F>::args>::values convert_args(
    const msgpack::object& params, std::string_view method, const std::string& signature) {
    using values_t = typename handler_shape<typename fn_traits<F>::args>::values;
    return convert_params<values_t>(params, method, signature,
                                    std::make_index_sequence<std::tuple_size_v<values_t>>());
}

// f's leading arguments (peer&, the reader, the writer, the stop token: those it takes), then
// `values`.
template <class F>
decltype(auto) invoke_with(F& f, peer& p, auto* r, auto* w, const std::stop_token& st,
                           auto& values) {
    using shape = handler_shape<typename fn_traits<F>::args>;
    return std::apply(
        [&](auto&... v) -> decltype(auto) {
            auto lead = [&](auto&&... l) -> decltype(auto) {
                if constexpr (shape::takes_stop)
                    return f(std::forward<decltype(l)>(l)..., st, std::move(v)...);
                else
                    return f(std::forward<decltype(l)>(l)..., std::move(v)...);
            };
            if constexpr (shape::takes_peer && shape::reads && shape::streams)
                return lead(p, *r, *w);
            else if constexpr (shape::takes_peer && shape::reads)
                return lead(p, *r);
            else if constexpr (shape::reads && shape::streams)
                return lead(*r, *w);
            else if constexpr (shape::reads)
                return lead(*r);
            else if constexpr (shape::takes_peer && shape::streams)
                return lead(p, *w);
            else if constexpr (shape::takes_peer)
                return lead(p);
            else if constexpr (shape::streams)
                return lead(*w);
            else
                return lead();
        },
        values);
}

template <class F, class W>
decltype(auto) invoke_stream_handler(F& f, peer& p, W& w, auto& values,
                                     const std::stop_token& st = {}) {
    return invoke_with(f, p, static_cast<void*>(nullptr), &w, st, values);
}

template <class F, class R, class W>
decltype(auto) invoke_reading_handler(F& f, peer& p, R& r, W* w, auto& values) {
    return invoke_with(f, p, &r, w, std::stop_token{}, values);
}

template <class F>
decltype(auto) invoke_handler(F& f, peer& p, auto& values, const std::stop_token& st = {}) {
    return invoke_with(f, p, static_cast<void*>(nullptr), static_cast<void*>(nullptr), st, values);
}

}  // namespace detail
}  // namespace ordo
