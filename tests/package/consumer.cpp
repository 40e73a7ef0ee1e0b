// A program that uses an installed ordo the way a user's would: a server and a client in one
// process, one typed call over tcp, the result on stdout. tests/package/consumer_test.sh builds it
// against a staged install, with CMake's find_package(ordo) and with pkg-config.
#include <exception>
#include <iostream>
#include <string>

#include <ordo/ordo.hpp>

// Every build of this program must see the settings libordo was compiled with, however it found
// ordo. A build that misses one may still run cleanly by luck, so it is checked here, not left to
// a crash.
#if !defined(ASIO_STANDALONE) || !defined(ASIO_NO_DEPRECATED) ||                       \
    !defined(ASIO_SEPARATE_COMPILATION) || !defined(ASIO_DISABLE_STD_ALIGNED_ALLOC) || \
    !defined(ASIO_HAS_CO_AWAIT) || !defined(MSGPACK_NO_BOOST)
#error "consumer: ordo's Asio and msgpack settings did not reach this translation unit"
#endif

namespace net = ordo::net;

struct greeter : ordo::interface {
    ordo::method<std::string(std::string)> hello{"hello"};
};

net::awaitable<void> run() {
    ordo::server srv(co_await net::this_coro::executor);
    srv.on(greeter{}.hello, [](std::string who) { return "hello, " + who; });
    const std::string url = srv.listen("tcp://127.0.0.1:0");

    ordo::channel ch = co_await ordo::async_connect(url);
    std::cout << co_await ordo::stub<greeter>(ch).hello("consumer") << "\n";
    co_await srv.async_stop();
}

int main() {
    net::io_context io;
    int status = 0;
    net::co_spawn(io, run(), [&](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& ex) {
            std::cerr << "consumer: " << ex.what() << "\n";
            status = 1;
        }
    });
    io.run();
    return status;
}
