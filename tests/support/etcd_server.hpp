// A real etcd (Debian's etcd-server) for tests: on loopback, on free client and peer ports, with
// a fresh data directory; started, SIGKILLed and restarted (same ports, same data) by PID only.
// Also a few direct calls to its v3 JSON gateway, to arrange what a test needs.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fleet/curl_multi.hpp"
#include "support/processes.hpp"

namespace ordo::test {

/// A loopback TCP port nobody listened on a moment ago.
inline std::uint16_t free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
        throw std::runtime_error("free_port: cannot bind a loopback socket");
    ::close(fd);
    return ntohs(a.sin_port);
}

/// The path of `name` on PATH, or "" if it is not there.
inline std::string on_path(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    for (std::size_t b = 0, e; b <= dirs.size(); b = e + 1) {
        e = dirs.find(':', b);
        if (e == std::string::npos) e = dirs.size();
        const std::string p = dirs.substr(b, e - b) + "/" + name;
        if (::access(p.c_str(), X_OK) == 0) return p;
    }
    return "";
}

/// What the test's own requests to etcd carry (https: the CA, a client certificate; a token
/// once etcd's authentication is on). Empty: plain http, as most tests use.
struct etcd_test_access {
    std::string ca, cert, key, token;
    void apply(detail::http_request& r) const {
        r.ca_file = ca;
        r.cert_file = cert;
        r.key_file = key;
        r.authorization = token;
    }
};
inline etcd_test_access& test_access() {
    static etcd_test_access a;
    return a;
}

/// etcd serving https (its client URL): its certificate and key, and, when `client_ca` is set,
/// the CA whose client certificates it requires (--client-cert-auth). `token_ttl_s`: how long
/// its authentication's tokens live.
struct etcd_tls {
    std::string cert, key, client_ca;
    int token_ttl_s = 300;
};

class etcd_server {
  public:
    etcd_server() : client_(free_port()), peer_(free_port()) {
        // In memory where there is a tmpfs: etcd fsyncs each write, and on a disk that builds
        // are using, a lease's revoke could wait for the disk longer than the tests allow.
        char shm[] = "/dev/shm/ordo-etcd-XXXXXX";
        char tmp[] = "/tmp/ordo-etcd-XXXXXX";
        char* tmpl = ::mkdtemp(shm) ? shm : tmp;
        if (tmpl == tmp && !::mkdtemp(tmp)) throw std::runtime_error("etcd_server: mkdtemp failed");
        dir_ = tmpl;
    }
    ~etcd_server() {
        kill();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    etcd_server(const etcd_server&) = delete;
    etcd_server& operator=(const etcd_server&) = delete;

    /// Starts etcd (again: same ports and data directory); its output goes to dir/etcd.log.
    void start() {
        const std::string etcd = on_path("etcd");
        if (etcd.empty())
            throw std::runtime_error("etcd not found on PATH (apt-get install -y etcd-server)");
        const std::string c = endpoint();
        const std::string p = "http://127.0.0.1:" + std::to_string(peer_);
        // exec: the shell becomes etcd, so the child's PID is etcd's.
        const std::string cmd = "exec '" + etcd + "' --name default --data-dir '" + dir_ +
                                "/data' --listen-client-urls " + c + " --advertise-client-urls " +
                                c + " --listen-peer-urls " + p + " --initial-advertise-peer-urls " +
                                p + " --initial-cluster default=" + p + tls_flags() + " >>'" +
                                dir_ + "/etcd.log' 2>&1";
        proc_ = std::make_unique<child>(std::vector<std::string>{"/bin/sh", "-c", cmd});
    }
    /// SIGKILLs etcd (by PID) and reaps it.
    void kill() { proc_.reset(); }
    /// SIGSTOP / SIGCONT: a hung etcd, whose connections stay open and answer nothing.
    void pause() { proc_->signal(SIGSTOP); }
    void resume() { proc_->signal(SIGCONT); }

    /// Waits until etcd answers /health with true, within `limit`.
    net::awaitable<bool> async_ready(detail::curl_multi& http,
                                     std::chrono::milliseconds limit = std::chrono::seconds(30)) {
        net::steady_timer t(co_await net::this_coro::executor);
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < deadline) {
            try {
                detail::http_request r;
                test_access().apply(r);
                r.authorization.clear();
                r.url = endpoint() + "/health";
                r.timeout = std::chrono::milliseconds(1000);
                const auto a = co_await http.async_request(r);
                if (a.status == 200 && a.body.find("true") != std::string::npos) co_return true;
            } catch (const std::exception&) {
            }
            t.expires_after(std::chrono::milliseconds(100));
            co_await t.async_wait(use_tuple);
        }
        co_return false;
    }

    std::string endpoint() const {
        return (tls ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client_);
    }
    /// Set before start(): https.
    std::optional<etcd_tls> tls;
    std::uint16_t client_port() const { return client_; }
    const std::string& dir() const { return dir_; }

  private:
    std::string tls_flags() const {
        if (!tls) return "";
        std::string f = " --cert-file '" + tls->cert + "' --key-file '" + tls->key +
                        "' --auth-token simple --auth-token-ttl " + std::to_string(tls->token_ttl_s);
        if (!tls->client_ca.empty())
            f += " --client-cert-auth --trusted-ca-file '" + tls->client_ca + "'";
        return f;
    }
    std::uint16_t client_, peer_;
    std::string dir_;
    std::unique_ptr<child> proc_;
};

inline std::string b64(std::string_view in) {
    static const char* chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    std::uint32_t v = 0;
    int bits = 0;
    for (const unsigned char c : in) {
        v = (v << 8) | c;
        bits += 8;
        while (bits >= 6) out += chars[(v >> (bits -= 6)) & 63];
    }
    if (bits > 0) out += chars[(v << (6 - bits)) & 63];
    while (out.size() % 4) out += '=';
    return out;
}

/// POSTs `body` to etcd's gateway at `path`; yields the answer, throws unless HTTP 200.
inline net::awaitable<nlohmann::json> etcd_post(detail::curl_multi& http, std::string endpoint,
                                                std::string path, nlohmann::json body) {
    detail::http_request r;
    test_access().apply(r);
    r.url = endpoint + path;
    r.post = body.dump();
    const auto a = co_await http.async_request(r);
    if (a.status != 200)
        throw std::runtime_error(r.url + " answered " + std::to_string(a.status) + ": " + a.body);
    co_return nlohmann::json::parse(a.body);
}

inline net::awaitable<void> etcd_put(detail::curl_multi& http, std::string endpoint,
                                     std::string key, std::string value) {
    nlohmann::json body;
    body["key"] = b64(key);
    body["value"] = b64(value);
    co_await etcd_post(http, endpoint, "/v3/kv/put", body);
}

inline net::awaitable<void> etcd_delete(detail::curl_multi& http, std::string endpoint,
                                        std::string key) {
    nlohmann::json body;
    body["key"] = b64(key);
    co_await etcd_post(http, endpoint, "/v3/kv/deleterange", body);
}

/// The lease `key` is under (0: none, or no such key).
inline net::awaitable<std::int64_t> etcd_lease_of(detail::curl_multi& http, std::string endpoint,
                                                  std::string key) {
    nlohmann::json body;
    body["key"] = b64(key);
    const auto a = co_await etcd_post(http, endpoint, "/v3/kv/range", body);
    if (!a.contains("kvs") || a["kvs"].empty()) co_return 0;
    const auto& kv = a["kvs"][0];
    co_return kv.contains("lease") ? std::stoll(kv["lease"].get<std::string>()) : 0;
}

/// Whether `key` exists.
inline net::awaitable<bool> etcd_has(detail::curl_multi& http, std::string endpoint,
                                     std::string key) {
    nlohmann::json body;
    body["key"] = b64(key);
    const auto a = co_await etcd_post(http, endpoint, "/v3/kv/range", body);
    co_return a.contains("kvs") && !a["kvs"].empty();
}

}  // namespace ordo::test
