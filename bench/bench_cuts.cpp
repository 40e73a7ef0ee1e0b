#include "bench_cuts.hpp"

#include "ordo/address.hpp"
#include "support/cutting_proxy.hpp"

bench_cuts::bench_cuts(const std::string& url, std::size_t cuts, std::uint64_t seed) {
    const auto a = ordo::parse_address(url);
    ordo::test::cut_options o;
    o.seed = seed;
    o.min_bytes = 100'000;
    o.max_bytes = 8'000'000;
    o.max_cuts = cuts;
    proxy_ = std::make_unique<ordo::test::cutting_proxy>(a.host, a.port, o);
}

bench_cuts::~bench_cuts() = default;

std::string bench_cuts::url() const {
    return proxy_->url();
}

std::size_t bench_cuts::cuts() const {
    return proxy_->cuts();
}
