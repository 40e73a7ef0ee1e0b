#include "tools/gateway_command.hpp"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <iostream>
#include <thread>

#include <ordo/rpc/connect.hpp>
#include <ordo/rpc/peer.hpp>

namespace ordo_tool {

namespace net = ordo::net;

void add_gateway_options(CLI::App* sub, gateway_args& a) {
    auto& o = a.options;
    sub->add_option("--listen", o.listen,
                    "http://HOST:PORT to serve HTTP on (PORT 0: any), or "
                    "https://HOST:PORT?cert=F&key=F[&ca=F] (ca: clients need a certificate)")
        ->capture_default_str();
    sub->add_option("--to", a.to, "the channel: tcp://, unix://, tls://, route+..., ?mode=pooled")
        ->required();
    auto ms = [&](const char* name, std::chrono::milliseconds& d, const char* what) {
        sub->add_option_function<long>(
               name, [&d](long v) { d = std::chrono::milliseconds(v); }, what)
            ->check(CLI::NonNegativeNumber)
            ->default_str(std::to_string(d.count()));
    };
    sub->add_option("--max-connections", o.max_connections,
                    "connections open at once; one more closes the oldest that has sent no "
                    "whole request, else is answered 503")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    sub->add_option("--max-connections-per-address", o.max_connections_per_address,
                    "connections open at once from one address (IPv6: a /64); 0: no cap")
        ->capture_default_str();
    sub->add_option("--max-header-bytes", o.max_header_bytes, "request line and headers (431)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    sub->add_option("--max-body-bytes", o.max_body_bytes, "request body (413)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    ms("--request-timeout-ms", o.request_timeout,
       "headers, then body, must arrive within this (408)");
    ms("--idle-timeout-ms", o.idle_timeout, "an idle keep-alive connection is closed after this");
    ms("--timeout-ms", o.default_timeout, "deadline of calls that give none (0: none)");
    sub->add_flag("--metrics", o.metrics, "serve GET /metrics (Prometheus text format)");
    sub->add_flag("--expose-admin", o.expose_admin,
                  "let HTTP clients call the reserved ordo.* methods (404 otherwise)");
    sub->add_option("--cors-origin", o.cors_origin,
                    "grant this origin (https://app.example) cross-origin calls (none otherwise)");
    sub->add_option("--allow-host", o.allowed_hosts,
                    "serve only requests whose Host header names this host (repeatable; any "
                    "otherwise)");
    sub->add_flag("--no-reconnect", a.no_reconnect,
                  "open --to as it is: a plain tcp://, unix:// or tls:// connection that is lost "
                  "stays lost (by default the gateway reconnects)");
    sub->add_option("--auth-tokens", a.auth_tokens,
                    "callers need Authorization: Bearer TOKEN with a token of FILE (lines "
                    "\"TOKEN SUBJECT\"; 401 otherwise); each caller's calls go upstream over a "
                    "connection that presents its token, so the backend names the caller")
        ->type_name("FILE");
    sub->add_option("--connect-timeout-ms", a.connect_timeout_ms,
                    "opening the channel may take this long")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
}

std::string channel_url(const gateway_args& a) {
    const std::string& u = a.to;
    const bool ordered = u.starts_with("tcp://") || u.starts_with("unix://") ||
                         u.starts_with("tls://");
    if (a.no_reconnect || !ordered || u.find("mode=pooled") != std::string::npos ||
        u.find("resume_ms=") != std::string::npos)
        return u;
    return "route+" + u;
}

namespace {

// `url` without its token_file= parameter: the caller's own token replaces the gateway's.
std::string without_token_file(std::string url) {
    const auto q = url.find('?');
    if (q == std::string::npos) return url;
    std::string kept;
    std::string_view rest = std::string_view(url).substr(q + 1);
    while (!rest.empty()) {
        const auto amp = rest.find('&');
        const std::string_view item = rest.substr(0, amp);
        rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
        if (item.starts_with("token_file=")) continue;
        kept += (kept.empty() ? "?" : "&") + std::string(item);
    }
    return url.substr(0, q) + kept;
}

net::awaitable<ordo::channel> connect_as(std::string url, ordo::credentials who) {
    ordo::peer_options o;
    o.credentials = std::move(who);
    co_return co_await ordo::async_connect(url, std::move(o), nullptr);
}

}  // namespace

int run_gateway(gateway_args a) {
    // SIGINT and SIGTERM are taken by sigwait() below, in this thread only: the loop's thread,
    // started from here, inherits the blocked mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    // The channel's loop runs on its own thread: stopping the gateway waits for calls in
    // flight, which complete there.
    net::io_context io;
    auto work = net::make_work_guard(io);
    std::thread loop([&io] { io.run(); });
    ordo::channel ch;
    // The channel is released on its loop's thread, then the loop stops.
    auto finish = [&](int status) {
        std::promise<void> released;
        net::post(io, [&] {
            ch = ordo::channel();
            released.set_value();
        });
        released.get_future().wait();
        work.reset();
        io.stop();
        loop.join();
        return status;
    };
    try {
        const std::string url = channel_url(a);  // async_connect borrows it
        auto connecting = net::co_spawn(io, ordo::async_connect(url), net::use_future);
        if (connecting.wait_for(std::chrono::milliseconds(a.connect_timeout_ms)) !=
            std::future_status::ready) {
            std::cerr << "ordo: gateway to " << a.to << " failed: not connected within "
                      << a.connect_timeout_ms << " ms\n";
            return finish(1);
        }
        ch = connecting.get();
    } catch (const ordo::rpc_error& e) {
        std::cerr << "ordo: gateway to " << a.to << " failed: "
                  << (e.detail().empty() ? e.what() : e.detail()) << '\n';
        return finish(1);
    } catch (const std::exception& e) {
        std::cerr << "ordo: gateway to " << a.to << " failed: " << e.what() << '\n';
        return finish(1);
    }
    a.options.on_event = [](const std::string& line) { std::cerr << line << std::endl; };
    if (!a.auth_tokens.empty()) {
        try {
            a.options.auth_tokens = ordo::read_token_file(a.auth_tokens);
        } catch (const std::exception& e) {
            std::cerr << "ordo: gateway --auth-tokens: " << e.what() << '\n';
            return finish(1);
        }
        a.options.connect_as = [url = without_token_file(channel_url(a))](ordo::credentials c) {
            return connect_as(url, std::move(c));
        };
    }
    try {
        ordo::gateway gw(ch, a.options);
        std::cout << "listening on " << gw.url() << " for " << a.to << std::endl;
        int sig = 0;
        sigwait(&stop_signals, &sig);
        gw.stop();
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return finish(1);
    }
    return finish(0);
}

}  // namespace ordo_tool
