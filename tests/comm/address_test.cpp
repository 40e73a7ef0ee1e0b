#include "ordo/address.hpp"

#include <gtest/gtest.h>

#include "lib/url_number.hpp"
#include "ordo/error.hpp"
#include "ordo/comm/transport.hpp"

namespace ordo {
namespace {

TEST(Address, TcpHostPortAndParameters) {
    auto a = parse_address("tcp://127.0.0.1:7000?mode=pooled&max_connections=16");
    EXPECT_EQ(a.scheme, "tcp");
    EXPECT_EQ(a.host, "127.0.0.1");
    EXPECT_EQ(a.port, 7000);
    EXPECT_EQ(a.param("mode"), "pooled");
    EXPECT_EQ(a.param("max_connections"), "16");
    EXPECT_FALSE(a.param("other").has_value());
    EXPECT_EQ(a.to_string(), "tcp://127.0.0.1:7000");
}

// One reading of a query for every URL: parse_address, the gateway's https listen address and
// ordo-inc-server's --register.
TEST(Address, QueryParamsKeepTheirOrderAndSkipEmptyItems) {
    using kv = std::pair<std::string, std::string>;
    EXPECT_EQ(query_params("a=1&b&&c=&d=x=y"),
              (std::vector<kv>{{"a", "1"}, {"b", ""}, {"c", ""}, {"d", "x=y"}}));
    EXPECT_EQ(query_params("=v"), (std::vector<kv>{{"", "v"}}));
    EXPECT_TRUE(query_params("").empty());
    EXPECT_TRUE(query_params("&&").empty());
    EXPECT_EQ(query_params("k=a%20b"), (std::vector<kv>{{"k", "a%20b"}}));  // not decoded
}

TEST(Address, TcpIpv6InBrackets) {
    auto a = parse_address("tcp://[::1]:0");
    EXPECT_EQ(a.host, "::1");
    EXPECT_EQ(a.port, 0);
    EXPECT_EQ(a.to_string(), "tcp://[::1]:0");
}

TEST(Address, UnixPath) {
    auto a = parse_address("unix:///tmp/ordo.sock");
    EXPECT_EQ(a.scheme, "unix");
    EXPECT_EQ(a.path, "/tmp/ordo.sock");
    EXPECT_EQ(a.to_string(), "unix:///tmp/ordo.sock");
}

TEST(Address, EveryTransportScheme) {
    EXPECT_EQ(parse_address("inproc://jobs?interval_ms=1").path, "jobs");
    EXPECT_EQ(parse_address("inproc://jobs").to_string(), "inproc://jobs");
    EXPECT_EQ(parse_address("zmq+ipc:///tmp/z.sock").path, "/tmp/z.sock");
    EXPECT_EQ(parse_address("zmq+ipc:///tmp/z.sock").to_string(), "zmq+ipc:///tmp/z.sock");
    auto z = parse_address("zmq+tcp://127.0.0.1:5555");
    EXPECT_EQ(z.host, "127.0.0.1");
    EXPECT_EQ(z.port, 5555);
    EXPECT_EQ(z.to_string(), "zmq+tcp://127.0.0.1:5555");
    auto t = parse_address("tls://localhost:443?ca=/etc/ca.pem");
    EXPECT_EQ(t.host, "localhost");
    EXPECT_EQ(t.param("ca"), "/etc/ca.pem");
    EXPECT_EQ(t.to_string(), "tls://localhost:443");
}

TEST(Address, BadAddressesNameTheUrlAndTheProblem) {
    for (const char* url : {"127.0.0.1:7000", "tcp://127.0.0.1", "tcp://:7000", "tcp://h:70000",
                            "tcp://h:7x", "tcp://[::1:7000", "unix://", "udp://h:1", "inproc://",
                            "zmq+ipc://", "zmq+tcp://h", "tls://:1", "tcp://h:1?a=1&=2"}) {
        try {
            parse_address(url);
            ADD_FAILURE() << url << " was accepted";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address);
            EXPECT_NE(std::string(e.what()).find(url), std::string::npos) << e.what();
        }
    }
}

TEST(UrlNumber, ParameterValuesAreWholeUnsignedNumbersOrAnErrorNamingParameterAndUrl) {
    EXPECT_EQ(detail::number_parameter("tcp://h:1?n=42", "n", "42"), 42u);
    for (const char* text : {"", "12abc", "-1", " 7", "+7", "1.5", "99999999999999999999999"}) {
        try {
            detail::number_parameter("tcp://h:1?n=x", "n", text);
            ADD_FAILURE() << '"' << text << "\" was accepted";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address);
            EXPECT_NE(std::string(e.what()).find("parameter n must be a number"), std::string::npos)
                << e.what();
            EXPECT_NE(std::string(e.what()).find("tcp://h:1?n=x"), std::string::npos) << e.what();
        }
    }
}

TEST(UrlNumber, TransportParametersUseTheSameRules) {
    net::io_context io;
    for (const char* url : {"zmq+tcp://127.0.0.1:0?zmq_heartbeat_ms=12abc",
                            "zmq+tcp://127.0.0.1:0?zmq_heartbeat_ms=-1",
                            "tls://127.0.0.1:0?handshake_timeout_ms=soon"}) {
        try {
            listen(io.get_executor(), url);
            ADD_FAILURE() << url << " was accepted";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address) << e.what();
            const std::string key = std::string(url).substr(std::string(url).find('?') + 1);
            EXPECT_NE(std::string(e.what()).find(key.substr(0, key.find('='))), std::string::npos)
                << e.what();
        }
    }
}

TEST(Listen, UnknownParametersAreRefusedByNameAndTransportParametersAccepted) {
    net::io_context io;
    for (const char* url : {"tcp://127.0.0.1:0?colour=blue", "zmq+tcp://127.0.0.1:0?mode=pooled",
                            "tcp://127.0.0.1:0?zmq_heartbeat_ms=100&sizee=3"}) {
        try {
            listen(io.get_executor(), url);
            ADD_FAILURE() << url << " was accepted";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address) << e.what();
            const std::string u = url;
            const std::string key =
                u.substr(u.rfind('&') != std::string::npos ? u.rfind('&') + 1 : u.find('?') + 1);
            EXPECT_NE(std::string(e.what()).find("unknown parameter \"" +
                                                 key.substr(0, key.find('=')) + "\""),
                      std::string::npos)
                << e.what();
        }
    }
    EXPECT_NO_THROW(listen(io.get_executor(), "zmq+tcp://127.0.0.1:0?zmq_heartbeat_ms=100"));
}

}  // namespace
}  // namespace ordo
