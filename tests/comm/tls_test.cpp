// tls://: verification on by default, and every way a handshake can go wrong fails cleanly on
// both sides with an error that says why. Certificates are made at test time (support/certs.hpp).
#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "support/run_test.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

const test::tls_files& files() {
    return test::shared_tls_files();
}

// A server answering inc over tls with the given certificate; records refused handshakes.
struct tls_server {
    std::vector<std::string> refused;
    std::unique_ptr<server> srv;
    std::string url;  // without parameters

    tls_server(const net::any_io_executor& ex, const std::string& cert, const std::string& key,
               const std::string& client_ca = "") {
        server_options so;
        so.peer.transport.on_refused = [this](const std::string& why) { refused.push_back(why); };
        srv = std::make_unique<server>(ex, so);
        srv->on("inc", [](int x) { return x + 1; });
        std::string listen = "tls://127.0.0.1:0?cert=" + cert + "&key=" + key;
        if (!client_ca.empty()) listen += "&ca=" + client_ca;
        url = srv->listen(listen);
    }
};

// Connects to `url` and makes a call, which must fail: returns the error's text.
net::awaitable<std::string> refusal(std::string url) {
    try {
        auto ch = co_await async_connect(url);
        co_await ch.async_call<int>("inc", 1);
        ADD_FAILURE() << url << " was accepted";
    } catch (const std::system_error& e) {
        co_return e.what();
    }
    co_return "";
}

#define EXPECT_CONTAINS(text, part) \
    EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(Tls, AVerifiedConnectionCarriesCalls) {
    run_test([]() -> net::awaitable<void> {
        tls_server s(co_await net::this_coro::executor, files().server_cert, files().server_key);
        auto ch = co_await async_connect(s.url + "?ca=" + files().ca);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 41), 42);
        // By name too: the certificate names localhost.
        const auto port = parse_address(s.url).port;
        auto by_name =
            co_await async_connect("tls://localhost:" + std::to_string(port) + "?ca=" + files().ca);
        EXPECT_EQ(co_await by_name.async_call<int>("inc", 1), 2);
        EXPECT_TRUE(s.refused.empty());
        co_await s.srv->async_stop();
    });
}

TEST(Tls, AClientTrustingAnotherCaIsRefusedWithAClearErrorAndTheServerGoesOn) {
    run_test([]() -> net::awaitable<void> {
        tls_server s(co_await net::this_coro::executor, files().server_cert, files().server_key);
        {
            const std::string why = co_await refusal(s.url + "?ca=" + files().other_ca);
            EXPECT_CONTAINS(why, "TLS handshake with " + s.url);
            EXPECT_CONTAINS(why, "certificate verify failed");
            EXPECT_CONTAINS(why, "unable to get local issuer certificate");
        }
        EXPECT_TRUE(co_await wait_until([&] { return !s.refused.empty(); }));
        if (!s.refused.empty()) {
            EXPECT_CONTAINS(s.refused[0], "TLS handshake with tls://127.0.0.1:");
        }
        auto ch = co_await async_connect(s.url + "?ca=" + files().ca);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await s.srv->async_stop();
    });
}

TEST(Tls, AnExpiredCertificateIsRefused) {
    run_test([]() -> net::awaitable<void> {
        tls_server s(co_await net::this_coro::executor, files().expired_cert, files().expired_key);
        {
            const std::string why = co_await refusal(s.url + "?ca=" + files().ca);
            EXPECT_CONTAINS(why, "certificate has expired");
        }
        co_await s.srv->async_stop();
    });
}

TEST(Tls, ACertificateForAnotherNameIsRefusedUnlessVerificationIsOff) {
    run_test([]() -> net::awaitable<void> {
        tls_server s(co_await net::this_coro::executor, files().server_cert, files().server_key);
        {
            const std::string why =
                co_await refusal(s.url + "?ca=" + files().ca + "&server_name=db.example.org");
            EXPECT_CONTAINS(why, "hostname mismatch");
        }
        // verify=none accepts anything (for tests; documented as such).
        auto ch = co_await async_connect(s.url + "?verify=none&server_name=db.example.org");
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await s.srv->async_stop();
    });
}

TEST(Tls, MutualTlsRefusesAClientWithoutACertificateAndAcceptsOneWithIt) {
    run_test([]() -> net::awaitable<void> {
        tls_server s(co_await net::this_coro::executor, files().server_cert, files().server_key,
                     files().ca);
        // TLS 1.3 finishes the client's side of the handshake before the server has checked the
        // client: the refusal then arrives as the end of the connection, at the first call.
        {
            const std::string why = co_await refusal(s.url + "?ca=" + files().ca);
            EXPECT_CONTAINS(why, s.url);
        }
        EXPECT_TRUE(co_await wait_until([&] { return !s.refused.empty(); }));
        if (!s.refused.empty()) {
            EXPECT_CONTAINS(s.refused[0], "certificate");
        }
        auto ch =
            co_await async_connect(s.url + "?ca=" + files().ca + "&cert=" + files().client_cert +
                                   "&key=" + files().client_key);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await s.srv->async_stop();
    });
}

TEST(Tls, PlaintextToATlsPortFailsCleanlyOnBothSides) {
    run_test([]() -> net::awaitable<void> {
        tls_server s(co_await net::this_coro::executor, files().server_cert, files().server_key);
        const auto port = parse_address(s.url).port;
        const std::string plain = "tcp://127.0.0.1:" + std::to_string(port);
        {
            const std::string why = co_await refusal(plain);
            EXPECT_CONTAINS(why, plain);
        }
        EXPECT_TRUE(co_await wait_until([&] { return !s.refused.empty(); }));
        EXPECT_EQ(s.srv->peer_count(), 0u);
        auto ch = co_await async_connect(s.url + "?ca=" + files().ca);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await s.srv->async_stop();
    });
}

TEST(Tls, TlsToAPlaintextPortFailsCleanlyOnBothSides) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        srv.on("inc", [](int x) { return x + 1; });
        const auto port = parse_address(srv.listen("tcp://127.0.0.1:0")).port;
        const std::string tls = "tls://127.0.0.1:" + std::to_string(port);
        {
            const std::string why =
                co_await refusal(tls + "?ca=" + files().ca + "&handshake_timeout_ms=5000");
            EXPECT_CONTAINS(why, "TLS handshake with " + tls);
        }
        // The plaintext server read a ClientHello as msgpack and closed that connection.
        EXPECT_TRUE(co_await wait_until([&] { return srv.peer_count() == 0; }));
        auto ch = co_await async_connect("tcp://127.0.0.1:" + std::to_string(port));
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
}

TEST(Tls, ASilentClientIsDroppedAfterTheHandshakeTimeoutAndBlocksNobody) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        std::vector<std::string> refused;
        so.peer.transport.on_refused = [&](const std::string& why) { refused.push_back(why); };
        server srv(ex, so);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url =
            srv.listen("tls://127.0.0.1:0?cert=" + files().server_cert +
                       "&key=" + files().server_key + "&handshake_timeout_ms=300");
        const auto port = parse_address(url).port;
        // Connects and says nothing.
        auto silent = co_await async_connect_transport("tcp://127.0.0.1:" + std::to_string(port));
        auto ch = co_await async_connect(url + "?ca=" + files().ca);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        EXPECT_TRUE(co_await wait_until([&] { return !refused.empty(); }, 10s));
        if (!refused.empty()) {
            EXPECT_CONTAINS(refused[0], "handshake timeout");
        }
        char byte;
        std::error_code ec;
        co_await silent->async_read_some(net::buffer(&byte, 1), ec);
        EXPECT_TRUE(ec) << "the silent connection should have been closed";
        co_await srv.async_stop();
    });
}

TEST(Tls, MissingOrUnreadableFilesAreNamedInTheError) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        try {
            listen(ex, "tls://127.0.0.1:0");
            ADD_FAILURE() << "a tls listener without a certificate was made";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address);
            EXPECT_NE(std::string(e.what()).find("cert= and key="), std::string::npos) << e.what();
        }
        try {
            listen(ex, "tls://127.0.0.1:0?cert=/nonexistent/c.pem&key=" + files().server_key);
            ADD_FAILURE() << "a missing certificate file was accepted";
        } catch (const std::system_error& e) {
            EXPECT_NE(std::string(e.what()).find("/nonexistent/c.pem"), std::string::npos)
                << e.what();
        }
        {
            const std::string why = co_await refusal("tls://127.0.0.1:1?ca=/nonexistent/ca.pem");
            EXPECT_CONTAINS(why, "/nonexistent/ca.pem");
        }
    });
}

}  // namespace
}  // namespace ordo
