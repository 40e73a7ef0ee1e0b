// Server-side batch handlers (docs/streams-and-batches.md, "Batch handlers"): callers make single
// calls; the handler gets them as one vector.
//
//   srv.on_batch("square_batch", {.max_batch_size = 64, .max_wait = 1ms},
//                [](std::vector<int> xs) { for (auto& x : xs) x *= x; return xs; });
//
// The options and result types are here; on_batch and batch_handle are in ordo/rpc/handlers.hpp,
// the machinery in ordo/rpc/detail/batcher.hpp.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ordo/error.hpp"
#include "ordo/identity.hpp"
#include "ordo/net.hpp"

namespace ordo {

struct batch_options {
    /// A batch never holds more calls than this.
    std::size_t max_batch_size = 32;
    /// A batch runs when it is full, or when this long has passed since its first call arrived.
    std::chrono::milliseconds max_wait{2};
    /// Batches of this handler that may run at once. With 1 (default) batches run one after
    /// another, so calls keep their arrival order inside and across batches.
    std::size_t max_concurrent_batches = 1;
    /// Calls waiting for a batch; one more fails at once with errc::overloaded.
    std::size_t max_queued = 65'536;
    /// Where batches run (e.g. an ordo::worker_pool's executor), so that a long batch does not
    /// stall the I/O of the connections on a loop. Empty: on the loop of the batch's first
    /// caller. Calls from every loop are gathered either way; each caller gets its result back
    /// on its own loop. With max_concurrent_batches > 1 on a pool, batches run in parallel.
    /// A batch is cancelled when every one of its callers has left (cancelled, deadline, peer
    /// lost), and a streaming batch also when the server stops, wherever it runs: a handler
    /// that takes a std::stop_token last sees stop requested, and where it awaits it gets Asio
    /// cancellation. One that ignores both runs to its end, holding its worker thread and its
    /// batch slot (max_concurrent_batches) meanwhile; its results are dropped.
    net::any_io_executor run_on{};
    /// Who may call it, as handler_options::allow: a caller it refuses gets
    /// errc::permission_denied and never joins a batch. Null: everyone.
    allow_fn allow{};
};

/// The failure of one element of a batch: only that call fails, with this code and message.
struct element_error {
    errc code = errc::remote_error;
    std::string message;
};

/// One element of a batch handler's result: a value, or an error for that call alone.
template <class T>
using element = std::variant<T, element_error>;

/// A streaming batch handler's "this caller's stream ends here" (on_batch_stream).
struct stream_end {};

/// What a streaming batch handler gives one open caller in one step: an item, the end of that
/// caller's stream, or an error that ends it.
template <class T>
using stream_step = std::variant<T, stream_end, element_error>;

namespace detail {
class stream_batch;
}  // namespace detail

/// A streaming batch handler's output (ordo::handlers::on_batch_stream). Each step gives one
/// entry per caller still open, in open()'s order; callers that ended, failed or cancelled
/// are left out of later steps. The batch is over when open() is empty (or the handler returns:
/// callers still open then end normally).
template <class T>
class batch_writer {
  public:
    explicit batch_writer(detail::stream_batch& b) : b_(&b) {}
    /// The callers still open: indices into the batch's inputs, in order. Empty once closed.
    const std::vector<std::size_t>& open() const;
    /// Whether the batcher has stopped (the server stops) while this batch runs: its callers
    /// have ended with errc::cancelled, open() is empty and step() throws errc::cancelled.
    bool closed() const noexcept;
    /// One step. Suspends while some open caller still holds too many items it has not sent
    /// (a reader out of credit), so that memory stays bounded. Throws std::system_error when
    /// `s` does not have one entry per open caller.
    net::awaitable<void> step(std::vector<stream_step<T>> s);

  private:
    detail::stream_batch* b_;
};

struct batch_stats {
    std::uint64_t batches = 0;
    std::uint64_t calls = 0;
    std::size_t queued = 0;
    std::size_t running = 0;
    std::map<std::size_t, std::uint64_t> size_histogram;  ///< batch size -> how many batches
};
}  // namespace ordo
