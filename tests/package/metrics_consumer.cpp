// Built by tests/package/CMakeLists.txt when the install has ordo::prometheus: an exporter that
// listens and says where.
#include <ordo/metrics/prometheus.hpp>

#include <iostream>

int main() {
    ordo::prometheus_exporter metrics("127.0.0.1:0");
    std::cout << "metrics on " << metrics.url() << std::endl;
}
