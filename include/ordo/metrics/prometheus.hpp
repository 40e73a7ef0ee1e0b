// Prometheus metrics for ordo servers and routers, served over HTTP by prometheus-cpp's
// exposer (Debian's prometheus-cpp-dev; link ordo-prometheus: `pkg-config --libs
// ordo-prometheus`, or the meson dependency ordo_prometheus_dep).
//
//   ordo::prometheus_exporter metrics("127.0.0.1:9464");
//   metrics.add(srv);                    // ordo_server_* for that server
//   metrics.add(router, "inference");    // ordo_router_* with router="inference"
//   std::cout << "metrics on " << metrics.url() << "\n";
//
// Figures are read when Prometheus scrapes, on each server's or router's own executor (the
// exporter posts there and waits up to a second): nothing is counted twice and the hot path only
// bumps ordo's own counters. Adding a server turns on its handler latency histogram
// (handlers::time_calls). A server or router that is gone is left out from the next scrape on;
// destroy the exporter before the io_context a server or router it reads runs on.
//
// Names, all with the label `server` or `router` when a name was given to add():
//   ordo_server_requests_total{method,code}       requests answered, code "ok" or an errc word
//   ordo_server_request_duration_seconds{method}  handler latency histogram
//   ordo_server_notifications_total{method,outcome}
//   ordo_server_unknown_requests_total, ordo_server_unknown_notifications_total
//   ordo_server_connections, ordo_server_connections_accepted_total,
//   ordo_server_connections_refused_total, ordo_server_received_bytes_total,
//   ordo_server_sent_bytes_total, ordo_server_queued_messages, ordo_server_running_handlers,
//   ordo_server_detached_sessions, ordo_server_sessions_moved_total,
//   ordo_server_memory_used_bytes, ordo_server_memory_budget_bytes
//   ordo_server_batches_total{method}, ordo_server_batch_size{method} (histogram)
//   ordo_router_calls_total, ordo_router_queued_calls, ordo_router_retried_total,
//   ordo_router_moved_total, ordo_router_over_budget_total,
//   ordo_router_replicas_lost_total
//   ordo_router_replica_live{replica}, ordo_router_replica_in_flight{replica},
//   ordo_router_replica_queued_calls{replica}, ordo_router_replica_calls_total{replica,outcome},
//   ordo_router_replica_overloaded_total{replica},
//   ordo_router_replica_latency_seconds{replica,quantile} (gauges: 0.5, 0.9, 0.99)
#pragma once

#include "ordo/config.hpp"

#include <memory>
#include <string>

namespace ordo {

class server;
class router;

class prometheus_exporter {
  public:
    /// Serves http://HOST:PORT/metrics (`bind` is "HOST:PORT"; port 0 picks a free one).
    /// Throws ordo::rpc_error (errc::bad_address) naming the address when it cannot listen.
    explicit prometheus_exporter(const std::string& bind);
    ~prometheus_exporter();
    prometheus_exporter(const prometheus_exporter&) = delete;
    prometheus_exporter& operator=(const prometheus_exporter&) = delete;

    /// Exports `s` until it is destroyed (then its series disappear). `name` non-empty adds
    /// the label server="name", to tell several servers apart. Call on the server's executor,
    /// before serving or from it.
    void add(server& s, const std::string& name = {});
    /// Exports the router and its replicas while it lives (held weakly).
    void add(const std::shared_ptr<router>& r, const std::string& name = {});

    /// The URL to scrape: http://HOST:PORT/metrics with the real port.
    std::string url() const;

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ordo
