// A server's resumable sessions by id (docs/protocol.md, "Resumable sessions"): where each
// lives, and the bound on those waiting for their caller to come back. rpc/session/session.hpp
// is the session itself; session_registry.cpp the registry's workings.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ordo/net.hpp"

namespace ordo::detail {

using session_id = std::array<unsigned char, 16>;
class session;

/// A server's resumable sessions, by id, and the bound on those waiting for their caller to
/// come back (detached). Shared by the server's loops (its members lock): each session is
/// touched only on its own loop, so a caller back on another loop is handed over to it.
class session_registry : public std::enable_shared_from_this<session_registry> {
  public:
    session_registry(std::chrono::milliseconds max_window, std::size_t max_detached)
        : max_window_(std::min(max_window, std::chrono::milliseconds(std::chrono::hours(24)))),
          max_detached_(max_detached) {}

    /// Where a session lives: null `s` if there is no such session. `s` may be used on `ex`
    /// only, and only after finding it again there.
    struct place {
        session* s = nullptr;
        net::any_io_executor ex;
        std::string identity;  // the caller's identity::resume_key(), checked on resume
    };

    /// The longest window this server grants (0: it does not resume sessions).
    std::chrono::milliseconds max_window() const noexcept { return max_window_; }
    place find(const session_id& id) const;
    /// On `s`'s loop.
    void add(const session_id& id, session* s, net::any_io_executor ex, std::string identity);
    void remove(const session_id& id, session* s);
    /// `s` lost its connection (on its loop). When more than max_detached wait, one is ended,
    /// on its own loop: the one detached longest of the address (port aside) that has the
    /// most waiting, so that one address's flood of hello-and-drop connections cannot push out
    /// another caller's session.
    void detached(session* s, const session_id& id, const net::any_io_executor& ex);
    /// `s` got a connection back, or ended.
    void attached(session* s);
    /// The server drains: its listeners are closed, so no caller can come back. Ends every
    /// detached session (each on its own loop), and from now on each one that detaches, with
    /// errc::peer_lost and `why`.
    void end_detached(std::string why);
    std::size_t detached_count() const;
    /// Resumes that moved their connection to the session's loop.
    std::uint64_t moved() const noexcept { return moved_.load(std::memory_order_relaxed); }
    void note_moved() noexcept { moved_.fetch_add(1, std::memory_order_relaxed); }

  private:
    static std::size_t key(const session_id& id) {
        std::size_t k = 0;
        for (std::size_t i = 0; i < sizeof k; ++i) k = (k << 8) | id[i];
        return k;
    }
    struct entry {
        session_id id;
        place at;
    };
    struct waiting {
        session* s;
        session_id id;
        net::any_io_executor ex;
        std::string from;  // the caller's address, its port aside
    };
    void give_up(const std::vector<waiting>& sessions, const std::string& why);
    static std::string address_of(const std::string& remote);
    std::list<waiting>::iterator longest_of_busiest();
    std::chrono::milliseconds max_window_;
    std::size_t max_detached_;
    mutable std::mutex m_;
    std::unordered_map<std::size_t, std::vector<entry>> by_id_;
    std::list<waiting> waiting_;
    std::string ending_why_;  // set by end_detached: detached sessions end at once
    std::atomic<std::uint64_t> moved_{0};
};

}  // namespace ordo::detail
