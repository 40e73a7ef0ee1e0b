// The README's hello world: connect, a typed stub, one call. It includes <ordo/client.hpp>, what
// a call site needs, and compiles in well under half the time of <ordo/ordo.hpp>
// (bench/call_site_compile.sh). Against a running server:
//   ordo-inc-server --listen tcp://127.0.0.1:7000 &
//   ./hello tcp://127.0.0.1:7000          # prints inc(1) = 2
#include <ordo/client.hpp>

#include <exception>
#include <iostream>
#include <string>

struct counter : ordo::interface {
    ordo::method<int(int)> inc{"inc"};
};

ordo::net::awaitable<void> hello(std::string url) {
    ordo::channel ch = co_await ordo::async_connect(url);
    auto c = ordo::stub<counter>(ch);
    int v = co_await c.inc(1);
    std::cout << "inc(1) = " << v << "\n";
}

int main(int argc, char** argv) {
    try {
        ordo::run(hello(argc > 1 ? argv[1] : "tcp://127.0.0.1:7000"));
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";  // ordo: call inc to tcp://... failed: <reason>
        return 1;
    }
}
