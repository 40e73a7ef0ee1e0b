// Who calls through the gateway: bearer tokens, the upstream connection that carries each
// caller's calls under its own token, and whether a caller is still there (client_gone).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <future>

#include "gateway/gateway_state.hpp"

namespace ordo::gw {

namespace {

// The socket of `c`: civetweb does not say, so the one whose two ends are the request's.
int socket_of(const mg_request_info* ri) {
    DIR* d = ::opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    while (const dirent* e = ::readdir(d)) {
        const int fd = std::atoi(e->d_name);
        if (fd <= 2) continue;
        sockaddr_storage peer{}, self{};
        socklen_t pn = sizeof peer, sn = sizeof self;
        if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pn) != 0 ||
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sn) != 0)
            continue;
        char ip[INET6_ADDRSTRLEN] = {};
        int pport = 0, sport = 0;
        if (peer.ss_family == AF_INET) {
            const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
            ::inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
            pport = ntohs(a->sin_port);
            sport = ntohs(reinterpret_cast<const sockaddr_in*>(&self)->sin_port);
        } else if (peer.ss_family == AF_INET6) {
            const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
            ::inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
            pport = ntohs(a->sin6_port);
            sport = ntohs(reinterpret_cast<const sockaddr_in6*>(&self)->sin6_port);
        } else {
            continue;
        }
        if (pport == ri->remote_port && sport == ri->server_port &&
            std::strcmp(ip, ri->remote_addr) == 0) {
            found = fd;
            break;
        }
    }
    ::closedir(d);
    return found;
}

}  // namespace

// The caller's bearer token, when the gateway has auth_tokens: empty and no reply if it has
// none; a 401 reply if the request carries no token the gateway accepts.
std::optional<reply> bearer_refused(mg_connection* c, gateway::state& s, std::string& token) {
    if (!s.check_token) return std::nullopt;
    const char* h = mg_get_header(c, "Authorization");
    std::string_view v = h ? h : "";
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
        why = "ordo gateway: the bearer token is not accepted";
    }
    auto r = request_error(401, "unauthenticated", why);
    r.headers = "\r\nWWW-Authenticate: Bearer";
    return r;
}

// The upstream that carries the calls of the caller with `token`: its own channel, opened
// once (gateway_options::connect_as), or the gateway's. Callers of other tokens never wait
// for it; one whose channel is still opening waits up to request_timeout. A failed opening
// is forgotten, so that the next request tries again.
channel upstream_for(gateway::state& s, const std::string& token) {
    if (token.empty() || !s.o.connect_as) return s.ch;
    std::shared_ptr<const std::shared_future<channel>> f;
    {
        std::lock_guard lk(s.upstream_mu);
        auto it = s.upstreams.find(token);
        if (it == s.upstreams.end()) {
            auto p = std::make_shared<std::promise<channel>>();
            it = s.upstreams
                     .emplace(token, std::make_shared<const std::shared_future<channel>>(
                                         p->get_future().share()))
                     .first;
            net::co_spawn(s.ch.get_executor(), s.o.connect_as(credentials{token}),
                          [p](std::exception_ptr e, channel ch) {
                              if (e)
                                  p->set_exception(e);
                              else
                                  p->set_value(std::move(ch));
                          });
        }
        f = it->second;
    }
    if (f->wait_for(s.o.request_timeout) != std::future_status::ready)
        throw std::system_error(make_error_code(errc::timed_out),
                                "ordo gateway: the caller's upstream connection is not open "
                                "after " + std::to_string(s.o.request_timeout.count()) + " ms");
    try {
        return f->get();
    } catch (...) {
        std::lock_guard lk(s.upstream_mu);
        if (auto it = s.upstreams.find(token); it != s.upstreams.end() && it->second == f)
            s.upstreams.erase(it);
        throw;
    }
}

bool client_gone(mg_connection* c) {
    auto* d = static_cast<conn_data*>(mg_get_user_connection_data(c));
    if (!d) return false;
    if (d->fd == -2) d->fd = socket_of(mg_get_request_info(c));
    if (d->fd < 0) return false;
    // The client ended its side: it closed (an HTTP client does not half-close and wait).
    pollfd p{d->fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace ordo::gw
