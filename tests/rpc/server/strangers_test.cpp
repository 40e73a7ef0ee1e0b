// What a server spends on callers it does not know yet (server_options::strangers;
// docs/security.md "Strangers"): the small message limit before authentication, the deadlines
// for authentication and for a first message, the cap per address, the oldest stranger making
// room, failed authentications per address, reports that a flood cannot multiply; and the
// smaller trust-boundary fixes beside them (reserved notifications sent as requests, control
// characters in event lines, token files others may read).
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <optional>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>
#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "rpc/wire/errors.hpp"
#include "support/peers.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"
#include "support/tokens.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::alice_token;
using test::port_of;
using test::run_test;
using test::wait_until;
using tcp = net::ip::tcp;

#define EXPECT_CONTAINS(text, part) \
    EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

struct stranger_events {
    std::vector<server_event> events;
    std::function<void(const server_event&)> recorder() {
        return [this](const server_event& e) { events.push_back(e); };
    }
    std::size_t count(server_event::kind k, std::string_view part = {}) const {
        std::size_t n = 0;
        for (const auto& e : events)
            if (e.what == k && e.reason.find(part) != std::string::npos) ++n;
        return n;
    }
};

server_options with_tokens(stranger_events& log) {
    server_options o;
    o.authenticate = authenticate_tokens({{alice_token, "alice"}});
    o.on_event = log.recorder();
    return o;
}

peer_options as_alice() {
    peer_options o;
    o.credentials.token = alice_token;
    return o;
}

// A raw connection from `source` (an address of 127.0.0.0/8), as a stranger opens one.
net::awaitable<tcp::socket> connect_from(std::string source, std::uint16_t port) {
    tcp::socket s(co_await net::this_coro::executor);
    s.open(tcp::v4());
    s.bind({net::ip::make_address(source), 0});
    co_await s.async_connect({net::ip::make_address("127.0.0.1"), port}, net::use_awaitable);
    co_return s;
}

// What `s` reads until the server ends the connection, or nothing more within `limit`: the
// bytes, and whether the connection ended.
net::awaitable<std::pair<std::string, bool>> read_to_end(tcp::socket& s,
                                                         std::chrono::milliseconds limit) {
    using namespace net::experimental::awaitable_operators;
    std::string got;
    char chunk[4096];
    net::steady_timer t(co_await net::this_coro::executor, limit);
    for (;;) {
        auto r = co_await (s.async_read_some(net::buffer(chunk), use_tuple) ||
                           t.async_wait(use_tuple));
        if (r.index() == 1) co_return std::make_pair(got, false);
        auto [ec, n] = std::get<0>(r);
        got.append(chunk, n);
        if (ec) co_return std::make_pair(got, true);
    }
}

// The response to `msgid` among what `t` reads: its error code and text (none: a result).
net::awaitable<std::pair<std::error_code, std::string>> answer_to(tcp::socket& s,
                                                                  std::uint32_t msgid) {
    decoder d;
    char chunk[4096];
    for (;;) {
        auto [ec, n] = co_await s.async_read_some(net::buffer(chunk), use_tuple);
        if (ec) co_return std::make_pair(make_error_code(errc::peer_lost), ec.message());
        d.feed(std::string_view(chunk, n));
        while (auto m = d.next()) {
            if (m->kind != message_kind::response || m->msgid != msgid) continue;
            std::string text;
            if (m->error.is_nil()) co_return std::make_pair(std::error_code{}, text);
            const std::error_code code = detail::error_from_wire(m->error, text);
            co_return std::make_pair(code, text);
        }
    }
}

net::awaitable<void> write_all(tcp::socket& s, const buffer& b) {
    co_await net::async_write(s, net::buffer(b.data(), b.size()), use_tuple);
}

// One 100 MiB ordo.auth is refused at its header: nothing of it is buffered, the stranger is
// told why, and a caller with a token then sends 1 MiB calls as before.
TEST(Strangers, ABigMessageBeforeAuthenticationIsRefusedAtItsHeader) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        stranger_events log;
        server srv(ex, with_tokens(log));
        srv.on("size", [](const std::string& s) { return s.size(); });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto s = co_await connect_from("127.0.0.1", port_of(url));
        // ordo.auth [{"token": str of 100 MiB}], the header only.
        const std::string head = std::string("\x93\x02\xa9ordo.auth\x91\x81\xa5token\xdb", 21) +
                                 std::string("\x06\x40\x00\x00", 4);
        co_await net::async_write(s, net::buffer(head), use_tuple);
        auto [said, ended] = co_await read_to_end(s, 20s);
        EXPECT_TRUE(ended);
        EXPECT_CONTAINS(said, "max_string_bytes");
        EXPECT_LT(srv.memory_used(), std::size_t{1} << 20);
        auto alice = co_await async_connect(url, as_alice(), nullptr);
        EXPECT_EQ(co_await alice.async_call<std::size_t>("size", std::string(1 << 20, 'a')),
                  std::size_t{1} << 20);
        co_await srv.async_stop();
    });
}

// A connection that never authenticates is told why and closed after auth_timeout; without
// authentication, one that sends nothing is closed after first_message_timeout.
TEST(Strangers, SilentConnectionsAreClosedAfterTheirDeadline) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        for (const bool auth : {true, false}) {
            stranger_events log;
            server_options o;
            if (auth) o = with_tokens(log);
            o.strangers.auth_timeout = 300ms;
            o.strangers.first_message_timeout = 300ms;
            server srv(ex, o);
            srv.on("inc", [](int x) { return x + 1; });
            const std::string url = srv.listen("tcp://127.0.0.1:0");
            auto silent = co_await connect_from("127.0.0.1", port_of(url));
            auto [said, ended] = co_await read_to_end(silent, 20s);
            silent.close();
            EXPECT_TRUE(ended) << auth;
            EXPECT_CONTAINS(said, auth ? "auth_timeout" : "first_message_timeout");
            // One that calls at once is served, and stays open past the deadline.
            // (Not a ?: of two co_awaits: GCC 12 mishandles the temporaries.)
            peer_options po;
            if (auth) po = as_alice();
            auto c = co_await async_connect(url, po, nullptr);
            EXPECT_EQ(co_await c.async_call<int>("inc", 1), 2);
            co_await test::sleep_for(600ms);
            EXPECT_EQ(co_await c.async_call<int>("inc", 2), 3);
            co_await srv.async_stop();
        }
    });
}

// An address with max_per_address connections open gets no more (told why); other addresses
// are served.
TEST(Strangers, ConnectionsPerAddressAreCappedAndTheRefusalSaysWhy) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        stranger_events log;
        server_options o;
        o.on_event = log.recorder();
        o.strangers.max_per_address = 3;
        server srv(ex, o);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        std::vector<tcp::socket> held;
        for (int i = 0; i < 3; ++i) held.push_back(co_await connect_from("127.0.0.5", port_of(url)));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return srv.peer_count() == 3; }));
        auto fourth = co_await connect_from("127.0.0.5", port_of(url));
        auto [said, ended] = co_await read_to_end(fourth, 20s);
        EXPECT_TRUE(ended);
        EXPECT_CONTAINS(said, "max_per_address");
        EXPECT_CONTAINS(said, "127.0.0.5");
        EXPECT_EQ(log.count(server_event::kind::refused, "max_per_address"), 1u);
        auto c = co_await async_connect(url);  // from 127.0.0.1
        EXPECT_EQ(co_await c.async_call<int>("inc", 1), 2);
        for (auto& h : held) h.close();
        co_await srv.async_stop();
    });
}

// Silent strangers from many addresses never fill max_connections: beyond max_strangers the
// oldest is closed, and a caller who authenticates as it connects is served.
TEST(Strangers, TheOldestStrangerMakesRoomAndANamedCallerIsServed) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        stranger_events log;
        server_options o = with_tokens(log);
        o.max_connections = 24;
        o.strangers.max_strangers = 8;
        o.strangers.max_strangers_per_address = 3;
        server srv(ex, o);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        std::vector<tcp::socket> held;
        for (int i = 0; i < 40; ++i)
            held.push_back(co_await connect_from("127.0.1." + std::to_string(10 + i % 20),
                                                 port_of(url)));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return srv.connections_accepted() == 40; }));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return srv.peer_count() <= 8; }));
        // The first ones were closed to make room.
        auto [said, ended] = co_await read_to_end(held.front(), 20s);
        EXPECT_TRUE(ended);
        auto alice = co_await async_connect(url, as_alice(), nullptr);
        EXPECT_EQ(co_await alice.async_call<int>("inc", 1), 2);
        // Per address: a fourth stranger from one address closes that address's oldest.
        std::vector<tcp::socket> mine;
        for (int i = 0; i < 4; ++i) mine.push_back(co_await connect_from("127.0.2.1", port_of(url)));
        auto [said0, ended0] = co_await read_to_end(mine.front(), 20s);
        EXPECT_TRUE(ended0);
        auto [said3, ended3] = co_await read_to_end(mine.back(), 300ms);
        EXPECT_FALSE(ended3);
        EXPECT_GE(log.count(server_event::kind::closed, "max_strangers"), 1u);
        EXPECT_EQ(co_await alice.async_call<int>("inc", 2), 3);
        for (auto& h : held) h.close();
        for (auto& m : mine) m.close();
        co_await srv.async_stop();
    });
}

// After max_auth_failures refused authentications from one address within the window, that
// address is refused at once, even with a good token; another address is served.
TEST(Strangers, FailedAuthenticationsFromOneAddressAreLimited) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        stranger_events log;
        server_options o = with_tokens(log);
        o.strangers.max_auth_failures = 3;
        o.strangers.auth_failure_window = 60s;
        server srv(ex, o);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto auth_then_inc = [&](std::string source, std::string token)
            -> net::awaitable<std::pair<std::error_code, std::string>> {
            auto s = co_await connect_from(source, port_of(url));
            buffer b;
            encode_notification(b, "ordo.auth",
                                std::map<std::string, std::string>{{"token", token}});
            encode_request(b, 1, "inc", 41);
            co_await write_all(s, b);
            co_return co_await answer_to(s, 1);
        };
        for (int i = 0; i < 3; ++i) {
            auto [code, text] = co_await auth_then_inc("127.0.0.9", "wrong-token-0123456789");
            EXPECT_EQ(code, errc::unauthenticated) << text;
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return srv.peer_count() == 0; }));
        auto [code, text] = co_await auth_then_inc("127.0.0.9", alice_token);
        EXPECT_NE(code, std::error_code{});  // refused before anything is read
        auto s = co_await connect_from("127.0.0.9", port_of(url));
        auto [said, ended] = co_await read_to_end(s, 20s);
        EXPECT_TRUE(ended);
        EXPECT_CONTAINS(said, "failed authentications from 127.0.0.9");
        auto [good, why] = co_await auth_then_inc("127.0.0.10", alice_token);
        EXPECT_EQ(good, std::error_code{}) << why;
        co_await srv.async_stop();
    });
}

// A flood of refused callers from one address is reported a few times a second, and the rest
// summed up in one line, not one line each.
TEST(Strangers, AFloodIsReportedInSumsNotLineByLine) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        stranger_events log;
        server_options o = with_tokens(log);
        o.strangers.max_auth_failures = 0;
        server srv(ex, o);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        constexpr int attempts = 30;
        for (int i = 0; i < attempts; ++i) {
            auto s = co_await connect_from("127.0.0.11", port_of(url));
            buffer b;
            encode_notification(b, "ordo.auth", std::map<std::string, std::string>{
                                                    {"token", "wrong-token-0123456789"}});
            co_await write_all(s, b);
            co_await read_to_end(s, 20s);
        }
        // Each refusal is either said or counted in a sum ("and N more like it").
        auto accounted = [&] {
            std::size_t n = 0;
            for (const auto& e : log.events) {
                if (e.what != server_event::kind::closed) continue;
                const auto at = e.reason.find("and ");
                if (e.reason.find("more like it") != std::string::npos)
                    n += std::stoul(e.reason.substr(at + 4));
                else
                    ++n;
            }
            return n;
        };
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return accounted() == attempts; }));
        EXPECT_LT(log.count(server_event::kind::closed), std::size_t{attempts});
        EXPECT_GE(log.count(server_event::kind::closed, "more like it"), 1u);
        co_await srv.async_stop();
    });
}

// ordo.cancel, ordo.credit, ordo.goaway and ordo.closing are notifications: sent as requests,
// they are answered with an error instead of leaving their caller waiting.
TEST(Strangers, ReservedNotificationsSentAsRequestsAreAnswered) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto s = co_await connect_from("127.0.0.1", port_of(url));
        std::uint32_t id = 1;
        for (const char* name : {"ordo.cancel", "ordo.credit", "ordo.goaway", "ordo.closing"}) {
            buffer b;
            encode_request(b, id, name, 1, 2);
            co_await write_all(s, b);
            auto [code, text] = co_await answer_to(s, id++);
            EXPECT_EQ(code, errc::method_not_found) << name;
            EXPECT_CONTAINS(text, "reserved notification");
        }
        buffer b;
        encode_request(b, id, "inc", 1);
        co_await write_all(s, b);
        auto [code, text] = co_await answer_to(s, id);
        EXPECT_EQ(code, std::error_code{}) << text;
        s.close();
        co_await srv.async_stop();
    });
}

// A method name with a line end or an escape sequence cannot forge or colour a log line.
TEST(Strangers, EventLinesEscapeControlCharacters) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        std::vector<std::string> lines;
        server_options o;
        o.on_event = [&](const server_event& e) { lines.push_back(to_string(e)); };
        server srv(ex, o);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto c = co_await async_connect(url);
        c.notify("x\nordo: opened tcp://10.0.0.1:1\x1b[31m", 1);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            for (const auto& l : lines)
                if (l.find("dropped") != std::string::npos) return true;
            return false;
        }));
        for (const auto& l : lines) {
            EXPECT_EQ(l.find('\n'), std::string::npos) << l;
            EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
        }
        bool escaped = false;
        for (const auto& l : lines) escaped |= l.find("x\\nordo: opened") != std::string::npos;
        EXPECT_TRUE(escaped);
        co_await srv.async_stop();
    });
}

// handler_options::allow on batch handlers too: a caller the rule refuses gets
// permission_denied and never joins a batch.
TEST(Strangers, ABatchHandlerRefusesCallersItsRuleDoesNotAllow) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        stranger_events log;
        server_options o = with_tokens(log);
        const std::string bob_token = "bob-token-0123456789ab";
        o.authenticate = authenticate_tokens({{alice_token, "alice"}, {bob_token, "bob"}});
        server srv(ex, o);
        std::vector<std::vector<int>> batches;
        batch_options only_alice{.max_batch_size = 8, .max_wait = 5ms};
        only_alice.allow = allow_subjects({"alice"});
        srv.on_batch("square", only_alice, [&](std::vector<int> xs) {
            batches.push_back(xs);
            for (auto& x : xs) x *= x;
            return xs;
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        peer_options bo;
        bo.credentials.token = bob_token;
        auto bob = co_await async_connect(url, bo, nullptr);
        auto [code, v] = co_await bob.async_call<int>("square", 3, use_tuple);
        EXPECT_EQ(code, errc::permission_denied);
        auto alice = co_await async_connect(url, as_alice(), nullptr);
        EXPECT_EQ(co_await alice.async_call<int>("square", 4), 16);
        EXPECT_EQ(batches, (std::vector<std::vector<int>>{{4}}));
        co_await srv.async_stop();
    });
}

// A route presents its token only to replicas it trusts: a replica that a replica file names
// gets no token unless token_hosts names its host (whoever writes the file cannot collect the
// token with a listener of their own).
TEST(Strangers, ARouteGivesItsTokenOnlyToHostsItTrusts) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        stranger_events log;
        server_options o = with_tokens(log);
        // The untrusted replica's connections fail again and again: not counted against the
        // address here (the trusted ones come from it too).
        o.strangers.max_auth_failures = 0;
        server srv(ex, o);
        srv.on("whoami", [](peer& p) { return p.identity().subject; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        char dir[] = "/tmp/ordo-route-XXXXXX";
        ORDO_CO_ASSERT_TRUE(::mkdtemp(dir) != nullptr);
        const std::string token = std::string(dir) + "/token", replicas = std::string(dir) + "/r";
        std::ofstream(token) << alice_token << "\n";
        ::chmod(token.c_str(), 0600);
        std::ofstream(replicas) << url << "\n";
        const std::string route = "route+file://" + replicas + "?token_file=" + token;
        {
            // Not trusted: connected without the token, so the server refuses the caller:
            // its call fails, or (when the refusal comes first, as on a loaded machine) the
            // route finds no replica that takes calls, saying why.
            std::optional<channel> ch;
            try {
                ch = co_await async_connect(route + "&wait_for_replica_ms=10000");
            } catch (const std::system_error& e) {
                EXPECT_CONTAINS(e.what(), "the server requires a token");
            }
            if (ch) {
                auto [code, who] = co_await ch->async_call<std::string>("whoami", use_tuple);
                EXPECT_EQ(code, errc::unauthenticated);
            }
            // The server reports the close once it has written the refusal, which the
            // caller may have read before that.
            EXPECT_TRUE(co_await wait_until(
                [&] { return log.count(server_event::kind::closed, "requires a token") >= 1; }));
        }
        for (const std::string& hosts :
             {std::string("127.0.0.1"), "127.0.0.1:" + std::to_string(port_of(url))}) {
            auto ch = co_await async_connect(route + "&token_hosts=" + hosts);
            EXPECT_EQ(co_await ch.async_call<std::string>("whoami"), "alice") << hosts;
        }
        ::unlink(token.c_str());
        ::unlink(replicas.c_str());
        ::rmdir(dir);
        co_await srv.async_stop();
    });
}

// A token file that group or others may read is refused, naming the fix, as ssh refuses such
// a private key.
TEST(Strangers, TokenFilesOthersMayReadAreRefused) {
    char tmpl[] = "/tmp/ordo-tokens-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ::close(fd);
    std::ofstream(tmpl) << alice_token << " alice\n";
    EXPECT_EQ(read_token_file(tmpl).at(alice_token), "alice");  // mkstemp's 0600
    EXPECT_NO_THROW(read_token(tmpl));
    for (const mode_t mode : {0644, 0640, 0602}) {
        ::chmod(tmpl, mode);
        try {
            read_token_file(tmpl);
            ADD_FAILURE() << "a token file with mode " << mode << " was read";
        } catch (const std::system_error& e) {
            EXPECT_CONTAINS(e.what(), "chmod 600");
        }
        EXPECT_THROW(read_token(tmpl), std::system_error);
    }
    ::unlink(tmpl);
}

}  // namespace
}  // namespace ordo
