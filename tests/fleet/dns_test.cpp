// ordo::make_dns_source against a real DNS server (dnsmasq from Debian's dnsmasq-base, started
// here on 127.0.0.1 and a free port, stopped by PID), and against a fake one inside the test
// that answers with garbage, truncated records or a wrong id.
#include "ordo/fleet/sources.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <asio/ip/udp.hpp>

#include "support/dnsmasq.hpp"
#include "support/processes.hpp"
#include "support/source_recorder.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using test::run_test;
using test::wait_until;

using test::dns_answers;
using test::dns_query;
using test::dnsmasq;
using test::free_udp_port;

using test::recorder;

std::uint64_t lookups(const replica_source& s) {
    const auto c = s.counters();
    return c.refreshes + c.failures;
}

dns_source_options options(std::string name, std::string nameserver, std::uint16_t port = 0) {
    dns_source_options o;
    o.name = std::move(name);
    o.nameserver = std::move(nameserver);
    o.port = port;
    return o;
}

class Dns : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!std::filesystem::exists(dnsmasq::path()))
            FAIL() << dnsmasq::path()
                   << " not found: apt-get install dnsmasq-base (or set ORDO_DNSMASQ)";
    }
};

TEST_F(Dns, ARecordsOfANameGiveOneMemberPerAddressOnThePort) {
    run_test([]() -> net::awaitable<void> {
        dnsmasq dns;
        dns.set_hosts("127.0.0.3 svc.test\n127.0.0.2 svc.test\n::2 svc.test\n");
        dns.start();
        auto o = options("svc.test", dns.nameserver(), 7000);
        auto src = make_dns_source(co_await net::this_coro::executor, o);
        EXPECT_EQ(src->describe(), "dns:svc.test (nameserver " + dns.nameserver() + ")");
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !r.updates.empty(); }));
        EXPECT_EQ(r.updates.back(), (std::vector<member>{{"tcp://127.0.0.2:7000", 1, ""},
                                                         {"tcp://127.0.0.3:7000", 1, ""},
                                                         {"tcp://[::2]:7000", 1, ""}}));
        EXPECT_EQ(src->counters().members, 3u);
        EXPECT_EQ(src->counters().failures, 0u);
        EXPECT_TRUE(r.problems.empty());
    });
}

TEST_F(Dns, AnIpv4OnlyNameWithASuffixAndAnotherScheme) {
    run_test([]() -> net::awaitable<void> {
        dnsmasq dns;
        dns.set_hosts("127.0.0.7 v4.svc.test\n");
        dns.start();
        auto o = options("v4.svc.test", dns.nameserver(), 7443);
        o.scheme = "tls";
        o.url_suffix = "?ca=/etc/ca.pem";
        auto src = make_dns_source(co_await net::this_coro::executor, o);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !r.updates.empty(); }));
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tls://127.0.0.7:7443?ca=/etc/ca.pem"});
    });
}

TEST_F(Dns, SrvRecordsGivePortsAndWeightsOfTheLowestPriority) {
    run_test([]() -> net::awaitable<void> {
        dnsmasq dns;
        dns.set_hosts("127.0.0.11 r1.svc.test\n127.0.0.12 r2.svc.test\n127.0.0.13 r3.svc.test\n");
        dns.start({"_ordo._tcp.svc.test,r1.svc.test,7001,0,10",
                   "_ordo._tcp.svc.test,r2.svc.test,7002,0,0",     // weight 0: becomes 1
                   "_ordo._tcp.svc.test,r3.svc.test,7003,1,50",    // a fallback: not used
                   "_ordo._tcp.svc.test,gone.svc.test,7004,0,5"});  // no address: left out
        auto o = options("_ordo._tcp.svc.test", dns.nameserver());
        o.refresh = 200ms;
        auto src = make_dns_source(co_await net::this_coro::executor, o);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !r.updates.empty(); }));
        EXPECT_EQ(r.updates.back(), (std::vector<member>{{"tcp://127.0.0.11:7001", 10, ""},
                                                         {"tcp://127.0.0.12:7002", 1, ""}}));
        EXPECT_TRUE(r.said("dns:_ordo._tcp.svc.test (nameserver " + dns.nameserver() +
                           "): target gone.svc.test: no address"));
        const auto c = src->counters();
        EXPECT_GE(c.refreshes, 1u);
        EXPECT_EQ(c.rejected, c.refreshes);  // gone.svc.test, once a lookup
        EXPECT_EQ(c.members, 2u);
        // Restarted with other records (a new weight, a fallback promoted): the next lookups
        // give the new set.
        dns.start({"_ordo._tcp.svc.test,r1.svc.test,7001,0,30",
                   "_ordo._tcp.svc.test,r3.svc.test,7003,0,50"});
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }));
        EXPECT_EQ(r.updates.back(), (std::vector<member>{{"tcp://127.0.0.11:7001", 30, ""},
                                                         {"tcp://127.0.0.13:7003", 50, ""}}));
    });
}

TEST_F(Dns, AChangeOfRecordsIsSeenWithinRefreshAndAnEqualAnswerIsNoUpdate) {
    run_test([]() -> net::awaitable<void> {
        dnsmasq dns;
        dns.set_hosts("127.0.0.2 svc.test\n127.0.0.3 svc.test\n");
        dns.start();
        auto o = options("svc.test", dns.nameserver(), 7000);
        o.refresh = 200ms;
        auto src = make_dns_source(co_await net::this_coro::executor, o);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        // Five more lookups with the same answer: no update.
        const auto seen = lookups(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return lookups(*src) >= seen + 5; }));
        EXPECT_EQ(r.updates.size(), 1u);
        const auto changed_at = clock_type::now();
        dns.set_hosts("127.0.0.2 svc.test\n127.0.0.4 svc.test\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }));
        EXPECT_LT(clock_type::now() - changed_at, 5s);  // a few refreshes on a loaded machine
        EXPECT_EQ(r.urls(),
                  (std::vector<std::string>{"tcp://127.0.0.2:7000", "tcp://127.0.0.4:7000"}));
    });
}

TEST_F(Dns, RefreshNowIsRateLimitedToOneLookupPerMinRefresh) {
    run_test([]() -> net::awaitable<void> {
        dnsmasq dns;
        dns.set_hosts("127.0.0.2 svc.test\n");
        dns.start();
        auto o = options("svc.test", dns.nameserver(), 7000);
        o.refresh = 600s;  // no periodic lookup within the test
        o.min_refresh = 1000ms;
        auto src = make_dns_source(co_await net::this_coro::executor, o);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return lookups(*src) == 1; }));
        const auto first_done = clock_type::now();
        for (int i = 0; i < 100; ++i) src->refresh_now();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return lookups(*src) == 2; }));
        // Not before min_refresh after the first lookup began (which was before first_done).
        EXPECT_GE(clock_type::now() - first_done, 500ms);
        const auto second_done = clock_type::now();
        for (int i = 0; i < 100; ++i) src->refresh_now();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return lookups(*src) == 3; }));
        EXPECT_GE(clock_type::now() - second_done, 500ms);
        // 200 calls gave 2 lookups: none is left to come.
        co_await test::sleep_for(2500ms);
        EXPECT_EQ(lookups(*src), 3u);
        EXPECT_EQ(r.updates.size(), 1u);
    });
}

TEST_F(Dns, AStoppedNameserverIsCountedAndReportedAndTheSetStaysUntilItIsBack) {
    run_test([]() -> net::awaitable<void> {
        dnsmasq dns;
        dns.set_hosts("127.0.0.2 svc.test\n");
        dns.start();
        auto o = options("svc.test", dns.nameserver(), 7000);
        o.refresh = 200ms;
        o.timeout = 600ms;
        auto src = make_dns_source(co_await net::this_coro::executor, o);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        dns.kill();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return src->counters().failures >= 2; }));
        const auto c = src->counters();
        EXPECT_EQ(c.members, 1u);
        EXPECT_EQ(r.updates.size(), 1u);  // the router keeps tcp://127.0.0.2:7000
        // Refused (ICMP port unreachable) or timed out, as the kernel has it.
        EXPECT_TRUE(c.last_error.find("dns:svc.test (nameserver " + dns.nameserver() +
                                      "): address lookup failed: ") == 0)
            << c.last_error;
        EXPECT_TRUE(c.last_error.find("(ARES_ECONNREFUSED)") != std::string::npos ||
                    c.last_error.find("(ARES_ETIMEOUT)") != std::string::npos)
            << c.last_error;
        EXPECT_TRUE(r.said(c.last_error));
        // Back, with another address: the next lookup gives it.
        dns.set_hosts("127.0.0.3 svc.test\n");
        dns.start();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }));
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tcp://127.0.0.3:7000"});
    });
}

TEST_F(Dns, AnUnknownNameIsReportedAsNxdomain) {
    run_test([]() -> net::awaitable<void> {
        dnsmasq dns;
        dns.set_hosts("127.0.0.2 svc.test\n");
        dns.start();
        auto ex = co_await net::this_coro::executor;
        auto host = make_dns_source(ex, options("nothere.svc.test", dns.nameserver(), 7000));
        auto srv = make_dns_source(ex, options("_none._tcp.svc.test", dns.nameserver()));
        recorder rh, rs;
        rh.start(*host);
        rs.start(*srv);
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return host->counters().failures >= 1 && srv->counters().failures >= 1; }));
        EXPECT_TRUE(rh.said("dns:nothere.svc.test (nameserver " + dns.nameserver() +
                            "): address lookup failed: Domain name not found (ARES_ENOTFOUND)"));
        EXPECT_TRUE(rs.said("dns:_none._tcp.svc.test (nameserver " + dns.nameserver() +
                            "): SRV lookup failed: Domain name not found (ARES_ENOTFOUND)"));
        EXPECT_TRUE(rh.updates.empty());
        EXPECT_TRUE(rs.updates.empty());
    });
}

// A DNS server inside the test: it answers A queries as `mode` says, AAAA queries with no
// record, and SRV queries with one record for srv.fake.test:7000 (or a cut one).
struct fake_dns {
    enum class mode { good, garbage_after_id, wrong_id, truncated, bad_rdlength, tiny, bad_srv };

    explicit fake_dns(net::any_io_executor ex) : sock(ex, {net::ip::make_address("127.0.0.1"), 0}) {}

    net::awaitable<void> serve() {
        std::array<char, 512> buf;
        for (;;) {
            net::ip::udp::endpoint from;
            auto [ec, n] = co_await sock.async_receive_from(net::buffer(buf), from, use_tuple);
            if (ec) break;  // closed
            if (n < 17) continue;
            ++queries;
            const std::string q(buf.data(), n);
            const auto qtype = static_cast<std::uint8_t>(q[n - 3]);
            std::string a = answer(q, qtype);
            co_await sock.async_send_to(net::buffer(a), from, use_tuple);
        }
        done = true;
    }

    std::string answer(const std::string& q, std::uint8_t qtype) const {
        // Header: the query's id, QR + RD + RA, NOERROR, one question, `an` answers.
        auto header = [&](int an) {
            return q.substr(0, 2) + std::string{char(0x81), char(0x80), 0, 1, 0, char(an), 0, 0, 0, 0};
        };
        const std::string question = q.substr(12);
        const std::string ptr_ttl_a = {char(0xc0), 12, 0, 1, 0, 1, 0, 0, 0, 0};
        if (qtype == 28) return header(0) + question;  // AAAA: none
        if (qtype == 33) {                             // SRV
            std::string target = std::string{3} + "srv" + std::string{4} + "fake" +
                                 std::string{4} + "test" + std::string{0};
            std::string rdata = std::string{0, 0, 0, 5, char(7000 >> 8), char(7000 & 0xff)} + target;
            if (m == mode::bad_srv) rdata = rdata.substr(0, 4);  // priority, weight: no port
            return header(1) + question +
                   std::string{char(0xc0), 12, 0, 33, 0, 1, 0, 0, 0, 0, 0, char(rdata.size())} +
                   rdata;
        }
        const std::string good = header(1) + question + ptr_ttl_a + std::string{0, 4} +
                                 std::string{127, 0, 0, char(address)};
        switch (m) {
            case mode::good: return good;
            case mode::garbage_after_id: {
                std::string g = q.substr(0, 2);
                for (int i = 0; i < 60; ++i) g += char((i * 37 + 11) & 0xff);
                return g;
            }
            case mode::wrong_id: {
                std::string w = good;
                w[0] = char(w[0] ^ 0x5a);
                return w;
            }
            case mode::truncated: return good.substr(0, good.size() - 7);  // inside the record
            case mode::bad_rdlength: {
                std::string b = good;
                b[b.size() - 6] = char(0xff);  // rdlength 0xff04, far past the end
                return b;
            }
            case mode::tiny: return q.substr(0, 5);
            case mode::bad_srv: return good;
        }
        return good;
    }

    net::ip::udp::socket sock;
    mode m = mode::good;
    int address = 9;  // 127.0.0.<address>
    int queries = 0;
    bool done = false;
};

TEST_F(Dns, MalformedAnswersAreReportedAndTheLastSetStays) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        fake_dns fake(ex);
        net::co_spawn(ex, fake.serve(), [](std::exception_ptr) {});
        const std::string ns = "127.0.0.1:" + std::to_string(fake.sock.local_endpoint().port());
        auto o = options("a.fake.test", ns, 7000);
        o.refresh = 100ms;
        o.timeout = 600ms;
        auto src = make_dns_source(ex, o);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tcp://127.0.0.9:7000"});
        using mode = fake_dns::mode;
        // c-ares drops a reply that does not match its query (id, question) and times out; a
        // matching reply whose records do not parse is a misformatted one.
        const std::pair<mode, std::string> cases[] = {
            {mode::garbage_after_id, "(ARES_ETIMEOUT)"}, {mode::wrong_id, "(ARES_ETIMEOUT)"},
            {mode::tiny, "(ARES_ETIMEOUT)"},           {mode::truncated, "(ARES_EBADRESP)"},
            {mode::bad_rdlength, "(ARES_EBADRESP)"},
        };
        for (const auto& [m, reason] : cases) {
            SCOPED_TRACE(reason);
            fake.m = m;
            const auto failed = src->counters().failures;
            ORDO_CO_ASSERT_TRUE(
                co_await wait_until([&] { return src->counters().failures >= failed + 2; }));
            const auto c = src->counters();
            EXPECT_EQ(c.last_error.rfind("dns:a.fake.test (nameserver " + ns +
                                         "): address lookup failed: ", 0), 0u)
                << c.last_error;
            EXPECT_NE(c.last_error.find(reason), std::string::npos) << c.last_error;
            EXPECT_TRUE(r.said(c.last_error));
            EXPECT_EQ(r.updates.size(), 1u);
            EXPECT_EQ(c.members, 1u);
        }
        // Well-formed again, with another address: seen.
        fake.m = mode::good;
        fake.address = 10;
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }));
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tcp://127.0.0.10:7000"});
        src.reset();

        // SRV: a good record, then one cut short.
        fake.m = mode::good;
        auto so = options("_ordo._tcp.fake.test", ns);
        so.refresh = 100ms;
        so.timeout = 600ms;
        auto srv = make_dns_source(ex, so);
        recorder rs;
        rs.start(*srv);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rs.updates.size() == 1; }));
        EXPECT_EQ(rs.updates.back(), (std::vector<member>{{"tcp://127.0.0.10:7000", 5, ""}}));
        fake.m = mode::bad_srv;
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return srv->counters().failures >= 1; }));
        EXPECT_TRUE(rs.said("dns:_ordo._tcp.fake.test (nameserver " + ns +
                            "): malformed SRV answer: "))
            << srv->counters().last_error;
        EXPECT_EQ(rs.updates.size(), 1u);
        srv.reset();

        fake.sock.close();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return fake.done; }));
    });
}

TEST_F(Dns, NoCallbackRunsAfterStopEvenWithALookupUnderWay) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        fake_dns fake(ex);
        net::co_spawn(ex, fake.serve(), [](std::exception_ptr) {});
        fake.m = fake_dns::mode::wrong_id;  // never a usable answer: lookups wait for timeouts
        const std::string ns = "127.0.0.1:" + std::to_string(fake.sock.local_endpoint().port());
        auto o = options("a.fake.test", ns, 7000);
        o.timeout = 1000ms;
        auto src = make_dns_source(ex, o);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return fake.queries >= 1; }));
        src->stop();
        src.reset();  // c-ares destroyed with its queries; queued handlers find the state stopped
        co_await test::sleep_for(2500ms);
        EXPECT_TRUE(r.problems.empty());
        EXPECT_TRUE(r.updates.empty());
        fake.sock.close();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return fake.done; }));
    });
}

TEST(DnsOptions, BadOptionsAreRefusedAtCreation) {
    net::io_context io;
    auto ex = io.get_executor();
    EXPECT_THROW(make_dns_source(ex, options("", "")), std::system_error);
    EXPECT_THROW(make_dns_source(ex, options("svc.test", "")), std::system_error);  // no port
    EXPECT_THROW(make_dns_source(ex, options("svc.test", "not an ip", 7000)), std::system_error);
    auto o = options("svc.test", "127.0.0.1:53", 7000);
    o.scheme = "gopher";
    EXPECT_THROW(make_dns_source(ex, o), std::system_error);
    // "[ipv6]:port" is a nameserver c-ares takes.
    auto v6 = make_dns_source(ex, options("svc.test", "[::1]:5353", 7000));
    EXPECT_EQ(v6->describe(), "dns:svc.test (nameserver [::1]:5353)");
}

}  // namespace
}  // namespace ordo
