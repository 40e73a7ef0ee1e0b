// tls:// connections and listeners: TLS settings from the URL and transport_options, the
// context, handshakes with a timeout (a listener runs them side by side), and the identity a
// client's certificate proves. The stream is tcp's (comm/detail/byte_streams.hpp).
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <deque>
#include <list>

#include "comm/detail/byte_streams.hpp"
#include "lib/escaped.hpp"
#include "lib/url_number.hpp"
#include "ordo/error.hpp"

namespace ordo::detail {

namespace {

std::string hex_of(const unsigned char* p, unsigned int n) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (unsigned int i = 0; i < n; ++i) {
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s;
}

std::string name_text(X509_NAME* name) {
    BIO* b = ::BIO_new(::BIO_s_mem());
    if (!b) return {};
    ::X509_NAME_print_ex(b, name, 0, XN_FLAG_RFC2253 & ~ASN1_STRFLGS_ESC_MSB);
    char* data = nullptr;
    const long n = ::BIO_get_mem_data(b, &data);
    std::string s(data ? data : "", n > 0 ? static_cast<std::size_t>(n) : 0);
    ::BIO_free(b);
    return s;
}

std::string asn1_text(const ASN1_STRING* a) {
    return std::string(reinterpret_cast<const char*>(::ASN1_STRING_get0_data(a)),
                       static_cast<std::size_t>(::ASN1_STRING_length(a)));
}

std::vector<std::string> alt_names(X509* cert) {
    std::vector<std::string> out;
    auto* names = static_cast<GENERAL_NAMES*>(
        ::X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
    if (!names) return out;
    for (int i = 0; i < sk_GENERAL_NAME_num(names) && out.size() < 64; ++i) {
        const GENERAL_NAME* g = sk_GENERAL_NAME_value(names, i);
        if (g->type == GEN_DNS) {
            out.push_back("DNS:" + asn1_text(g->d.dNSName));
        } else if (g->type == GEN_URI) {
            out.push_back("URI:" + asn1_text(g->d.uniformResourceIdentifier));
        } else if (g->type == GEN_EMAIL) {
            out.push_back("email:" + asn1_text(g->d.rfc822Name));
        } else if (g->type == GEN_IPADD) {
            const int n = ::ASN1_STRING_length(g->d.iPAddress);
            const unsigned char* p = ::ASN1_STRING_get0_data(g->d.iPAddress);
            char text[64] = {};
            if (n == 4 || n == 16)
                ::inet_ntop(n == 4 ? AF_INET : AF_INET6, p, text, sizeof text);
            if (text[0]) out.push_back(std::string("IP:") + text);
        }
    }
    ::GENERAL_NAMES_free(names);
    return out;
}

}  // namespace

void describe_certificate(const ssl::stream<tcp::socket>& s, identity& who) {
    SSL* ssl = const_cast<ssl::stream<tcp::socket>&>(s).native_handle();
    // Only a certificate that chained to this side's CA names anyone.
    if (::SSL_get_verify_result(ssl) != X509_V_OK) return;
    X509* cert = ::SSL_get1_peer_certificate(ssl);
    if (!cert) return;
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (::X509_digest(cert, ::EVP_sha256(), digest, &n) == 1) who.cert_sha256 = hex_of(digest, n);
    who.cert_subject = name_text(::X509_get_subject_name(cert));
    who.cert_sans = alt_names(cert);
    ::X509_free(cert);
}

namespace {

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

// Accepts tcp connections and runs their handshakes side by side, so that one slow or silent
// client holds up nobody; async_accept hands out the connections whose handshake succeeded.
// Unfinished handshakes are capped, in all and per address (port aside): beyond a cap the
// oldest is dropped, so that silent connections cannot stop the listener from accepting.
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
    static constexpr std::size_t max_ready = 256;          // handshakes done, not yet taken
    static constexpr std::size_t max_handshakes = 256;     // running, in all
    static constexpr std::size_t max_per_address = 32;     // running, from one address

    // A handshake running on its connection's executor, as the listener's loop sees it.
    struct shaking {
        std::string from;  // the address, port aside
        net::any_io_executor ex;
        std::weak_ptr<tls_stream> ts;
    };

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
        std::list<std::shared_ptr<shaking>> handshakes;  // oldest first
        std::uint64_t dropped = 0;
        bool open = true;
        std::string local;
        std::function<net::any_io_executor()> choose;  // set_placement
    };

    static net::awaitable<void> accept_loop(std::shared_ptr<state> s) {
        const net::any_io_executor home = s->acceptor.get_executor();
        net::steady_timer backoff(home);
        while (s->open) {
            while (s->open && s->ready.size() >= max_ready) co_await s->wake.async_wait(use_tuple);
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
            std::error_code no_peer;
            const auto peer = sock.remote_endpoint(no_peer);
            auto h = std::make_shared<shaking>();
            h->from = no_peer ? std::string() : address_group(peer.address());
            h->ex = ex;
            std::string remote = tcp_url(peer, "tls");
            auto ts = std::make_shared<tls_stream>(std::move(sock), s->ctx);
            h->ts = ts;
            make_room(*s, h->from);
            s->handshakes.push_back(h);
            net::co_spawn(ex, shake(s, h, home, std::move(ts), std::move(remote)),
                          detail::rethrow_escaped{});
        }
    }

    // Whose handshakes count together: an IPv4 address, or an IPv6 /64 (one host can hold a
    // whole /64, and would otherwise step around the per-address cap).
    static std::string address_group(const net::ip::address& a) {
        if (!a.is_v6() || a.to_v6().is_v4_mapped()) return a.to_string();
        auto bytes = a.to_v6().to_bytes();
        std::fill(bytes.begin() + 8, bytes.end(), 0);
        return net::ip::address_v6(bytes).to_string() + "/64";
    }

    // Before a handshake from `from` starts: drops the oldest of that address's when it has
    // max_per_address running, and the oldest of all when max_handshakes run.
    static void make_room(state& s, const std::string& from) {
        std::size_t mine = 0;
        auto oldest_mine = s.handshakes.end();
        for (auto it = s.handshakes.begin(); it != s.handshakes.end(); ++it) {
            if ((*it)->from != from) continue;
            if (mine++ == 0) oldest_mine = it;
        }
        if (mine >= max_per_address)
            drop(s, oldest_mine, "more than " + std::to_string(max_per_address) +
                                     " unfinished TLS handshakes from " + from);
        else if (s.handshakes.size() >= max_handshakes)
            drop(s, s.handshakes.begin(),
                 "more than " + std::to_string(max_handshakes) + " unfinished TLS handshakes");
    }

    static void drop(state& s, std::list<std::shared_ptr<shaking>>::iterator it,
                     const std::string& why) {
        auto h = std::move(*it);
        s.handshakes.erase(it);
        ++s.dropped;
        if (s.on_refused)
            s.on_refused("ordo: dropped the oldest TLS handshake" +
                         (h->from.empty() ? std::string() : " from " + h->from) + " on " +
                         s.local + ": " + why);
        // Its socket belongs to its executor: closed there, which ends the handshake.
        net::post(h->ex, [w = h->ts] {
            if (auto ts = w.lock()) {
                std::error_code ignored;
                ts->stream.next_layer().close(ignored);
            }
        });
    }

    // Runs on the connection's executor; the listener's state is touched back on `home`.
    static net::awaitable<void> shake(std::shared_ptr<state> s, std::shared_ptr<shaking> h,
                                      net::any_io_executor home, std::shared_ptr<tls_stream> ts,
                                      std::string remote) {
        std::string why = co_await handshake(ts, ssl::stream_base::server, s->o.handshake_timeout);
        if (!why.empty()) {
            std::error_code ignored;
            ts->stream.next_layer().close(ignored);
        }
        auto t = why.empty() ? tls_transport(std::move(ts), remote) : nullptr;
        net::dispatch(home, [s, h, t = std::move(t), why = std::move(why),
                             remote = std::move(remote)]() mutable {
            auto it = std::find(s->handshakes.begin(), s->handshakes.end(), h);
            if (it == s->handshakes.end()) return;  // dropped: already reported
            s->handshakes.erase(it);
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

}  // namespace

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

std::unique_ptr<listener> listen_tls(const net::any_io_executor& ex, const address& a,
                                     const transport_options& o) {
    return std::make_unique<tls_listener>(ex, a, o);
}

}  // namespace ordo::detail
