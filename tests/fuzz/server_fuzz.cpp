// Fuzz target 2: a whole server connection, with ordo-inc-server's handlers, fed arbitrary
// bytes by a raw client over inproc:// (no sockets). The client writes the input, ends its
// side and reads whatever comes back; the server must answer or close with a protocol error,
// and then stop cleanly. A crash, a leak or a server that does not stop is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "inc_handlers.hpp"

namespace net = ordo::net;

namespace {

template <class Cond>
void run_until(net::io_context& io, Cond done, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && !io.stopped() && std::chrono::steady_clock::now() < deadline)
        io.run_one_for(std::chrono::milliseconds(1));
}

}  // namespace

namespace {

// (Not in the extern "C" function itself: GCC 12 gives the coroutine lambdas of such a function
// clashing assembler names.)
int run_one(const std::uint8_t* data, std::size_t size) {
    static int runs = 0;
    net::io_context io;
    ordo::server_options o;
    // An input whose first byte is odd (a 3-element array: a notification such as ordo.auth)
    // meets a server that authenticates: the gate and its refusals get fuzzed too.
    if (size > 0 && (data[0] & 1)) {
        o.authenticate = ordo::authenticate_tokens({{"fuzz-token-0123456789", "fuzz"}});
        o.allow_introspection = ordo::allow_subjects({"fuzz"});
    }
    o.peer.comm.limits.max_message_bytes = 1 << 16;  // reach the limits with short inputs
    o.peer.comm.limits.max_container_length = 256;
    o.peer.comm.limits.max_depth = 16;
    ordo::server srv(io.get_executor(), o);
    long total = 0;
    serve_counter(srv, total);
    const std::string url = srv.listen("inproc://fuzz-server-" + std::to_string(runs++));
    bool client_done = false, stopped = false;
    const std::string input(reinterpret_cast<const char*>(data), size);
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            auto t = co_await ordo::async_connect_transport(url);
            std::error_code ec;
            co_await t->async_write(net::buffer(input), ec);
            t->shutdown_send();
            // Read the answers until the server closes (or 1 MiB: enough for any answer here).
            char buf[4096];
            for (std::size_t got = 0; !ec && got < (1u << 20);)
                got += co_await t->async_read_some(net::buffer(buf), ec);
            client_done = true;
        },
        net::detached);
    // Until the server has closed the connection; handlers such as sleep_ms may hold it open,
    // so after 20 ms the server is stopped anyway (that cancels them).
    run_until(io, [&] { return client_done; }, std::chrono::milliseconds(20));
    net::co_spawn(io, srv.async_stop(), [&](std::exception_ptr) { stopped = true; });
    run_until(io, [&] { return stopped; }, std::chrono::seconds(5));
    if (!stopped) __builtin_trap();  // the server did not stop within 5 s
    return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return run_one(data, size);
}
