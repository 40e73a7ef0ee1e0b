// ordo::sync_client: blocking calls for programs without an event loop.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/detail/params_buffer.hpp"
#include "ordo/error.hpp"

namespace ordo {

namespace detail {
class stream_core;  // include/ordo/rpc/stream_call.hpp
}  // namespace detail

namespace detail {
/// A blocking call's answer as R: nothing (void), the raw value, or converted (errc::bad_result
/// naming `method` and `remote` when it does not convert).
template <class R>
R convert_answer(value v, std::string_view method, const std::string& remote) {
    if constexpr (std::is_void_v<R>) {
        return;
    } else if constexpr (std::is_same_v<R, value>) {
        return v;
    } else {
        try {
            try {
                return v.get().as<R>();
            } catch (const std::exception&) {
                throw_bad_result(typeid(R), v.get());
            }
        } catch (const rpc_error& e) {
            throw rpc_error(e.code(), std::string(method), remote, e.detail(), e.retry_after());
        }
    }
}
}  // namespace detail

/// The untyped part of sync_stream<T> (rpc/channels/sync_client.cpp).
class sync_stream_base {
  public:
    sync_stream_base(sync_stream_base&& o) noexcept;
    /// Cancels the stream held before, as the destructor does.
    sync_stream_base& operator=(sync_stream_base&& o) noexcept;
    /// Cancels the stream if it has not ended (ordo.cancel: the server's handler is cancelled
    /// at its next suspension, its writer throws errc::cancelled). Does not block.
    ~sync_stream_base();

    /// Stops the stream (ordo.cancel to the handler); next() then yields what had arrived and
    /// throws errc::cancelled. Does nothing once the stream has ended. Does not block.
    void cancel();
    /// Items received so far (read or not).
    std::uint64_t received() const;
    const std::string& method() const noexcept;
    /// The remote side's address, as a URL.
    const std::string& remote_address() const noexcept;

  protected:
    explicit sync_stream_base(std::shared_ptr<detail::stream_core> s) noexcept;
    /// The next raw item (nullopt: the end), waiting at most `wait` (none: no limit).
    std::optional<value> next_raw(std::optional<std::chrono::milliseconds> wait);
    /// An item that does not convert (`e`: bad_result): the stream is cancelled, and this
    /// error, naming the item, is thrown now and by every later next().
    [[noreturn]] void bad_item(const rpc_error& e);

    // ---- the writing half (sync_upload, sync_two_way) ----
    /// Writes one packed item, blocking until the server's credit lets it go; false when the
    /// call has already ended. Throws std::logic_error after close_writes().
    bool write_raw(const detail::params_buffer& item);
    /// No more items (ordo.in_end); once.
    void close_writes();
    /// Items written so far.
    std::uint64_t written() const;
    /// A client stream's answer: closes the writing side and blocks until it comes.
    value finish_raw();

  private:
    std::shared_ptr<detail::stream_core> s_;
    std::uint64_t taken_ = 0;
    std::exception_ptr failed_;
};

/// The caller's end of a streaming call made with sync_client::stream (docs/protocol.md,
/// "Streams"): `while (auto v = s.next()) use(*v);` or `for (T& v : s)`.
/// The server sends up to call_options::window items ahead of the reader (8192 and 1 MiB by
/// default) and more as it reads: a reader that stops holds both sides at the window.
/// Destroying it before the end cancels the call (see ~sync_stream_base). One reader at a time,
/// on any thread; it may outlive its sync_client (whose destructor ends it with errc::closed).
/// Move-only.
template <class T = value>
class sync_stream : public sync_stream_base {
  public:
    using value_type = T;

    /// Blocks until the next item, in order, and returns it; std::nullopt once the handler has
    /// returned (every item read). Throws ordo::rpc_error, once the items that arrived before
    /// the failure have been returned: the handler threw (remote_error, ...), peer_lost, the
    /// stream's deadline (call_options::timeout, for the whole stream: timed_out), cancelled,
    /// closed (the sync_client was destroyed), protocol_error (the server broke the protocol,
    /// e.g. sent beyond the credit), bad_result (an item does not convert to T).
    std::optional<T> next() { return convert(next_raw(std::nullopt)); }
    /// The same, waiting at most `wait` for an item: when it passes first, throws
    /// ordo::rpc_error(timed_out) naming the peer and method; nothing is taken then and the
    /// stream stays open (call next() again, or destroy the stream to cancel it).
    std::optional<T> next(std::chrono::milliseconds wait) { return convert(next_raw(wait)); }

    /// A blocking input iterator: each increment is next() without a limit (and throws as it
    /// does); equal to end() after the last item.
    class iterator {
      public:
        using value_type = T;
        using difference_type = std::ptrdiff_t;
        T& operator*() { return *v_; }
        iterator& operator++() {
            v_ = s_->next();
            return *this;
        }
        void operator++(int) { ++*this; }
        bool operator==(std::default_sentinel_t) const noexcept { return !v_; }

      private:
        friend class sync_stream;
        iterator(sync_stream* s, std::optional<T> v) : s_(s), v_(std::move(v)) {}
        sync_stream* s_;
        std::optional<T> v_;
    };
    /// Blocks for the first item, as next() does.
    iterator begin() { return iterator(this, next()); }
    std::default_sentinel_t end() const noexcept { return {}; }

  protected:
    friend class sync_client;
    explicit sync_stream(std::shared_ptr<detail::stream_core> s) noexcept
        : sync_stream_base(std::move(s)) {}

  private:
    std::optional<T> convert(std::optional<value> v) {
        if constexpr (std::is_same_v<T, value>) {
            return v;
        } else {
            if (!v) return std::nullopt;
            try {
                try {
                    return v->get().as<T>();
                } catch (const std::exception&) {
                    detail::throw_bad_result(typeid(T), v->get());
                }
            } catch (const rpc_error& e) {
                bad_item(e);
            }
        }
    }
};

/// The caller's end of a two-way stream made with sync_client::two_way (docs/protocol.md,
/// "Streams both ways"): write() items of type In (blocking while the server's credit is used
/// up), close() after the last, and read the handler's items of type Out with next(), as from a
/// sync_stream<Out>. The writer and the reader may be two threads (one of each at a time).
template <class In, class Out = value>
class sync_two_way : public sync_stream<Out> {
  public:
    /// Blocks until the item may go (the handler reads; a handler that stops holds the writer
    /// at its window) and hands it to the connection; false when the call has already ended
    /// (next() then gives what came: the items, then the end or the error). Throws
    /// std::logic_error after close().
    bool write(const In& item) {
        detail::params_buffer b;
        msgpack::pack(b, item);
        return this->write_raw(b);
    }
    /// No more items: the handler's reader sees the end after those written.
    void close() { this->close_writes(); }
    using sync_stream_base::written;

  private:
    friend class sync_client;
    explicit sync_two_way(std::shared_ptr<detail::stream_core> s) noexcept
        : sync_stream<Out>(std::move(s)) {}
};

/// The caller's end of a client stream made with sync_client::upload: write() each item, then
/// finish() for the handler's answer. Destroying it before finish() cancels the call.
template <class In, class R = value>
class sync_upload : public sync_stream_base {
  public:
    /// As sync_two_way::write.
    bool write(const In& item) {
        detail::params_buffer b;
        msgpack::pack(b, item);
        return write_raw(b);
    }
    /// Closes the writing side and blocks until the handler's answer, converted to R. Throws
    /// ordo::rpc_error: the handler's error (remote_error, bad_arguments naming the item that
    /// did not convert, ...), cancelled, peer_lost, timed_out, closed, bad_result.
    R finish() { return detail::convert_answer<R>(finish_raw(), method(), remote_address()); }
    using sync_stream_base::written;

  private:
    friend class sync_client;
    explicit sync_upload(std::shared_ptr<detail::stream_core> s) noexcept
        : sync_stream_base(std::move(s)) {}
};

/// A channel (see async_connect) driven by an io_context on one thread of its own, with
/// blocking calls. No Asio in this header: the typed edge packs arguments and converts the
/// result; the rest is in rpc/channels/sync_client.cpp.
///
/// Any thread may call at once; a thread's calls and notifications are sent in the order it
/// makes them (on an ordered channel they arrive in that order, as async_connect says). Never
/// call it from a thread that must not block. Not copyable, not movable.
class sync_client {
  public:
    /// Connects to `url` (anything async_connect takes, its parameters included: `timeout_ms`
    /// sets the default deadline of calls) and starts the thread. Throws ordo::rpc_error as
    /// async_connect does (refused, bad address, ...); no thread is left behind then.
    explicit sync_client(std::string_view url);
    /// Fails calls still waiting and ends open streams with errc::closed (their handlers are
    /// asked to cancel), closes the connection after sending what is queued (at most 2 s), and
    /// joins the thread.
    ~sync_client();
    sync_client(const sync_client&) = delete;
    sync_client& operator=(const sync_client&) = delete;

    /// Calls `method` with `args...` and blocks until the result arrives, converted to R
    /// (void: none; ordo::value: the raw msgpack value). A trailing ordo::call_options
    /// (`ordo::timeout(50ms)`) sets this call's deadline. Throws ordo::rpc_error: the remote
    /// error (method_not_found, remote_error...), timed_out, peer_lost, bad_result, closed.
    template <class R = value, class... Args>
    R call(std::string_view method, const Args&... args) {
        if constexpr (ends_with_options<Args...>()) {
            constexpr std::size_t n = sizeof...(Args);
            const auto all = std::forward_as_tuple(args...);
            return convert<R>(method,
                              call_raw(method, pack_first(all, std::make_index_sequence<n - 1>()),
                                       std::get<n - 1>(all)));
        } else {
            return convert<R>(method,
                              call_raw(method, detail::pack_params(args...), call_options{}));
        }
    }

    /// Sends a one-way message; returns once the channel has taken it (not when it is
    /// delivered). Throws ordo::rpc_error when it cannot be taken (overloaded, peer_lost,
    /// closed).
    template <class... Args>
    void notify(std::string_view method, const Args&... args) {
        notify_raw(method, detail::pack_params(args...));
    }

    /// Starts the streaming call `method(args...)` (a handler taking an ordo::writer<T>&) and
    /// returns its reader at once; what fails (method_not_found, ...) is thrown by its first
    /// next(). A trailing ordo::call_options sets the stream's deadline (timeout, for the whole
    /// stream) and credit (window, window_bytes). The destructor of the sync_client ends its
    /// open streams with errc::closed (a reader blocked in next() wakes) and closing the
    /// connection cancels their handlers.
    template <class T = value, class... Args>
    sync_stream<T> stream(std::string_view method, const Args&... args) {
        if constexpr (ends_with_options<Args...>()) {
            constexpr std::size_t n = sizeof...(Args);
            const auto all = std::forward_as_tuple(args...);
            return sync_stream<T>(stream_raw(
                method, pack_first(all, std::make_index_sequence<n - 1>()), std::get<n - 1>(all)));
        } else {
            return sync_stream<T>(stream_raw(method, detail::pack_params(args...), call_options{}));
        }
    }

    /// Starts the client stream `method(args...)` (a handler taking an ordo::reader<In>&) and
    /// returns its writer at once; a trailing ordo::call_options sets its deadline. What fails
    /// is thrown by write() (false) and finish().
    template <class In, class R = value, class... Args>
    sync_upload<In, R> upload(std::string_view method, const Args&... args) {
        return sync_upload<In, R>(open_typed(method, true, args...));
    }
    /// Starts the two-way stream `method(args...)` (a handler taking an ordo::reader<In>& and an
    /// ordo::writer<Out>&); a trailing ordo::call_options sets its deadline and credit.
    template <class In, class Out = value, class... Args>
    sync_two_way<In, Out> two_way(std::string_view method, const Args&... args) {
        return sync_two_way<In, Out>(open_typed(method, false, args...));
    }

    /// The remote side's address, as a URL.
    const std::string& remote_address() const noexcept;

  private:
    template <class... Args>
    std::shared_ptr<detail::stream_core> open_typed(std::string_view method, bool upload,
                                                    const Args&... args) {
        if constexpr (ends_with_options<Args...>()) {
            constexpr std::size_t n = sizeof...(Args);
            const auto all = std::forward_as_tuple(args...);
            return writing_raw(method, pack_first(all, std::make_index_sequence<n - 1>()),
                               std::get<n - 1>(all), upload);
        } else {
            return writing_raw(method, detail::pack_params(args...), call_options{}, upload);
        }
    }

    template <class... Args>
    static constexpr bool ends_with_options() {
        if constexpr (sizeof...(Args) == 0)
            return false;
        else
            return std::is_same_v<
                std::decay_t<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>>,
                call_options>;
    }

    template <class Tuple, std::size_t... I>
    static detail::params_buffer pack_first(const Tuple& all, std::index_sequence<I...>) {
        return detail::pack_params(std::get<I>(all)...);
    }

    template <class R>
    R convert(std::string_view method, value v) const {
        return detail::convert_answer<R>(std::move(v), method, remote_address());
    }

    value call_raw(std::string_view method, detail::params_buffer params, call_options o);
    void notify_raw(std::string_view method, detail::params_buffer params);
    std::shared_ptr<detail::stream_core> stream_raw(std::string_view method,
                                                    detail::params_buffer params, call_options o);
    /// A stream whose caller writes: a client stream (`upload`) or a two-way stream.
    std::shared_ptr<detail::stream_core> writing_raw(std::string_view method,
                                                     detail::params_buffer params, call_options o,
                                                     bool upload);

    struct state;
    std::unique_ptr<state> s_;
};

}  // namespace ordo
