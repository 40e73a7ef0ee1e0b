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
// Streams both ways (docs/protocol.md, "Streams both ways"): in a client stream the caller
// writes items and gets one answer; in a two-way stream both sides write, each direction with
// its own credit and order.
//
//   struct store : ordo::interface {
//       ordo::method<ordo::upload<std::string, std::uint64_t>()> put{"put"};
//       ordo::method<ordo::two_way<int, int>()> echo{"echo"};
//   };
//   auto up = co_await s.put();                  // caller
//   co_await up.write("a");                      // suspends while the server's credit is used up
//   std::uint64_t n = co_await up.finish();      // closes this side, waits for the answer
//   srv.on(store{}.put, [](ordo::reader<std::string>& in) -> net::awaitable<std::uint64_t> {
//       std::uint64_t n = 0;
//       while (auto v = co_await in.next()) n += v->size();  // nullopt: the caller closed
//       co_return n;
//   });
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
    /// The window of credit now, in bytes (it grows with call_options::max_window_bytes).
    std::uint64_t window_bytes() const { return s_ ? s_->current_window_bytes() : 0; }
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

/// A handler's input in a client or two-way stream: `while (auto v = co_await in.next()) ...`.
/// next() gives the caller's items in order, std::nullopt once it closed its side; throws
/// std::system_error: errc::cancelled when the call is cancelled, errc::bad_arguments when an
/// item does not convert to T, errc::protocol_error when the caller broke its credit. The
/// handler grants the caller credit as it reads (a window of 8192 items and 1 MiB).
template <class T>
class reader {
  public:
    explicit reader(detail::stream_in& in) : in_(&in) {}

    net::awaitable<std::optional<T>> next() {
        const msgpack::object* o = nullptr;
        while (!in_->try_next(o)) co_await in_->wait();
        if (!o) co_return std::nullopt;
        if constexpr (std::is_same_v<T, msgpack::object_handle>) {
            co_return msgpack::clone(*o);
        } else {
            std::optional<T> v;
            try {
                v.emplace(o->as<T>());
            } catch (const std::exception& e) {
                detail::throw_bad_item(in_->taken(), typeid(T), e);
            }
            co_return v;
        }
    }
    /// Items read so far.
    std::uint64_t read() const noexcept { return in_->taken(); }

  private:
    detail::stream_in* in_;
};

/// The caller's end of a client stream: write items, then finish() for the handler's answer.
/// Move-only; dropping it before finish() has returned cancels the call (ordo.cancel).
template <class In, class R>
class upload {
  public:
    upload() = default;
    explicit upload(std::shared_ptr<detail::upload_state<R>> s) : s_(std::move(s)) {}
    upload(upload&&) noexcept = default;
    upload& operator=(upload&& o) noexcept {
        if (this != &o) {
            if (s_) s_->cancel();
            s_ = std::move(o.s_);
        }
        return *this;
    }
    ~upload() {
        if (s_) s_->cancel();
    }

    /// Sends one item, suspending while the server's credit is used up. False when the call
    /// has ended already (the handler answered early, or failed: finish() says which).
    net::awaitable<bool> write(const In& v) {
        msgpack::pack(s_->item_buffer(), v);
        return detail::stream_core::write_item(s_);
    }
    /// Closes this side and waits for the handler's answer; throws ordo::rpc_error when the
    /// call failed (the handler threw, the peer was lost, the deadline passed, cancelled).
    net::awaitable<R> finish() {
        auto s = s_;
        if constexpr (std::is_void_v<R>) {
            co_await detail::upload_state<R>::finish(s);
            s_.reset();
        } else {
            R r = co_await detail::upload_state<R>::finish(s);
            s_.reset();
            co_return r;
        }
    }
    void cancel() {
        if (s_) s_->cancel();
    }
    std::uint64_t written() const { return s_ ? s_->written() : 0; }
    explicit operator bool() const noexcept { return s_ != nullptr; }

  private:
    std::shared_ptr<detail::upload_state<R>> s_;
};

/// The caller's end of a two-way stream: write() items (close() when done) and read the
/// handler's with next(), each direction in order with its own credit. Move-only; dropping it
/// before the end cancels the call. A writer and a reader may work at once (one of each).
template <class In, class Out>
class two_way {
  public:
    two_way() = default;
    explicit two_way(std::shared_ptr<detail::stream_state<Out>> s) : s_(std::move(s)) {}
    two_way(two_way&&) noexcept = default;
    two_way& operator=(two_way&& o) noexcept {
        if (this != &o) {
            if (s_) s_->cancel();
            s_ = std::move(o.s_);
        }
        return *this;
    }
    ~two_way() {
        if (s_) s_->cancel();
    }

    /// Sends one item, suspending while the server's credit is used up. False when the call
    /// has ended already (next() then says how).
    net::awaitable<bool> write(const In& v) {
        msgpack::pack(s_->item_buffer(), v);
        return detail::stream_core::write_item(s_);
    }
    /// No more items from this side: the handler's reader ends after those written.
    void close() {
        if (s_) s_->close_writes();
    }
    /// The handler's next item; std::nullopt once it has returned; throws as stream::next().
    net::awaitable<std::optional<Out>> next() { return detail::stream_state<Out>::next(s_); }
    void cancel() {
        if (s_) s_->cancel();
    }
    std::uint64_t written() const { return s_ ? s_->written() : 0; }
    std::uint64_t received() const { return s_ ? s_->received() : 0; }
    explicit operator bool() const noexcept { return s_ != nullptr; }

  private:
    std::shared_ptr<detail::stream_state<Out>> s_;
};

namespace detail {

template <class In, class R>
net::awaitable<upload<In, R>> open_upload(std::shared_ptr<channel_impl> ch, std::string method,
                                          params_buffer params, call_options o) {
    auto s = std::make_shared<upload_state<R>>(std::move(method), ch->remote_address(),
                                               ch->get_executor());
    start_stream(ch, s, std::move(params), std::move(o));
    co_return upload<In, R>(std::move(s));
}

template <class In, class Out>
net::awaitable<two_way<In, Out>> open_two_way(std::shared_ptr<channel_impl> ch,
                                              std::string method, params_buffer params,
                                              call_options o) {
    const std::uint32_t window = o.window ? o.window : default_stream_window;
    const std::uint64_t bytes = o.window_bytes ? o.window_bytes : default_stream_window_bytes;
    auto s = std::make_shared<stream_state<Out>>(std::move(method), ch->remote_address(),
                                                 ch->get_executor(), window, bytes);
    s->set_writes();
    if (o.max_window_bytes > bytes) s->grow_toward(o.max_window_bytes);
    start_stream(ch, s, std::move(params), std::move(o));
    co_return two_way<In, Out>(std::move(s));
}

template <class R>
struct is_upload : std::false_type {};
template <class In, class R>
struct is_upload<upload<In, R>> : std::true_type {
    using in = In;
    using result = R;
};
template <class R>
struct is_two_way : std::false_type {};
template <class In, class Out>
struct is_two_way<two_way<In, Out>> : std::true_type {
    using in = In;
    using item = Out;
};

template <class T>
net::awaitable<stream<T>> open_stream(std::shared_ptr<channel_impl> ch, std::string method,
                                      params_buffer params, call_options o) {
    const std::uint32_t window = o.window ? o.window : default_stream_window;
    const std::uint64_t bytes = o.window_bytes ? o.window_bytes : default_stream_window_bytes;
    auto s = std::make_shared<stream_state<T>>(std::move(method), ch->remote_address(),
                                               ch->get_executor(), window, bytes);
    if (o.max_window_bytes > bytes) s->grow_toward(o.max_window_bytes);
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
