// A fleet of ordo-inc-server processes behind a router that follows DNS (dnsmasq) or etcd, all on
// loopback and started here: rolling restarts by drain (SIGTERM), a crash (SIGKILL), replicas
// added and removed in DNS, registrations that come and go, and a one-replica service restarted
// with wait_for_replica_ms. Calls run throughout, 64 in flight, keyed and unkeyed; every replica
// appends each note(key, n) it runs to one shared journal, which shows that each call ran
// exactly once and that each key's calls ran in the order sent.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "support/dnsmasq.hpp"
#include "support/etcd_server.hpp"
#include "support/processes.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

std::string temp_dir() {
    char tmpl[] = "/tmp/ordo-fleet-test-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    return tmpl;
}

// One ordo-inc-server on `url`, journaling to `journal`; started again on the same URL.
struct replica_proc {
    std::string url, journal, extra;
    std::unique_ptr<test::child> proc;
    clock_type::time_point listening{};
    void start() {
        const char* path = std::getenv("ORDO_INC_SERVER");
        if (!path) throw std::runtime_error("ORDO_INC_SERVER is not set (run through meson test)");
        std::vector<std::string> argv{path, "--listen", url, "--journal", journal,
                                      "--drain-ms", "10000"};
        if (!extra.empty()) {
            argv.push_back("--register");
            argv.push_back(extra);
            argv.push_back("--register-ttl-s");
            argv.push_back("2");
        }
        // A port that a killed process held may take a moment to be free for the new one.
        for (int attempt = 0; attempt < 50; ++attempt) {
            proc = std::make_unique<test::child>(argv);
            const std::string line = proc->read_line();
            if (line.rfind("listening on ", 0) == 0) {
                listening = clock_type::now();
                if (!extra.empty()) proc->read_line();  // "registered ..."
                return;
            }
            proc.reset();
            std::this_thread::sleep_for(100ms);
        }
        throw std::runtime_error("ordo-inc-server did not start on " + url);
    }
    // SIGTERM: drains, then exits 0.
    int drain() {
        proc->signal(SIGTERM);
        const auto status = proc->wait_exit(30s);
        proc.reset();
        return status.value_or(-1);
    }
    void crash() {
        proc->signal(SIGKILL);
        proc->wait_exit(10s);
        proc.reset();
    }
};

// Calls note(key, n) (keyed, on 16 keys) and `unkeyed`(..) alternately, `window` in flight,
// until told to stop and at least `target` were made.
struct load {
    channel ch;
    std::string unkeyed;  // "note" (journaled) or "inc" (idempotent in the crash test)
    std::size_t window = 64, target = 0;
    std::atomic<bool> stop{false};
    std::atomic<bool> finished{false};
    std::size_t started = 0, active = 0, ok = 0;
    std::map<std::string, int> next;
    std::set<std::pair<std::string, int>> succeeded, failed;
    std::vector<std::string> errors;  // what() of each failure, with the method
    std::vector<std::pair<clock_type::time_point, clock_type::duration>> latencies;

    void begin() {
        while (active < window) one();
    }
    void one() {
        const std::size_t i = started++;
        ++active;
        const bool keyed = i % 2 == 0;
        const std::string key = keyed ? "k" + std::to_string((i / 2) % 16) : "u";
        const int n = keyed ? next[key]++ : static_cast<int>(i);
        const auto t0 = clock_type::now();
        auto done = [this, key, n, t0, keyed](std::error_code ec, int) {
            --active;
            const auto t1 = clock_type::now();
            if (!ec) {
                ++ok;
                latencies.emplace_back(t1, t1 - t0);
                if (keyed || unkeyed == "note") succeeded.insert({key, n});
            } else {
                if (keyed || unkeyed == "note") failed.insert({key, n});
                errors.push_back((keyed ? "note: " : unkeyed + ": ") + ec.message());
            }
            if (!stop || started < target) {
                one();
            } else if (active == 0) {
                finished = true;
            }
        };
        if (keyed)
            ch.async_call<int>("note", key, n, ordo::key(key), done);
        else if (unkeyed == "note")
            ch.async_call<int>("note", key, n, done);
        else
            ch.async_call<int>("inc", n, done);
    }
    // Calls per second and p99 of the calls completed in [from, to).
    std::pair<double, double> figures(clock_type::time_point from, clock_type::time_point to) const {
        std::vector<double> ms;
        for (auto& [t, d] : latencies)
            if (t >= from && t < to) ms.push_back(std::chrono::duration<double, std::milli>(d).count());
        if (ms.empty()) return {0, 0};
        std::sort(ms.begin(), ms.end());
        const double secs = std::chrono::duration<double>(to - from).count();
        return {static_cast<double>(ms.size()) / secs, ms[ms.size() * 99 / 100]};
    }
};

// Each line of the journal, in order.
std::vector<std::pair<std::string, int>> read_journal(const std::string& path) {
    std::vector<std::pair<std::string, int>> out;
    std::ifstream in(path);
    std::string key;
    int n;
    while (in >> key >> n) out.emplace_back(key, n);
    return out;
}

// Every call that succeeded ran exactly once, one that failed at most once, and the calls of
// each key ran in the order sent.
void check_journal(const std::string& path, const load& l) {
    const auto lines = read_journal(path);
    std::map<std::pair<std::string, int>, int> runs;
    std::map<std::string, int> last;
    for (auto& [key, n] : lines) {
        ++runs[{key, n}];
        if (key == "u") continue;
        auto it = last.find(key);
        if (it != last.end()) {
            EXPECT_GT(n, it->second) << "key " << key << " ran " << n << " after " << it->second;
        }
        last[key] = n;
    }
    for (auto& c : l.succeeded) EXPECT_EQ(runs[c], 1) << c.first << " " << c.second;
    for (auto& c : l.failed) EXPECT_LE(runs[c], 1) << c.first << " " << c.second;
    std::size_t unknown = 0;
    for (auto& [c, k] : runs) unknown += !l.succeeded.count(c) && !l.failed.count(c);
    EXPECT_EQ(unknown, 0u) << "calls in the journal that nobody made";
}

// Runs `f` on the io thread and returns its result (for the thread that drives processes).
template <class F>
auto on_io(net::io_context& io, F f) {
    std::promise<decltype(f())> p;
    auto fut = p.get_future();
    net::post(io, [&] { p.set_value(f()); });
    return fut.get();
}

// How long after `since` the router had `url` ready and had finished a call there, or -1 after
// 10 s.
long ms_until_serving(net::io_context& io, router& r, const std::string& url,
                      clock_type::time_point since) {
    const auto base = on_io(io, [&] {
        for (auto& rc : r.replicas())
            if (rc.url == url) return rc.completed;
        return std::uint64_t{0};
    });
    while (clock_type::now() < since + 10s) {
        const bool serving = on_io(io, [&] {
            for (auto& rc : r.replicas())
                if (rc.url == url) return rc.state == replica_state::ready && rc.completed > base;
            return false;
        });
        if (serving)
            return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - since)
                .count();
        std::this_thread::sleep_for(10ms);
    }
    return -1;
}

bool router_lists(net::io_context& io, router& r, const std::string& url) {
    return on_io(io, [&] {
        for (auto& rc : r.replicas())
            if (rc.url == url && rc.member) return true;
        return false;
    });
}

// The fleet for one test: replicas on 127.0.0.2... sharing one port and one journal.
struct fleet {
    std::string dir = temp_dir();
    std::uint16_t port = test::free_port();
    std::vector<replica_proc> reps;
    std::string journal = dir + "/journal";
    fleet(int n, const std::string& extra = {}) {
        for (int i = 0; i < n; ++i) add(extra);
    }
    ~fleet() {
        reps.clear();
        std::filesystem::remove_all(dir);
    }
    replica_proc& add(const std::string& extra = {}) {
        const std::string ip = "127.0.0." + std::to_string(2 + reps.size());
        reps.push_back({"tcp://" + ip + ":" + std::to_string(port), journal, extra, nullptr, {}});
        reps.back().start();
        return reps.back();
    }
    std::string hosts(const std::vector<std::size_t>& which) const {
        std::string out;
        for (auto i : which) out += reps[i].url.substr(6, reps[i].url.rfind(':') - 6) + " svc.test\n";
        return out;
    }
};

// Runs the load on its own io thread over a router made from `url`, while `sequence` runs on
// this thread; returns when both are done.
struct driven {
    net::io_context io;
    std::shared_ptr<router> r;
    load l;
    std::vector<std::string> events;
    std::thread t;
    clock_type::time_point began;

    driven(const std::string& url, std::string unkeyed, std::size_t target) {
        l.unkeyed = std::move(unkeyed);
        l.target = target;
        auto spec = parse_route_url(url, {});
        r = make_router(io.get_executor(), spec.options);
        r->on_event([this](const std::string& e) { events.push_back(e); });
        std::promise<std::string> ready;
        net::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                for (auto& rep : spec.replicas) co_await r->async_add_replica(rep.url);
                if (spec.source) co_await r->async_follow(spec.source(io.get_executor()));
                l.ch = channel(r);
                began = clock_type::now();
                l.begin();
            },
            [&](std::exception_ptr e) {
                std::string why;
                if (e) try {
                        std::rethrow_exception(e);
                    } catch (const std::exception& x) {
                        why = x.what();
                    }
                ready.set_value(why);
            });
        t = std::thread([this] {
            auto work = net::make_work_guard(io);
            io.run();
        });
        const std::string why = ready.get_future().get();
        if (!why.empty()) throw std::runtime_error("the router did not start: " + why);
    }
    // Stops the load once `target` calls were made and waits for the last to finish.
    void finish() {
        l.stop = true;
        const auto deadline = clock_type::now() + 120s;
        while (!l.finished && clock_type::now() < deadline) std::this_thread::sleep_for(10ms);
        on_io(io, [&] {
            r->close();
            return 0;
        });
        io.stop();
        t.join();
    }
    ~driven() {
        if (t.joinable()) {
            io.stop();
            t.join();
        }
    }
    void print_events() const {
        for (auto& e : events) std::printf("  %s\n", e.c_str());
    }
};

TEST(Fleet, ARollingRestartUnderDnsWithAReplicaAddedAndOneRemovedFailsNoCall) {
    fleet f(3);
    test::dnsmasq dns;
    dns.set_hosts(f.hosts({0, 1, 2}));
    dns.start();
    driven d("route+dns+tcp://svc.test:" + std::to_string(f.port) + "?dns_server=" +
                 dns.nameserver() + "&refresh_ms=200&reconnect_max_ms=1000",
             "note", 200'000);
    std::this_thread::sleep_for(1s);  // steady state
    const auto rolling = clock_type::now();
    for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(f.reps[i].drain(), 0) << f.reps[i].url;
        f.reps[i].start();
        const long ms = ms_until_serving(d.io, *d.r, f.reps[i].url, f.reps[i].listening);
        std::printf("%s took calls again %ld ms after listening\n", f.reps[i].url.c_str(), ms);
        EXPECT_GE(ms, 0) << f.reps[i].url;
        // A reconnect comes at most reconnect_max_ms (+-20%) after the last: with the connect
        // and a call's answer, within 5 s on a busy machine.
        EXPECT_LE(ms, 5000) << f.reps[i].url;
    }
    // A fourth replica in DNS takes calls; then the second leaves DNS, drains and stops.
    auto& fourth = f.add();
    dns.set_hosts(f.hosts({0, 1, 2, 3}));
    EXPECT_GE(ms_until_serving(d.io, *d.r, fourth.url, clock_type::now()), 0);
    dns.set_hosts(f.hosts({0, 2, 3}));
    for (int i = 0; i < 1000 && router_lists(d.io, *d.r, f.reps[1].url); ++i)
        std::this_thread::sleep_for(10ms);
    EXPECT_FALSE(router_lists(d.io, *d.r, f.reps[1].url));
    EXPECT_EQ(f.reps[1].drain(), 0);
    const auto done = clock_type::now();
    d.finish();
    d.print_events();
    EXPECT_GE(d.l.started, 200'000u);
    EXPECT_TRUE(d.l.errors.empty()) << d.l.errors.size() << " failed, first: " << d.l.errors[0];
    check_journal(f.journal, d.l);
    const auto [steady_rate, steady_p99] = d.l.figures(d.began, rolling);
    const auto [rolling_rate, rolling_p99] = d.l.figures(rolling, done);
    std::printf("fleet: steady %.0f calls/s p99 %.2f ms; during the rolling restart %.0f calls/s "
                "p99 %.2f ms (%.2fx the rate)\n",
                steady_rate, steady_p99, rolling_rate, rolling_p99, rolling_rate / steady_rate);
}

TEST(Fleet, ACrashUnderDnsFailsOnlyTheKilledReplicasNonIdempotentCallsAndItRejoins) {
    fleet f(3);
    test::dnsmasq dns;
    dns.set_hosts(f.hosts({0, 1, 2}));
    dns.start();
    driven d("route+dns+tcp://svc.test:" + std::to_string(f.port) + "?dns_server=" +
                 dns.nameserver() + "&refresh_ms=200&idempotent=inc",
             "inc", 100'000);
    std::this_thread::sleep_for(500ms);
    f.reps[1].crash();
    std::this_thread::sleep_for(300ms);
    f.reps[1].start();
    const long ms = ms_until_serving(d.io, *d.r, f.reps[1].url, f.reps[1].listening);
    std::printf("%s took calls again %ld ms after listening (backoff: 100 ms x1.6 up to 5 s)\n",
                f.reps[1].url.c_str(), ms);
    EXPECT_GE(ms, 0);
    EXPECT_LE(ms, 6000);  // within the backoff's cap, plus its jitter
    d.finish();
    d.print_events();
    for (auto& e : d.l.errors) {
        EXPECT_EQ(e.rfind("note: ", 0), 0u) << "an idempotent call failed: " << e;
        EXPECT_NE(e.find("peer lost"), std::string::npos) << e;
    }
    // Each failure names the killed replica (what() of the failed calls, from the events).
    bool named = false;
    for (auto& e : d.events) named = named || e.find("replica " + f.reps[1].url + " lost") == 0;
    EXPECT_TRUE(named);
    EXPECT_LE(d.l.failed.size(), 64u);  // at most those in flight
    std::printf("crash: %zu of %zu calls failed (keyed note calls in flight on the killed replica)\n",
                d.l.errors.size(), d.l.started);
    check_journal(f.journal, d.l);
}

TEST(Fleet, EtcdRegistrationsComeAndGoWithinTheirLease) {
    test::etcd_server etcd;
    etcd.start();
    {
        net::io_context io;
        detail::curl_multi http(io.get_executor());
        bool up = false;
        net::co_spawn(io, [&]() -> net::awaitable<void> { up = co_await etcd.async_ready(http); },
                      net::detached);
        io.run();
        ASSERT_TRUE(up) << "etcd did not start";
    }
    const std::string at = "etcd://127.0.0.1:" + std::to_string(etcd.client_port()) + "/ordo/svc/";
    fleet f(2, at);
    driven d("route+etcd://127.0.0.1:" + std::to_string(etcd.client_port()) + "/ordo/svc/", "note",
             20'000);
    EXPECT_GE(ms_until_serving(d.io, *d.r, f.reps[0].url, clock_type::now()), 0);
    EXPECT_GE(ms_until_serving(d.io, *d.r, f.reps[1].url, clock_type::now()), 0);
    // Killed without revoking: out of the set once the lease (2 s) expires; within 6 s on a
    // busy machine (etcd's lease check, its revoke, the watch and the router all run late).
    const auto killed = clock_type::now();
    f.reps[1].crash();
    while (router_lists(d.io, *d.r, f.reps[1].url) && clock_type::now() < killed + 10s)
        std::this_thread::sleep_for(10ms);
    const auto left_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - killed).count();
    std::printf("a SIGKILLed replica left the set %ld ms after the kill (lease 2 s)\n",
                static_cast<long>(left_ms));
    EXPECT_LE(left_ms, 6000);
    // A new registration takes calls within seconds of being registered.
    auto& third = f.add(at);
    const long ms = ms_until_serving(d.io, *d.r, third.url, clock_type::now());
    std::printf("a new registration took calls %ld ms after it was registered\n", ms);
    EXPECT_GE(ms, 0);
    EXPECT_LE(ms, 5000);
    d.finish();
    d.print_events();
}

TEST(Fleet, AOneReplicaServiceRestartedWithWaitForReplicaFailsNoCall) {
    fleet f(1);
    driven d(std::string("route+") + f.reps[0].url +
                 "?wait_for_replica_ms=5000&reconnect_max_ms=500",
             "note", 5'000);
    std::this_thread::sleep_for(300ms);
    for (int round = 0; round < 2; ++round) {
        EXPECT_EQ(f.reps[0].drain(), 0);
        std::this_thread::sleep_for(200ms);  // nobody listens meanwhile
        f.reps[0].start();
        EXPECT_GE(ms_until_serving(d.io, *d.r, f.reps[0].url, f.reps[0].listening), 0);
    }
    d.finish();
    d.print_events();
    EXPECT_TRUE(d.l.errors.empty()) << d.l.errors.size() << " failed, first: " << d.l.errors[0];
    check_journal(f.journal, d.l);
}

}  // namespace
}  // namespace ordo
