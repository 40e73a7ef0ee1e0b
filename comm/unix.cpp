// unix:// connections and listeners, on the transport tcp and tls share
// (comm/detail/byte_streams.hpp).
#include <sys/stat.h>
#include <unistd.h>

#include "comm/detail/byte_streams.hpp"

namespace ordo::detail {

namespace {

class unix_listener final : public listener {
  public:
    unix_listener(const net::any_io_executor& ex, const address& a) : acceptor_(ex), path_(a.path) {
        remove_stale_socket(ex);
        std::error_code ec;
        unix_stream::endpoint ep(path_);
        acceptor_.open(ep.protocol(), ec);
        if (!ec) acceptor_.bind(ep, ec);
        if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
        if (ec) fail("cannot listen on", a.to_string(), ec);
        local_ = a.to_string();
    }

    ~unix_listener() override { close(); }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        auto [ec, s] = co_await acceptor_.async_accept(place(acceptor_.get_executor()), use_tuple);
        if (ec) fail("accept failed on", local_, ec);
        co_return std::make_unique<stream_transport<unix_stream::socket>>(std::move(s), local_);
    }

    void close() noexcept override {
        if (!acceptor_.is_open()) return;
        std::error_code ignored;
        acceptor_.close(ignored);
        ::unlink(path_.c_str());
    }

  private:
    // A socket file left by a process that died refuses connections: remove it. One that accepts
    // belongs to a live server, and bind will fail with "address in use" as it should.
    void remove_stale_socket(const net::any_io_executor& ex) {
        struct stat st {};
        if (::stat(path_.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return;
        unix_stream::socket probe(ex);
        std::error_code ec;
        probe.connect(unix_stream::endpoint(path_), ec);
        if (ec == net::error::connection_refused) ::unlink(path_.c_str());
    }

    unix_stream::acceptor acceptor_;
    std::string path_;
};

}  // namespace

net::awaitable<std::unique_ptr<transport>> connect_unix(const address& a) {
    auto ex = co_await net::this_coro::executor;
    unix_stream::socket s(ex);
    auto [ec] = co_await s.async_connect(unix_stream::endpoint(a.path), use_tuple);
    if (ec) fail("cannot connect to", a.to_string(), ec);
    co_return std::make_unique<stream_transport<unix_stream::socket>>(std::move(s), a.to_string());
}

std::unique_ptr<listener> listen_unix(const net::any_io_executor& ex, const address& a) {
    return std::make_unique<unix_listener>(ex, a);
}

}  // namespace ordo::detail
