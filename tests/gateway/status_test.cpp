// The gateway's status for every ordo::errc (docs/gateway.md, "Errors"), and the code names in
// bodies.
#include "ordo/gateway/gateway.hpp"

#include <gtest/gtest.h>

#include "ordo/error.hpp"

namespace ordo {
namespace {

int status_of(errc e, const std::string& detail = "x") {
    return http_status(make_error_code(e), detail);
}

TEST(GatewayStatus, EveryErrcHasItsStatus) {
    EXPECT_EQ(status_of(errc::method_not_found), 404);
    EXPECT_EQ(status_of(errc::bad_arguments), 400);
    EXPECT_EQ(status_of(errc::timed_out), 504);
    EXPECT_EQ(status_of(errc::overloaded), 503);
    EXPECT_EQ(status_of(errc::shutting_down), 503);
    EXPECT_EQ(status_of(errc::closed), 503);
    EXPECT_EQ(status_of(errc::cancelled), 503);
    EXPECT_EQ(status_of(errc::peer_lost, "connection reset by peer"), 502);
    EXPECT_EQ(status_of(errc::peer_lost, "no live replica in route:tcp://h:1"), 503);
    EXPECT_EQ(status_of(errc::session_lost), 502);
    EXPECT_EQ(status_of(errc::protocol_error), 502);
    EXPECT_EQ(status_of(errc::bad_result), 502);
    EXPECT_EQ(status_of(errc::remote_error), 500);
    EXPECT_EQ(status_of(errc::bad_address), 500);
    EXPECT_EQ(http_status(std::make_error_code(std::errc::io_error), "x"), 500);
}

TEST(GatewayStatus, CodesAreNamedInSnakeCase) {
    EXPECT_EQ(code_name(make_error_code(errc::method_not_found)), "method_not_found");
    EXPECT_EQ(code_name(make_error_code(errc::peer_lost)), "peer_lost");
    EXPECT_EQ(code_name(make_error_code(errc::session_lost)), "session_lost");
    for (int e = 1; e <= 13; ++e)
        EXPECT_EQ(code_name(make_error_code(static_cast<errc>(e))).find(' '), std::string::npos);
}

}  // namespace
}  // namespace ordo
