// detail::session_registry: a server's resumable sessions by id, and the bound on those
// detached (waiting for their caller to come back).
#include "rpc/session/session.hpp"

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <asio/post.hpp>

namespace ordo::detail {

session_registry::place session_registry::find(const session_id& id) const {
    std::lock_guard lock(m_);
    auto it = by_id_.find(key(id));
    if (it == by_id_.end()) return {};
    for (const auto& e : it->second)
        if (e.id == id) return e.at;
    return {};
}

void session_registry::add(const session_id& id, session* s, net::any_io_executor ex,
                           std::string identity) {
    std::lock_guard lock(m_);
    by_id_[key(id)].push_back({id, {s, std::move(ex), std::move(identity)}});
}

void session_registry::remove(const session_id& id, session* s) {
    std::lock_guard lock(m_);
    std::erase_if(waiting_, [&](const waiting& w) { return w.s == s; });
    auto it = by_id_.find(key(id));
    if (it == by_id_.end()) return;
    std::erase_if(it->second, [&](const entry& e) { return e.at.s == s; });
    if (it->second.empty()) by_id_.erase(it);
}

void session_registry::attached(session* s) {
    std::lock_guard lock(m_);
    std::erase_if(waiting_, [&](const waiting& w) { return w.s == s; });
}

std::size_t session_registry::detached_count() const {
    std::lock_guard lock(m_);
    return waiting_.size();
}

void session_registry::detached(session* s, const session_id& id, const net::any_io_executor& ex) {
    std::vector<waiting> over;
    std::string why;
    {
        std::lock_guard lock(m_);
        std::erase_if(waiting_, [&](const waiting& w) { return w.s == s; });
        waiting_.push_back({s, id, ex, address_of(s->remote_)});
        if (!ending_why_.empty()) {
            why = ending_why_;
            over.assign(waiting_.begin(), waiting_.end());
            waiting_.clear();
        }
        while (waiting_.size() > max_detached_) {
            auto it = longest_of_busiest();
            over.push_back(*it);
            waiting_.erase(it);
        }
    }
    if (why.empty())
        why = "ordo: session given up: more than " + std::to_string(max_detached_) +
              " sessions were waiting to resume (max_detached_sessions)";
    give_up(over, why);
}

// "tcp://10.0.0.7:41234" -> "tcp://10.0.0.7" (IPv6 in brackets alike); a unix caller's
// address has no port.
std::string session_registry::address_of(const std::string& remote) {
    const auto colon = remote.rfind(':');
    const auto bracket = remote.rfind(']');
    const auto scheme = remote.find("://");
    if (colon == std::string::npos || colon <= scheme + 2 ||
        (bracket != std::string::npos && colon < bracket))
        return remote;
    return remote.substr(0, colon);
}

// Under the lock, with waiting_ not empty: the address with the most sessions waiting, and
// its session detached longest.
std::list<session_registry::waiting>::iterator session_registry::longest_of_busiest() {
    std::unordered_map<std::string_view, std::size_t> count;
    std::string_view busiest;
    std::size_t most = 0;
    for (const auto& w : waiting_)
        if (const auto n = ++count[w.from]; n > most) {
            most = n;
            busiest = w.from;
        }
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
        if (it->from == busiest) return it;
    return waiting_.begin();
}

void session_registry::end_detached(std::string why) {
    std::vector<waiting> all;
    {
        std::lock_guard lock(m_);
        ending_why_ = why;
        all.assign(waiting_.begin(), waiting_.end());
        waiting_.clear();
    }
    give_up(all, why);
}

// Each on its own loop, if it is still there and still waiting by then. Posted, never run
// inline: a session detaches inside a send() whose write failed, and ending one there would
// fail calls under the feet of the code that is sending.
void session_registry::give_up(const std::vector<waiting>& sessions, const std::string& why) {
    for (const auto& w : sessions)
        net::post(w.ex, [self = shared_from_this(), w, why] {
            if (self->find(w.id).s != w.s || w.s->attached()) return;
            w.s->give_up(why);
        });
}

}  // namespace ordo::detail
