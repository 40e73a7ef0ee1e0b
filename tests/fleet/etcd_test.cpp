// etcd v3 membership against a real etcd on loopback (tests/support/etcd_server.hpp): the HTTP
// client under it (fleet/curl_multi), the replica source (a range read, then a watch) and the
// registration (a key under a lease, kept alive, put again, revoked).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fleet/curl_multi.hpp"
#include "ordo/error.hpp"
#include "ordo/rpc/connect.hpp"
#include "ordo/fleet/sources.hpp"
#include "ordo/rpc/server.hpp"
#include "support/etcd_server.hpp"
#include "support/processes.hpp"
#include "support/source_recorder.hpp"
#include "support/run_test.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using namespace net::experimental::awaitable_operators;
using test::run_test;
using test::wait_until;

// One etcd for the tests that do not stop it (each uses a prefix of its own), started by the
// first that needs it and killed, its data removed, after the last.
std::unique_ptr<test::etcd_server>& shared_etcd_holder() {
    static std::unique_ptr<test::etcd_server> s;
    return s;
}
test::etcd_server& shared_etcd() {
    auto& s = shared_etcd_holder();
    if (!s) {
        s = std::make_unique<test::etcd_server>();
        s->start();
    }
    return *s;
}

class Etcd : public ::testing::Test {
  protected:
    static void TearDownTestSuite() { shared_etcd_holder().reset(); }
};

// A prefix no other test uses.
std::string fresh_prefix() {
    static int n = 0;
    return "/ordo-test/" + std::to_string(::getpid()) + "/" + std::to_string(++n) + "/";
}

using test::recorder;

etcd_source_options source_options(const std::string& endpoint, const std::string& prefix) {
    etcd_source_options o;
    o.endpoint = endpoint;
    o.prefix = prefix;
    o.timeout = 2s;
    o.retry = 300ms;
    return o;
}

// What most tests start with: a client, the shared etcd (answering) and a fresh prefix.
struct world {
    explicit world(net::any_io_executor e) : ex(std::move(e)), http(ex) {}
    net::any_io_executor ex;
    detail::curl_multi http;
    test::etcd_server& etcd = shared_etcd();
    const std::string p = fresh_prefix();

    net::awaitable<bool> ready() { co_return co_await etcd.async_ready(http); }
    net::awaitable<void> put(std::string key, std::string value) {
        co_await test::etcd_put(http, etcd.endpoint(), std::move(key), std::move(value));
    }
    net::awaitable<void> del(std::string key) {
        co_await test::etcd_delete(http, etcd.endpoint(), std::move(key));
    }
    net::awaitable<bool> has(std::string key) {
        co_return co_await test::etcd_has(http, etcd.endpoint(), std::move(key));
    }
    /// A source on the prefix, started, telling `rec`.
    std::unique_ptr<replica_source> source(recorder& rec, std::chrono::milliseconds retry = 300ms,
                                           std::string url_suffix = "") {
        auto o = source_options(etcd.endpoint(), p);
        o.retry = retry;
        o.url_suffix = std::move(url_suffix);
        auto s = make_etcd_source(ex, o);
        rec.start(*s);
        return s;
    }
};

// `r` fails with `code`, and the error names r's URL.
net::awaitable<void> expect_failure(detail::curl_multi& http, detail::http_request r, errc code) {
    try {
        const auto a = co_await http.async_request(r);
        ADD_FAILURE() << r.url << " answered " << a.status << ": " << a.body;
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        EXPECT_NE(std::string(e.what()).find(r.url), std::string::npos) << e.what();
    }
}

TEST_F(Etcd, CurlClientGetsEtcdVersionAndPostsJson) {
    run_test([]() -> net::awaitable<void> {
        detail::curl_multi http(co_await net::this_coro::executor);
        auto& etcd = shared_etcd();
        ORDO_CO_ASSERT_TRUE(co_await etcd.async_ready(http));
        detail::http_request r;
        r.url = etcd.endpoint() + "/version";
        const auto v = co_await http.async_request(r);
        EXPECT_EQ(v.status, 200);
        EXPECT_NE(v.body.find("etcdserver"), std::string::npos) << v.body;
        // A POST whose body etcd cannot read: an answer all the same, with etcd's reason.
        r.url = etcd.endpoint() + "/v3/kv/range";
        r.post = "not json";
        const auto bad = co_await http.async_request(r);
        EXPECT_EQ(bad.status, 400);
        EXPECT_NE(bad.body.find("invalid character"), std::string::npos) << bad.body;
        // A body over the cap fails the request instead of growing.
        r.url = etcd.endpoint() + "/version";
        r.post.reset();
        r.max_body = 8;
        co_await expect_failure(http, r, errc::protocol_error);
    });
}

TEST_F(Etcd, CurlClientNamesTheUrlOfARefusedConnection) {
    run_test([]() -> net::awaitable<void> {
        detail::curl_multi http(co_await net::this_coro::executor);
        detail::http_request r;
        r.url = "http://127.0.0.1:" + std::to_string(test::free_port()) + "/health";
        co_await expect_failure(http, r, errc::peer_lost);
    });
}

TEST_F(Etcd, CurlClientTimesOutOnAServerThatNeverAnswers) {
    run_test([]() -> net::awaitable<void> {
        // Listening, never accepting: the kernel completes the handshake, nobody answers.
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        ORDO_CO_ASSERT_TRUE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        ORDO_CO_ASSERT_TRUE(::listen(fd, 8) == 0);
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
        detail::curl_multi http(co_await net::this_coro::executor);
        detail::http_request r;
        r.url = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/health";
        r.timeout = 300ms;
        const auto t0 = std::chrono::steady_clock::now();
        co_await expect_failure(http, r, errc::timed_out);
        const auto took = std::chrono::steady_clock::now() - t0;
        EXPECT_GE(took, 250ms);
        EXPECT_LT(took, 10s);
        ::close(fd);
    });
}

TEST_F(Etcd, CurlStreamDeliversChunksAsTheyArriveAndStopsWhenCancelled) {
    run_test([]() -> net::awaitable<void> {
        const auto ex = co_await net::this_coro::executor;
        detail::curl_multi http(ex);
        auto& etcd = shared_etcd();
        ORDO_CO_ASSERT_TRUE(co_await etcd.async_ready(http));
        const std::string key = fresh_prefix() + "k";
        nlohmann::json create;
        create["create_request"]["key"] = test::b64(key);
        detail::http_request r;
        r.url = etcd.endpoint() + "/v3/watch";
        r.post = create.dump();
        std::string got;
        // The watch stays open: its messages come as chunks while the stream runs.
        auto watch = [&]() -> net::awaitable<void> {
            (void)co_await http.async_stream(r, [&](std::string_view c) { got.append(c); });
            ADD_FAILURE() << "the watch ended by itself";
        };
        auto drive = [&]() -> net::awaitable<void> {
            EXPECT_TRUE(co_await wait_until(
                [&] { return got.find("\"created\":true") != std::string::npos; }, 20s));
            co_await test::etcd_put(http, etcd.endpoint(), key, "v1");
            EXPECT_TRUE(co_await wait_until(
                [&] { return got.find(test::b64("v1")) != std::string::npos; }, 20s));
        };
        // drive() ends first, which cancels the stream (|| waits for the first to succeed).
        try {
            co_await (watch() || drive());
        } catch (const std::exception& e) {
            ADD_FAILURE() << e.what();
        }
        // And a stream on its own, cancelled from outside, ends with errc::cancelled.
        net::cancellation_signal cancel;
        bool ended = false;
        std::error_code code;
        net::co_spawn(ex, http.async_stream(r, [](std::string_view) {}),
                      net::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, long) {
                          ended = true;
                          try {
                              if (e) std::rethrow_exception(e);
                          } catch (const std::system_error& x) {
                              code = x.code();
                          }
                      }));
        net::steady_timer t(ex, 200ms);
        co_await t.async_wait(use_tuple);
        cancel.emit(net::cancellation_type::terminal);
        EXPECT_TRUE(co_await wait_until([&] { return ended; }, 10s));
        EXPECT_EQ(code, errc::cancelled);
    });
}

TEST_F(Etcd, SourceGivesTheInitialSetWithWeightsAndGroups) {
    run_test([]() -> net::awaitable<void> {
        world w(co_await net::this_coro::executor);
        ORDO_CO_ASSERT_TRUE(co_await w.ready());
        co_await w.put(w.p + "tcp://127.0.0.1:7001", "");
        co_await w.put(w.p + "tcp://127.0.0.1:7002", R"({"weight": 2.5, "group": "canary"})");
        // Outside the prefix: not a member.
        co_await w.put(w.p.substr(0, w.p.size() - 1) + "x/tcp://127.0.0.1:7009", "");
        recorder rec;
        auto src = w.source(rec);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !rec.updates.empty(); }, 20s));
        const std::vector<member> want{{"tcp://127.0.0.1:7001", 1, ""},
                                       {"tcp://127.0.0.1:7002", 2.5, "canary"}};
        EXPECT_EQ(rec.updates.front(), want);
        EXPECT_TRUE(rec.problems.empty()) << rec.problems.front();
        const auto c = src->counters();
        EXPECT_EQ(c.members, 2u);
        EXPECT_GE(c.refreshes, 1u);
        EXPECT_EQ(c.failures, 0u);
        EXPECT_NE(src->describe().find(w.etcd.endpoint()), std::string::npos) << src->describe();
        src->stop();
    });
}

TEST_F(Etcd, SourceFollowsPutsDeletesAndWeightChangesThroughTheWatch) {
    run_test([]() -> net::awaitable<void> {
        world w(co_await net::this_coro::executor);
        ORDO_CO_ASSERT_TRUE(co_await w.ready());
        const std::string a = "tcp://127.0.0.1:7001", b = "tcp://127.0.0.1:7002";
        co_await w.put(w.p + a, "");
        recorder rec;
        // A re-read would also find the changes: with retry at 60 s, only the watch may.
        auto src = w.source(rec, 60s, "?timeout_ms=500");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 1; }, 20s));
        EXPECT_EQ(rec.urls(), std::vector<std::string>{a + "?timeout_ms=500"});
        // A key with a '?' of its own keeps it.
        co_await w.put(w.p + b + "?mode=pooled", "");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 2; }, 20s));
        EXPECT_EQ(rec.urls(),
                  (std::vector<std::string>{a + "?timeout_ms=500", b + "?mode=pooled"}));
        co_await w.put(w.p + a, R"({"weight": 3})");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 3; }, 20s));
        EXPECT_EQ(rec.updates.back().front().weight, 3);
        co_await w.del(w.p + b + "?mode=pooled");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 4; }, 20s));
        EXPECT_EQ(rec.urls(), std::vector<std::string>{a + "?timeout_ms=500"});
        // The last key gone: a failed lookup, reported; the router keeps the last good set.
        co_await w.del(w.p + a);
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return rec.said("no usable key"); }, 20s));
        EXPECT_EQ(rec.updates.size(), 4u);
        EXPECT_EQ(src->counters().members, 1u);
        EXPECT_GE(src->counters().failures, 1u);
        // And a key put again is a set again.
        co_await w.put(w.p + b, "");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 5; }, 20s));
        EXPECT_EQ(rec.urls(), std::vector<std::string>{b + "?timeout_ms=500"});
        src->stop();
        // No callback after stop().
        const auto seen = rec.updates.size();
        co_await w.put(w.p + a, "");
        net::steady_timer t(w.ex, 500ms);
        co_await t.async_wait(use_tuple);
        EXPECT_EQ(rec.updates.size(), seen);
    });
}

// An etcd key cannot weaken the route either (the rule file sources follow): no unix:// or
// inproc://, no TLS parameter of its own; the route's apply.
TEST_F(Etcd, KeysThatWouldWeakenTheRouteAreLeftOut) {
    run_test([]() -> net::awaitable<void> {
        world w(co_await net::this_coro::executor);
        ORDO_CO_ASSERT_TRUE(co_await w.ready());
        co_await w.put(w.p + "tls://127.0.0.1:7001", "");
        co_await w.put(w.p + "tls://127.0.0.1:7002?verify=none", "");
        co_await w.put(w.p + "unix:///run/app.sock", "");
        co_await w.put(w.p + "tcp://127.0.0.1:7003", "");
        recorder rec;
        auto src = w.source(rec, 300ms, "?ca=/etc/ca.pem");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !rec.updates.empty(); }, 20s));
        EXPECT_EQ(rec.urls(), std::vector<std::string>{"tls://127.0.0.1:7001?ca=/etc/ca.pem"});
        EXPECT_TRUE(rec.said("cannot set verify=")) << ::testing::PrintToString(rec.problems);
        EXPECT_TRUE(rec.said("not unix://")) << ::testing::PrintToString(rec.problems);
        EXPECT_TRUE(rec.said("the route is TLS")) << ::testing::PrintToString(rec.problems);
        EXPECT_EQ(src->counters().rejected, 3u);
        src->stop();
    });
}

TEST_F(Etcd, SourceLeavesOutKeysItCannotUseAndKeepsTheRest) {
    run_test([]() -> net::awaitable<void> {
        world w(co_await net::this_coro::executor);
        ORDO_CO_ASSERT_TRUE(co_await w.ready());
        const std::string good = "tcp://127.0.0.1:7001";
        co_await w.put(w.p + good, "");
        co_await w.put(w.p + "garbage-not-a-url", "");
        co_await w.put(w.p + "tcp://127.0.0.1:7002", "{bad json");
        co_await w.put(w.p + "tcp://127.0.0.1:7003", R"({"weight": -1})");
        recorder rec;
        auto src = w.source(rec);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !rec.updates.empty(); }, 20s));
        EXPECT_EQ(rec.urls(), std::vector<std::string>{good});
        EXPECT_TRUE(rec.said(w.p + "garbage-not-a-url"))
            << ::testing::PrintToString(rec.problems);
        EXPECT_TRUE(rec.said(w.p + "tcp://127.0.0.1:7002' left out: its value is not JSON"))
            << ::testing::PrintToString(rec.problems);
        EXPECT_TRUE(rec.said("weight is not a positive number"))
            << ::testing::PrintToString(rec.problems);
        EXPECT_EQ(src->counters().rejected, 3u);
        // Through the watch too: a bad key is left out, the set stays.
        co_await w.put(w.p + "tcp://no-port", "");
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return rec.said("tcp://no-port"); }, 20s));
        EXPECT_EQ(src->counters().rejected, 4u);
        EXPECT_EQ(rec.updates.size(), 1u);
        // A good key that turns bad leaves the set.
        co_await w.put(w.p + "tcp://127.0.0.1:7004", "");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 2; }, 20s));
        co_await w.put(w.p + "tcp://127.0.0.1:7004", "[1]");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 3; }, 20s));
        EXPECT_EQ(rec.urls(), std::vector<std::string>{good});
        EXPECT_TRUE(rec.said("not a JSON object"));
        src->stop();
    });
}

TEST_F(Etcd, RefreshNowRereadsAtMostOncePerRetry) {
    run_test([]() -> net::awaitable<void> {
        world w(co_await net::this_coro::executor);
        ORDO_CO_ASSERT_TRUE(co_await w.ready());
        co_await w.put(w.p + "tcp://127.0.0.1:7001", "");
        recorder rec;
        auto src = w.source(rec, 1s);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !rec.updates.empty(); }, 20s));
        const auto reads = src->counters().refreshes;
        // Asked 40 times in 2 s: at most one read a second, and at least one.
        net::steady_timer t(w.ex);
        for (int i = 0; i < 40; ++i) {
            src->refresh_now();
            t.expires_after(50ms);
            co_await t.async_wait(use_tuple);
        }
        EXPECT_TRUE(co_await wait_until([&] { return src->counters().refreshes > reads; }, 10s));
        EXPECT_LE(src->counters().refreshes - reads, 4u);
        EXPECT_EQ(rec.updates.size(), 1u);  // the same set: no update
        EXPECT_EQ(src->counters().failures, 0u) << src->counters().last_error;
        src->stop();
    });
}

TEST(EtcdDown, SourceKeepsTheLastGoodSetWhileEtcdIsDownAndRecovers) {
    run_test(
        []() -> net::awaitable<void> {
            const auto ex = co_await net::this_coro::executor;
            detail::curl_multi http(ex);
            test::etcd_server etcd;  // not started yet
            const std::string p = "/down/";
            auto src = make_etcd_source(ex, source_options(etcd.endpoint(), p));
            recorder rec;
            rec.start(*src);
            // Unreachable from the start: failures reported, no set.
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.problems.size() >= 2; }, 20s));
            EXPECT_TRUE(rec.said(etcd.endpoint())) << rec.problems.front();
            EXPECT_TRUE(rec.updates.empty());
            EXPECT_GE(src->counters().failures, 2u);

            etcd.start();
            ORDO_CO_ASSERT_TRUE(co_await etcd.async_ready(http));
            co_await test::etcd_put(http, etcd.endpoint(), p + "tcp://127.0.0.1:7001", "");
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 1; }, 20s));
            // The watch is on: a put shows.
            co_await test::etcd_put(http, etcd.endpoint(), p + "tcp://127.0.0.1:7002", "");
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 2; }, 20s));

            // SIGKILLed mid-watch: the watch breaks, reported; the set stays.
            const auto failures = src->counters().failures;
            const auto problems = rec.problems.size();
            etcd.kill();
            ORDO_CO_ASSERT_TRUE(
                co_await wait_until([&] { return src->counters().failures >= failures + 2; }, 20s));
            EXPECT_GT(rec.problems.size(), problems);
            EXPECT_EQ(rec.updates.size(), 2u);
            EXPECT_EQ(src->counters().members, 2u);

            // Back on the same ports and data: a fresh read, then the watch again.
            etcd.start();
            ORDO_CO_ASSERT_TRUE(co_await etcd.async_ready(http));
            co_await test::etcd_delete(http, etcd.endpoint(), p + "tcp://127.0.0.1:7001");
            ORDO_CO_ASSERT_TRUE(co_await wait_until(
                [&] { return rec.urls() == std::vector<std::string>{"tcp://127.0.0.1:7002"}; },
                20s));
            co_await test::etcd_put(http, etcd.endpoint(), p + "tcp://127.0.0.1:7003", "");
            ORDO_CO_ASSERT_TRUE(
                co_await wait_until([&] { return rec.has("tcp://127.0.0.1:7003"); }, 20s));
            src->stop();
        },
        120s);
}

// A hung etcd (SIGSTOP) leaves the watch open and silent: the periodic re-read times out and is
// reported, the set stays, and once etcd goes on a fresh read and watch see what changed.
TEST(EtcdDown, AHungEtcdIsNoticedByThePeriodicReadAndTheWatchStartsOver) {
    run_test(
        []() -> net::awaitable<void> {
            const auto ex = co_await net::this_coro::executor;
            detail::curl_multi http(ex);
            test::etcd_server etcd;
            etcd.start();
            ORDO_CO_ASSERT_TRUE(co_await etcd.async_ready(http));
            const std::string p = "/hung/";
            co_await test::etcd_put(http, etcd.endpoint(), p + "tcp://127.0.0.1:7001", "");
            auto o = source_options(etcd.endpoint(), p);
            o.timeout = 500ms;
            o.retry = 300ms;
            o.reread = 1000ms;
            auto src = make_etcd_source(ex, o);
            recorder rec;
            rec.start(*src);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.updates.size() == 1; }, 20s));
            etcd.pause();
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.said("timed out"); }, 20s));
            EXPECT_EQ(rec.updates.size(), 1u);
            EXPECT_EQ(src->counters().members, 1u);
            etcd.resume();
            ORDO_CO_ASSERT_TRUE(co_await etcd.async_ready(http));
            co_await test::etcd_put(http, etcd.endpoint(), p + "tcp://127.0.0.1:7002", "");
            ORDO_CO_ASSERT_TRUE(
                co_await wait_until([&] { return rec.has("tcp://127.0.0.1:7002"); }, 20s));
            src->stop();
        },
        120s);
}

etcd_registration_options registration_options(const std::string& endpoint,
                                               const std::string& prefix, const std::string& url) {
    etcd_registration_options o;
    o.endpoint = endpoint;
    o.prefix = prefix;
    o.url = url;
    o.weight = 2;
    o.group = "blue";
    o.ttl = 2s;
    return o;
}

TEST_F(Etcd, RegistrationAppearsWithItsWeightAndAsyncStopRemovesItAtOnce) {
    run_test([]() -> net::awaitable<void> {
        world w(co_await net::this_coro::executor);
        ORDO_CO_ASSERT_TRUE(co_await w.ready());
        co_await w.put(w.p + "tcp://127.0.0.1:7001", "");
        recorder rec;
        auto src = w.source(rec);
        etcd_registration reg(w.ex,
                              registration_options(w.etcd.endpoint(), w.p, "tcp://127.0.0.1:7100"));
        co_await reg.async_start();
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return rec.has("tcp://127.0.0.1:7100"); }, 20s));
        const auto& set = rec.updates.back();
        const auto it = std::find_if(set.begin(), set.end(), [](const member& m) {
            return m.url == "tcp://127.0.0.1:7100";
        });
        EXPECT_EQ(it->weight, 2);
        EXPECT_EQ(it->group, "blue");
        // Kept alive past several ttls.
        net::steady_timer t(w.ex, 5s);
        co_await t.async_wait(use_tuple);
        EXPECT_TRUE(co_await w.has(w.p + "tcp://127.0.0.1:7100"));
        EXPECT_TRUE(rec.has("tcp://127.0.0.1:7100"));
        const auto t0 = std::chrono::steady_clock::now();
        co_await reg.async_stop();
        EXPECT_FALSE(co_await w.has(w.p + "tcp://127.0.0.1:7100"));
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return !rec.has("tcp://127.0.0.1:7100"); }, 20s));
        // The key went with the revoke (checked above); the watch tells the source soon after.
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
        src->stop();
    });
}

TEST_F(Etcd, RegistrationWhoseLeaseWasRevokedBehindItsBackPutsItselfAgain) {
    run_test([]() -> net::awaitable<void> {
        world w(co_await net::this_coro::executor);
        ORDO_CO_ASSERT_TRUE(co_await w.ready());
        const std::string key = w.p + "tcp://127.0.0.1:7100";
        auto o = registration_options(w.etcd.endpoint(), w.p, "tcp://127.0.0.1:7100");
        std::vector<std::string> events;
        o.on_event = [&](const std::string& e) { events.push_back(e); };
        etcd_registration reg(w.ex, o);
        co_await reg.async_start();
        const auto lease = co_await test::etcd_lease_of(w.http, w.etcd.endpoint(), key);
        ORDO_CO_ASSERT_TRUE(lease != 0);
        nlohmann::json revoke;
        revoke["ID"] = std::to_string(lease);
        co_await test::etcd_post(w.http, w.etcd.endpoint(), "/v3/lease/revoke", revoke);
        EXPECT_FALSE(co_await w.has(key));
        // The next keep-alive (every ttl / 3) finds the lease gone and puts the key again.
        std::int64_t again = 0;
        for (int i = 0; i < 100 && (again == 0 || again == lease); ++i) {
            net::steady_timer t(w.ex, 100ms);
            co_await t.async_wait(use_tuple);
            again = co_await test::etcd_lease_of(w.http, w.etcd.endpoint(), key);
        }
        EXPECT_NE(again, 0);
        EXPECT_NE(again, lease);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !events.empty(); }, 10s));
        EXPECT_NE(events.front().find("put again"), std::string::npos) << events.front();
        EXPECT_NE(events.front().find(key), std::string::npos) << events.front();
        co_await reg.async_stop();
        EXPECT_FALSE(co_await w.has(key));
    });
}

TEST_F(Etcd, RegistrationRefusesAUrlOrdoCannotParseAndNamesAnUnreachableEtcd) {
    run_test([]() -> net::awaitable<void> {
        const auto ex = co_await net::this_coro::executor;
        auto& etcd = shared_etcd();
        etcd_registration bad(ex, registration_options(etcd.endpoint(), "/x/", "tcp://no-port"));
        try {
            co_await bad.async_start();
            ADD_FAILURE() << "a URL ordo cannot parse was registered";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address);
            EXPECT_NE(std::string(e.what()).find("tcp://no-port"), std::string::npos) << e.what();
        }
        const std::string nowhere = "http://127.0.0.1:" + std::to_string(test::free_port());
        etcd_registration lost(ex, registration_options(nowhere, "/x/", "tcp://127.0.0.1:7100"));
        try {
            co_await lost.async_start();
            ADD_FAILURE() << "registered with no etcd";
        } catch (const std::system_error& e) {
            EXPECT_NE(std::string(e.what()).find(nowhere), std::string::npos) << e.what();
        }
    });
}

// ordo-inc-server --register as a child: a SIGKILLed replica leaves the set when its lease
// expires, not before (a ttl of 6 s, kept alive every 2 s: at least 4 s after the kill, and
// within ttl + 4 s on a busy machine); a SIGTERMed one revokes its key before it stops, well
// before a lease could expire.
TEST_F(Etcd, KilledRegisteredServerLeavesWithinTheTtlAndAStoppedOneAtOnce) {
    const char* server = std::getenv("ORDO_INC_SERVER");
    ASSERT_NE(server, nullptr) << "ORDO_INC_SERVER is not set (run through meson test)";
    run_test(
        [server]() -> net::awaitable<void> {
            world w(co_await net::this_coro::executor);
            ORDO_CO_ASSERT_TRUE(co_await w.ready());
            co_await w.put(w.p + "tcp://127.0.0.1:7001", "");
            recorder rec;
            auto src = w.source(rec);
            const std::string where =
                "etcd://127.0.0.1:" + std::to_string(w.etcd.client_port()) + w.p;
            for (const int sig : {SIGKILL, SIGTERM}) {
                test::child srv({server, "--listen", "tcp://127.0.0.1:0", "--register", where,
                                 "--register-ttl-s", "6"});
                const std::string listening = srv.read_line(20s);
                ORDO_CO_ASSERT_TRUE(listening.rfind("listening on ", 0) == 0);
                const std::string url = listening.substr(13);
                EXPECT_EQ(srv.read_line(20s), "registered " + where + url);
                ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.has(url); }, 20s));
                // Past a keep-alive or two.
                net::steady_timer t(w.ex, 1500ms);
                co_await t.async_wait(use_tuple);
                EXPECT_TRUE(rec.has(url));
                const auto t0 = std::chrono::steady_clock::now();
                srv.signal(sig);
                ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !rec.has(url); }, 20s));
                const auto took = std::chrono::steady_clock::now() - t0;
                if (sig == SIGKILL) {
                    EXPECT_GE(took, 3500ms) << "the lease outlives its last keep-alive by ttl";
                    EXPECT_LT(took, 10s) << "ttl 6 s + 4 s";
                } else {
                    EXPECT_LT(took, 3s) << "revoked at once, not expired";
                }
                EXPECT_TRUE(srv.wait_exit(10s).has_value());
            }
            src->stop();
        },
        120s);
}

// ---- etcd over https (etcd_access) ----

// Restores plain http for the tests' own requests when a TLS test ends.
// (Fields set one by one: GCC 12 cannot brace-initialize these from string literals inside a
// coroutine.)
struct access_scope {
    access_scope(const std::string& ca, const std::string& cert, const std::string& key) {
        auto& a = test::test_access();
        a.ca = ca;
        a.cert = cert;
        a.key = key;
    }
    ~access_scope() { test::test_access() = {}; }
};

std::string write_secret(const std::string& dir, const std::string& name, const std::string& v) {
    const std::string path = dir + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs((v + "\n").c_str(), f);
    std::fclose(f);
    ::chmod(path.c_str(), 0600);  // a secret: a file others may read is refused
    return path;
}

// Starts `e` serving https with the shared test certificate; `client_ca`: it requires client
// certificates that CA signed; `token_ttl_s`: its authentication's tokens live this long.
void start_over_https(test::etcd_server& e, const std::string& client_ca, int token_ttl_s) {
    const auto& f = test::shared_tls_files();
    test::etcd_tls tls;
    tls.cert = f.server_cert;
    tls.key = f.server_key;
    tls.client_ca = client_ca;
    tls.token_ttl_s = token_ttl_s;
    e.tls = tls;
    e.start();
}

// Adds the user root (password secret-pw, role root) and turns etcd's authentication on.
net::awaitable<void> enable_auth(detail::curl_multi& http, std::string ep) {
    nlohmann::json user, grant;
    user["name"] = "root";
    user["password"] = "secret-pw";
    grant["user"] = "root";
    grant["role"] = "root";
    co_await test::etcd_post(http, ep, "/v3/auth/user/add", user);
    co_await test::etcd_post(http, ep, "/v3/auth/user/grant", grant);
    co_await test::etcd_post(http, ep, "/v3/auth/enable", nlohmann::json::object());
}

// etcd over https with its authentication on, tokens living 1 s: a router following
// route+etcd+https with the CA, a user and a password file reaches a server that registered
// itself the same way, and the registration outlives many tokens (each renewed when etcd
// refuses it). Without the user, or with a wrong password, the reason is etcd's.
TEST(EtcdTls, OverHttpsWithAUserARouterFollowsWhatAServerRegistered) {
    run_test(
        []() -> net::awaitable<void> {
            auto ex = co_await net::this_coro::executor;
            const auto& f = test::shared_tls_files();
            test::etcd_server e;
            start_over_https(e, "", 1);
            access_scope scope(f.ca, std::string(), std::string());
            detail::curl_multi http(ex);
            ORDO_CO_ASSERT_TRUE(co_await e.async_ready(http));
            const std::string ep = e.endpoint();
            co_await enable_auth(http, ep);
            const std::string pw = write_secret(e.dir(), "pw", "secret-pw");

            server srv(ex);
            srv.on("inc", [](int x) { return x + 1; });
            const std::string at = srv.listen("tcp://127.0.0.1:0");
            etcd_registration_options ro = registration_options(ep, "/tls/", at);
            ro.access.ca_file = f.ca;
            ro.access.user = "root";
            ro.access.password = "secret-pw";
            std::vector<std::string> events;
            ro.on_event = [&](const std::string& line) { events.push_back(line); };
            etcd_registration reg(ex, ro);
            co_await reg.async_start();

            const std::string route = "route+etcd+https://127.0.0.1:" +
                                      std::to_string(e.client_port()) + "/tls/?etcd_ca=" + f.ca +
                                      "&etcd_user=root&etcd_password_file=" + pw +
                                      "&wait_for_replica_ms=20000";
            auto c = co_await async_connect(route);
            EXPECT_EQ(co_await c.async_call<int>("inc", 1), 2);
            // Several token lifetimes: the lease is kept alive throughout.
            net::steady_timer t(ex, 4s);
            co_await t.async_wait(use_tuple);
            EXPECT_EQ(co_await c.async_call<int>("inc", 2), 3);
            for (const auto& line : events) ADD_FAILURE() << "registration event: " << line;

            // etcd restarts: the tokens it gave are gone. A source that had one logs in again.
            recorder user;
            auto uo = source_options(ep, "/tls/");
            uo.access.ca_file = f.ca;
            uo.access.user = "root";
            uo.access.password = "secret-pw";
            auto usrc = make_etcd_source(ex, uo);
            user.start(*usrc);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return user.has(at); }, 20s));
            e.kill();
            e.start();
            ORDO_CO_ASSERT_TRUE(co_await e.async_ready(http));
            nlohmann::json login;
            login["name"] = "root";
            login["password"] = "secret-pw";
            test::test_access().token =
                (co_await test::etcd_post(http, ep, "/v3/auth/authenticate", login))["token"];
            co_await test::etcd_put(http, ep, "/tls/tcp://127.0.0.1:7999", "");
            EXPECT_TRUE(co_await wait_until([&] { return user.has("tcp://127.0.0.1:7999"); }, 30s));
            usrc->stop();
            test::test_access().token.clear();

            recorder nobody;
            auto o = source_options(ep, "/tls/");
            o.access.ca_file = f.ca;
            auto src = make_etcd_source(ex, o);
            nobody.start(*src);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !nobody.problems.empty(); }, 20s));
            EXPECT_TRUE(nobody.said("user name is empty")) << nobody.problems.front();
            EXPECT_TRUE(nobody.updates.empty());
            src->stop();

            ro.access.password = "wrong";
            etcd_registration bad(ex, ro);
            try {
                co_await bad.async_start();
                ADD_FAILURE() << "a wrong password registered";
            } catch (const std::system_error& x) {
                EXPECT_NE(std::string(x.what()).find("authentication failed"), std::string::npos)
                    << x.what();
            }
            co_await reg.async_stop();
            co_await srv.async_stop();
        },
        120s);
}

// An etcd that requires client certificates: a source with one reads the set; one without is
// refused at the handshake, and says so.
TEST(EtcdTls, AClientCertificateIsPresentedToAnEtcdThatRequiresOne) {
    run_test(
        []() -> net::awaitable<void> {
            auto ex = co_await net::this_coro::executor;
            const auto& f = test::shared_tls_files();
            test::etcd_server e;
            start_over_https(e, f.ca, 300);
            access_scope scope(f.ca, f.client_cert, f.client_key);
            detail::curl_multi http(ex);
            ORDO_CO_ASSERT_TRUE(co_await e.async_ready(http));
            co_await test::etcd_put(http, e.endpoint(), "/cert/tcp://127.0.0.1:7001", "");
            recorder with;
            auto o = source_options(e.endpoint(), "/cert/");
            o.access.ca_file = f.ca;
            o.access.cert_file = f.client_cert;
            o.access.key_file = f.client_key;
            auto src = make_etcd_source(ex, o);
            with.start(*src);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !with.updates.empty(); }, 20s));
            EXPECT_TRUE(with.has("tcp://127.0.0.1:7001"));
            src->stop();
            recorder without;
            o.access.cert_file.clear();
            o.access.key_file.clear();
            auto bare = make_etcd_source(ex, o);
            without.start(*bare);
            ORDO_CO_ASSERT_TRUE(
                co_await wait_until([&] { return !without.problems.empty(); }, 20s));
            EXPECT_TRUE(without.updates.empty());
            EXPECT_TRUE(without.said(e.endpoint())) << without.problems.front();
            bare->stop();
        },
        120s);
}

}  // namespace
}  // namespace ordo
