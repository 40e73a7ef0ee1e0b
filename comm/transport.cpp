#include "ordo/transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <deque>

#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/ssl.hpp>
#include <asio/write.hpp>

#include "comm/transports.hpp"
#include "lib/escaped.hpp"
#include "lib/url_number.hpp"
#include "ordo/error.hpp"

namespace ordo {
namespace detail {

void transport_fail(std::string_view what, std::string_view url, const std::error_code& ec) {
    throw rpc_error(ec, {}, {}, "ordo: " + std::string(what) + " " + std::string(url));
}

}  // namespace detail

namespace {

using tcp = net::ip::tcp;
using unix_stream = net::local::stream_protocol;
namespace ssl = net::ssl;
using detail::transport_fail;

[[noreturn]] void fail(std::string_view what, std::string_view url, const std::error_code& ec) {
    transport_fail(what, url, ec);
}

std::string tcp_url(const tcp::endpoint& ep, std::string scheme = "tcp") {
    address a;
    a.scheme = std::move(scheme);
    a.host = ep.address().to_string();
    a.port = ep.port();
    return a.to_string();
}

// A TLS stream and the context it was made from, kept together so that the context outlives it.
struct tls_stream {
    tls_stream(tcp::socket s, std::shared_ptr<ssl::context> c)
        : ctx(std::move(c)), stream(std::move(s), *ctx) {}
    std::shared_ptr<ssl::context> ctx;
    ssl::stream<tcp::socket> stream;
};

// "sha256:<hex>" of the peer's certificate, or empty when it showed none.
std::string certificate_identity(const ssl::stream<tcp::socket>& s) {
    X509* cert =
        ::SSL_get1_peer_certificate(const_cast<ssl::stream<tcp::socket>&>(s).native_handle());
    if (!cert) return {};
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    const bool ok = ::X509_digest(cert, ::EVP_sha256(), digest, &n) == 1;
    ::X509_free(cert);
    if (!ok) return {};
    static const char hex[] = "0123456789abcdef";
    std::string id = "sha256:";
    for (unsigned int i = 0; i < n; ++i) {
        id += hex[digest[i] >> 4];
        id += hex[digest[i] & 15];
    }
    return id;
}

tcp::socket& lowest(tcp::socket& s) {
    return s;
}
unix_stream::socket& lowest(unix_stream::socket& s) {
    return s;
}
tcp::socket& lowest(std::shared_ptr<tls_stream>& s) {
    return s->stream.next_layer();
}
auto& stream_of(tcp::socket& s) {
    return s;
}
auto& stream_of(unix_stream::socket& s) {
    return s;
}
auto& stream_of(std::shared_ptr<tls_stream>& s) {
    return s->stream;
}

// The kernel's probing of a tcp connection, below ordo's own (transport::set_liveness).
struct keepalive {
    int idle_s;                // TCP_KEEPIDLE: silence before the first probe
    int interval_s;            // TCP_KEEPINTVL: between unanswered probes
    int count;                 // TCP_KEEPCNT
    unsigned user_timeout_ms;  // TCP_USER_TIMEOUT
};

// Only connections with nothing pending rely on this: while calls are pending or handlers run,
// ordo pings and gives up after `liveness` itself (rpc/liveness.cpp). So the probes can be rare,
// and must never end a healthy connection:
//  - The first probe comes after 6 x liveness of silence (60 s by default), plus up to half as
//    much again, spread evenly over the sockets. Without the spread, connections opened together
//    probe together forever (the kernel's timers round to the same tick), and a burst of
//    thousands of probes overflows the receive backlog (net.core.netdev_max_backlog, 1000 by
//    default; on loopback the probes and their answers both pass through it).
//  - With TCP_USER_TIMEOUT set, Linux ignores TCP_KEEPCNT: it ends the connection at the first
//    probe time after user_timeout of silence. user_timeout is therefore idle + 3 intervals, so
//    that three probes in a row must go unanswered (were it below idle, one lost probe would do).
//    This also bounds how long a half-open idle peer holds its slot: 90-120 s by default.
//  - The cost: data left unacknowledged with nothing pending at the ordo level (notifications,
//    a response to a client that vanished) ends the connection after that same user_timeout,
//    not after 2 x liveness. The kernel couples the two; a user_timeout short enough for
//    unacknowledged data would need a probe at least that often on every idle connection.
keepalive keepalive_for(std::chrono::milliseconds liveness) {
    // The kernel refuses more than 32767 s of idle or interval.
    const auto seconds = [](long long ms) {
        return static_cast<int>(std::clamp(ms / 1000, 1LL, 32767LL));
    };
    static std::atomic<std::uint32_t> sockets{0};
    // The golden-ratio sequence spreads any run of consecutive sockets evenly over [0, 1).
    const double spread =
        (sockets.fetch_add(1, std::memory_order_relaxed) * 2654435769u) / 4294967296.0;
    const int idle = seconds(6 * liveness.count());
    keepalive k;
    k.idle_s = std::min(32767, idle + static_cast<int>(spread * (idle / 2 + 1)));
    k.interval_s = seconds(liveness.count());
    k.count = 3;  // used only if the socket refuses TCP_USER_TIMEOUT
    const long long user_timeout = std::max(1000LL * (k.idle_s + k.count * k.interval_s),
                                            2 * static_cast<long long>(liveness.count()));
    k.user_timeout_ms = static_cast<unsigned>(std::min<long long>(user_timeout, INT_MAX));
    return k;
}

// tcp, unix and tls streams share everything but their names.
template <class Socket>
class stream_transport final : public transport {
  public:
    stream_transport(Socket s, std::string remote)
        : transport(std::move(remote)), socket_(std::move(s)) {}

    net::awaitable<std::size_t> async_read_some(net::mutable_buffer b,
                                                std::error_code& ec) override {
        auto [e, n] = co_await stream_of(socket_).async_read_some(b, use_tuple);
        ec = e;
        // ordo ends a TLS connection with a TCP FIN after its last message, without a TLS
        // close_notify (one cannot be sent while a read is pending). Message boundaries are
        // checked by the framer, so a stream cut inside a message is still an error.
        if (ec == ssl::error::stream_truncated) ec = net::error::eof;
        co_return n;
    }

    net::awaitable<std::size_t> async_write(net::const_buffer b, std::error_code& ec) override {
        auto [e, n] = co_await net::async_write(stream_of(socket_), b, use_tuple);
        ec = e;
        co_return n;
    }

    void shutdown_send() noexcept override {
        std::error_code ignored;
        lowest(socket_).shutdown(net::socket_base::shutdown_send, ignored);
    }

    void close() noexcept override {
        std::error_code ignored;
        lowest(socket_).close(ignored);
    }

    net::any_io_executor get_executor() override { return lowest(socket_).get_executor(); }

    std::string peer_identity() const override {
        if constexpr (std::is_same_v<Socket, std::shared_ptr<tls_stream>>)
            return certificate_identity(socket_->stream);
        else
            return {};
    }

    void reset() noexcept override {
        if constexpr (!std::is_same_v<Socket, unix_stream::socket>) {
            std::error_code ignored;
            lowest(socket_).set_option(net::socket_base::linger(true, 0), ignored);
        }
        close();
    }

    void set_liveness(std::chrono::milliseconds liveness) noexcept override {
        if constexpr (!std::is_same_v<Socket, unix_stream::socket>) {
            const keepalive k = keepalive_for(liveness);
            const int fd = lowest(socket_).native_handle();
            const int on = 1;
            // Best effort: a socket that refuses an option keeps ordo's own probing.
            ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k.idle_s, sizeof k.idle_s);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k.interval_s, sizeof k.interval_s);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k.count, sizeof k.count);
            ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &k.user_timeout_ms,
                         sizeof k.user_timeout_ms);
        }
    }

  private:
    Socket socket_;
};

// A connected tcp socket and the endpoint it reached.
struct tcp_connection {
    tcp::socket socket;
    tcp::endpoint remote;
};

// Connects to the first of a.host's addresses that accepts, on the current executor, with
// Nagle's delay off (batched_comm does its own batching). Throws what transport_fail throws:
// "cannot resolve" or "cannot connect to", naming the URL.
net::awaitable<tcp_connection> connect_tcp(const address& a) {
    auto ex = co_await net::this_coro::executor;
    tcp::resolver r(ex);
    auto [rec, endpoints] = co_await r.async_resolve(a.host, std::to_string(a.port), use_tuple);
    if (rec) fail("cannot resolve", a.to_string(), rec);
    tcp::socket s(ex);
    auto [ec, ep] = co_await net::async_connect(s, endpoints, use_tuple);
    if (ec) fail("cannot connect to", a.to_string(), ec);
    s.set_option(tcp::no_delay(true), ec);
    co_return tcp_connection{std::move(s), ep};
}

tcp::acceptor open_acceptor(const net::any_io_executor& ex, const address& a) {
    tcp::acceptor acceptor(ex);
    std::error_code ec;
    auto ip = net::ip::make_address(a.host, ec);
    tcp::endpoint ep;
    if (!ec) {
        ep = tcp::endpoint(ip, a.port);
    } else {
        tcp::resolver r(ex);
        auto results = r.resolve(a.host, std::to_string(a.port), ec);
        if (ec || results.empty()) fail("cannot resolve listen address", a.to_string(), ec);
        ep = *results.begin();
    }
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) fail("cannot listen on", a.to_string(), ec);
    return acceptor;
}

class tcp_listener final : public listener {
  public:
    tcp_listener(const net::any_io_executor& ex, const address& a)
        : acceptor_(open_acceptor(ex, a)) {
        local_ = tcp_url(acceptor_.local_endpoint());
    }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        auto [ec, s] = co_await acceptor_.async_accept(place(acceptor_.get_executor()), use_tuple);
        if (ec) fail("accept failed on", local_, ec);
        s.set_option(tcp::no_delay(true), ec);
        auto remote = tcp_url(s.remote_endpoint(ec));
        co_return std::make_unique<stream_transport<tcp::socket>>(std::move(s), std::move(remote));
    }

    void close() noexcept override {
        std::error_code ignored;
        acceptor_.close(ignored);
    }

  private:
    tcp::acceptor acceptor_;
};

// --- TLS -----------------------------------------------------------------------------------

[[noreturn]] void bad_tls(const address& a, const std::string& why) {
    throw_error(errc::bad_address, "ordo: TLS settings for " + a.to_string() + ": " + why);
}

std::string openssl_reason(const std::error_code& ec) {
    std::string r = ec.message();
    if (unsigned long e = ::ERR_get_error()) {
        char buf[256];
        ::ERR_error_string_n(e, buf, sizeof buf);
        r = buf;
    }
    ::ERR_clear_error();
    return r;
}

tls_options tls_settings(const address& a, tls_options o) {
    for (const auto& [k, v] : a.params) {
        if (k == "cert")
            o.cert_file = v;
        else if (k == "key")
            o.key_file = v;
        else if (k == "ca")
            o.ca_file = v;
        else if (k == "server_name")
            o.server_name = v;
        else if (k == "verify") {
            if (v != "none" && v != "peer") bad_tls(a, "verify must be peer or none");
            o.verify_peer = v == "peer";
        } else if (k == "handshake_timeout_ms") {
            o.handshake_timeout =
                std::chrono::milliseconds(detail::number_parameter(a.to_string(), k, v));
        }
    }
    return o;
}

std::shared_ptr<ssl::context> make_tls_context(const address& a, const tls_options& o,
                                               bool server) {
    auto ctx = std::make_shared<ssl::context>(server ? ssl::context::tls_server
                                                     : ssl::context::tls_client);
    ::SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
    ctx->set_options(ssl::context::default_workarounds | ssl::context::no_compression);
    std::error_code ec;
    if (server && (o.cert_file.empty() || o.key_file.empty()))
        bad_tls(a, "a tls:// listener needs a certificate and a key (cert= and key=)");
    if (o.cert_file.empty() != o.key_file.empty())
        bad_tls(a, "a certificate needs its key, and a key its certificate");
    if (!o.cert_file.empty()) {
        if (ctx->use_certificate_chain_file(o.cert_file, ec); ec)
            bad_tls(a, "cannot use certificate " + o.cert_file + ": " + openssl_reason(ec));
        if (ctx->use_private_key_file(o.key_file, ssl::context::pem, ec); ec)
            bad_tls(a, "cannot use key " + o.key_file + ": " + openssl_reason(ec));
    }
    if (!o.ca_file.empty()) {
        if (ctx->load_verify_file(o.ca_file, ec); ec)
            bad_tls(a, "cannot read CA file " + o.ca_file + ": " + openssl_reason(ec));
    } else if (!server) {
        ctx->set_default_verify_paths(ec);
    }
    if (server)
        ctx->set_verify_mode(o.ca_file.empty()
                                 ? ssl::verify_none
                                 : ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    else
        ctx->set_verify_mode(o.verify_peer ? ssl::verify_peer : ssl::verify_none);
    return ctx;
}

// Why a handshake failed, in words: OpenSSL's verification result when there is one.
std::string handshake_reason(ssl::stream<tcp::socket>& s, const std::error_code& ec,
                             bool timed_out) {
    if (timed_out) return "no handshake within the handshake timeout";
    const long v = ::SSL_get_verify_result(s.native_handle());
    std::string r = ec.message();
    if (v != X509_V_OK) r += " (" + std::string(::X509_verify_cert_error_string(v)) + ")";
    ::ERR_clear_error();
    return r;
}

// Runs the handshake; closes the socket if it takes longer than the options allow.
net::awaitable<std::string> handshake(std::shared_ptr<tls_stream> ts,
                                      ssl::stream_base::handshake_type type,
                                      std::chrono::milliseconds timeout) {
    auto done = std::make_shared<bool>(false);
    auto timed_out = std::make_shared<bool>(false);
    net::steady_timer timer(ts->stream.get_executor());
    timer.expires_after(timeout);
    timer.async_wait([w = std::weak_ptr<tls_stream>(ts), done, timed_out](std::error_code e) {
        auto s = w.lock();
        if (e || *done || !s) return;
        *timed_out = true;
        std::error_code ignored;
        s->stream.next_layer().close(ignored);
    });
    auto [ec] = co_await ts->stream.async_handshake(type, use_tuple);
    *done = true;
    timer.cancel();
    if (!ec && !*timed_out) co_return std::string();
    co_return handshake_reason(ts->stream, ec, *timed_out);
}

std::unique_ptr<transport> tls_transport(std::shared_ptr<tls_stream> ts, std::string remote) {
    return std::make_unique<stream_transport<std::shared_ptr<tls_stream>>>(std::move(ts),
                                                                           std::move(remote));
}

net::awaitable<std::unique_ptr<transport>> connect_tls(const address& a,
                                                       const transport_options& to) {
    const tls_options o = tls_settings(a, to.tls);
    auto ctx = make_tls_context(a, o, false);
    tcp_connection c = co_await connect_tcp(a);
    auto ts = std::make_shared<tls_stream>(std::move(c.socket), ctx);
    const std::string name = o.server_name.empty() ? a.host : o.server_name;
    SSL* h = ts->stream.native_handle();
    std::error_code not_ip;
    net::ip::make_address(name, not_ip);
    if (not_ip) ::SSL_set_tlsext_host_name(h, name.c_str());
    if (o.verify_peer) {
        X509_VERIFY_PARAM* param = ::SSL_get0_param(h);
        if (not_ip)
            ::X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0);
        else
            ::X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str());
    }
    const std::string why = co_await handshake(ts, ssl::stream_base::client, o.handshake_timeout);
    if (!why.empty())
        throw_error(errc::peer_lost,
                    "ordo: TLS handshake with " + a.to_string() + " failed: " + why);
    co_return tls_transport(std::move(ts), tcp_url(c.remote, "tls"));
}

// Accepts tcp connections and runs their handshakes side by side, so that one slow or silent
// client holds up nobody; async_accept hands out the connections whose handshake succeeded.
class tls_listener final : public listener {
  public:
    tls_listener(const net::any_io_executor& ex, const address& a, const transport_options& to)
        : st_(std::make_shared<state>(ex, a, to)) {
        local_ = tcp_url(st_->acceptor.local_endpoint(), "tls");
        st_->local = local_;
        net::co_spawn(ex, accept_loop(st_), detail::rethrow_escaped{});
    }
    ~tls_listener() override { close(); }

    void set_placement(std::function<net::any_io_executor()> choose) override {
        st_->choose = std::move(choose);
    }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        auto s = st_;
        while (s->ready.empty() && s->open) co_await s->wake.async_wait(use_tuple);
        if (s->ready.empty()) fail("accept failed on", local_, net::error::operation_aborted);
        auto t = std::move(s->ready.front());
        s->ready.pop_front();
        s->wake.cancel();  // the accept loop may wait for room
        co_return t;
    }

    void close() noexcept override {
        if (!st_->open) return;
        st_->open = false;
        std::error_code ignored;
        st_->acceptor.close(ignored);
        st_->ready.clear();  // handshakes done, never taken: closed now, on a live loop
        st_->wake.cancel();
    }

  private:
    static constexpr std::size_t max_pending = 256;  // handshakes running + ready, not taken

    struct state {
        state(const net::any_io_executor& ex, const address& a, const transport_options& to)
            : o(tls_settings(a, to.tls)),
              ctx(make_tls_context(a, o, true)),
              on_refused(to.on_refused),
              acceptor(open_acceptor(ex, a)),
              wake(ex, std::chrono::steady_clock::time_point::max()) {}
        tls_options o;
        std::shared_ptr<ssl::context> ctx;
        std::function<void(const std::string&)> on_refused;
        tcp::acceptor acceptor;
        net::steady_timer wake;
        std::deque<std::unique_ptr<transport>> ready;
        std::size_t handshaking = 0;
        bool open = true;
        std::string local;
        std::function<net::any_io_executor()> choose;  // set_placement
    };

    static net::awaitable<void> accept_loop(std::shared_ptr<state> s) {
        const net::any_io_executor home = s->acceptor.get_executor();
        net::steady_timer backoff(home);
        while (s->open) {
            while (s->open && s->handshaking + s->ready.size() >= max_pending)
                co_await s->wake.async_wait(use_tuple);
            if (!s->open) break;
            const net::any_io_executor ex = s->choose ? s->choose() : home;
            auto [ec, sock] = co_await s->acceptor.async_accept(ex, use_tuple);
            if (!s->open) break;
            if (ec) {
                backoff.expires_after(std::chrono::milliseconds(100));
                co_await backoff.async_wait(use_tuple);
                continue;
            }
            sock.set_option(tcp::no_delay(true), ec);
            ++s->handshaking;
            net::co_spawn(ex, shake(s, home, std::move(sock)), detail::rethrow_escaped{});
        }
    }

    // Runs on the connection's executor; the listener's state is touched back on `home`.
    static net::awaitable<void> shake(std::shared_ptr<state> s, net::any_io_executor home,
                                      tcp::socket sock) {
        std::error_code ec;
        std::string remote = tcp_url(sock.remote_endpoint(ec), "tls");
        auto ts = std::make_shared<tls_stream>(std::move(sock), s->ctx);
        std::string why = co_await handshake(ts, ssl::stream_base::server, s->o.handshake_timeout);
        if (!why.empty()) {
            std::error_code ignored;
            ts->stream.next_layer().close(ignored);
        }
        auto t = why.empty() ? tls_transport(std::move(ts), remote) : nullptr;
        net::dispatch(home, [s, t = std::move(t), why = std::move(why),
                             remote = std::move(remote)]() mutable {
            --s->handshaking;
            s->wake.cancel();
            if (!why.empty()) {
                if (s->on_refused)
                    s->on_refused("ordo: TLS handshake with " + remote + " on " + s->local +
                                  " failed: " + why);
                return;
            }
            // Closed meanwhile: the transport is dropped (and closed) here.
            if (s->open) s->ready.push_back(std::move(t));
        });
    }

    std::shared_ptr<state> st_;
};

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

transport::~transport() = default;
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
    auto ex = co_await net::this_coro::executor;
    if (a.scheme == "inproc") co_return co_await detail::connect_inproc(a, o);
    if (a.scheme == "zmq+tcp" || a.scheme == "zmq+ipc")
        co_return co_await detail::connect_zmq(a, o);
    if (a.scheme == "tls") co_return co_await connect_tls(a, o);
    if (a.scheme == "unix") {
        unix_stream::socket s(ex);
        auto [ec] = co_await s.async_connect(unix_stream::endpoint(a.path), use_tuple);
        if (ec) fail("cannot connect to", a.to_string(), ec);
        co_return std::make_unique<stream_transport<unix_stream::socket>>(std::move(s),
                                                                          a.to_string());
    }
    tcp_connection c = co_await connect_tcp(a);
    co_return std::make_unique<stream_transport<tcp::socket>>(std::move(c.socket),
                                                              tcp_url(c.remote));
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
    if (a.scheme == "unix") return std::make_unique<unix_listener>(ex, a);
    if (a.scheme == "inproc") return detail::listen_inproc(ex, a, o);
    if (a.scheme == "zmq+tcp" || a.scheme == "zmq+ipc") return detail::listen_zmq(ex, a, o);
    if (a.scheme == "tls") return std::make_unique<tls_listener>(ex, a, o);
    return std::make_unique<tcp_listener>(ex, a);
}

}  // namespace ordo
