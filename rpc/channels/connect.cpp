#include "ordo/rpc/connect.hpp"

#include <cctype>

#include <asio/experimental/awaitable_operators.hpp>

#include "lib/url_number.hpp"
#include "ordo/rpc/peer.hpp"
#include "ordo/rpc/pool.hpp"
#include "ordo/rpc/router.hpp"
#include "rpc/channels/connecting.hpp"
#include "rpc/context/context.hpp"
#include "rpc/session/session.hpp"

namespace ordo {

channel_impl::~channel_impl() = default;

namespace detail {

bool apply_peer_parameter(std::string_view url, const std::string& key, const std::string& value,
                          peer_options& o) {
    auto ms = [&] { return std::chrono::milliseconds(number_parameter(url, key, value)); };
    if (key == "timeout_ms")
        o.default_timeout = ms();
    else if (key == "interval_ms")
        o.comm.interval = ms();
    else if (key == "liveness_timeout_ms")
        o.liveness_timeout = ms();
    else if (key == "heartbeat_ms")
        o.heartbeat_interval = ms();
    else if (key == "resume_ms")
        o.resume = ms();
    else if (key == "max_unacked_bytes")
        o.max_unacked_bytes = number_parameter(url, key, value);
    else if (key == "piece_bytes")
        o.piece_bytes = number_parameter(url, key, value);
    else if (key == "lane_window")
        o.lane_window = number_parameter(url, key, value);
    else if (key == "token_file")
        o.credentials.token = read_token(value);
    else
        return false;
    return true;
}

namespace {

// `r`: `e` when it is an rpc_error.
rpc_error connect_error(std::string_view url, const std::system_error& e, const rpc_error* r) {
    if (r && !r->peer().empty()) return *r;  // already names its address
    // What went wrong, without the "ordo: " prefix and the code's words after it.
    std::string inner = r ? r->detail() : e.what();
    if (inner.starts_with("ordo: ")) inner.erase(0, 6);
    if (!r && inner.ends_with(": " + e.code().message()))
        inner.resize(inner.size() - e.code().message().size() - 2);
    if (e.code().category() == ordo::error_category())
        return rpc_error(e.code(), {}, std::string(url), inner);
    const std::error_code ec = e.code();
    const bool unknown_host =
        ec == net::error::host_not_found || ec == net::error::service_not_found;
    // The OS's words, as a phrase ("connection refused"), after what was tried when that names
    // another address than `url` (a router's replica).
    std::string reason = ec.message();
    if (!reason.empty()) reason[0] = static_cast<char>(std::tolower(reason[0]));
    std::string canonical;
    try {
        canonical = parse_address(url).to_string();
    } catch (const std::system_error&) {
    }
    const bool names_url = inner.find(std::string(url)) != std::string::npos ||
                           (!canonical.empty() && inner.find(canonical) != std::string::npos);
    if (!names_url && inner.ends_with(": " + ec.message()))
        reason = inner.substr(0, inner.size() - ec.message().size()) + reason;
    return rpc_error(
        unknown_host ? make_error_code(errc::bad_address) : make_error_code(errc::peer_lost), {},
        std::string(url), reason);
}

}  // namespace

rpc_error connect_error(std::string_view url) {
    try {
        throw;
    } catch (const rpc_error& r) {
        return connect_error(url, r, &r);
    } catch (const std::system_error& e) {
        return connect_error(url, e, nullptr);
    }
}

namespace {

using attempt_result = std::pair<std::unique_ptr<transport>, std::exception_ptr>;

// A failed connection is a result here, not an exception: `||` waits for the first operation
// that succeeds, so a refused connection that threw would wait for the timer.
net::awaitable<attempt_result> attempt(std::string url, transport_options to) {
    try {
        co_return attempt_result{co_await async_connect_transport(url, std::move(to)), nullptr};
    } catch (...) {
        co_return attempt_result{nullptr, std::current_exception()};
    }
}

}  // namespace

net::awaitable<std::unique_ptr<transport>> open_transport_within(std::string url,
                                                                 std::chrono::milliseconds limit,
                                                                 transport_options to) {
    using namespace net::experimental::awaitable_operators;
    net::steady_timer timer(co_await net::this_coro::executor, limit);
    auto r = co_await (attempt(url, std::move(to)) || timer.async_wait(net::use_awaitable));
    if (r.index() == 1)
        throw_error(errc::timed_out, "ordo: connecting to " + url + " took longer than " +
                                         std::to_string(limit.count()) + " ms");
    auto& [t, failure] = std::get<0>(r);
    if (failure) std::rethrow_exception(failure);
    co_return std::move(t);
}

namespace {

// A coroutine over copies: it outlives the call that started it.
net::awaitable<std::unique_ptr<transport>> reopen(std::string url, transport_options to,
                                                  std::chrono::milliseconds liveness,
                                                  std::chrono::milliseconds limit) {
    auto t = co_await open_transport_within(std::move(url), limit, std::move(to));
    if (liveness.count() > 0) t->set_liveness(liveness);
    co_return t;
}

}  // namespace

// resume_ms over zmq+: ZeroMQ reconnects underneath and may drop messages in doing so without
// ordo seeing a drop, so the session's counts would not say what was lost. Refused, naming both.
void check_resume_scheme(std::string_view url, std::chrono::milliseconds resume) {
    if (resume.count() > 0 && url.substr(0, 4) == "zmq+")
        throw_error(errc::bad_address,
                    "ordo: invalid address \"" + std::string(url) +
                        "\": resume_ms is not supported over zmq+ transports (ZeroMQ reconnects "
                        "underneath and may drop messages unseen, so a session could not keep "
                        "exactly-once delivery); use tcp://, unix:// or tls://");
}

std::shared_ptr<peer> make_connected_peer(std::unique_ptr<transport> t, const std::string& url,
                                          peer_options o, const handlers* h) {
    check_resume_scheme(url, o.resume);
    resume_config rc;
    if (o.resume.count() > 0) {
        rc.window = o.resume;
        rc.reconnect = [url, to = o.transport, lv = o.liveness_timeout](
                           std::chrono::milliseconds limit) { return reopen(url, to, lv, limit); };
    }
    return make_peer(std::move(t), std::move(o), h, std::move(rc));
}

}  // namespace detail

namespace {

[[noreturn]] void bad(std::string_view url, const std::string& why) {
    throw_error(errc::bad_address, "ordo: invalid address \"" + std::string(url) + "\": " + why);
}

std::vector<std::string> split(std::string_view s, char sep) {
    std::vector<std::string> parts;
    while (true) {
        auto at = s.find(sep);
        parts.emplace_back(s.substr(0, at));
        if (at == std::string_view::npos) return parts;
        s = s.substr(at + 1);
    }
}

// What makes the source of a `route+dns+SCHEME://`, `route+file://` or `route+etcd://` URL.
std::function<std::unique_ptr<replica_source>(net::any_io_executor)> source_maker(
    std::string_view url, const std::string& scheme, const std::string& rest,
    const std::string& kept, const std::string& dns_server,
    std::optional<std::chrono::milliseconds> refresh, std::chrono::milliseconds min_refresh,
    const etcd_access& access) {
    if (scheme.rfind("dns+", 0) == 0) {
        dns_source_options d;
        d.scheme = scheme.substr(4);
        d.url_suffix = kept;
        d.nameserver = dns_server;
        if (refresh) d.refresh = *refresh;
        d.min_refresh = min_refresh;
        if (!rest.empty() && rest[0] == '_') {
            d.name = rest;  // SRV: the records carry the ports
        } else {
            const auto colon = rest.rfind(':');
            if (colon == std::string::npos || colon == 0)
                bad(url, "a dns+ router needs NAME:PORT, or an SRV name (_service._proto.name)");
            d.name = rest.substr(0, colon);
            const auto port = detail::number_parameter(url, "port", rest.substr(colon + 1));
            if (port == 0 || port > 65535) bad(url, "the port must be 1-65535");
            d.port = static_cast<std::uint16_t>(port);
        }
        try {  // a bad scheme or transport parameter, named now rather than at each lookup
            parse_address(d.scheme + "://127.0.0.1:1" + kept);
        } catch (const std::system_error& e) {
            bad(url, std::string("its replicas' addresses would be refused: ") + e.what());
        }
        return [d](net::any_io_executor ex) { return make_dns_source(std::move(ex), d); };
    }
    if (scheme == "file") {
        if (rest.empty() || rest[0] != '/') bad(url, "a file router needs an absolute path");
        file_source_options f;
        f.path = rest;
        f.url_suffix = kept;
        if (refresh) f.poll = *refresh;
        return [f](net::any_io_executor ex) { return make_file_source(std::move(ex), f); };
    }
    const auto slash = rest.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == rest.size())
        bad(url, "an etcd router needs HOST:PORT/PREFIX");
    etcd_source_options e;
    e.endpoint = (scheme == "etcd+https" ? "https://" : "http://") + rest.substr(0, slash);
    e.access = access;
    e.prefix = rest.substr(slash);
    e.url_suffix = kept;
    if (refresh) e.reread = *refresh;
    return [e](net::any_io_executor ex) { return make_etcd_source(std::move(ex), e); };
}

net::awaitable<channel> connect_route(std::string_view url, peer_options o) {
    route_spec spec = parse_route_url(url, std::move(o));
    auto r = make_router(co_await net::this_coro::executor, spec.options);
    for (auto& rep : spec.replicas) co_await r->async_add_replica(rep.url, rep.weight, rep.group);
    if (spec.source) co_await r->async_follow(spec.source(r->get_executor()));
    co_return channel(std::move(r));
}

}  // namespace

route_spec parse_route_url(std::string_view url, peer_options o) {
    constexpr std::string_view prefix = "route+";
    if (url.substr(0, prefix.size()) != prefix) bad(url, "a router address starts with route+");
    const auto sep = url.find("://");
    if (sep == std::string_view::npos) bad(url, "expected route+scheme://replica,replica,...");
    const std::string scheme(url.substr(prefix.size(), sep - prefix.size()));
    std::string_view rest = url.substr(sep + 3);
    std::string_view query;
    if (auto q = rest.find('?'); q != std::string_view::npos) {
        query = rest.substr(q + 1);
        rest = rest.substr(0, q);
    }
    route_spec spec;
    std::vector<std::string> weights, shadows;
    std::string kept;  // transport parameters, passed on to every replica
    // A source instead of a list: dns+SCHEME, file, etcd.
    const bool dns = scheme.rfind("dns+", 0) == 0;
    const bool etcd = scheme == "etcd" || scheme == "etcd+https";
    const bool sourced = dns || scheme == "file" || etcd;
    etcd_access access;      // etcd_*= parameters
    std::string route_tls[3];  // the route's own ca=, cert=, key=: etcd's too, unless etcd_*= say
    std::string dns_server;
    std::optional<std::chrono::milliseconds> refresh;
    std::chrono::milliseconds min_refresh{500};
    for (const std::string& item : split(query, '&')) {
        if (item.empty()) continue;
        const auto eq = item.find('=');
        const std::string key = item.substr(0, eq);
        const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
        auto n = [&] { return detail::number_parameter(url, key, value); };
        router_options& ro = spec.options;
        if (key == "max_concurrent") {
            ro.max_concurrent = std::max<std::size_t>(1, n());
        } else if (key == "max_queued") {
            ro.max_queued_calls = n();
        } else if (key == "queue") {
            if (value == "edf")
                ro.queue = queue_order::earliest_deadline;
            else if (value == "fifo")
                ro.queue = queue_order::fifo;
            else
                bad(url, "queue must be edf or fifo");
        } else if (key == "policy") {
            if (value == "least_loaded")
                ro.policy = route_policy::least_loaded;
            else if (value == "round_robin")
                ro.policy = route_policy::round_robin;
            else if (value == "weighted")
                ro.policy = route_policy::weighted;
            else
                bad(url, "policy must be least_loaded, round_robin or weighted");
        } else if (key == "aperture") {
            if (value == "adaptive")
                ro.aperture = true;
            else if (value == "all")
                ro.aperture = false;
            else
                bad(url, "aperture must be adaptive or all");
        } else if (key == "idempotent") {
            for (auto& m : split(value, ',')) ro.idempotent_methods.insert(m);
        } else if (key == "weights") {
            weights = split(value, ',');
        } else if (key == "shadow") {
            shadows = split(value, ',');
        } else if (key == "shadow_fraction") {
            ro.shadow_fraction = std::min(1.0, detail::fraction_parameter(url, key, value));
        } else if (key == "connect_timeout_ms") {
            ro.connect_timeout = std::chrono::milliseconds(n());
        } else if (key == "reconnect_ms") {
            ro.reconnect_initial = std::chrono::milliseconds(std::max<std::size_t>(1, n()));
        } else if (key == "reconnect_max_ms") {
            ro.reconnect_max = std::chrono::milliseconds(std::max<std::size_t>(1, n()));
        } else if (key == "eject_after") {
            ro.eject_after = n();
        } else if (key == "eject_ms") {
            ro.eject_base = std::chrono::milliseconds(n());
        } else if (key == "eject_max_ms") {
            ro.eject_max = std::chrono::milliseconds(n());
        } else if (key == "max_ejected_percent") {
            ro.max_ejected_percent = std::min<std::size_t>(100, n());
        } else if (key == "wait_for_replica_ms") {
            ro.wait_for_replica = std::chrono::milliseconds(n());
        } else if (key == "hedge_after_ms") {
            ro.hedge.after = std::chrono::milliseconds(n());
        } else if (key == "hedge_after") {
            if (value != "p95") bad(url, "hedge_after must be p95 (or hedge_after_ms=N)");
            ro.hedge.p95 = true;
        } else if (key == "hedge") {
            // METHOD:N or METHOD:p95, comma-separated.
            for (const auto& item : split(value, ',')) {
                const auto colon = item.rfind(':');
                if (colon == std::string::npos || colon == 0)
                    bad(url, "hedge takes METHOD:N or METHOD:p95, not \"" + item + "\"");
                hedge_policy hp;
                const std::string when = item.substr(colon + 1);
                if (when == "p95")
                    hp.p95 = true;
                else
                    hp.after =
                        std::chrono::milliseconds(detail::number_parameter(url, "hedge", when));
                ro.hedge_methods[item.substr(0, colon)] = hp;
            }
        } else if (key == "token_hosts") {
            ro.token_hosts = split(value, ',');
        } else if (key == "health") {
            if (value == "watch")
                ro.watch_health = true;
            else if (value == "off")
                ro.watch_health = false;
            else
                bad(url, "health must be watch or off");
        } else if (key == "overload_cooldown_ms") {
            ro.overload_cooldown = std::chrono::milliseconds(n());
        } else if (key == "retry_budget_percent") {
            ro.retry_budget_percent =
                value == "off" ? -1.0 : detail::fraction_parameter(url, key, value);
        } else if (key == "min_retries_per_s") {
            ro.min_retries_per_s = detail::fraction_parameter(url, key, value);
        } else if (etcd && key.rfind("etcd_", 0) == 0) {
            if (key == "etcd_ca")
                access.ca_file = value;
            else if (key == "etcd_cert")
                access.cert_file = value;
            else if (key == "etcd_key")
                access.key_file = value;
            else if (key == "etcd_user")
                access.user = value;
            else if (key == "etcd_password_file")
                access.password = read_token(value);
            else if (key == "etcd_token_file")
                access.token = read_token(value);
            else
                bad(url, "unknown parameter \"" + key + "\"");
        } else if (dns && key == "dns_server") {
            dns_server = value;
        } else if (sourced && key == "refresh_ms") {
            refresh = std::chrono::milliseconds(std::max<std::size_t>(1, n()));
        } else if (dns && key == "min_refresh_ms") {
            min_refresh = std::chrono::milliseconds(n());
        } else if (detail::apply_peer_parameter(url, key, value, o)) {
        } else if (is_transport_parameter(key)) {
            kept += (kept.empty() ? "?" : "&") + item;
            if (key == "ca") route_tls[0] = value;
            if (key == "cert") route_tls[1] = value;
            if (key == "key") route_tls[2] = value;
        } else {
            bad(url, "unknown parameter \"" + key + "\"");
        }
    }
    if (access.ca_file.empty()) access.ca_file = route_tls[0];
    if (access.cert_file.empty() && access.key_file.empty()) {
        access.cert_file = route_tls[1];
        access.key_file = route_tls[2];
    }
    spec.options.peer = std::move(o);
    if (sourced) {
        if (!weights.empty() || !shadows.empty())
            bad(url, "weights and shadow name replicas of a list, not of a " + scheme + " source");
        spec.source = source_maker(url, scheme, std::string(rest), kept, dns_server, refresh,
                                   min_refresh, access);
        return spec;
    }
    auto replica_url = [&](const std::string& item) {
        if (item.empty()) bad(url, "empty replica address");
        const std::string u = scheme + "://" + item;
        parse_address(u);  // names what is wrong with this one
        return u + kept;
    };
    const auto items = split(rest, ',');
    if (!weights.empty() && weights.size() != items.size())
        bad(url, "weights has " + std::to_string(weights.size()) + " entries for " +
                     std::to_string(items.size()) + " replicas");
    for (std::size_t i = 0; i < items.size(); ++i) {
        route_spec::replica r{replica_url(items[i]), 1.0, {}};
        if (!weights.empty()) r.weight = detail::fraction_parameter(url, "weights", weights[i]);
        if (!(r.weight > 0)) bad(url, "weights must be positive");
        spec.replicas.push_back(std::move(r));
    }
    for (const auto& item : shadows) spec.replicas.push_back({replica_url(item), 1.0, "shadow"});
    if (!shadows.empty()) spec.options.shadow_group = "shadow";
    return spec;
}

net::awaitable<channel> async_connect(std::string_view url) {
    return async_connect(url, peer_options{}, nullptr);
}

namespace {

net::awaitable<channel> open_channel(std::string_view url, peer_options o, const handlers* h) {
    if (url.substr(0, 6) == "route+") co_return co_await connect_route(url, std::move(o));
    const address a = parse_address(url);
    bool pooled = false;
    std::string lane;  // the channel's default lane
    pool_options po;
    std::string kept;  // transport parameters (TLS files...), passed on
    for (const auto& param : a.params) {
        // (Named references, not a structured binding: clang 14 cannot capture those.)
        const std::string& key = param.first;
        const std::string& value = param.second;
        auto n = [&] { return detail::number_parameter(url, key, value); };
        if (key == "mode") {
            if (value != "ordered" && value != "pooled") bad(url, "mode must be ordered or pooled");
            pooled = value == "pooled";
        } else if (key == "lane") {
            lane = value;
        } else if (detail::apply_peer_parameter(url, key, value, o)) {
        } else if (key == "max_connections") {
            po.max_connections = std::max<std::size_t>(1, n());
        } else if (key == "max_idle") {
            po.max_idle = n();
        } else if (key == "idle_timeout_ms") {
            po.idle_timeout = std::chrono::milliseconds(n());
        } else if (key == "connect_timeout_ms") {
            po.connect_timeout = std::chrono::milliseconds(n());
        } else if (key == "max_queued") {
            po.max_queued_calls = n();
        } else if (is_transport_parameter(key)) {
            kept += (kept.empty() ? "?" : "&") + key + "=" + value;
        } else {
            bad(url, "unknown parameter \"" + key + "\"");
        }
    }
    if (pooled && o.resume.count() > 0)
        bad(url,
            "resume_ms applies to ordered channels and router replicas, not to mode=pooled "
            "(a pool's calls are independent: a dropped connection fails only its own call)");
    detail::check_resume_scheme(url, o.resume);
    // The transport sees the address with its own parameters only.
    const std::string where = a.to_string() + kept;
    auto ex = co_await net::this_coro::executor;
    if (pooled) {
        po.peer = o;
        auto p = make_pool(ex, where, po);
        co_await p->async_warm_up();
        co_return channel(std::move(p)).lane(lane);
    }
    auto t = co_await async_connect_transport(where, o.transport);
    auto p = detail::make_connected_peer(std::move(t), where, std::move(o), h);
    p->start();
    co_return channel(std::move(p)).lane(lane);
}

}  // namespace

net::awaitable<channel> async_connect(std::string_view url, peer_options o, const handlers* h) {
    // A copy: the caller's string may not outlive the first suspension of the rethrow below.
    const std::string where(url);
    // Inside a handler, the connection is made on the plain loop: its sockets and timers must
    // not carry this call's context into every later call (docs/design.md 5.11).
    const auto ex = co_await net::this_coro::executor;
    try {
        if (ex.target<detail::context_executor>())
            co_return co_await net::co_spawn(detail::without_context(ex),
                                             open_channel(where, std::move(o), h),
                                             net::use_awaitable);
        co_return co_await open_channel(where, std::move(o), h);
    } catch (const std::system_error&) {
        throw detail::connect_error(where);
    }
}

}  // namespace ordo
