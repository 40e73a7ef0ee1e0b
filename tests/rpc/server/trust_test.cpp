// The trust boundary (docs/security.md): callers with names and methods with permissions
// (docs/protocol.md "Authentication": the ordo.auth message, server_options::authenticate over
// tcp, unix and tls, peer::identity() in handlers, handler_options::allow, closed
// introspection, a resumed session that must present the identity that opened it), and a
// client's half-close, which still gets every answer.
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "rpc/wire/errors.hpp"
#include "support/cutting_proxy.hpp"
#include "support/peers.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"
#include "support/streams.hpp"
#include "support/tokens.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::alice_token;
using test::as;
using test::bob_token;
using test::peer_of;
using test::run_test;
using test::wait_until;

// What a handler saw of its caller.
struct seen {
    std::string subject, address, cert_subject, cert_sha256, token_subject;
    std::vector<std::string> sans;
    bool has_unix = false;
    std::uint32_t uid = 0;
    std::int32_t pid = 0;
    MSGPACK_DEFINE(subject, address, cert_subject, cert_sha256, token_subject, sans, has_unix, uid,
                   pid)
};

struct auth_server {
    server srv;
    std::string url;
    std::vector<server_event> closed;  // connections that ended, and how
    int secret_runs = 0;

    std::uint16_t port() const {
        return static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
    }

    // (No default argument, and callers pass named options: GCC 12 mishandles a temporary
    // server_options made for this constructor inside a coroutine.)
    auth_server(net::any_io_executor ex, const std::string& listen, server_options o)
        : srv(ex, with_events(std::move(o), closed)) {
        srv.on("inc", [](int x) { return x + 1; });
        srv.on("whoami", [](peer& p) {
            const identity& who = p.identity();
            seen s{who.subject, who.address, who.cert_subject, who.cert_sha256, who.token_subject,
                   who.cert_sans, who.unix_peer.has_value(), 0, 0};
            if (who.unix_peer) {
                s.uid = who.unix_peer->uid;
                s.pid = who.unix_peer->pid;
            }
            return s;
        });
        handler_options only_alice;
        only_alice.allow = allow_subjects({"alice"});
        // Runs straight from the read when open to everyone: the rule must still be checked.
        srv.on("secret", [this] { return ++secret_runs; }, only_alice);
        srv.on(
            "secret_async",
            [this]() -> net::awaitable<int> { co_return ++secret_runs; }, only_alice);
        handler_options by_rule;
        by_rule.allow = [](const identity& who) { return who.subject.starts_with("b"); };
        srv.on("b_only", [] { return 1; }, by_rule);
        url = srv.listen(listen);
    }

    static server_options with_events(server_options o, std::vector<server_event>& closed) {
        o.on_event = [&closed](const server_event& e) {
            if (e.what == server_event::kind::closed) closed.push_back(e);
        };
        return o;
    }
};

server_options tokens() {
    server_options o;
    o.authenticate = authenticate_tokens({{alice_token, "alice"}, {bob_token, "bob"}});
    return o;
}

// A call that must fail: its code and text.
template <class F>
net::awaitable<std::pair<std::error_code, std::string>> failure(F f) {
    try {
        co_await f();
        ADD_FAILURE() << "the call succeeded";
    } catch (const std::system_error& e) {
        co_return std::make_pair(e.code(), std::string(e.what()));
    }
    co_return std::make_pair(std::error_code{}, std::string());
}

#define EXPECT_CONTAINS(text, part) \
    EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(Auth, ATokenNamesTheCallerOverTcp) {
    run_test([]() -> net::awaitable<void> {
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", tokens());
        auto c = co_await async_connect(s.url, as(alice_token), nullptr);
        EXPECT_EQ(co_await c.async_call<int>("inc", 1), 2);
        const seen w = co_await c.async_call<seen>("whoami");
        EXPECT_EQ(w.subject, "alice");
        EXPECT_EQ(w.token_subject, "alice");
        EXPECT_CONTAINS(w.address, "tcp://127.0.0.1:");
        EXPECT_TRUE(w.cert_subject.empty());
        co_await s.srv.async_stop();
    });
}

TEST(Auth, NoTokenOrAWrongOneIsRefusedWithTheReasonAndTheConnectionCloses) {
    run_test([]() -> net::awaitable<void> {
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", tokens());
        {
            auto c = co_await async_connect(s.url);
            auto [code, text] = co_await failure([&] { return c.async_call<int>("inc", 1); });
            EXPECT_EQ(code, errc::unauthenticated) << text;
            EXPECT_CONTAINS(text, "requires a token");
            EXPECT_CONTAINS(text, "inc");
            // The connection closes: later calls fail at once, with the same code.
            EXPECT_TRUE(co_await wait_until([&] { return !peer_of(c)->is_open(); }));
            auto [later, why] = co_await failure([&] { return c.async_call<int>("inc", 1); });
            EXPECT_EQ(later, errc::unauthenticated) << why;
        }
        {
            auto c = co_await async_connect(s.url, as("not-a-token-0123456789"), nullptr);
            auto [code, text] = co_await failure([&] { return c.async_call<int>("inc", 1); });
            EXPECT_EQ(code, errc::unauthenticated) << text;
            EXPECT_CONTAINS(text, "not accepted");
        }
        EXPECT_TRUE(co_await wait_until([&] { return s.closed.size() == 2; }));
        for (const auto& e : s.closed) {
            EXPECT_EQ(e.code, errc::unauthenticated) << e.reason;
            EXPECT_CONTAINS(e.reason, "refused");
        }
        co_await s.srv.async_stop();
    });
}

// token_file=PATH on the URL, for every kind of channel: ordered, pooled, routed.
TEST(Auth, TheUrlsTokenFileIsPresentedByEveryKindOfChannel) {
    run_test([]() -> net::awaitable<void> {
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", tokens());
        char tmpl[] = "/tmp/ordo-token-XXXXXX";
        const int fd = ::mkstemp(tmpl);
        ::close(fd);
        std::ofstream(tmpl) << bob_token << "\n";
        const std::string port = s.url.substr(s.url.rfind(':') + 1);
        for (const std::string& url :
             {s.url + "?token_file=" + tmpl, s.url + "?mode=pooled&token_file=" + tmpl,
              "route+tcp://127.0.0.1:" + port + "?token_file=" + std::string(tmpl)}) {
            auto c = co_await async_connect(url);
            EXPECT_EQ((co_await c.async_call<seen>("whoami")).subject, "bob") << url;
        }
        const std::string missing = s.url + "?token_file=/nonexistent/token";
        auto [code, text] = co_await failure([&] { return async_connect(missing); });
        EXPECT_EQ(code, errc::bad_address) << text;
        EXPECT_CONTAINS(text, "/nonexistent/token");
        ::unlink(tmpl);
        co_await s.srv.async_stop();
    });
}

TEST(Auth, OverUnixTheKernelNamesTheCallersProcess) {
    run_test([]() -> net::awaitable<void> {
        server_options o;
        o.authenticate = [](const identity& who, const credentials&) {
            if (who.unix_peer && who.unix_peer->uid == ::getuid())
                return auth_verdict::accept("uid:" + std::to_string(who.unix_peer->uid));
            return auth_verdict::refuse("not this user");
        };
        auth_server s(co_await net::this_coro::executor, test::listen_url("unix"), std::move(o));
        auto c = co_await async_connect(s.url);
        const seen w = co_await c.async_call<seen>("whoami");
        EXPECT_TRUE(w.has_unix);
        EXPECT_EQ(w.uid, ::getuid());
        EXPECT_EQ(w.pid, ::getpid());
        EXPECT_EQ(w.subject, "uid:" + std::to_string(::getuid()));
        EXPECT_TRUE(w.token_subject.empty());
        co_await s.srv.async_stop();

        server_options never;
        never.authenticate = [](const identity&, const credentials&) {
            return auth_verdict::refuse("no unix callers today");
        };
        auth_server t(co_await net::this_coro::executor, test::listen_url("unix"),
                      std::move(never));
        auto d = co_await async_connect(t.url);
        auto [code, text] = co_await failure([&] { return d.async_call<int>("inc", 1); });
        EXPECT_EQ(code, errc::unauthenticated) << text;
        EXPECT_CONTAINS(text, "no unix callers today");
        co_await t.srv.async_stop();
    });
}

TEST(Auth, OverMutualTlsTheCertificateNamesTheCaller) {
    run_test([]() -> net::awaitable<void> {
        const auto& f = test::shared_tls_files();
        auth_server s(co_await net::this_coro::executor,
                      "tls://127.0.0.1:0" + f.server_params() + "&ca=" + f.ca, tokens());
        const std::string with_cert = s.url + "?ca=" + f.ca + "&cert=" + f.client_cert +
                                      "&key=" + f.client_key;
        auto c = co_await async_connect(with_cert);
        const seen w = co_await c.async_call<seen>("whoami");
        EXPECT_EQ(w.cert_subject, "CN=ordo-test-client");
        EXPECT_EQ(w.subject, "CN=ordo-test-client");  // no token: the certificate's subject
        EXPECT_EQ(w.cert_sha256.size(), 64u);
        EXPECT_NE(std::find(w.sans.begin(), w.sans.end(), "DNS:localhost"), w.sans.end());
        EXPECT_NE(std::find(w.sans.begin(), w.sans.end(), "IP:127.0.0.1"), w.sans.end());
        // A token names the caller over the certificate.
        auto d = co_await async_connect(with_cert, as(alice_token), nullptr);
        const seen v = co_await d.async_call<seen>("whoami");
        EXPECT_EQ(v.subject, "alice");
        EXPECT_EQ(v.cert_subject, "CN=ordo-test-client");
        co_await s.srv.async_stop();

        // Server-side TLS without a CA: no certificate, so a token is needed.
        auth_server t(co_await net::this_coro::executor, "tls://127.0.0.1:0" + f.server_params(),
                      tokens());
        auto e = co_await async_connect(t.url + "?ca=" + f.ca);
        auto [code, text] = co_await failure([&] { return e.async_call<int>("inc", 1); });
        EXPECT_EQ(code, errc::unauthenticated) << text;
        auto g = co_await async_connect(t.url + "?ca=" + f.ca, as(bob_token), nullptr);
        EXPECT_EQ((co_await g.async_call<seen>("whoami")).subject, "bob");
        co_await t.srv.async_stop();
    });
}

TEST(Auth, AMethodRefusesCallersItDoesNotAllowAndRunsNothing) {
    run_test([]() -> net::awaitable<void> {
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", tokens());
        auto bob = co_await async_connect(s.url, as(bob_token), nullptr);
        for (const char* m : {"secret", "secret_async"}) {
            auto [code, text] = co_await failure([&] { return bob.async_call<int>(m); });
            EXPECT_EQ(code, errc::permission_denied) << text;
            EXPECT_CONTAINS(text, std::string("method \"") + m + "\"");
            EXPECT_CONTAINS(text, "bob");
        }
        bob.notify("secret");
        EXPECT_EQ(co_await bob.async_call<int>("b_only"), 1);
        EXPECT_EQ(co_await bob.async_call<int>("inc", 1), 2);  // the connection goes on
        EXPECT_EQ(s.secret_runs, 0);
        auto alice = co_await async_connect(s.url, as(alice_token), nullptr);
        EXPECT_EQ(co_await alice.async_call<int>("secret"), 1);
        EXPECT_EQ(co_await alice.async_call<int>("secret_async"), 2);
        auto [code, text] = co_await failure([&] { return alice.async_call<int>("b_only"); });
        EXPECT_EQ(code, errc::permission_denied) << text;
        co_await s.srv.async_stop();

        // Without authentication nobody has a subject: a subject rule lets nobody in.
        server_options none;
        auth_server open(co_await net::this_coro::executor, "tcp://127.0.0.1:0", std::move(none));
        auto anyone = co_await async_connect(open.url);
        auto [c2, t2] = co_await failure([&] { return anyone.async_call<int>("secret"); });
        EXPECT_EQ(c2, errc::permission_denied) << t2;
        EXPECT_EQ(open.secret_runs, 0);
        co_await open.srv.async_stop();
    });
}

TEST(Auth, IntrospectionIsClosedToCallersTheServerHasNotAllowed) {
    run_test([]() -> net::awaitable<void> {
        server_options o = tokens();
        o.allow_introspection = allow_subjects({"alice"});
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", std::move(o));
        auto bob = co_await async_connect(s.url, as(bob_token), nullptr);
        for (const char* m : {"ordo.methods", "ordo.stats", "ordo.traces"}) {
            auto [code, text] =
                co_await failure([&] { return bob.async_call<int>(m); });
            EXPECT_EQ(code, errc::permission_denied) << text;
            EXPECT_CONTAINS(text, m);
        }
        auto alice = co_await async_connect(s.url, as(alice_token), nullptr);
        const auto methods = co_await alice.async_call<std::map<std::string, std::string>>(
            "ordo.methods");
        EXPECT_TRUE(methods.count("whoami"));
        // ordo.traces answers alice: the spans this process recorded (none here).
        EXPECT_TRUE((co_await alice.async_call<std::vector<span>>("ordo.traces")).empty());
        co_await s.srv.async_stop();
    });
}

// Any msgpack-rpc peer can authenticate: ordo.auth [{"token": ...}] as its first message.
TEST(Auth, ARawMsgpackRpcPeerSendsOrdoAuthFirst) {
    run_test([]() -> net::awaitable<void> {
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", tokens());
        for (const auto& [token, expect] :
             {std::pair<std::string, errc>{alice_token, errc{}}, {"nope-0123456789abcdef",
                                                                   errc::unauthenticated}}) {
            auto t = co_await async_connect_transport(s.url);
            buffer b;
            encode_notification(b, "ordo.auth", std::map<std::string, std::string>{{"token", token}});
            encode_request(b, 1, "inc", 41);
            std::error_code ec;
            co_await t->async_write(net::buffer(b.data(), b.size()), ec);
            decoder d;
            char chunk[4096];
            std::optional<message> m;
            while (!ec) {
                const std::size_t n = co_await t->async_read_some(net::buffer(chunk), ec);
                d.feed(std::string_view(chunk, n));
                while ((m = d.next()) && m->kind != message_kind::response) {
                }
                if (m) break;
            }
            ORDO_CO_ASSERT_TRUE(m.has_value());
            if (expect == errc{}) {
                EXPECT_TRUE(m->error.is_nil());
                EXPECT_EQ(m->result.as<int>(), 42);
            } else {
                std::string text;
                EXPECT_EQ(detail::error_from_wire(m->error, text), expect) << text;
            }
            t->close();
        }
        co_await s.srv.async_stop();
    });
}

// Reads answers from `t` until a response to `msgid` arrives: its error code (none: welcome)
// and, for a welcome, the session id it carries.
net::awaitable<std::pair<std::error_code, std::vector<char>>> answer_to(transport& t,
                                                                        std::uint32_t msgid) {
    decoder d;
    char chunk[4096];
    std::error_code ec;
    while (!ec) {
        const std::size_t n = co_await t.async_read_some(net::buffer(chunk), ec);
        d.feed(std::string_view(chunk, n));
        while (auto m = d.next()) {
            if (m->kind != message_kind::response || m->msgid != msgid) continue;
            if (!m->error.is_nil()) {
                std::string text;
                co_return std::make_pair(detail::error_from_wire(m->error, text),
                                         std::vector<char>{});
            }
            const auto& id = m->result.via.array.ptr[1];
            co_return std::make_pair(std::error_code{},
                                     std::vector<char>(id.via.bin.ptr,
                                                       id.via.bin.ptr + id.via.bin.size));
        }
    }
    co_return std::make_pair(ec ? ec : make_error_code(errc::peer_lost), std::vector<char>{});
}

// Opens (no id) or resumes a session as the holder of `token`.
net::awaitable<std::pair<std::error_code, std::vector<char>>> hello_as(
    const std::string& url, const std::string& token, const std::vector<char>* id,
    std::unique_ptr<transport>& keep) {
    keep = co_await async_connect_transport(url);
    buffer b;
    encode_notification(b, "ordo.auth", std::map<std::string, std::string>{{"token", token}});
    if (id)
        encode_request(b, 1, "ordo.hello", 1, *id, 0, 10'000);
    else
        encode_request(b, 1, "ordo.hello", 1, msgpack::type::nil_t(), 0, 10'000);
    std::error_code ec;
    co_await keep->async_write(net::buffer(b.data(), b.size()), ec);
    co_return co_await answer_to(*keep, 1);
}

class AuthOnLoops : public ::testing::TestWithParam<std::size_t> {};
INSTANTIATE_TEST_SUITE_P(Threads, AuthOnLoops, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "loops"; });

// A session opened by alice resumes for alice only: bob, with a valid token of his own and
// alice's session id, is told there is no such session.
TEST_P(AuthOnLoops, OnlyTheSubjectThatOpenedASessionResumesIt) {
    run_test([]() -> net::awaitable<void> {
        server_options o = tokens();
        o.threads = GetParam();
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", std::move(o));
        std::unique_ptr<transport> first, thief, owner;
        auto [code, id] = co_await hello_as(s.url, alice_token, nullptr, first);
        ORDO_CO_ASSERT_TRUE(!code);
        ORDO_CO_ASSERT_EQ(id.size(), 16u);
        first->close();  // the session waits, detached
        auto [stolen, none] = co_await hello_as(s.url, bob_token, &id, thief);
        EXPECT_EQ(stolen, errc::session_lost);
        auto [back, same] = co_await hello_as(s.url, alice_token, &id, owner);
        EXPECT_FALSE(back) << back.message();
        EXPECT_EQ(same, id);
        thief->close();
        owner->close();
        co_await s.srv.async_stop();
    });
}

// Alice (by her token) in a resumable session with a window of `resume`, through `proxy`.
net::awaitable<channel> alice_through(const test::cutting_proxy& proxy,
                                      std::chrono::milliseconds resume) {
    peer_options o = as(alice_token);
    o.resume = resume;
    co_return co_await async_connect("tcp://127.0.0.1:" + std::to_string(proxy.port()), o,
                                     nullptr);
}

// Through cuts, a client with a token resumes: each new connection presents it again.
TEST(Auth, AResumableSessionPresentsItsTokenOnEveryConnection) {
    run_test([]() -> net::awaitable<void> {
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", tokens());
        test::cutting_proxy proxy("127.0.0.1", s.port());
        auto c = co_await alice_through(proxy, 10s);
        for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(co_await c.async_call<int>("inc", i), i + 1);
            proxy.cut_all();
        }
        EXPECT_EQ((co_await c.async_call<seen>("whoami")).subject, "alice");
        auto p = std::dynamic_pointer_cast<peer>(c.impl());
        EXPECT_TRUE(p->is_resumable());
        EXPECT_GE(p->counters().resumes, 1u);
        co_await s.srv.async_stop();
    });
}

TEST(Auth, TokenFilesAreReadWithLimits) {
    char tmpl[] = "/tmp/ordo-tokens-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ::close(fd);
    auto write = [&](const std::string& text) { std::ofstream(tmpl) << text; };
    write("# comment\n\n" + alice_token + " alice\n" + bob_token + "  bob smith \n");
    const auto t = read_token_file(tmpl);
    EXPECT_EQ(t.at(alice_token), "alice");
    EXPECT_EQ(t.at(bob_token), "bob smith");
    for (const auto& [text, says] : {std::pair<std::string, std::string>{"short alice\n", "16"},
                                     {alice_token + "\n", "no subject"},
                                     {alice_token + " a\n" + alice_token + " b\n", "repeats"}}) {
        write(text);
        try {
            read_token_file(tmpl);
            ADD_FAILURE() << "accepted: " << text;
        } catch (const std::system_error& e) {
            EXPECT_CONTAINS(e.what(), says);
            EXPECT_CONTAINS(e.what(), "line");
        }
    }
    write(std::string(std::size_t{2} << 20, 'x'));
    EXPECT_THROW(read_token_file(tmpl), std::system_error);
    // A file with no token at all would turn authentication off where an empty table means
    // "none", or refuse everyone where it does not: it is refused instead.
    write("# nothing yet\n\n");
    try {
        read_token_file(tmpl);
        ADD_FAILURE() << "a file with no token was accepted";
    } catch (const std::system_error& e) {
        EXPECT_CONTAINS(e.what(), "has no tokens");
    }
    ::unlink(tmpl);
}

// A client that sends its requests and then ends its sending side (shutdown(SHUT_WR)) gets every
// answer, in order, and then the server's end of stream.
TEST(HalfClose, TheServerAnswersWhatItReadThenCloses) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        srv.on("slow", [](int x) -> net::awaitable<int> {
            net::steady_timer t(co_await net::this_coro::executor, 200ms);
            co_await t.async_wait(net::use_awaitable);
            co_return x;
        });
        for (const char* scheme : {"tcp", "unix"}) {
            const std::string url = srv.listen(test::listen_url(scheme));
            auto t = co_await async_connect_transport(url);
            buffer b;
            encode_request(b, 1, "slow", 10);  // a serial handler: the rest waits behind it
            for (std::uint32_t i = 2; i <= 50; ++i) encode_request(b, i, "inc", int(i));
            std::error_code ec;
            co_await t->async_write(net::buffer(b.data(), b.size()), ec);
            t->shutdown_send();
            decoder d;
            char chunk[4096];
            std::vector<std::pair<std::uint32_t, int>> answers;
            while (!ec) {
                const std::size_t n = co_await t->async_read_some(net::buffer(chunk), ec);
                d.feed(std::string_view(chunk, n));
                while (auto m = d.next())
                    if (m->kind == message_kind::response && m->error.is_nil())
                        answers.emplace_back(m->msgid, m->result.as<int>());
            }
            EXPECT_EQ(ec, net::error::eof) << scheme << ": " << ec.message();
            ORDO_CO_ASSERT_EQ(answers.size(), 50u);
            EXPECT_EQ(answers[0], std::make_pair(1u, 10));
            for (std::uint32_t i = 2; i <= 50; ++i)
                EXPECT_EQ(answers[i - 1], std::make_pair(i, int(i) + 1)) << scheme;
            t->close();
        }
        co_await srv.async_stop();
    });
}

// End of stream with a handler running is also how a caller that closed altogether looks: the
// server probes (ordo.ping) at once and 5, 20 and 100 ms later, so that the write after the
// reset fails within a few ms (bench/python/closed_peer.py times it). A caller that only
// half-closed reads the four probes, and then its answer.
TEST(HalfClose, TheServerProbesAHalfClosedCallerFourTimesAndStillAnswers) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("slow", [](int x) -> net::awaitable<int> {
            net::steady_timer t(co_await net::this_coro::executor, 1500ms);
            co_await t.async_wait(net::use_awaitable);
            co_return x;
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto t = co_await async_connect_transport(url);
        buffer b;
        encode_request(b, 1, "slow", 10);
        std::error_code ec;
        co_await t->async_write(net::buffer(b.data(), b.size()), ec);
        t->shutdown_send();
        decoder d;
        char chunk[4096];
        int pings = 0;
        std::optional<int> answer;
        int pings_before_answer = -1;
        while (!ec) {
            const std::size_t n = co_await t->async_read_some(net::buffer(chunk), ec);
            d.feed(std::string_view(chunk, n));
            while (auto m = d.next()) {
                if (m->kind == message_kind::request && m->method == "ordo.ping") ++pings;
                if (m->kind == message_kind::response && m->msgid == 1) {
                    answer = m->result.as<int>();
                    pings_before_answer = pings;
                }
            }
        }
        EXPECT_EQ(answer, 10);
        EXPECT_EQ(pings_before_answer, 4) << "probes before the answer";
        t->close();
        co_await srv.async_stop();
    });
}

// The other way round: a server that ends its side fails this side's pending calls at once
// (no answer can come), with the reason.
TEST(HalfClose, ACallerWhosePeerEndedItsSideFailsItsCallsAtOnce) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, "tcp://127.0.0.1:0");
        const std::string url = l->local_address();
        std::unique_ptr<transport> accepted;
        net::co_spawn(ex, [&]() -> net::awaitable<void> { accepted = co_await l->async_accept(); },
                      net::detached);
        auto c = co_await async_connect(url);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return accepted != nullptr; }));
        std::optional<std::pair<std::error_code, std::string>> outcome;
        net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                outcome = co_await failure([&] { return c.async_call<int>("inc", 1); });
            },
            net::detached);
        co_await test::sleep_for(50ms);
        EXPECT_FALSE(outcome.has_value());
        accepted->shutdown_send();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return outcome.has_value(); }));
        EXPECT_EQ(outcome->first, errc::peer_lost) << outcome->second;
        EXPECT_CONTAINS(outcome->second, "closed the connection");
        auto [later, why] = co_await failure([&] { return c.async_call<int>("inc", 2); });
        EXPECT_EQ(later, errc::peer_lost) << why;
        accepted->close();
    });
}

// Silent connections cannot stop a TLS listener from accepting: 280 of them (more than the 256
// handshakes it runs at once) from one address, then a real client, which is served at once
// although the silent ones would hold their handshakes for a minute.
TEST(TlsAcceptQueue, SilentConnectionsDoNotStopOthersFromBeingAccepted) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        const auto& f = test::shared_tls_files();
        std::vector<std::string> refused;
        server_options o;
        o.peer.transport.on_refused = [&](const std::string& why) { refused.push_back(why); };
        server srv(ex, o);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url =
            srv.listen("tls://127.0.0.1:0" + f.server_params() + "&handshake_timeout_ms=60000");
        const auto port = static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
        std::vector<net::ip::tcp::socket> silent;
        for (const char* from : {"127.0.0.2", "127.0.0.3"}) {
            for (int i = 0; i < 140; ++i) {
                net::ip::tcp::socket sock(ex);
                sock.open(net::ip::tcp::v4());
                sock.bind({net::ip::make_address(from), 0});
                auto [ec] = co_await sock.async_connect({net::ip::make_address("127.0.0.1"), port},
                                                        use_tuple);
                EXPECT_FALSE(ec) << ec.message();
                silent.push_back(std::move(sock));
            }
        }
        // Each address keeps at most 32 handshakes: the listener dropped the others' oldest.
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return refused.size() >= 280 - 64; }));
        EXPECT_CONTAINS(refused.front(), "dropped the oldest TLS handshake from 127.0.0.");
        EXPECT_CONTAINS(refused.front(), "more than 32 unfinished TLS handshakes");
        // Without the caps it would wait for the silent ones' minute, past its own 20 s.
        auto c = co_await async_connect(url + "?ca=" + f.ca + "&handshake_timeout_ms=20000");
        EXPECT_EQ(co_await c.async_call<int>("inc", 1), 2);
        for (auto& sock : silent) sock.close();
        co_await srv.async_stop();
    });
}

// A caller with credentials and a resumable session, against a server that does not
// authenticate: the ordo.auth it sends first is dropped, and its session is still resumable.
TEST(Auth, CredentialsToAServerThatDoesNotAskForThemKeepTheSessionResumable) {
    run_test([]() -> net::awaitable<void> {
        server_options none;
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", std::move(none));
        peer_options o = as(alice_token);
        o.resume = 10s;
        auto c = co_await async_connect(s.url, o, nullptr);
        EXPECT_EQ(co_await c.async_call<int>("inc", 1), 2);
        EXPECT_TRUE(peer_of(c)->is_resumable());
        co_await s.srv.async_stop();
    });
}

// A server that stops accepting a caller's credentials between two connections of its
// session: the resume fails at once with unauthenticated, not after the window.
TEST(Auth, AResumeTheServerRefusesFailsWithUnauthenticated) {
    run_test([]() -> net::awaitable<void> {
        auto accepted = std::make_shared<int>(0);
        server_options o;
        o.authenticate = [accepted](const identity&, const credentials& c) {
            if (c.token == alice_token && (*accepted)++ == 0) return auth_verdict::accept("alice");
            return auth_verdict::refuse("alice's token was revoked");
        };
        auth_server s(co_await net::this_coro::executor, "tcp://127.0.0.1:0", std::move(o));
        test::cutting_proxy proxy("127.0.0.1", s.port());
        auto c = co_await alice_through(proxy, 30s);
        EXPECT_EQ(co_await c.async_call<int>("inc", 1), 2);
        proxy.cut_all();
        auto [code, text] = co_await failure([&] { return c.async_call<int>("inc", 2); });
        EXPECT_EQ(code, errc::unauthenticated) << text;
        EXPECT_CONTAINS(text, "revoked");
        co_await s.srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
