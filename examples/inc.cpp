// ordo in one page: a server and a client over tcp, a typed call, ordered one-way messages, a
// deadline and an error.
#include <iostream>

#include "counter.hpp"
#include "run_main.hpp"

namespace net = ordo::net;
using namespace std::chrono_literals;

net::awaitable<void> run() {
    auto ex = co_await net::this_coro::executor;
    long total = 0;
    ordo::server srv(ex);
    srv.on(counter{}.inc, [](int x) { return x + 1; });
    srv.on(counter{}.add, [&](int x) { return total += x; });
    srv.on(counter{}.total, [&] { return total; });
    srv.on(counter{}.sleep_ms, [](int ms) -> net::awaitable<int> {
        net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
        co_await t.async_wait(net::use_awaitable);  // other calls go on meanwhile
        co_return ms;
    });
    srv.on(counter{}.fail, [](std::string why) { throw std::runtime_error(why); });
    const std::string url = srv.listen("tcp://127.0.0.1:0");

    // "tcp://...": one ordered connection. The call sites below do not depend on it.
    ordo::channel ch = co_await ordo::async_connect(url);
    auto c = ordo::stub<counter>(ch);

    int v = co_await c.inc(1);
    std::cout << "inc(1) = " << v << "\n";

    c.add.notify(5);  // one-way, never blocks
    c.add.notify(6);
    std::cout << "total() = " << co_await c.total() << " (both notifications came first)\n";

    try {
        co_await c.sleep_ms(10'000, ordo::timeout(50ms));
    } catch (const ordo::rpc_error& e) {
        std::cout << "deadline: " << e.what() << "\n";
    }
    try {
        co_await c.fail("account 42 is frozen");
    } catch (const ordo::rpc_error& e) {
        std::cout << "error: " << e.what() << "\n";
    }
    co_await srv.async_stop();
}

int main() {
    return run_main("inc: ", run());
}
