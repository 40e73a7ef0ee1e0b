// ordo::server and the connections it does not know yet (server_options::strangers;
// docs/security.md "Strangers"): caps per address and on strangers in all (the oldest stranger
// makes room), the deadline for a first message or for authentication, failed authentications
// per address, and reports that a flood cannot turn into a flood of lines.
#include "ordo/rpc/server.hpp"

#include <algorithm>

#include "lib/address_group.hpp"
#include "lib/escaped.hpp"
#include "rpc/server/server_state.hpp"

namespace ordo {

using clock = std::chrono::steady_clock;

namespace {

constexpr auto report_window_length = std::chrono::seconds(1);
constexpr std::size_t reports_per_window = 5;  // said at once per address; the rest summed up

std::string ms(clock::duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) +
           " ms";
}

}  // namespace

std::string server::state::address_group(std::string_view url) {
    return detail::address_group(url);
}

std::shared_ptr<server::state::stranger> server::state::welcome(std::unique_ptr<transport>& t,
                                                                loop& lp) {
    const stranger_limits& lim = o.strangers;
    auto st = std::make_shared<stranger>();
    st->key = address_group(t->remote_address());
    st->lp = &lp;
    if (!st->key.empty()) {
        address_count& a = addresses[st->key];
        const auto now = clock::now();
        if (o.authenticate && lim.max_auth_failures > 0 && a.failures >= lim.max_auth_failures &&
            now - a.failures_since < lim.auth_failure_window) {
            refuse(std::move(t), errc::unauthenticated,
                   "ordo: " + std::to_string(a.failures) + " failed authentications from " +
                       st->key + " within " + ms(lim.auth_failure_window) +
                       " (max_auth_failures); try again in " +
                       ms(a.failures_since + lim.auth_failure_window - now));
            return nullptr;
        }
        if (lim.max_per_address > 0 && a.open >= lim.max_per_address) {
            refuse(std::move(t), errc::overloaded,
                   "ordo: " + std::to_string(a.open) + " connections from " + st->key +
                       " are open (max_per_address); try again later");
            return nullptr;
        }
        if (lim.max_strangers_per_address > 0 && a.strangers >= lim.max_strangers_per_address) {
            for (auto& old : strangers)
                if (old->key == st->key) {
                    evict(old, errc::overloaded,
                          "ordo: closed as the oldest of " + std::to_string(a.strangers) +
                              " connections from " + st->key +
                              " that have not been accepted yet (max_strangers_per_address)",
                          false);
                    break;
                }
        }
    }
    if (lim.max_strangers > 0 && strangers.size() >= lim.max_strangers)
        evict(strangers.front(), errc::overloaded,
              "ordo: closed as the oldest of " + std::to_string(strangers.size()) +
                  " connections that have not been accepted yet (max_strangers)",
              false);
    if (!st->key.empty()) {
        address_count& a = addresses[st->key];
        ++a.open;
        ++a.strangers;
    }
    st->where = strangers.insert(strangers.end(), st);
    return st;
}

std::function<auth_verdict(identity&, const credentials&)> server::state::gate_for(
    std::shared_ptr<stranger> st) {
    return [w = weak_from_this(), st = std::move(st), auth = o.authenticate,
            intro = o.allow_introspection](identity& who, const credentials& presented) {
        auth_verdict v = auth ? auth(who, presented) : auth_verdict::accept({});
        if (!v.accepted) {
            // Counted against the address now, not when the connection has closed: a caller
            // that keeps refused connections open must not try more tokens meanwhile.
            if (auto s = w.lock()) s->at_home(*st->lp, [s, st] { s->failed_auth(*st); });
            return v;
        }
        if (auth) {
            who.subject = v.subject;
            who.may_introspect = intro && intro(who);
        } else {
            who.may_introspect = true;
        }
        st->known = true;
        if (auto s = w.lock()) s->at_home(*st->lp, [s, st] { s->known(st); });
        return v;
    };
}

void server::state::known(const std::shared_ptr<stranger>& st) {
    st->met = true;
    unlist(*st);
}

void server::state::unlist(stranger& st) {
    if (!st.listed) return;
    st.listed = false;
    strangers.erase(st.where);
    if (!st.key.empty()) --addresses[st.key].strangers;
}

// `st` by value: callers pass an element of `strangers`, which unlist() erases.
void server::state::evict(std::shared_ptr<stranger> st, errc code, std::string why, bool tell) {
    unlist(*st);
    on_loop(*st->lp, [st, code, why = std::move(why), tell]() mutable {
        if (st->known) return;  // accepted meanwhile, on its loop
        auto p = st->p.lock();
        if (!p || !p->is_open()) return;
        if (tell)
            p->close(code, std::move(why));
        else
            p->abort(code, std::move(why));  // a flood: nothing lingers for its goodbye
    });
}

void server::state::failed_auth(const stranger& st) {
    if (st.key.empty()) return;
    address_count& a = addresses[st.key];
    const auto now = clock::now();
    if (now - a.failures_since >= o.strangers.auth_failure_window) {
        a.failures = 0;
        a.failures_since = now;
    }
    ++a.failures;
}

void server::state::forget(const std::shared_ptr<stranger>& st) {
    unlist(*st);
    if (st->key.empty()) return;
    auto it = addresses.find(st->key);
    if (it == addresses.end()) return;
    address_count& a = it->second;
    --a.open;
    const auto now = clock::now();
    if (a.open == 0 && (a.failures == 0 || now - a.failures_since >= o.strangers.auth_failure_window))
        addresses.erase(it);
}

void server::state::left(const std::shared_ptr<stranger>& st, std::string remote,
                         std::error_code code, std::string why) {
    forget(st);
    if (st->met)
        event(server_event::kind::closed, std::move(remote), code, std::move(why));
    else
        report(server_event::kind::closed, st->key, std::move(remote), code, std::move(why));
}

void server::state::report(server_event::kind what, const std::string& key, std::string peer,
                           std::error_code code, std::string reason) {
    if (!o.on_event) return;
    const auto now = clock::now();
    std::string k = std::to_string(static_cast<int>(what)) + " " + key;
    report_window& r = reports[k];
    if (now - r.since >= report_window_length) {
        if (r.unsaid > 0) say_unsaid(k, r);
        r.since = now;
        r.said = 0;
    }
    if (r.said < reports_per_window) {
        ++r.said;
        return event(what, std::move(peer), code, std::move(reason));
    }
    ++r.unsaid;
    r.last_code = code;
}

void server::state::say_unsaid(const std::string& k, report_window& r) {
    const auto space = k.find(' ');
    const auto what = static_cast<server_event::kind>(std::stoi(k.substr(0, space)));
    const std::string from = k.substr(space + 1);
    event(what, from.empty() ? "local callers" : from, r.last_code,
          "ordo: and " + std::to_string(r.unsaid) + " more like it from " +
              (from.empty() ? "local callers" : from) + " within a second, not reported one by one");
    r.unsaid = 0;
}

// Closes strangers that outstayed the deadline (oldest first: the list is in arrival order),
// and says what reports held back. On the server's executor.
net::awaitable<void> server::state::watch_strangers(std::shared_ptr<state> s) {
    const auto limit =
        s->o.authenticate ? s->o.strangers.auth_timeout : s->o.strangers.first_message_timeout;
    const auto tick = limit.count() > 0
                          ? std::clamp<clock::duration>(limit / 4, std::chrono::milliseconds(50),
                                                        report_window_length)
                          : clock::duration(report_window_length);
    auto& timer = *s->stranger_tick;
    while (!s->stopping) {
        timer.expires_after(tick);
        co_await timer.async_wait(use_tuple);
        if (s->stopping) break;
        const auto now = clock::now();
        while (limit.count() > 0 && !s->strangers.empty() &&
               now - s->strangers.front()->since >= limit) {
            auto st = s->strangers.front();
            s->evict(st, errc::timed_out,
                     s->o.authenticate
                         ? "ordo: not authenticated within " + ms(limit) +
                               " of connecting (auth_timeout): send ordo.auth first"
                         : "ordo: no whole message within " + ms(limit) +
                               " of connecting (first_message_timeout)",
                     true);
        }
        for (auto it = s->reports.begin(); it != s->reports.end();) {
            if (now - it->second.since < report_window_length) {
                ++it;
                continue;
            }
            if (it->second.unsaid > 0) s->say_unsaid(it->first, it->second);
            it = s->reports.erase(it);
        }
        for (auto it = s->addresses.begin(); it != s->addresses.end();) {
            const auto& a = it->second;
            if (a.open == 0 && now - a.failures_since >= s->o.strangers.auth_failure_window)
                it = s->addresses.erase(it);
            else
                ++it;
        }
    }
}

}  // namespace ordo
