// ordo::async_connect_transport and ordo::listen: a URL's scheme picks the transport (tcp.cpp,
// unix.cpp, tls.cpp, inproc.cpp, zmq.cpp; comm/transports.hpp declares them). Also what a
// batched_comm keeps in place of a transport it handed over.
#include "ordo/comm/transport.hpp"

#include "comm/detail/byte_streams.hpp"
#include "comm/transports.hpp"
#include "ordo/error.hpp"

namespace ordo {
namespace detail {

net::awaitable<std::tuple<std::error_code>> wait_writable(tcp::socket& s) {
    return s.async_wait(net::socket_base::wait_write, use_tuple);
}
net::awaitable<std::tuple<std::error_code>> wait_writable(unix_stream::socket& s) {
    return s.async_wait(net::socket_base::wait_write, use_tuple);
}

void transport_fail(std::string_view what, std::string_view url, const std::error_code& ec) {
    throw rpc_error(ec, {}, {}, "ordo: " + std::string(what) + " " + std::string(url));
}

namespace {

// What a batched_comm holds once its transport went to another owner (hand_over()): the
// address for messages, and nothing to read or write.
class handed_transport_impl final : public transport {
  public:
    handed_transport_impl(std::string remote, net::any_io_executor ex)
        : transport(std::move(remote)), ex_(std::move(ex)) {}
    net::awaitable<std::size_t> async_read_some(net::mutable_buffer, std::error_code& ec) override {
        ec = net::error::not_connected;
        co_return 0;
    }
    net::awaitable<std::size_t> async_write(net::const_buffer, std::error_code& ec) override {
        ec = net::error::not_connected;
        co_return 0;
    }
    void shutdown_send() noexcept override {}
    void close() noexcept override {}
    net::any_io_executor get_executor() override { return ex_; }

  private:
    net::any_io_executor ex_;
};

}  // namespace

std::unique_ptr<transport> handed_transport(std::string remote, net::any_io_executor ex) {
    return std::make_unique<handed_transport_impl>(std::move(remote), std::move(ex));
}

}  // namespace detail

transport::~transport() = default;

std::size_t transport::try_write(net::const_buffer, std::error_code& ec) noexcept {
    ec = net::error::operation_not_supported;
    return 0;
}

net::awaitable<std::tuple<std::error_code>> transport::async_wait_writable() {
    co_return std::error_code(net::error::operation_not_supported);
}

std::unique_ptr<transport> transport::rehome(const net::any_io_executor&) {
    return nullptr;
}
listener::~listener() = default;

bool is_transport_parameter(std::string_view name) noexcept {
    for (std::string_view k :
         {"cert", "key", "ca", "verify", "server_name", "handshake_timeout_ms", "zmq_heartbeat_ms"})
        if (k == name) return true;
    return false;
}

net::awaitable<std::unique_ptr<transport>> async_connect_transport(std::string_view url) {
    return async_connect_transport(url, transport_options{});
}

net::awaitable<std::unique_ptr<transport>> async_connect_transport(std::string_view url,
                                                                   transport_options o) {
    const address a = parse_address(url);
    if (a.scheme == "inproc") co_return co_await detail::connect_inproc(a, o);
    if (a.scheme == "zmq+tcp" || a.scheme == "zmq+ipc")
        co_return co_await detail::connect_zmq(a, o);
    if (a.scheme == "tls") co_return co_await detail::connect_tls(a, o);
    if (a.scheme == "unix") co_return co_await detail::connect_unix(a);
    co_return co_await detail::connect_tcp_transport(a);
}

std::unique_ptr<listener> listen(const net::any_io_executor& ex, std::string_view url) {
    return listen(ex, url, transport_options{});
}

std::unique_ptr<listener> listen(const net::any_io_executor& ex, std::string_view url,
                                 const transport_options& o) {
    const address a = parse_address(url);
    // Only transport parameters configure a listener (the same list connect passes on): a
    // misspelt one would otherwise be ignored silently.
    for (const auto& param : a.params)
        if (!is_transport_parameter(param.first))
            throw_error(errc::bad_address, "ordo: invalid address \"" + std::string(url) +
                                               "\": unknown parameter \"" + param.first + "\"");
    if (a.scheme == "unix") return detail::listen_unix(ex, a);
    if (a.scheme == "inproc") return detail::listen_inproc(ex, a, o);
    if (a.scheme == "zmq+tcp" || a.scheme == "zmq+ipc") return detail::listen_zmq(ex, a, o);
    if (a.scheme == "tls") return detail::listen_tls(ex, a, o);
    return detail::listen_tcp(ex, a);
}

}  // namespace ordo
