// A streaming handler's output on the server's side of a connection (docs/protocol.md,
// "Streams"): what ordo::writer writes to. Declared here for rpc/connection/dispatcher.cpp, which
// starts and cancels streaming handlers and hands them credit; its workings are
// rpc/streams/dispatcher_stream.cpp.
#pragma once

#include <cstdint>

#include "ordo/rpc/stream_call.hpp"
#include "rpc/connection/dispatcher.hpp"

namespace ordo::detail {

// One streaming handler's output (ordo::writer writes here). A caller that streams (ordo.stream)
// gets each item at once as ordo.item [msgid, item] while it has credit; any other caller gets
// the items collected into the final response, an array.
class dispatcher::stream_run final : public stream_out {
  public:
    // `window_bytes` 0: no byte limit (a caller that grants items only).
    stream_run(dispatcher& d, std::uint32_t msgid, std::uint32_t window, std::uint64_t window_bytes,
               stream_run** back);
    ~stream_run() override;

    bool has_credit() const noexcept override;
    net::awaitable<void> wait_credit() override;
    buffer& begin_item() override;
    bool end_item() override;

    std::uint64_t written() const noexcept override { return written_; }

    void grant(std::uint64_t n, std::uint64_t bytes);

    // The final response's result: the number of items sent, or the items collected.
    void finish(buffer& out) const;

    // The call was cancelled, or its connection ended: a write waiting for credit ends (also
    // one a body on handler_options::run_on handed over, which Asio cancellation cannot reach
    // here), and later ones throw.
    void cancel();
    bool cancelled = false;

  private:
    [[noreturn]] static void throw_cancelled() {
        throw_error(errc::cancelled, "the stream was cancelled");
    }

    dispatcher& d_;
    std::uint32_t msgid_;
    bool streaming_;
    // Credit in bytes may go below 0: the item that used it up was sent whole.
    static constexpr std::uint64_t max_bytes = std::uint64_t{1} << 62;
    std::uint32_t credit_;
    bool bytes_limited_;
    std::int64_t bytes_credit_;
    stream_run** back_;
    net::steady_timer wake_;
    bool waiting_ = false;
    std::uint64_t written_ = 0;
    buffer item_{small_buffer};
    buffer collected_{small_buffer};
    std::size_t charged_ = 0;
};

}  // namespace ordo::detail
