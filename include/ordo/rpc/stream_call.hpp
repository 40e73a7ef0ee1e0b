// Streaming calls (on the wire: docs/protocol.md, "Streams").
//
//   struct counter : ordo::interface {
//       ordo::method<ordo::stream<int>(int)> count_to{"count_to"};
//   };
//   // caller
//   auto s = co_await c.count_to(5);
//   while (auto v = co_await s.next()) use(*v);        // 0 1 2 3 4, then the end
//   // server
//   srv.on(counter{}.count_to, [](ordo::writer<int>& out, int n) -> net::awaitable<void> {
//       for (int i = 0; i < n; ++i) co_await out.write(i);  // suspends while the caller's
//   });                                                    // credit is used up
//
// The caller grants credit (call_options::window items, 8192, and window_bytes, 1 MiB, by
// default) and grants more as it reads, so a reader that stops keeps both sides' memory within
// the window. Dropping the stream
// or cancel() sends ordo.cancel: the handler is cancelled at its next suspension.
#pragma once

#include "ordo/config.hpp"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/channel_impl.hpp"
#include "ordo/rpc/detail/stream_core.hpp"
#include "ordo/net.hpp"

namespace ordo {

/// The caller's end of a streaming call: `while (auto v = co_await s.next()) ...`. Move-only.
/// Dropping it before the end cancels the call (ordo.cancel). next() may be awaited from any
/// executor, by one reader at a time.
template <class T>
class stream {
  public:
    using value_type = T;

    stream() = default;
    explicit stream(std::shared_ptr<detail::stream_state<T>> s) : s_(std::move(s)) {}
    stream(stream&&) noexcept = default;
    stream& operator=(stream&& o) noexcept {
        if (this != &o) {
            if (s_) s_->cancel();
            s_ = std::move(o.s_);
        }
        return *this;
    }
    ~stream() {
        if (s_) s_->cancel();
    }

    /// The next item in order; std::nullopt once the handler has returned; throws
    /// ordo::rpc_error (handler threw, peer lost, deadline, cancelled) once the items that
    /// arrived before the failure have been returned.
    net::awaitable<std::optional<T>> next() { return detail::stream_state<T>::next(s_); }
    /// Stops the stream (ordo.cancel to the remote handler); next() then yields what had
    /// arrived and throws errc::cancelled.
    void cancel() {
        if (s_) s_->cancel();
    }
    /// Items received so far (read or not).
    std::uint64_t received() const { return s_ ? s_->received() : 0; }
    explicit operator bool() const noexcept { return s_ != nullptr; }

  private:
    std::shared_ptr<detail::stream_state<T>> s_;
};

/// A streaming handler's output: `co_await out.write(v)` sends one item, suspending while the
/// caller's credit is used up. Throws std::system_error(errc::cancelled) once the call has been
/// cancelled. From a body on handler_options::run_on, write() hands the item to the
/// connection's loop and completes once it has been sent there: one round trip per item.
template <class T>
class writer {
  public:
    explicit writer(detail::stream_out& o) : o_(&o) {}

    net::awaitable<void> write(T v) {
        if (!o_->has_credit()) co_await o_->wait_credit();
        msgpack::pack(o_->begin_item(), v);
        if (!o_->end_item()) co_await o_->hand_over();
    }
    /// Items written so far.
    std::uint64_t written() const noexcept { return o_->written(); }

  private:
    detail::stream_out* o_;
};

namespace detail {

template <class T>
net::awaitable<stream<T>> open_stream(std::shared_ptr<channel_impl> ch, std::string method,
                                      params_buffer params, call_options o) {
    const std::uint32_t window = o.window ? o.window : default_stream_window;
    const std::uint64_t bytes = o.window_bytes ? o.window_bytes : default_stream_window_bytes;
    auto s = std::make_shared<stream_state<T>>(std::move(method), ch->remote_address(),
                                               ch->get_executor(), window, bytes);
    start_stream(ch, s, std::move(params), std::move(o));
    co_return stream<T>(std::move(s));
}

template <class R>
struct is_stream : std::false_type {};
template <class T>
struct is_stream<stream<T>> : std::true_type {
    using item = T;
};

}  // namespace detail
}  // namespace ordo
