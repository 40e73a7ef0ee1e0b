// ordo-bench --cuts N: the client reaches the server through a userspace proxy that resets the
// connection N times (tests/support/cutting_proxy.hpp). In a translation unit of its own, so that
// the proxy's Asio code does not change how ordo_bench.cpp's handlers are compiled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ordo::test {
class cutting_proxy;
}

/// Forwards to `url` (tcp://host:port), resetting each connection after a uniformly random
/// 100 KB to 8 MB forwarded (both directions), `cuts` times in all; `seed` draws the points.
class bench_cuts {
  public:
    bench_cuts(const std::string& url, std::size_t cuts, std::uint64_t seed);
    ~bench_cuts();
    bench_cuts(const bench_cuts&) = delete;
    bench_cuts& operator=(const bench_cuts&) = delete;

    /// The URL the client connects to instead.
    std::string url() const;
    /// Connections cut so far.
    std::size_t cuts() const;

  private:
    std::unique_ptr<ordo::test::cutting_proxy> proxy_;
};
