// detail::session_registry: a server's resumable sessions by id, and the bound on those
// detached (waiting for their caller to come back).
#include "rpc/session.hpp"

#include <algorithm>
#include <string>

namespace ordo::detail {

session* session_registry::find(const session_id& id) const {
    auto it = by_id_.find(key(id));
    if (it == by_id_.end()) return nullptr;
    for (const auto& e : it->second)
        if (e.id == id) return e.s;
    return nullptr;
}

void session_registry::remove(const session_id& id, session* s) {
    waiting_.remove(s);
    auto it = by_id_.find(key(id));
    if (it == by_id_.end()) return;
    std::erase_if(it->second, [&](const entry& e) { return e.s == s; });
    if (it->second.empty()) by_id_.erase(it);
}

void session_registry::detached(session* s) {
    waiting_.remove(s);
    waiting_.push_back(s);
    while (waiting_.size() > max_detached_) {
        session* oldest = waiting_.front();
        waiting_.pop_front();
        oldest->give_up("ordo: session given up: more than " + std::to_string(max_detached_) +
                        " sessions were waiting to resume (max_detached_sessions)");
    }
}

}  // namespace ordo::detail
