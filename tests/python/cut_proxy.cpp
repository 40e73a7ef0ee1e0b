// ordo-cut-proxy: tests/support/cutting_proxy.hpp as a program, for the Python tests
// (tests/python/test_faults.py, test_dask.py): forwards 127.0.0.1:<any port> to --to and resets each
// connection after a random number of bytes in [--min-bytes, --max-bytes]. Prints
// "listening on tcp://127.0.0.1:PORT", then runs until stdin closes (the test's pipe: a test
// that dies takes the proxy with it) and prints "cuts N" on exit.
#include <cstdio>
#include <iostream>
#include <string>

#include "ordo/address.hpp"
#include "support/cutting_proxy.hpp"

int main(int argc, char** argv) {
    if (argc != 5 || std::string(argv[1]) != "--to") {
        std::cerr << "usage: ordo-cut-proxy --to tcp://HOST:PORT MIN_BYTES MAX_BYTES\n";
        return 2;
    }
    const auto a = ordo::parse_address(argv[2]);
    ordo::test::cut_options o;
    o.min_bytes = std::stoul(argv[3]);
    o.max_bytes = std::stoul(argv[4]);
    ordo::test::cutting_proxy proxy(a.host, a.port, o);
    std::cout << "listening on " << proxy.url() << std::endl;
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    std::cout << "cuts " << proxy.cuts() << std::endl;
    return 0;
}
