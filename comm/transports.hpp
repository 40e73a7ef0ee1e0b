// Private: the transports behind ordo::async_connect_transport and ordo::listen, one file each
// (tcp.cpp, unix.cpp and tls.cpp, on detail/byte_streams.hpp; inproc.cpp; zmq.cpp, on
// detail/zmq_socket.hpp).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "ordo/address.hpp"
#include "ordo/comm/transport.hpp"

namespace ordo::detail {

/// Throws std::system_error(ec) reading "ordo: <what> <url>: <reason>".
[[noreturn]] void transport_fail(std::string_view what, std::string_view url,
                                 const std::error_code& ec);

/// What a batched_comm holds once its transport went to another owner (batched_comm::
/// hand_over): the address for messages, and nothing to read or write.
std::unique_ptr<transport> handed_transport(std::string remote, net::any_io_executor ex);

net::awaitable<std::unique_ptr<transport>> connect_tcp_transport(const address& a);
std::unique_ptr<listener> listen_tcp(const net::any_io_executor& ex, const address& a);

net::awaitable<std::unique_ptr<transport>> connect_unix(const address& a);
std::unique_ptr<listener> listen_unix(const net::any_io_executor& ex, const address& a);

net::awaitable<std::unique_ptr<transport>> connect_tls(const address& a,
                                                       const transport_options& o);
std::unique_ptr<listener> listen_tls(const net::any_io_executor& ex, const address& a,
                                     const transport_options& o);

net::awaitable<std::unique_ptr<transport>> connect_inproc(const address& a,
                                                          const transport_options& o);
std::unique_ptr<listener> listen_inproc(const net::any_io_executor& ex, const address& a,
                                        const transport_options& o);

net::awaitable<std::unique_ptr<transport>> connect_zmq(const address& a,
                                                       const transport_options& o);
std::unique_ptr<listener> listen_zmq(const net::any_io_executor& ex, const address& a,
                                     const transport_options& o);

}  // namespace ordo::detail
