// ordo-inc-server --listen URL [--listen URL...] [--liveness-timeout-ms L]
//                 [--cert F --key F [--ca F]]
// Serves counter (examples/counter.hpp) and echo(any) on every URL, of any scheme: tcp://,
// unix://, tls://, zmq+tcp://, zmq+ipc:// (and inproc://, reachable from this process only).
// --cert/--key are the certificate and key of tls:// listeners; with --ca, clients must show a
// certificate signed by that CA (mutual TLS). Prints "listening on URL" for each (with the real
// port for port 0), "refused: <why>" on stderr for failed TLS handshakes, and exits 0 after a
// graceful stop on SIGINT/SIGTERM.
#include <asio/signal_set.hpp>

#include <iostream>
#include <vector>

#include "inc_handlers.hpp"

namespace net = ordo::net;

int main(int argc, char** argv) {
    std::vector<std::string> urls;
    ordo::server_options options;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--listen" && i + 1 < argc) {
            urls.push_back(argv[++i]);
        } else if (a == "--liveness-timeout-ms" && i + 1 < argc) {
            options.peer.liveness_timeout = std::chrono::milliseconds(std::stol(argv[++i]));
        } else if (a == "--cert" && i + 1 < argc) {
            options.peer.transport.tls.cert_file = argv[++i];
        } else if (a == "--key" && i + 1 < argc) {
            options.peer.transport.tls.key_file = argv[++i];
        } else if (a == "--ca" && i + 1 < argc) {
            options.peer.transport.tls.ca_file = argv[++i];
        } else {
            std::cerr << "usage: ordo-inc-server --listen URL [--listen URL...] "
                         "[--liveness-timeout-ms L] [--cert F --key F [--ca F]]\n";
            return 2;
        }
    }
    if (urls.empty()) urls.push_back("tcp://127.0.0.1:7000");

    options.peer.transport.on_refused = [](const std::string& why) {
        std::cerr << "refused: " << why << std::endl;
    };
    net::io_context io;
    ordo::server srv(io.get_executor(), options);
    long total = 0;  // process-wide, shared by every peer
    serve_counter(srv, total);

    try {
        for (const auto& u : urls) std::cout << "listening on " << srv.listen(u) << std::endl;
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
    net::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code ec, int) {
        if (ec) return;
        net::co_spawn(io, srv.async_stop(), net::detached);
    });
    io.run();
    return 0;
}
