// ordo::prometheus_exporter (ordo/metrics/prometheus.hpp): one prometheus::Collectable that reads
// every added server and router on its own executor at scrape time.
#include "ordo/metrics/prometheus.hpp"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "ordo/rpc/router.hpp"
#include "ordo/rpc/server.hpp"

namespace ordo {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using labels = std::vector<ClientMetric::Label>;

constexpr std::chrono::milliseconds scrape_wait{1000};

// The families of one scrape, by name, in the order first met.
class families {
  public:
    ClientMetric& add(const std::string& name, MetricType type, const std::string& help, labels l) {
        auto it = index_.find(name);
        if (it == index_.end()) {
            it = index_.emplace(name, out_.size()).first;
            out_.push_back({name, help, type, {}});
        }
        auto& m = out_[it->second].metric.emplace_back();
        m.label = std::move(l);
        return m;
    }
    void counter(const std::string& name, const std::string& help, labels l, double v) {
        add(name, MetricType::Counter, help, std::move(l)).counter.value = v;
    }
    void gauge(const std::string& name, const std::string& help, labels l, double v) {
        add(name, MetricType::Gauge, help, std::move(l)).gauge.value = v;
    }
    std::vector<MetricFamily> take() { return std::move(out_); }

  private:
    std::map<std::string, std::size_t> index_;
    std::vector<MetricFamily> out_;
};

labels with(labels base, std::string name, std::string value) {
    base.push_back({std::move(name), std::move(value)});
    return base;
}

// "ok", or the code's words with underscores ("timed_out").
std::string code_label(std::size_t i) {
    if (i == 0) return "ok";
    std::string s = to_string(static_cast<errc>(i));
    for (auto& c : s)
        if (c == ' ') c = '_';
    return s;
}

void export_server(families& f, const labels& base, const server_stats& s) {
    f.gauge("ordo_server_connections", "Connections open", base, double(s.connections));
    f.counter("ordo_server_connections_accepted_total", "Connections accepted, refused included",
              base, double(s.connections_accepted));
    f.counter("ordo_server_connections_refused_total",
              "Connections refused (max_connections, out of descriptors)", base,
              double(s.connections_refused));
    f.counter("ordo_server_received_bytes_total", "Bytes received over every connection", base,
              double(s.bytes_received));
    f.counter("ordo_server_sent_bytes_total", "Bytes sent over every connection", base,
              double(s.bytes_sent));
    f.gauge("ordo_server_queued_messages", "Messages waiting for a serial handler", base,
            double(s.queued_messages));
    f.gauge("ordo_server_running_handlers", "Handlers running", base, double(s.running_handlers));
    f.gauge("ordo_server_detached_sessions", "Resumable sessions waiting for their caller", base,
            double(s.detached_sessions));
    f.counter("ordo_server_sessions_moved_total",
              "Resumes whose connection moved to its session's loop", base,
              double(s.sessions_moved));
    f.gauge("ordo_server_memory_used_bytes", "Bytes charged to the memory budget", base,
            double(s.memory_used));
    f.gauge("ordo_server_memory_budget_bytes", "The memory budget (0: none)", base,
            double(s.memory_budget));
    f.counter("ordo_server_unknown_requests_total", "Requests for methods with no handler", base,
              double(s.unknown_requests));
    f.counter("ordo_server_unknown_notifications_total",
              "Notifications for methods with no handler (dropped)", base,
              double(s.unknown_notifications));
    if (s.concurrency.what != concurrency_limit::kind::none) {
        f.gauge("ordo_server_concurrency_limit", "Calls the server's concurrency limit lets run",
                base, double(s.concurrency.limit));
        f.gauge("ordo_server_concurrency_in_flight", "Calls holding a slot of the limit", base,
                double(s.concurrency.in_flight));
        f.counter("ordo_server_concurrency_refused_total",
                  "Calls the limit refused (overloaded)", base, double(s.concurrency.refused));
        // Shared among callers: the 8 that called most, and "other" (bounded cardinality).
        for (const auto& c : s.concurrency.callers) {
            const labels cl = with(base, "caller", c.caller);
            f.gauge("ordo_server_caller_running", "Calls of a caller holding a slot", cl,
                    double(c.running));
            f.gauge("ordo_server_caller_waiting", "Calls of a caller waiting for a slot", cl,
                    double(c.waiting));
            const char* help = "Calls of a caller under the shared limit, by outcome";
            f.counter("ordo_server_caller_calls_total", help, with(cl, "outcome", "served"),
                      double(c.served));
            f.counter("ordo_server_caller_calls_total", help, with(cl, "outcome", "queued"),
                      double(c.queued));
            f.counter("ordo_server_caller_calls_total", help, with(cl, "outcome", "refused"),
                      double(c.refused));
        }
    }
    for (const auto& m : s.methods) {
        const labels ml = with(base, "method", m.name);
        for (std::size_t i = 0; i < m.requests.size(); ++i) {
            if (i != 0 && m.requests[i] == 0) continue;  // "ok" always, errors once seen
            f.counter("ordo_server_requests_total", "Requests answered, by method and code",
                      with(ml, "code", code_label(i)), double(m.requests[i]));
        }
        // The two counters are read one after the other while handlers may run elsewhere.
        const auto failed = std::min(m.notification_errors, m.notifications);
        f.counter("ordo_server_notifications_total", "Notifications handled, by outcome",
                  with(ml, "outcome", "ok"), double(m.notifications - failed));
        if (m.notification_errors != 0)
            f.counter("ordo_server_notifications_total", "Notifications handled, by outcome",
                      with(ml, "outcome", "error"), double(m.notification_errors));
        auto& h = f.add("ordo_server_request_duration_seconds", MetricType::Histogram,
                        "Handler latency, from dispatch to the response queued (requests and "
                        "notifications)",
                        ml)
                      .histogram;
        std::uint64_t cumulative = 0;
        for (std::size_t i = 0; i < latency_bounds.size(); ++i) {
            cumulative += m.latency_buckets[i];
            h.bucket.push_back({cumulative, latency_bounds[i]});
        }
        // Counted from the buckets themselves, so that +Inf is never below the last bound even
        // when a call lands between reading the buckets and reading the count.
        cumulative += m.latency_buckets.back();
        h.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
        h.sample_count = cumulative;
        h.sample_sum = m.latency_sum_seconds;
    }
    for (const auto& b : s.batches) {
        const labels bl = with(base, "method", b.name);
        f.counter("ordo_server_batches_total", "Batches run by a batch handler", bl,
                  double(b.stats.batches));
        f.gauge("ordo_server_batch_queued_calls", "Calls waiting for their batch", bl,
                double(b.stats.queued));
        // Batch sizes in powers of two.
        auto& h = f.add("ordo_server_batch_size", MetricType::Histogram,
                        "Calls per batch of a batch handler", bl)
                      .histogram;
        std::uint64_t count = 0;
        double sum = 0;
        std::size_t largest = 1;
        for (const auto& [size, n] : b.stats.size_histogram) {
            count += n;
            sum += double(size) * double(n);
            largest = std::max(largest, size);
        }
        for (std::size_t bound = 1;; bound *= 2) {
            std::uint64_t c = 0;
            for (const auto& [size, n] : b.stats.size_histogram)
                if (size <= bound) c += n;
            h.bucket.push_back({c, double(bound)});
            if (bound >= largest) break;
        }
        h.bucket.push_back({count, std::numeric_limits<double>::infinity()});
        h.sample_count = count;
        h.sample_sum = sum;
    }
}

struct router_snapshot {
    router_counters totals;
    std::vector<replica_counters> replicas;
};

void export_router(families& f, const labels& base, const router_snapshot& r) {
    f.counter("ordo_router_calls_total", "Calls made through the router", base,
              double(r.totals.calls));
    f.gauge("ordo_router_queued_calls", "Calls waiting for a replica with room", base,
            double(r.totals.queued));
    f.counter("ordo_router_expired_in_queue_total",
              "Calls whose deadline passed while they waited for a replica (never sent)", base,
              double(r.totals.expired_in_queue));
    f.counter("ordo_router_retried_total", "Idempotent calls sent again after a replica died", base,
              double(r.totals.retried));
    f.counter("ordo_router_moved_total",
              "Calls sent to another replica after one refused them as overloaded", base,
              double(r.totals.moved));
    f.counter("ordo_router_over_budget_total",
              "Second tries and moves not made because the retry budget was spent", base,
              double(r.totals.over_budget));
    f.counter("ordo_router_replicas_lost_total", "Replicas whose connection ended", base,
              double(r.totals.replicas_lost));
    f.counter("ordo_router_reconnects_total", "Connections opened again to a member", base,
              double(r.totals.reconnects));
    f.counter("ordo_router_ejections_total", "Replicas ejected for failing every call", base,
              double(r.totals.ejections));
    f.counter("ordo_router_drains_total", "Replicas whose server said it was going away", base,
              double(r.totals.drains));
    f.counter("ordo_router_key_waits_total",
              "Keyed calls held until their key's calls on its previous replica finished", base,
              double(r.totals.key_waits));
    f.gauge("ordo_router_aperture",
            "Replicas that calls without a key go to while they have room (least_loaded)", base,
            double(r.totals.aperture));
    f.counter("ordo_router_aperture_trials_total",
              "Trials of one replica fewer or one more in the aperture", base,
              double(r.totals.aperture_trials));
    f.counter("ordo_router_aperture_changes_total",
              "Changes of the aperture kept because calls went faster", base,
              double(r.totals.aperture_changes));
    f.counter("ordo_router_source_updates_total", "Replica sets applied from sources", base,
              double(r.totals.source_updates));
    f.counter("ordo_router_source_problems_total",
              "Failed lookups and rejected entries of sources (the last good set stays)", base,
              double(r.totals.source_problems));
    for (const auto& rep : r.replicas) {
        labels rl = with(base, "replica", rep.url);
        if (!rep.group.empty()) rl = with(rl, "group", rep.group);
        f.gauge("ordo_router_replica_live", "1 while the replica takes calls", rl,
                rep.live ? 1 : 0);
        // One series per state, 1 for the replica's own (as kube-state-metrics does).
        for (auto st :
             {replica_state::connecting, replica_state::ready, replica_state::reconnecting,
              replica_state::ejected, replica_state::draining, replica_state::not_serving})
            f.gauge("ordo_router_replica_state", "1 for the state the replica is in",
                    with(rl, "state", to_string(st)), rep.state == st ? 1 : 0);
        f.gauge("ordo_router_replica_in_flight", "Calls sent to the replica and not answered", rl,
                double(rep.in_flight));
        f.gauge("ordo_router_replica_queued_calls", "Keyed calls waiting for the replica", rl,
                double(rep.queued));
        f.counter("ordo_router_replica_calls_total", "Calls finished on the replica, by outcome",
                  with(rl, "outcome", "ok"), double(rep.completed));
        f.counter("ordo_router_replica_calls_total", "Calls finished on the replica, by outcome",
                  with(rl, "outcome", "error"), double(rep.errors));
        f.counter("ordo_router_replica_overloaded_total",
                  "Calls the replica refused as overloaded (moved elsewhere, or failed)", rl,
                  double(rep.overloaded));
        // The router keeps percentiles, not a sum: gauges by quantile, and the calls counted.
        const auto secs = [](std::chrono::microseconds us) { return double(us.count()) / 1e6; };
        const std::pair<const char*, std::chrono::microseconds> qs[] = {
            {"0.5", rep.latency.p50}, {"0.9", rep.latency.p90}, {"0.99", rep.latency.p99}};
        for (const auto& [q, v] : qs)
            f.gauge("ordo_router_replica_latency_seconds",
                    "Call latency on the replica, from send to response, by quantile",
                    with(rl, "quantile", q), secs(v));
    }
}

// Runs `read` on `ex` and waits up to scrape_wait for its result.
template <class T>
std::optional<T> read_on(const net::any_io_executor& ex, std::function<std::optional<T>()> read) {
    struct box {
        std::mutex m;
        std::condition_variable cv;
        bool done = false;
        std::optional<T> result;
    };
    auto b = std::make_shared<box>();
    net::post(ex, [b, read = std::move(read)] {
        auto r = read();
        std::lock_guard<std::mutex> lock(b->m);
        b->result = std::move(r);
        b->done = true;
        b->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(b->m);
    if (!b->cv.wait_for(lock, scrape_wait, [&] { return b->done; })) return std::nullopt;
    return std::move(b->result);
}

}  // namespace

struct prometheus_exporter::impl : prometheus::Collectable {
    std::string host;
    std::unique_ptr<prometheus::Exposer> exposer;
    std::shared_ptr<impl> self_view;  // what the exposer holds (weakly)

    struct source {
        labels base;
        // Adds the figures; false once what it reads is gone (the source is then dropped).
        std::function<bool(families&)> collect;
    };
    mutable std::mutex m;
    mutable std::vector<source> sources;

    std::vector<MetricFamily> Collect() const override {
        std::vector<source> now;
        {
            std::lock_guard<std::mutex> lock(m);
            now = sources;
        }
        families f;
        std::vector<std::size_t> gone;
        for (std::size_t i = 0; i < now.size(); ++i)
            if (!now[i].collect(f)) gone.push_back(i);
        if (!gone.empty()) {
            // Sources are only ever appended: the first now.size() are the ones read here.
            std::lock_guard<std::mutex> lock(m);
            for (auto i = gone.rbegin(); i != gone.rend(); ++i)
                sources.erase(sources.begin() + static_cast<std::ptrdiff_t>(*i));
        }
        return f.take();
    }
};

prometheus_exporter::prometheus_exporter(const std::string& bind)
    : impl_(std::make_unique<impl>()) {
    const auto colon = bind.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == bind.size())
        throw_error(errc::bad_address, "ordo: metrics address \"" + bind +
                                           "\" is not HOST:PORT (e.g. 127.0.0.1:9464)");
    impl_->host = bind.substr(0, colon);
    try {
        // Two threads are plenty for scrapes. The options' form of the constructor stops at
        // once; the address' form took 2 s in its destructor (civetweb waiting out a timeout).
        impl_->exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
            "listening_ports", bind, "num_threads", "2", "request_timeout_ms", "10000"});
    } catch (const std::exception& e) {
        throw_error(errc::bad_address,
                    "ordo: cannot serve metrics on " + bind + ": " + std::string(e.what()));
    }
    // The exposer holds collectables weakly; this one lives as long as the exporter.
    impl_->self_view = std::shared_ptr<impl>(impl_.get(), [](impl*) {});
    impl_->exposer->RegisterCollectable(impl_->self_view);
}

prometheus_exporter::~prometheus_exporter() {
    // Stop serving (and so collecting) before the sources go.
    impl_->exposer.reset();
}

void prometheus_exporter::add(server& s, const std::string& name) {
    s.handlers().time_calls(true);
    labels base;
    if (!name.empty()) base.push_back({"server", name});
    std::function<std::optional<server_stats>()> read = s.stats_reader();
    std::lock_guard<std::mutex> lock(impl_->m);
    impl_->sources.push_back({base, [base, read, ex = s.get_executor()](families& f) {
                                  // Outer: answered in time; inner: the server still there.
                                  auto st = read_on<std::optional<server_stats>>(ex, [read] {
                                      return std::optional<std::optional<server_stats>>(read());
                                  });
                                  if (st && *st) export_server(f, base, **st);
                                  return !st || st->has_value();
                              }});
}

void prometheus_exporter::add(const std::shared_ptr<router>& r, const std::string& name) {
    labels base;
    if (!name.empty()) base.push_back({"router", name});
    std::weak_ptr<router> w = r;
    auto ex = r->get_executor();
    std::lock_guard<std::mutex> lock(impl_->m);
    impl_->sources.push_back({base, [base, w, ex](families& f) {
                                  if (w.expired()) return false;
                                  auto snap = read_on<router_snapshot>(
                                      ex, [w]() -> std::optional<router_snapshot> {
                                          auto r = w.lock();
                                          if (!r) return std::nullopt;
                                          return router_snapshot{r->counters(), r->replicas()};
                                      });
                                  if (snap) export_router(f, base, *snap);
                                  return true;
                              }});
}

std::string prometheus_exporter::url() const {
    const auto ports = impl_->exposer->GetListeningPorts();
    const std::string port = ports.empty() ? "0" : std::to_string(ports.front());
    return "http://" + impl_->host + ":" + port + "/metrics";
}

}  // namespace ordo
