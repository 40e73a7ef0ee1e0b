// Shared by the transport tests: a URL for every scheme, a connected pair of transports, and
// numbered msgpack messages whose order can be checked.
#pragma once

#include <unistd.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include "ordo/comm/transport.hpp"
#include "support/certs.hpp"

namespace ordo::test {

/// Every transport scheme ordo has.
inline const std::string all_schemes[] = {"tcp", "unix", "inproc", "tls", "zmq+tcp", "zmq+ipc"};

/// Certificates shared by a test program's TLS connections.
inline tls_files& shared_tls_files() {
    static tls_files files;
    return files;
}

/// A fresh address to listen on for `scheme` (port 0, a new path or name).
inline std::string listen_url(const std::string& scheme) {
    static std::atomic<int> n{0};
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(n++);
    if (scheme == "unix") return "unix:///tmp/ordo-test-" + tag + ".sock";
    if (scheme == "zmq+ipc") return "zmq+ipc:///tmp/ordo-ztest-" + tag + ".sock";
    if (scheme == "inproc") return "inproc://test-" + tag;
    if (scheme == "tls") return "tls://127.0.0.1:0" + shared_tls_files().server_params();
    return scheme + "://127.0.0.1:0";
}

/// What a client adds to a listener's address to connect (the CA for tls).
inline std::string connect_url(const std::string& bound) {
    if (bound.rfind("tls://", 0) == 0) return bound + shared_tls_files().client_params();
    return bound;
}

/// A name for gtest: letters and digits only.
inline std::string scheme_name(std::string s) {
    for (auto& c : s)
        if (c == '+') c = '_';
    return s;
}

struct transport_pair {
    std::unique_ptr<listener> l;
    std::unique_ptr<transport> client, server;
};

inline net::awaitable<transport_pair> connect_pair(const std::string& scheme) {
    transport_pair p;
    p.l = listen(co_await net::this_coro::executor, listen_url(scheme));
    p.client = co_await async_connect_transport(connect_url(p.l->local_address()));
    p.server = co_await p.l->async_accept();
    co_return p;
}

// Message i: a msgpack uint32 (0xce + 4 bytes, big-endian), optionally followed in an array by
// a bin payload of `pad` bytes.
inline std::string seq_msg(std::uint32_t i, std::size_t pad = 0) {
    std::string s;
    if (pad > 0) s += "\x92";
    s += '\xce';
    for (int shift = 24; shift >= 0; shift -= 8) s += char((i >> shift) & 0xff);
    if (pad > 0) {
        s += '\xc6';
        for (int shift = 24; shift >= 0; shift -= 8) s += char((pad >> shift) & 0xff);
        s += std::string(pad, 'p');
    }
    return s;
}

inline std::uint32_t seq_of(std::string_view m) {
    if (!m.empty() && m[0] == '\x92') m.remove_prefix(1);
    if (m.size() < 5 || m[0] != '\xce') throw std::runtime_error("not a sequence message");
    std::uint32_t v = 0;
    for (int i = 1; i <= 4; ++i) v = (v << 8) | static_cast<unsigned char>(m[i]);
    return v;
}

}  // namespace ordo::test
