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

// ---- URL parameters (docs/calls-and-channels.md) ----

// What the parameters of one URL set: a channel's (`ordo://...?k=v`: its peer, or its pool),
// or a route's (`route+...`: the router, its source, its replicas' peers).
struct url_settings {
    url_settings(std::string_view u, peer_options& p) : url(u), o(p) {}
    std::string_view url;
    peer_options& o;
    // A channel's.
    bool pooled = false;
    std::string lane;  // the channel's default lane
    pool_options po;
    // A route's.
    router_options ro;
    std::vector<std::string> weights, shadows;
    etcd_access access;        // etcd_*= parameters
    std::string route_tls[3];  // the route's own ca=, cert=, key=: etcd's too, unless etcd_*= say
    std::string dns_server;
    std::optional<std::chrono::milliseconds> refresh;
    std::chrono::milliseconds min_refresh{500};
    // Both: transport parameters (TLS files...), passed on to the transport or every replica.
    std::string kept;

    std::size_t n(const std::string& key, const std::string& value) const {
        return detail::number_parameter(url, key, value);
    }
    std::chrono::milliseconds ms(const std::string& key, const std::string& value) const {
        return std::chrono::milliseconds(n(key, value));
    }
    std::chrono::milliseconds ms_at_least_1(const std::string& key,
                                            const std::string& value) const {
        return std::chrono::milliseconds(std::max<std::size_t>(1, n(key, value)));
    }
    double fraction(const std::string& key, const std::string& value) const {
        return detail::fraction_parameter(url, key, value);
    }
};

// Which URLs take a parameter.
enum url_kind : std::uint8_t {
    channel_url = 1,   // ordo://, tcp://...: an ordered channel or a pool
    route_url = 2,     // route+SCHEME://a,b,...
    dns_route = 4,     // route+dns+SCHEME://
    file_route = 8,    // route+file://
    etcd_route = 16,   // route+etcd://, route+etcd+https://
    any_route = route_url | dns_route | file_route | etcd_route,
    any_url = channel_url | any_route,
};

using url_setter = void (*)(url_settings&, const std::string& key, const std::string& value);
struct url_parameter {
    std::string_view name;
    std::uint8_t takes;  // url_kind bits
    url_setter set;
};

// Every parameter but the transports' own (is_transport_parameter), with what it sets.
const url_parameter url_parameters[] = {
    // Every connection's (peer_options).
    {"timeout_ms", any_url, [](auto& s, auto& k, auto& v) { s.o.default_timeout = s.ms(k, v); }},
    {"interval_ms", any_url, [](auto& s, auto& k, auto& v) { s.o.comm.interval = s.ms(k, v); }},
    {"liveness_timeout_ms", any_url,
     [](auto& s, auto& k, auto& v) { s.o.liveness_timeout = s.ms(k, v); }},
    {"heartbeat_ms", any_url,
     [](auto& s, auto& k, auto& v) { s.o.heartbeat_interval = s.ms(k, v); }},
    {"resume_ms", any_url, [](auto& s, auto& k, auto& v) { s.o.resume = s.ms(k, v); }},
    {"max_unacked_bytes", any_url,
     [](auto& s, auto& k, auto& v) { s.o.max_unacked_bytes = s.n(k, v); }},
    {"piece_bytes", any_url, [](auto& s, auto& k, auto& v) { s.o.piece_bytes = s.n(k, v); }},
    {"lane_window", any_url, [](auto& s, auto& k, auto& v) { s.o.lane_window = s.n(k, v); }},
    {"token_file", any_url,
     [](auto& s, auto&, auto& v) { s.o.credentials.token = read_token(v); }},
    // A channel's, and its pool's (pool_options).
    {"mode", channel_url,
     [](auto& s, auto&, auto& v) {
         if (v != "ordered" && v != "pooled") bad(s.url, "mode must be ordered or pooled");
         s.pooled = v == "pooled";
     }},
    {"lane", channel_url, [](auto& s, auto&, auto& v) { s.lane = v; }},
    {"max_connections", channel_url,
     [](auto& s, auto& k, auto& v) { s.po.max_connections = std::max<std::size_t>(1, s.n(k, v)); }},
    {"max_idle", channel_url, [](auto& s, auto& k, auto& v) { s.po.max_idle = s.n(k, v); }},
    {"idle_timeout_ms", channel_url,
     [](auto& s, auto& k, auto& v) { s.po.idle_timeout = s.ms(k, v); }},
    {"connect_timeout_ms", channel_url,
     [](auto& s, auto& k, auto& v) { s.po.connect_timeout = s.ms(k, v); }},
    {"max_queued", channel_url,
     [](auto& s, auto& k, auto& v) { s.po.max_queued_calls = s.n(k, v); }},
    // A router's (router_options).
    {"max_concurrent", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.max_concurrent = std::max<std::size_t>(1, s.n(k, v)); }},
    {"max_queued", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.max_queued_calls = s.n(k, v); }},
    {"queue", any_route,
     [](auto& s, auto&, auto& v) {
         if (v == "edf")
             s.ro.queue = queue_order::earliest_deadline;
         else if (v == "fifo")
             s.ro.queue = queue_order::fifo;
         else
             bad(s.url, "queue must be edf or fifo");
     }},
    {"policy", any_route,
     [](auto& s, auto&, auto& v) {
         if (v == "least_loaded")
             s.ro.policy = route_policy::least_loaded;
         else if (v == "round_robin")
             s.ro.policy = route_policy::round_robin;
         else if (v == "weighted")
             s.ro.policy = route_policy::weighted;
         else
             bad(s.url, "policy must be least_loaded, round_robin or weighted");
     }},
    {"aperture", any_route,
     [](auto& s, auto&, auto& v) {
         if (v != "adaptive" && v != "all") bad(s.url, "aperture must be adaptive or all");
         s.ro.aperture = v == "adaptive";
     }},
    {"idempotent", any_route,
     [](auto& s, auto&, auto& v) {
         for (auto& m : split(v, ',')) s.ro.idempotent_methods.insert(m);
     }},
    {"weights", any_route, [](auto& s, auto&, auto& v) { s.weights = split(v, ','); }},
    {"shadow", any_route, [](auto& s, auto&, auto& v) { s.shadows = split(v, ','); }},
    {"shadow_fraction", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.shadow_fraction = std::min(1.0, s.fraction(k, v)); }},
    {"connect_timeout_ms", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.connect_timeout = s.ms(k, v); }},
    {"reconnect_ms", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.reconnect_initial = s.ms_at_least_1(k, v); }},
    {"reconnect_max_ms", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.reconnect_max = s.ms_at_least_1(k, v); }},
    {"eject_after", any_route, [](auto& s, auto& k, auto& v) { s.ro.eject_after = s.n(k, v); }},
    {"eject_ms", any_route, [](auto& s, auto& k, auto& v) { s.ro.eject_base = s.ms(k, v); }},
    {"eject_max_ms", any_route, [](auto& s, auto& k, auto& v) { s.ro.eject_max = s.ms(k, v); }},
    {"max_ejected_percent", any_route,
     [](auto& s, auto& k, auto& v) {
         s.ro.max_ejected_percent = std::min<std::size_t>(100, s.n(k, v));
     }},
    {"wait_for_replica_ms", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.wait_for_replica = s.ms(k, v); }},
    {"hedge_after_ms", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.hedge.after = s.ms(k, v); }},
    {"hedge_after", any_route,
     [](auto& s, auto&, auto& v) {
         if (v != "p95") bad(s.url, "hedge_after must be p95 (or hedge_after_ms=N)");
         s.ro.hedge.p95 = true;
     }},
    {"hedge", any_route,
     [](auto& s, auto&, auto& v) {
         // METHOD:N or METHOD:p95, comma-separated.
         for (const auto& item : split(v, ',')) {
             const auto colon = item.rfind(':');
             if (colon == std::string::npos || colon == 0)
                 bad(s.url, "hedge takes METHOD:N or METHOD:p95, not \"" + item + "\"");
             hedge_policy hp;
             const std::string when = item.substr(colon + 1);
             if (when == "p95")
                 hp.p95 = true;
             else
                 hp.after = s.ms("hedge", when);
             s.ro.hedge_methods[item.substr(0, colon)] = hp;
         }
     }},
    {"token_hosts", any_route, [](auto& s, auto&, auto& v) { s.ro.token_hosts = split(v, ','); }},
    {"health", any_route,
     [](auto& s, auto&, auto& v) {
         if (v != "watch" && v != "off") bad(s.url, "health must be watch or off");
         s.ro.watch_health = v == "watch";
     }},
    {"overload_cooldown_ms", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.overload_cooldown = s.ms(k, v); }},
    {"retry_budget_percent", any_route,
     [](auto& s, auto& k, auto& v) {
         s.ro.retry_budget_percent = v == "off" ? -1.0 : s.fraction(k, v);
     }},
    {"min_retries_per_s", any_route,
     [](auto& s, auto& k, auto& v) { s.ro.min_retries_per_s = s.fraction(k, v); }},
    // A router's source.
    {"etcd_ca", etcd_route, [](auto& s, auto&, auto& v) { s.access.ca_file = v; }},
    {"etcd_cert", etcd_route, [](auto& s, auto&, auto& v) { s.access.cert_file = v; }},
    {"etcd_key", etcd_route, [](auto& s, auto&, auto& v) { s.access.key_file = v; }},
    {"etcd_user", etcd_route, [](auto& s, auto&, auto& v) { s.access.user = v; }},
    {"etcd_password_file", etcd_route,
     [](auto& s, auto&, auto& v) { s.access.password = read_token(v); }},
    {"etcd_token_file", etcd_route,
     [](auto& s, auto&, auto& v) { s.access.token = read_token(v); }},
    {"dns_server", dns_route, [](auto& s, auto&, auto& v) { s.dns_server = v; }},
    {"refresh_ms", dns_route | file_route | etcd_route,
     [](auto& s, auto& k, auto& v) { s.refresh = s.ms_at_least_1(k, v); }},
    {"min_refresh_ms", dns_route, [](auto& s, auto& k, auto& v) { s.min_refresh = s.ms(k, v); }},
};

// Applies `key=value` to `s` for a URL of `kind`: a parameter of the table, or a transport's
// (kept as `written` for the transport; a route's ca=, cert= and key= are etcd's too). Throws
// errc::bad_address naming any other.
void apply_url_parameter(url_settings& s, url_kind kind, const std::string& key,
                         const std::string& value, std::string_view written) {
    for (const auto& p : url_parameters)
        if (p.name == key && (p.takes & kind) != 0) return p.set(s, key, value);
    if (!is_transport_parameter(key)) bad(s.url, "unknown parameter \"" + key + "\"");
    s.kept.append(s.kept.empty() ? "?" : "&").append(written);
    if (kind == channel_url) return;
    if (key == "ca") s.route_tls[0] = value;
    if (key == "cert") s.route_tls[1] = value;
    if (key == "key") s.route_tls[2] = value;
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
    // A source instead of a list: dns+SCHEME, file, etcd.
    url_kind kind = route_url;
    if (scheme.rfind("dns+", 0) == 0)
        kind = dns_route;
    else if (scheme == "file")
        kind = file_route;
    else if (scheme == "etcd" || scheme == "etcd+https")
        kind = etcd_route;
    const bool sourced = kind != route_url;
    url_settings params(url, o);
    for (const std::string& item : split(query, '&')) {
        if (item.empty()) continue;
        const auto eq = item.find('=');
        apply_url_parameter(params, kind, item.substr(0, eq),
                            eq == std::string::npos ? "" : item.substr(eq + 1), item);
    }
    auto& access = params.access;
    if (access.ca_file.empty()) access.ca_file = params.route_tls[0];
    if (access.cert_file.empty() && access.key_file.empty()) {
        access.cert_file = params.route_tls[1];
        access.key_file = params.route_tls[2];
    }
    route_spec spec;
    spec.options = std::move(params.ro);
    spec.options.peer = std::move(o);
    if (sourced) {
        if (!params.weights.empty() || !params.shadows.empty())
            bad(url, "weights and shadow name replicas of a list, not of a " + scheme + " source");
        spec.source = source_maker(url, scheme, std::string(rest), params.kept, params.dns_server,
                                   params.refresh, params.min_refresh, access);
        return spec;
    }
    auto replica_url = [&](const std::string& item) {
        if (item.empty()) bad(url, "empty replica address");
        const std::string u = scheme + "://" + item;
        parse_address(u);  // names what is wrong with this one
        return u + params.kept;
    };
    const auto items = split(rest, ',');
    const auto& weights = params.weights;
    if (!weights.empty() && weights.size() != items.size())
        bad(url, "weights has " + std::to_string(weights.size()) + " entries for " +
                     std::to_string(items.size()) + " replicas");
    for (std::size_t i = 0; i < items.size(); ++i) {
        route_spec::replica r{replica_url(items[i]), 1.0, {}};
        if (!weights.empty()) r.weight = detail::fraction_parameter(url, "weights", weights[i]);
        if (!(r.weight > 0)) bad(url, "weights must be positive");
        spec.replicas.push_back(std::move(r));
    }
    for (const auto& item : params.shadows)
        spec.replicas.push_back({replica_url(item), 1.0, "shadow"});
    if (!params.shadows.empty()) spec.options.shadow_group = "shadow";
    return spec;
}

net::awaitable<channel> async_connect(std::string_view url) {
    return async_connect(url, peer_options{}, nullptr);
}

namespace {

net::awaitable<channel> open_channel(std::string_view url, peer_options o, const handlers* h) {
    if (url.substr(0, 6) == "route+") co_return co_await connect_route(url, std::move(o));
    const address a = parse_address(url);
    url_settings params(url, o);
    for (const auto& [key, value] : a.params)
        apply_url_parameter(params, channel_url, key, value, key + "=" + value);
    const bool pooled = params.pooled;
    if (pooled && o.resume.count() > 0)
        bad(url,
            "resume_ms applies to ordered channels and router replicas, not to mode=pooled "
            "(a pool's calls are independent: a dropped connection fails only its own call)");
    detail::check_resume_scheme(url, o.resume);
    // The transport sees the address with its own parameters only.
    const std::string where = a.to_string() + params.kept;
    auto ex = co_await net::this_coro::executor;
    if (pooled) {
        auto& po = params.po;
        po.peer = o;
        auto p = make_pool(ex, where, po);
        co_await p->async_warm_up();
        co_return channel(std::move(p)).lane(params.lane);
    }
    auto t = co_await async_connect_transport(where, o.transport);
    auto p = detail::make_connected_peer(std::move(t), where, std::move(o), h);
    p->start();
    co_return channel(std::move(p)).lane(params.lane);
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
