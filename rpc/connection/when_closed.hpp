// Watching a peer's connection end, for its owners (pools, routers, servers): the one way to
// run owner code after a peer closed, posted and guarded by the owner's lifetime.
#pragma once

#include <memory>
#include <string>

#include "lib/task_scope.hpp"
#include "ordo/rpc/peer.hpp"

namespace ordo::detail {

/// Runs `f(code, why)` on `ex` once `p`'s connection has ended: posted, never inside the peer's own
/// close (where releasing the peer would destroy it under its own feet), and only if `owner`
/// still lives then (it is held while f runs).
template <class F>
void when_closed(peer& p, const net::any_io_executor& ex, std::weak_ptr<void> owner, F f) {
    p.on_closed([ex, owner = std::move(owner), f = std::move(f)](const std::error_code& code,
                                                                 const std::string& why) {
        if (owner.expired()) return;
        net::post(ex, [owner, f, code, why] {
            if (auto keep = owner.lock()) f(code, why);
        });
    });
}

/// The same for an owner that joins its children (task_scope): `t` keeps it until `f` has run
/// (or until `p` lets go of its watchers), so `f` checks only whether the owner is closing.
template <class F>
void when_closed(peer& p, const net::any_io_executor& ex, task_scope::ticket t, F f) {
    p.on_closed([ex, t = std::move(t), f = std::move(f)](const std::error_code& code,
                                                         const std::string& why) {
        net::post(ex, [t, f, code, why] { f(code, why); });
    });
}

}  // namespace ordo::detail
