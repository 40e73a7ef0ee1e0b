// Who calls through the gateway: bearer tokens, and the upstream connection that carries each
// caller's calls under its own token.
#include <strings.h>

#include <asio/experimental/awaitable_operators.hpp>

#include "gateway/gateway_state.hpp"
#include "lib/escaped.hpp"

namespace ordo::gw {

/// One caller's upstream channel (gateway_options::connect_as), opened once; the requests that
/// come meanwhile wait for it.
struct upstream {
    explicit upstream(net::any_io_executor ex) : opened(ex, std::chrono::steady_clock::time_point::max()) {}
    std::optional<channel> ch;
    std::exception_ptr failed;
    bool opening = true;
    net::steady_timer opened;  // cancelled once it is open, or failed
};

std::optional<reply> bearer_refused(const http_request& req, gateway::state& s,
                                    std::string& token) {
    if (!s.check_token) return std::nullopt;
    const std::string* h = req.header("Authorization");
    std::string_view v = h ? std::string_view(*h) : std::string_view();
    if (v.size() > 7 && strncasecmp(v.data(), "Bearer ", 7) == 0) {
        v.remove_prefix(7);
        while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
        while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
        token.assign(v);
    }
    std::string why = "ordo gateway: this gateway needs Authorization: Bearer TOKEN";
    if (!token.empty()) {
        const auto verdict = s.check_token(identity{}, credentials{token});
        if (verdict.accepted) return std::nullopt;
        token.clear();
        why = "ordo gateway: the bearer token is not accepted";
    }
    auto r = request_error(401, "unauthenticated", why);
    r.headers = "\r\nWWW-Authenticate: Bearer";
    return r;
}

namespace {

net::awaitable<void> open_upstream(std::shared_ptr<gateway::state> s, std::shared_ptr<upstream> u,
                                   std::string token) {
    try {
        // Named, not a temporary inside the co_await: GCC 12 destroys such temporaries twice.
        credentials who{token};
        auto opening = s->o.connect_as(std::move(who));
        u->ch = co_await std::move(opening);
    } catch (...) {
        u->failed = std::current_exception();
        // Forgotten, so that the next request tries again.
        if (auto it = s->upstreams.find(token); it != s->upstreams.end() && it->second == u)
            s->upstreams.erase(it);
    }
    u->opening = false;
    u->opened.cancel();
}

}  // namespace

// The upstream that carries the calls of the caller with `token`: its own channel, opened
// once (gateway_options::connect_as), or the gateway's. Callers of other tokens never wait for
// it; one whose channel is still opening waits up to request_timeout.
net::awaitable<channel> upstream_for(gateway::state& s, const std::string& token) {
    using namespace net::experimental::awaitable_operators;
    if (token.empty() || !s.o.connect_as) co_return s.ch;
    auto& slot = s.upstreams[token];
    if (!slot) {
        slot = std::make_shared<upstream>(s.ex);
        net::co_spawn(s.ex, open_upstream(s.shared_from_this(), slot, token),
                      detail::rethrow_escaped{});
    }
    auto u = slot;
    if (u->opening) {
        net::steady_timer limit(s.ex, s.o.request_timeout);
        co_await (u->opened.async_wait(use_tuple) || limit.async_wait(use_tuple));
    }
    if (u->opening)
        throw std::system_error(make_error_code(errc::timed_out),
                                "ordo gateway: the caller's upstream connection is not open "
                                "after " + std::to_string(s.o.request_timeout.count()) + " ms");
    if (u->failed) std::rethrow_exception(u->failed);
    co_return *u->ch;
}

}  // namespace ordo::gw
