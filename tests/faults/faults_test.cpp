// Dead peers (docs/protocol.md, "Liveness"): crash, hang and vanish each fail every pending call within a
// bounded time. Servers run as separate processes (ordo-inc-server, path in ORDO_INC_SERVER)
// started and killed by PID here; proxies and foreign peers run in the test's io_context.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"
#include "support/processes.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using test::run_test;
using test::wait_until;
using test::sleep_for;
using test::child;
using test::start_server;

struct outcome_log {
    int ok = 0, lost = 0, other = 0;
    clock_type::time_point last{};
    std::error_code other_code;
    int done() const { return ok + lost + other; }
    auto recorder() {
        return [this](std::error_code ec, int) {
            if (!ec)
                ++ok;
            else if (ec == errc::peer_lost)
                ++lost;
            else {
                ++other;
                other_code = ec;
            }
            last = clock_type::now();
        };
    }
};

peer& peer_of(const channel& ch) {
    return static_cast<peer&>(*ch.impl());
}

// Pending calls that the server does not answer soon: sleep_ms is serial, so one runs and the
// rest wait behind it.
void issue_slow_calls(const channel& ch, int n, outcome_log& log) {
    for (int i = 0; i < n; ++i) ch.async_call<int>("sleep_ms", 30'000, log.recorder());
}

class Crash : public ::testing::TestWithParam<std::string> {};

TEST_P(Crash, KilledServerFailsAThousandPendingCallsWithPeerLostWithinTwoSeconds) {
    std::unique_ptr<child> srv;
    const std::string url = start_server(srv, "", GetParam());
    run_test([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(url);
        outcome_log log;
        issue_slow_calls(ch, 1000, log);
        EXPECT_TRUE(co_await wait_until([&] { return peer_of(ch).comm().messages_sent >= 1000; }));
        const auto killed = clock_type::now();
        srv->signal(SIGKILL);
        EXPECT_TRUE(co_await wait_until([&] { return log.done() == 1000; }, 10s));
        EXPECT_EQ(log.lost, 1000);
        EXPECT_LT(log.last - killed, 2s);
        // The next call fails at once, with the same error.
        const auto t0 = clock_type::now();
        auto [ec, v] =
            co_await ch.async_call<int>("inc", 1, net::experimental::as_tuple(net::use_awaitable));
        EXPECT_EQ(ec, errc::peer_lost);
        EXPECT_LT(clock_type::now() - t0, 1s);
        EXPECT_EQ(peer_of(ch).counters().pending_calls, 0u);
        EXPECT_EQ(peer_of(ch).comm().buffered_bytes, 0u);
    });
}

INSTANTIATE_TEST_SUITE_P(SocketTransports, Crash,
                         ::testing::Values("tcp", "unix", "tls", "zmq+tcp", "zmq+ipc"),
                         [](const auto& info) { return test::scheme_name(info.param); });

// ZeroMQ answers ZMTP heartbeats from its own I/O thread, so they catch a stopped process (not
// a stuck event loop: ordo.ping does that) even with ordo's liveness timeout at its 10 s default.
TEST(Hang, ZmtpHeartbeatsFailCallsToAStoppedZeroMQServerWellBeforeTheLivenessTimeout) {
    std::unique_ptr<child> srv;
    const std::string url = start_server(srv, "", "zmq+tcp");
    run_test([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(url + "?zmq_heartbeat_ms=200");
        outcome_log log;
        issue_slow_calls(ch, 100, log);
        EXPECT_TRUE(co_await wait_until([&] { return peer_of(ch).comm().messages_sent >= 100; }));
        const auto stopped = clock_type::now();
        srv->signal(SIGSTOP);
        EXPECT_TRUE(co_await wait_until([&] { return log.done() == 100; }, 20s));
        EXPECT_EQ(log.lost, 100);
        EXPECT_LT(log.last - stopped, 3s);  // 3 heartbeats of 200 ms, plus scheduling
    });
    srv->signal(SIGCONT);
}

TEST(Hang, StoppedServerFailsEveryPendingCallWithinTheLivenessTimeout) {
    std::unique_ptr<child> srv;
    const std::string url = start_server(srv);
    run_test([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(url + "?liveness_timeout_ms=500");
        outcome_log log;
        issue_slow_calls(ch, 100, log);
        // Three bounds long with calls pending and the server alive: pings keep it so.
        net::steady_timer t(co_await net::this_coro::executor, 1500ms);
        co_await t.async_wait(use_tuple);
        EXPECT_EQ(log.done(), 0);
        EXPECT_GT(peer_of(ch).counters().pings_sent, 0u);
        const auto stopped = clock_type::now();
        srv->signal(SIGSTOP);
        EXPECT_TRUE(co_await wait_until([&] { return log.done() == 100; }, 20s));
        EXPECT_EQ(log.lost, 100);
        EXPECT_LT(log.last - stopped, 500ms + 2s);
        // Not before the bound: 500 ms of silence, counted from the last bytes heard (a pong may
        // have come up to a heartbeat before the stop, or late under load).
        EXPECT_GE(log.last - peer_of(ch).comm().last_receive, 500ms);
        EXPECT_EQ(peer_of(ch).counters().pending_calls, 0u);
    });
    srv->signal(SIGCONT);
}

// Forwards bytes both ways until told to go dark; then it drops everything, closing nothing.
class blackhole_proxy {
  public:
    blackhole_proxy(net::any_io_executor ex, std::string target)
        : l_(listen(ex, "tcp://127.0.0.1:0")), target_(std::move(target)) {
        net::co_spawn(ex, accept_loop(), net::detached);
    }
    ~blackhole_proxy() {
        l_->close();
        for (auto& t : open_) t->close();
    }
    std::string url() const { return l_->local_address(); }
    void go_dark() { *dark_ = true; }

  private:
    net::awaitable<void> accept_loop() {
        try {
            for (;;) {
                auto down = std::shared_ptr<transport>(co_await l_->async_accept());
                auto up = std::shared_ptr<transport>(co_await async_connect_transport(target_));
                open_.push_back(down);
                open_.push_back(up);
                auto ex = co_await net::this_coro::executor;
                net::co_spawn(ex, pump(down, up, dark_), net::detached);
                net::co_spawn(ex, pump(up, down, dark_), net::detached);
            }
        } catch (const std::exception&) {
            // closed
        }
    }
    static net::awaitable<void> pump(std::shared_ptr<transport> from, std::shared_ptr<transport> to,
                                     std::shared_ptr<bool> dark) {
        std::vector<char> buf(65536);
        for (;;) {
            std::error_code ec;
            auto n = co_await from->async_read_some(net::buffer(buf), ec);
            if (ec) break;
            if (*dark) continue;
            co_await to->async_write(net::buffer(buf.data(), n), ec);
            if (ec) break;
        }
    }

    std::unique_ptr<listener> l_;
    std::string target_;
    std::vector<std::shared_ptr<transport>> open_;
    std::shared_ptr<bool> dark_ = std::make_shared<bool>(false);
};

TEST(Vanish, APeerBehindABlackholeFailsEveryPendingCallWithinTheLivenessTimeout) {
    std::unique_ptr<child> srv;
    const std::string url = start_server(srv);
    run_test([&]() -> net::awaitable<void> {
        blackhole_proxy proxy(co_await net::this_coro::executor, url);
        auto ch = co_await async_connect(proxy.url() + "?liveness_timeout_ms=500");
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        outcome_log log;
        issue_slow_calls(ch, 100, log);
        net::steady_timer t(co_await net::this_coro::executor, 1500ms);
        co_await t.async_wait(use_tuple);
        EXPECT_EQ(log.done(), 0);
        const auto dark = clock_type::now();
        proxy.go_dark();
        EXPECT_TRUE(co_await wait_until([&] { return log.done() == 100; }, 20s));
        EXPECT_EQ(log.lost, 100);
        EXPECT_LT(log.last - dark, 500ms + 2s);
        EXPECT_EQ(peer_of(ch).counters().pending_calls, 0u);
    });
}

TEST(Vanish, AForeignPeerThatAnswersPingsWithErrorsCountsAsAliveUntilItGoesSilent) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, "tcp://127.0.0.1:0");
        auto answering = std::make_shared<bool>(true);
        auto pings = std::make_shared<int>(0);
        // A minimal msgpack-rpc server: ordo.ping gets a neovim-style error, nothing else an
        // answer.
        net::co_spawn(
            ex,
            [&l, answering, pings]() -> net::awaitable<void> {
                std::shared_ptr<transport> t = co_await l->async_accept();
                decoder d;
                std::vector<char> buf(65536);
                for (;;) {
                    std::error_code ec;
                    auto n = co_await t->async_read_some(net::buffer(buf), ec);
                    if (ec) co_return;
                    d.feed(std::string_view(buf.data(), n));
                    while (auto m = d.next()) {
                        if (m->kind != message_kind::request || m->method != "ordo.ping" ||
                            !*answering)
                            continue;
                        ++*pings;
                        buffer out;
                        msgpack::packer<buffer> p(out);
                        p.pack_array(4).pack(1).pack(m->msgid);
                        p.pack_array(2).pack(0).pack(std::string("Invalid method: ordo.ping"));
                        p.pack_nil();
                        co_await t->async_write(net::buffer(out.data(), out.size()), ec);
                    }
                }
            },
            net::detached);
        auto ch = co_await async_connect(l->local_address() + "?liveness_timeout_ms=500");
        outcome_log log;
        ch.async_call<int>("inc", 1, log.recorder());
        net::steady_timer t(ex, 1500ms);
        co_await t.async_wait(use_tuple);
        EXPECT_EQ(log.done(), 0) << "declared dead while it answered pings";
        EXPECT_GT(*pings, 0);
        const auto silent = clock_type::now();
        *answering = false;
        EXPECT_TRUE(co_await wait_until([&] { return log.done() == 1; }, 20s));
        EXPECT_EQ(log.lost, 1);
        EXPECT_LT(log.last - silent, 500ms + 2s);
        l->close();
    });
}

TEST(Reset, AResetInTheMiddleOfALargeBatchFailsEveryCallAndHandsBackNotifications) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, "tcp://127.0.0.1:0");
        int undelivered = 0;
        peer_options o;
        o.on_undelivered = [&](const undelivered_notification& u) {
            EXPECT_EQ(u.method, "bulk");
            EXPECT_EQ(u.code, errc::peer_lost);
            ++undelivered;
        };
        auto ch = co_await async_connect(l->local_address(), o);
        auto server_side = co_await l->async_accept();
        outcome_log log;
        const std::string chunk(1 << 20, 'b');
        for (int i = 0; i < 64; ++i) {
            ch.notify("bulk", chunk);
            ch.async_call<int>("inc", i, log.recorder());
        }
        // Read a little of the 64 MiB batch, then reset the connection (SO_LINGER 0).
        std::vector<char> buf(256 * 1024);
        std::error_code ec;
        co_await server_side->async_read_some(net::buffer(buf), ec);
        server_side->reset();
        EXPECT_TRUE(co_await wait_until([&] { return log.done() == 64; }));
        EXPECT_EQ(log.lost, 64);
        EXPECT_GT(undelivered, 0);
        EXPECT_EQ(peer_of(ch).counters().notifications_undelivered, std::uint64_t(undelivered));
        EXPECT_EQ(peer_of(ch).counters().pending_calls, 0u);
        EXPECT_EQ(peer_of(ch).comm().buffered_bytes, 0u);
    });
}

// A client process, forked before any io starts, that makes 10 sleep_ms(60000) calls to the URL
// it is sent (a line) and then waits. Returns its PID and the pipe to send the URL on.
std::pair<pid_t, int> fork_sleeping_client() {
    int to_child[2];
    if (::pipe(to_child) != 0) throw std::runtime_error("pipe failed");
    const pid_t client = ::fork();
    if (client == 0) {
        ::close(to_child[1]);
        std::string url;
        char c;
        while (::read(to_child[0], &c, 1) == 1 && c != '\n') url += c;
        net::io_context io;
        net::co_spawn(
            io,
            [url]() -> net::awaitable<void> {
                auto ch = co_await async_connect(url);
                for (int i = 0; i < 10; ++i)
                    ch.async_call<int>("sleep_ms", 60'000, [](std::error_code, int) {});
                net::steady_timer forever(co_await net::this_coro::executor, 120s);
                co_await forever.async_wait(use_tuple);
            },
            net::detached);
        io.run();
        std::_Exit(0);
    }
    ::close(to_child[0]);
    return {client, to_child[1]};
}

// Kills (after continuing) and reaps the forked client at the end of a test.
struct reaper {
    pid_t pid;
    ~reaper() {
        ::kill(pid, SIGCONT);
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
};

// Registers a concurrent sleep_ms handler that counts the calls it starts and those cancelled.
void serve_counting_sleep(server& srv, int& started, int& cancelled) {
    srv.on("sleep_ms",
           [&started, &cancelled](int ms) -> net::awaitable<int> {
               ++started;
               try {
                   co_await sleep_for(std::chrono::milliseconds(ms));
               } catch (const std::system_error&) {
                   ++cancelled;
                   throw;
               }
               co_return ms;
           },
           {.concurrent = true});
}

class ClientCrash : public ::testing::TestWithParam<std::string> {};

TEST_P(ClientCrash, KillingAClientCancelsItsRunningHandlersAndTheServerServesOthers) {
    auto [client, url_pipe] = fork_sleeping_client();
    reaper reap{client};
    run_test([&, client = client, url_pipe = url_pipe, scheme = GetParam()]()
                 -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        int started = 0, cancelled = 0;
        serve_counting_sleep(srv, started, cancelled);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = test::connect_url(srv.listen(test::listen_url(scheme))) + "\n";
        EXPECT_EQ(::write(url_pipe, url.data(), url.size()), ssize_t(url.size()));
        EXPECT_TRUE(co_await wait_until([&] { return started == 10; }));
        const auto killed = clock_type::now();
        ::kill(client, SIGKILL);
        EXPECT_TRUE(co_await wait_until([&] { return cancelled == 10; }, 20s));
        EXPECT_LT(clock_type::now() - killed, 2s);
        EXPECT_TRUE(co_await wait_until([&] { return srv.peer_count() == 0; }));
        auto other = co_await async_connect(url.substr(0, url.size() - 1));
        EXPECT_EQ(co_await other.async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
    ::close(url_pipe);
}

// A ZeroMQ ROUTER hears of no disconnect by routing id: ordo finds the gone client by probing.
INSTANTIATE_TEST_SUITE_P(TcpAndZeroMQ, ClientCrash, ::testing::Values("tcp", "zmq+tcp", "tls"),
                         [](const auto& info) { return test::scheme_name(info.param); });

TEST(ClientHang, AStoppedClientsHandlersAreCancelledWithinTheServersLivenessTimeout) {
    auto [client, url_pipe] = fork_sleeping_client();
    reaper reap{client};
    run_test([&, client = client, url_pipe = url_pipe]() -> net::awaitable<void> {
        server_options so;
        so.peer.liveness_timeout = 500ms;
        server srv(co_await net::this_coro::executor, so);
        int started = 0, cancelled = 0;
        serve_counting_sleep(srv, started, cancelled);
        const std::string url = srv.listen("tcp://127.0.0.1:0") + "\n";
        EXPECT_EQ(::write(url_pipe, url.data(), url.size()), ssize_t(url.size()));
        EXPECT_TRUE(co_await wait_until([&] { return started == 10; }));
        // Alive and answering pings: nothing is cancelled for three bounds.
        net::steady_timer t(co_await net::this_coro::executor, 1500ms);
        co_await t.async_wait(use_tuple);
        EXPECT_EQ(cancelled, 0);
        const auto stopped = clock_type::now();
        ::kill(client, SIGSTOP);
        EXPECT_TRUE(co_await wait_until([&] { return cancelled == 10; }, 20s));
        EXPECT_LT(clock_type::now() - stopped, 500ms + 2s);
        EXPECT_TRUE(co_await wait_until([&] { return srv.peer_count() == 0; }));
        co_await srv.async_stop();
    });
    ::close(url_pipe);
}

// Runs a command, returning its exit status (its output goes to the test log).
int run(const std::string& cmd) {
    return std::system((cmd + " >&2").c_str());
}

// Two network namespaces joined by a veth pair, removed again on destruction.
class netns_pair {
  public:
    netns_pair() {
        const std::string id = std::to_string(::getpid());
        client = "ordo-c-" + id;
        server = "ordo-s-" + id;
        veth_c = "ovc" + id;
        veth_s = "ovs" + id;
        const int net = ::getpid() % 250;
        client_ip = "10.213." + std::to_string(net) + ".1";
        server_ip = "10.213." + std::to_string(net) + ".2";
        ok = run("ip netns add " + client) == 0 && run("ip netns add " + server) == 0 &&
             run("ip link add " + veth_c + " netns " + client + " type veth peer name " + veth_s +
                 " netns " + server) == 0 &&
             run(in(client, "ip addr add " + client_ip + "/30 dev " + veth_c)) == 0 &&
             run(in(server, "ip addr add " + server_ip + "/30 dev " + veth_s)) == 0 &&
             run(in(client, "ip link set " + veth_c + " up")) == 0 &&
             run(in(server, "ip link set " + veth_s + " up")) == 0 &&
             run(in(client, "ip link set lo up")) == 0 && run(in(server, "ip link set lo up")) == 0;
    }
    ~netns_pair() {
        run("ip netns del " + client + " 2>/dev/null");
        run("ip netns del " + server + " 2>/dev/null");
    }
    static std::string in(const std::string& ns, const std::string& cmd) {
        return "ip netns exec " + ns + " " + cmd;
    }
    bool ok = false;
    std::string client, server, veth_c, veth_s, client_ip, server_ip;
};

std::string ip_binary() {
    for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
        if (::access(p, X_OK) == 0) return p;
    return "";
}

TEST(Vanish, ALinkTakenDownBetweenTwoNetworkNamespacesFailsCallsWithinTheBound) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    const std::string ip = ip_binary();
    if (ip.empty()) GTEST_SKIP() << "iproute2's ip is not installed";
    netns_pair ns;
    if (!ns.ok) GTEST_SKIP() << "ip netns / veth setup failed here (see the log above)";
    const char* server_path = std::getenv("ORDO_INC_SERVER");
    const char* client_path = std::getenv("ORDO_INC_CLIENT");
    ASSERT_TRUE(server_path && client_path) << "run through meson test";

    child srv(
        {ip, "netns", "exec", ns.server, server_path, "--listen", "tcp://" + ns.server_ip + ":0"});
    const std::string line = srv.read_line();
    ASSERT_EQ(line.rfind("listening on ", 0), 0u) << line;
    const std::string url = line.substr(13);

    child cli({ip, "netns", "exec", ns.client, client_path, "--connect", url, "--calls",
               "1000000000", "--inflight", "64", "--liveness-timeout-ms", "500"},
              true);
    ASSERT_FALSE(cli.wait_exit(1500ms).has_value()) << cli.read_line(1s);  // calls flowing
    const auto down = clock_type::now();
    ASSERT_EQ(run(netns_pair::in(ns.server, "ip link set " + ns.veth_s + " down")), 0);
    auto status = cli.wait_exit(20s);
    const auto took = clock_type::now() - down;
    ASSERT_TRUE(status.has_value()) << "the client did not notice the link going down";
    EXPECT_EQ(*status, 1);
    const std::string err = cli.read_line(1s);
    EXPECT_NE(err.find("peer lost"), std::string::npos) << err;
    EXPECT_LT(took, 500ms + 2s);
    std::cerr << "link down detected after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
              << " ms: " << err << "\n";
}

}  // namespace
}  // namespace ordo
