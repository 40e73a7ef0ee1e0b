// Type facts shared by the handler and batch machinery: type_name() and is_awaitable.
#pragma once

#include <string>
#include <type_traits>
#include <typeinfo>

#include "ordo/net.hpp"

namespace ordo::detail {

/// A readable name for T ("int", "std::string", ...).
std::string type_name(const std::type_info& t);

template <class T>
struct is_awaitable : std::false_type {};
template <class T, class E>
struct is_awaitable<net::awaitable<T, E>> : std::true_type {
    using value_type = T;
};

}  // namespace ordo::detail
