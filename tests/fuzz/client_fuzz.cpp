// Fuzz target 3: the client side fed arbitrary responses while calls are pending. A peer makes
// 8 calls (msgids 0..7) and 2 notifications over inproc://; a raw server reads them and
// answers with the input, then closes. Every call must end (with a result or an error), none
// may hang; a crash, a leak or a call left pending is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ordo/ordo.hpp"

namespace net = ordo::net;

namespace {

// (Not in the extern "C" function itself: GCC 12 gives the coroutine lambdas of such a function
// clashing assembler names.)
int run_one(const std::uint8_t* data, std::size_t size) {
    static int runs = 0;
    net::io_context io;
    auto l = ordo::listen(io.get_executor(), "inproc://fuzz-client-" + std::to_string(runs++));
    const std::string input(reinterpret_cast<const char*>(data), size);
    constexpr int calls = 8;
    int ended = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            auto server_side = co_await l->async_accept();
            std::error_code ec;
            co_await server_side->async_write(net::buffer(input), ec);
            server_side->shutdown_send();
            char buf[4096];
            while (!ec) co_await server_side->async_read_some(net::buffer(buf), ec);
        },
        net::detached);
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            ordo::peer_options o;
            o.comm.limits.max_message_bytes = 1 << 16;
            o.comm.limits.max_container_length = 256;
            o.comm.limits.max_depth = 16;
            auto p = ordo::make_peer(co_await ordo::async_connect_transport(l->local_address()), o);
            p->start();
            ordo::channel ch(p);
            for (int i = 0; i < calls; ++i) {
                if (i == 3) ch.notify("add", 1);
                ch.async_call<ordo::value>("echo", i, [&](std::error_code, ordo::value) { ++ended; });
            }
            ch.notify("add", 2);
            co_await p->async_wait_closed();
        },
        net::detached);
    io.run_for(std::chrono::seconds(5));
    if (ended != calls) __builtin_trap();  // a call neither answered nor failed
    return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return run_one(data, size);
}
