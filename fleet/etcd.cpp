// etcd v3 membership over etcd's JSON gateway (its client port), through fleet/curl_multi:
// - make_etcd_source: a range read of every key under the prefix, then a watch from the
//   revision after it; a broken watch or an unreachable etcd is reported, the last good set
//   stays, and after `retry` a fresh range read starts again.
// - etcd_registration: a key under a lease, kept alive every ttl / 3, granted and put again
//   when etcd forgot the lease, revoked on a graceful stop.
// Keys and values travel base64-encoded, 64-bit numbers as JSON strings (the gateway's form).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>

#include "fleet/curl_multi.hpp"
#include "fleet/etcd_client.hpp"
#include "fleet/last_good_set.hpp"
#include "fleet/entry.hpp"
#include "lib/escaped.hpp"
#include "ordo/address.hpp"
#include "ordo/error.hpp"
#include "ordo/fleet/sources.hpp"

namespace ordo {
namespace {

using json = nlohmann::json;
using namespace net::experimental::awaitable_operators;
using detail::base64_decode;
using detail::base64_encode;
using detail::etcd_call;
using detail::etcd_client;
using detail::etcd_reason;
using detail::trimmed_endpoint;
using steady = std::chrono::steady_clock;

// A watch message (one line) may be this long; longer is a broken stream.
constexpr std::size_t max_watch_line = 16 * 1024 * 1024;

// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(std::string prefix) {
    while (!prefix.empty()) {
        if (std::uint8_t(prefix.back()) < 0xff) {
            prefix.back() = char(std::uint8_t(prefix.back()) + 1);
            return prefix;
        }
        prefix.pop_back();
    }
    return std::string(1, '\0');  // every key
}

// A key as messages show it: printable, and not too long.
std::string shown(std::string_view key) {
    std::string out;
    for (const char c : key.substr(0, 200)) {
        if (std::uint8_t(c) >= 0x20 && std::uint8_t(c) < 0x7f) {
            out += c;
        } else {
            static const char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[std::uint8_t(c) >> 4];
            out += hex[std::uint8_t(c) & 15];
        }
    }
    if (key.size() > 200) out += "...";
    return out;
}

[[noreturn]] void fail(errc code, const std::string& why) {
    throw std::system_error(make_error_code(code), why);
}

// A 64-bit integer the gateway sends as a string (or, from other gateways, a number).
std::optional<std::int64_t> as_int64(const json& j) {
    if (j.is_number_integer()) return j.get<std::int64_t>();
    if (!j.is_string()) return std::nullopt;
    const auto& s = j.get_ref<const std::string&>();
    if (s.empty() || s.size() > 20) return std::nullopt;
    try {
        std::size_t used = 0;
        const long long v = std::stoll(s, &used);
        if (used != s.size()) return std::nullopt;
        return v;
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

// A key's value as a member, or why it cannot be one. Empty: weight 1, no group.
std::variant<member, std::string> parse_value(std::string url, std::string_view value) {
    member m;
    m.url = std::move(url);
    if (value.empty()) return m;
    const json j = json::parse(value, nullptr, false);
    if (j.is_discarded()) return "its value is not JSON: " + shown(value);
    if (!j.is_object()) return "its value is not a JSON object: " + shown(value);
    if (const auto w = j.find("weight"); w != j.end()) {
        if (!w->is_number() || !std::isfinite(w->get<double>()) || w->get<double>() <= 0)
            return "its weight is not a positive number: " + w->dump();
        m.weight = w->get<double>();
    }
    if (const auto g = j.find("group"); g != j.end()) {
        if (!g->is_string()) return "its group is not a string: " + g->dump();
        m.group = g->get<std::string>();
    }
    return m;
}

class etcd_source final : public replica_source {
  public:
    etcd_source(net::any_io_executor ex, etcd_source_options o)
        : s_(std::make_shared<state>(std::move(ex), std::move(o))) {}
    ~etcd_source() override { stop(); }

    void start(std::function<void(std::vector<member>)> update,
               std::function<void(const std::string&)> problem) override {
        if (s_->started) throw std::logic_error("ordo: " + describe() + " started twice");
        s_->started = true;
        s_->set.start(std::move(update), std::move(problem));
        net::co_spawn(s_->ex, run(s_),
                      net::bind_cancellation_slot(s_->cancel.slot(), detail::rethrow_escaped{}));
    }
    void refresh_now() override {
        s_->refresh_wanted = true;
        s_->wake.cancel();
    }
    void stop() override {
        if (s_->stopped) return;
        s_->stopped = true;
        s_->set.stop();
        if (s_->started) s_->cancel.emit(net::cancellation_type::terminal);
    }
    std::string describe() const override {
        return "etcd:" + s_->o.endpoint + " prefix " + shown(s_->o.prefix);
    }
    source_counters counters() const override { return s_->set.counters(); }

  private:
    struct state {
        state(net::any_io_executor e, etcd_source_options opts)
            : ex(std::move(e)),
              o(std::move(opts)),
              http(ex),
              client{http, trimmed_endpoint(o.endpoint), o.access, o.timeout, {}},
              wake(ex) {
            o.endpoint = client.endpoint;
        }
        net::any_io_executor ex;
        etcd_source_options o;
        detail::curl_multi http;
        etcd_client client;
        bool started = false;
        bool stopped = false;
        net::cancellation_signal cancel;
        net::steady_timer wake;  // cancelled by refresh_now()
        bool refresh_wanted = false;
        steady::time_point last_read{};
        std::map<std::string, member> keys;  // the usable keys, by key
        detail::last_good_set set;

        void failure(const std::string& why) {
            if (stopped) return;
            set.failed(why);
        }
        void reject(const std::string& key, const std::string& why) {
            if (stopped) return;
            set.left_out("etcd " + o.endpoint + ": key '" + shown(key) + "' left out: " + why);
        }
        // A key that was put (now, or before the range read): usable, or left out.
        void put(const std::string& key, std::string_view value) {
            keys.erase(key);
            if (key.compare(0, o.prefix.size(), o.prefix) != 0)
                return reject(key, "it is not under the prefix");
            std::string why;
            std::string url =
                detail::fleet_entry_url(key.substr(o.prefix.size()), o.url_suffix, why);
            if (!why.empty()) return reject(key, why);
            auto m = parse_value(std::move(url), value);
            if (auto* why = std::get_if<std::string>(&m)) return reject(key, *why);
            keys[key] = std::move(std::get<member>(m));
        }
        // Hands the set to `update` when it changed; an empty one is a failed lookup.
        void publish() {
            if (stopped) return;
            if (keys.empty())
                return failure("etcd " + o.endpoint + ": no usable key under prefix '" +
                               shown(o.prefix) + "' (the last good set stays)");
            std::vector<member> found;
            found.reserve(keys.size());
            for (const auto& [k, m] : keys) found.push_back(m);
            set.found(std::move(found));
        }
        // The keys under the prefix, as range and watch requests name them.
        json range() const {
            return {{"key", base64_encode(o.prefix)},
                    {"range_end", base64_encode(prefix_end(o.prefix))}};
        }

        // The range read: every key under the prefix; yields the revision it saw.
        net::awaitable<std::int64_t> read_all() {
            last_read = steady::now();
            const json a = co_await etcd_call(client, "/v3/kv/range", range());
            const auto rev =
                a.contains("header") && a["header"].is_object() && a["header"].contains("revision")
                    ? as_int64(a["header"]["revision"])
                    : std::nullopt;
            if (!rev)
                fail(errc::protocol_error,
                     "etcd " + o.endpoint + "/v3/kv/range: no revision in the answer");
            keys.clear();
            if (const auto kvs = a.find("kvs"); kvs != a.end() && kvs->is_array())
                for (const json& kv : *kvs) take_kv(kv, false);
            publish();
            co_return *rev;
        }
        // One kv of a range answer or a watch event.
        void take_kv(const json& kv, bool deleted) {
            const auto k = kv.is_object() && kv.contains("key") && kv["key"].is_string()
                               ? base64_decode(kv["key"].get_ref<const std::string&>())
                               : std::nullopt;
            if (!k) return reject(kv.dump().substr(0, 200), "no key in base64");
            if (deleted) {
                keys.erase(*k);
                return;
            }
            std::optional<std::string> v = std::string();
            if (const auto value = kv.find("value"); value != kv.end())
                v = value->is_string() ? base64_decode(value->get_ref<const std::string&>())
                                       : std::nullopt;
            if (!v) return reject(*k, "its value is not base64");
            put(*k, *v);
        }

        // The watch from `revision`, until it breaks: yields why (never throws, so that
        // `watch(...) || refresh_requested()` ends with whichever ends first).
        net::awaitable<std::string> watch(std::int64_t revision) {
            const std::string url = o.endpoint + "/v3/watch";
            std::string pending;  // an incomplete line
            try {
                json create = range();
                create["start_revision"] = std::to_string(revision);
                co_await client.log_in();
                detail::http_request r = client.request("/v3/watch");
                r.post = json{{"create_request", std::move(create)}}.dump();
                const long status =
                    co_await http.async_stream(std::move(r), [&](std::string_view chunk) {
                        pending.append(chunk);
                        std::size_t begin = 0;
                        for (std::size_t nl; (nl = pending.find('\n', begin)) != std::string::npos;
                             begin = nl + 1)
                            take_line(url, std::string_view(pending).substr(begin, nl - begin));
                        pending.erase(0, begin);
                        if (pending.size() > max_watch_line)
                            fail(errc::protocol_error, "etcd " + url + ": a watch message over " +
                                                           std::to_string(max_watch_line) +
                                                           " bytes");
                    });
                co_return "etcd " + url + ": the watch ended (HTTP " + std::to_string(status) +
                    (pending.empty() ? "" : ": " + etcd_reason(pending)) + ")";
            } catch (const std::exception& e) {
                co_return e.what();
            }
        }
        void take_line(const std::string& url, std::string_view line) {
            if (stopped || line.empty()) return;
            const json j = json::parse(line, nullptr, false);
            if (!j.is_object())
                fail(errc::protocol_error,
                     "etcd " + url + ": a watch message that is not JSON: " + shown(line));
            if (j.contains("error"))
                fail(errc::remote_error,
                     "etcd " + url + ": the watch failed: " + etcd_reason(std::string(line)));
            const auto res = j.find("result");
            if (res == j.end() || !res->is_object())
                fail(errc::protocol_error,
                     "etcd " + url + ": a watch message without a result: " + shown(line));
            if (res->value("canceled", false))
                fail(errc::remote_error,
                     "etcd " + url + ": etcd cancelled the watch: " +
                         res->value("cancel_reason", std::string("no reason given")) +
                         (res->contains("compact_revision")
                              ? " (compacted at revision " + (*res)["compact_revision"].dump() + ")"
                              : ""));
            const auto events = res->find("events");
            if (events == res->end() || !events->is_array() || events->empty()) return;
            for (const json& ev : *events) {
                if (!ev.is_object() || !ev.contains("kv")) {
                    reject(ev.dump().substr(0, 200), "a watch event without a kv");
                    continue;
                }
                take_kv(ev["kv"], ev.value("type", std::string("PUT")) == "DELETE");
            }
            publish();
        }

        // Ends once refresh_now() asked for a read and `retry` has passed since the last one
        // began; once `reread` has passed since the last read; or at once when cancelled.
        net::awaitable<void> refresh_requested() {
            if (!refresh_wanted) {
                wake.expires_at(o.reread.count() > 0 ? last_read + o.reread
                                                     : steady::time_point::max());
                co_await wake.async_wait(use_tuple);
                if (!refresh_wanted) co_return;  // time for the periodic read, or cancelled
            }
            net::steady_timer t(ex, last_read + o.retry);
            co_await t.async_wait(use_tuple);
        }
        net::awaitable<void> sleep(std::chrono::milliseconds d) {
            net::steady_timer t(ex, d);
            co_await t.async_wait(use_tuple);
        }
    };

    static net::awaitable<void> run(std::shared_ptr<state> s) {
        while (!s->stopped) {
            s->refresh_wanted = false;
            std::string why;
            try {
                const std::int64_t rev = co_await s->read_all();
                if (s->stopped) break;
                auto r = co_await (s->watch(rev + 1) || s->refresh_requested());
                if (r.index() == 1) continue;  // a refresh: read again now
                why = std::get<0>(r);
            } catch (const std::exception& e) {
                why = e.what();
            }
            if (s->stopped) break;
            if (why.rfind("etcd ", 0) != 0) why = "etcd " + why;
            s->failure(why + " (the last good set stays; again in " +
                       std::to_string(s->o.retry.count()) + " ms)");
            co_await (s->sleep(s->o.retry) || s->refresh_requested());
        }
    }

    std::shared_ptr<state> s_;
};

}  // namespace

std::unique_ptr<replica_source> make_etcd_source(net::any_io_executor ex, etcd_source_options o) {
    return std::make_unique<etcd_source>(std::move(ex), std::move(o));
}

// ---- etcd_registration ----

struct etcd_registration::state {
    state(net::any_io_executor e, etcd_registration_options opts)
        : ex(std::move(e)),
          o(std::move(opts)),
          http(ex),
          client{http, trimmed_endpoint(o.endpoint), o.access, o.timeout, {}},
          loop_done(ex) {
        o.endpoint = client.endpoint;
        key = o.prefix + o.url;
        json v{{"weight", o.weight}};
        if (!o.group.empty()) v["group"] = o.group;
        value = v.dump();
    }
    net::any_io_executor ex;
    etcd_registration_options o;
    detail::curl_multi http;
    etcd_client client;
    std::string key, value;
    std::int64_t lease = 0;  // 0: none
    bool stopping = false;
    bool looping = false;
    net::cancellation_signal cancel;
    net::steady_timer loop_done;  // cancelled when the keep-alive loop ends

    void event(const std::string& line) {
        if (o.on_event && !stopping) o.on_event(line);
    }
    net::awaitable<json> call(const char* path, const json& body, bool* not_found = nullptr) {
        co_return co_await etcd_call(client, path, body, not_found);
    }
    // A new lease, and the key put under it.
    net::awaitable<void> grant_and_put() {
        // (Bodies are built before co_await: GCC 12 cannot keep a braced json list in a frame.)
        json body;
        body["TTL"] = std::to_string(o.ttl.count());
        const json g = co_await call("/v3/lease/grant", body);
        const auto id = g.contains("ID") ? as_int64(g["ID"]) : std::nullopt;
        if (!id || *id == 0)
            fail(errc::protocol_error, "etcd " + o.endpoint + "/v3/lease/grant: no lease ID in " +
                                           g.dump().substr(0, 200));
        lease = *id;
        json put;
        put["key"] = base64_encode(key);
        put["value"] = base64_encode(value);
        put["lease"] = std::to_string(lease);
        co_await call("/v3/kv/put", put);
    }
    static net::awaitable<void> keep_alive_loop(std::shared_ptr<state> s) {
        net::steady_timer t(s->ex);
        const auto period = std::max<std::chrono::milliseconds>(
            std::chrono::milliseconds(100),
            std::chrono::duration_cast<std::chrono::milliseconds>(s->o.ttl) / 3);
        while (!s->stopping) {
            t.expires_after(period);
            co_await t.async_wait(use_tuple);
            if (s->stopping) break;
            try {
                json body;
                body["ID"] = std::to_string(s->lease);
                const json a = co_await s->call("/v3/lease/keepalive", body);
                const json& r = a.contains("result") ? a["result"] : a;
                const auto ttl = r.is_object() && r.contains("TTL")
                                     ? as_int64(r["TTL"])
                                     : std::optional<std::int64_t>(0);
                if (s->stopping) break;
                if (ttl && *ttl > 0) continue;
                const auto old = s->lease;
                co_await s->grant_and_put();
                s->event("etcd " + s->o.endpoint + ": lease " + std::to_string(old) + " of '" +
                         shown(s->key) + "' was gone; put again under lease " +
                         std::to_string(s->lease));
            } catch (const std::exception& e) {
                if (s->stopping) break;
                s->event("etcd " + s->o.endpoint + ": keep-alive of '" + shown(s->key) +
                         "' failed: " + e.what());
            }
        }
        s->looping = false;
        s->loop_done.cancel();
    }
};

etcd_registration::etcd_registration(net::any_io_executor ex, etcd_registration_options o)
    : s_(std::make_shared<state>(std::move(ex), std::move(o))) {}

etcd_registration::~etcd_registration() {
    s_->stopping = true;
    if (s_->looping) s_->cancel.emit(net::cancellation_type::terminal);
}

net::awaitable<void> etcd_registration::async_start() {
    auto s = s_;
    if (s->looping || s->lease != 0)
        throw std::logic_error("ordo: etcd registration of '" + shown(s->key) + "' started twice");
    try {
        (void)parse_address(s->o.url);
    } catch (const std::exception& e) {
        fail(errc::bad_address,
             "etcd " + s->o.endpoint + ": cannot register '" + shown(s->o.url) + "': " + e.what());
    }
    if (s->o.ttl < std::chrono::seconds(1))
        fail(errc::bad_address, "etcd " + s->o.endpoint + ": a lease's ttl must be at least 1 s");
    s->stopping = false;
    co_await s->grant_and_put();
    s->looping = true;
    s->loop_done.expires_at(steady::time_point::max());
    net::co_spawn(s->ex, state::keep_alive_loop(s),
                  net::bind_cancellation_slot(s->cancel.slot(), detail::rethrow_escaped{}));
}

net::awaitable<void> etcd_registration::async_stop() {
    auto s = s_;
    s->stopping = true;
    if (s->looping) {
        s->cancel.emit(net::cancellation_type::terminal);
        co_await s->loop_done.async_wait(use_tuple);
    }
    if (s->lease == 0) co_return;
    const auto lease = std::exchange(s->lease, 0);
    // A lease etcd no longer has took the key with it: the stop is done all the same.
    bool not_found = false;
    json body;
    body["ID"] = std::to_string(lease);
    co_await s->call("/v3/lease/revoke", body, &not_found);
}

}  // namespace ordo
