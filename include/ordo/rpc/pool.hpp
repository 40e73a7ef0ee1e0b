// ordo::pool: pooled calls (docs/calls-and-channels.md, "Ordered or pooled"). One connection per
// call in flight, reused after calls that succeed; no ordering between calls and no head-of-line
// blocking.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ordo/rpc/channel.hpp"
#include "ordo/rpc/peer.hpp"

namespace ordo {

struct pool_options {
    /// Connections open at once (idle, busy or being opened).
    std::size_t max_connections = 16;
    /// Idle connections kept; a connection returned beyond this is closed.
    std::size_t max_idle = 16;
    /// An idle connection unused this long is closed.
    std::chrono::milliseconds idle_timeout{30'000};
    /// Opening one connection may take this long; then the calls waiting for it fail with
    /// errc::timed_out (if no other connection can serve them).
    std::chrono::milliseconds connect_timeout{10'000};
    /// Calls waiting for a connection when all max_connections are busy, served earliest
    /// deadline first (then calls without a deadline, oldest first). One more fails at once with
    /// errc::overloaded. A waiting call's deadline runs while it waits: one that passes there
    /// fails with errc::timed_out and is never sent.
    std::size_t max_queued_calls = 65'536;
    /// For each connection. Its default_timeout is the default deadline of pooled calls; its
    /// on_undelivered also hears of notifications that found no connection to go on.
    peer_options peer;
};

struct pool_counters {
    std::size_t open = 0;  ///< connections open (idle + busy)
    std::size_t idle = 0;
    std::size_t connecting = 0;
    std::size_t queued_calls = 0;
    std::uint64_t connections_opened = 0;
    std::uint64_t connections_discarded = 0;  ///< closed after a failed or cancelled call, or dead
    std::uint64_t expired_in_queue = 0;  ///< calls whose deadline passed while they waited
};

/// Lends one connection (an ordo::peer) to each call in flight, opening connections up to
/// max_connections; further calls wait in a bounded queue, earliest deadline first. After a
/// successful call the connection goes back to the pool; after a failed, timed-out or cancelled
/// call it is closed, never reused. Notifications go over any open connection: pooled notifications
/// are NOT ordered, with each other or with calls. An idle connection that its server closed is
/// discarded as soon as its end of stream is read; no call is retried on another connection once it
/// was sent.
///
/// Belongs to the executor given at creation (a strand when the io_context runs on several
/// threads). Created shared (make_pool); channels keep it alive.
class pool final : public channel_impl, public std::enable_shared_from_this<pool> {
  public:
    struct private_tag {};
    pool(private_tag, net::any_io_executor ex, std::string url, pool_options o);
    ~pool() override;
    pool(const pool&) = delete;
    pool& operator=(const pool&) = delete;

    void start_call(std::unique_ptr<detail::pending_call> call) override;
    void notify_raw(std::string_view method, std::string_view params) override;
    const std::string& remote_address() const noexcept override;
    net::any_io_executor get_executor() const override;

    /// Opens one connection now (so that the first call does not pay for it). Throws
    /// ordo::rpc_error naming the address if it cannot be opened (see async_connect). Calls
    /// that wait for a connection which cannot be opened fail with the same code and reason.
    net::awaitable<void> async_warm_up();
    /// Closes every connection; calls in flight and waiting fail with errc::closed.
    void close() override;

    const pool_counters& counters() const noexcept;

    struct state;

  private:
    std::unique_ptr<state> s_;
};

std::shared_ptr<pool> make_pool(net::any_io_executor ex, std::string url, pool_options o);
std::shared_ptr<pool> make_pool(net::any_io_executor ex, std::string url);

}  // namespace ordo
