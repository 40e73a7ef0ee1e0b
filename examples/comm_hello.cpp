// The smallest use of ordo's comm layer: one BatchedComm over tcp, ordered messages both ways.
// A server echoes every message back; the client sends ten, prints the echoes in order and
// closes (close() flushes before it closes).
#include <iostream>
#include <memory>
#include <string>

#include <msgpack.hpp>

#include "ordo/comm/batched_comm.hpp"
#include "run_main.hpp"

namespace net = ordo::net;

net::awaitable<void> run() {
    auto ex = co_await net::this_coro::executor;
    auto listener = ordo::listen(ex, "tcp://127.0.0.1:0");  // port 0: the system picks one
    std::cout << "listening on " << listener->local_address() << "\n";

    auto client_side = co_await ordo::async_connect_transport(listener->local_address());
    auto server_side = co_await listener->async_accept();

    // The server echoes each message (one msgpack object) back on the same ordered stream.
    std::unique_ptr<ordo::batched_comm> server;
    server = std::make_unique<ordo::batched_comm>(
        std::move(server_side), ordo::comm_options{},
        [&](std::string_view message) { server->send(message); });

    int echoes = 0;
    ordo::comm_options options;
    options.interval = std::chrono::milliseconds(2);  // coalesce writes, at most one per 2 ms
    ordo::batched_comm client(std::move(client_side), options, [&](std::string_view message) {
        auto text = msgpack::unpack(message.data(), message.size())->as<std::string>();
        std::cout << "echo " << ++echoes << ": " << text << "\n";
    });
    server->start();
    client.start();

    for (int i = 1; i <= 10; ++i) {
        msgpack::sbuffer buf;
        msgpack::pack(buf, "message " + std::to_string(i));
        client.send({buf.data(), buf.size()});  // never blocks
    }
    net::steady_timer wait(ex);
    for (int tries = 0; echoes < 10 && tries < 500; ++tries) {
        wait.expires_after(std::chrono::milliseconds(10));
        co_await wait.async_wait(net::use_awaitable);
    }
    auto result = co_await client.async_close();
    const auto& c = client.counters();
    std::cout << "closed: " << result.reason << "\n"
              << c.messages_sent << " messages in " << c.writes << " writes, " << echoes
              << " echoes received in order\n";
    if (echoes != 10) throw std::runtime_error("missing echoes");
}

int main() {
    return run_main("comm_hello: ", run());
}
