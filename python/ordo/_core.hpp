// The C++ half of the Python binding: one process-wide io thread that runs ordo (runtime), and
// one completion queue per asyncio loop (hub). Nothing here touches a Python object: the
// pybind11 layer (_module.cpp) converts bytes, ints and strings at the edge.
//
// Threading (docs/python.md):
// - runtime::io runs on one thread of its own; it never takes the GIL. Everything keyed by id
//   below (channels, calls, streams, servers, requests) is touched on that thread only.
// - Python submits work with submit() (GIL released by the caller): the closures queue under a
//   mutex and one post to the io thread runs all that queued meanwhile, in order.
// - Results go back through hub::push: a queue under a mutex and one eventfd, written only when
//   the queue goes from empty to non-empty, so one wake-up of the asyncio loop drains many.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include "ordo/ordo.hpp"

namespace ordo::py {

/// What the io thread tells Python. `kind` says which fields mean what.
enum class kind : int {
    call_done = 0,     ///< token: the call; code 0: data = msgpack result; else text, detail
    connected = 1,     ///< token: the connect; code 0: a = channel id, text = remote address
    stream_item = 2,   ///< token: the stream; data = one msgpack item; a = its wire bytes
    stream_end = 3,    ///< token: the stream; code 0: ended well; else text, detail
    request = 4,       ///< token: request id; a = handler id; b = peer's channel id;
                       ///< data = msgpack params array; text = method
    request_gone = 5,  ///< token: request id: cancelled (ordo.cancel, deadline, peer lost)
    item_written = 6,  ///< token: request id of a streaming handler; a = items written so far
    done = 7,          ///< token: a listen or stop; code 0: text = bound address; else text
    notify_failed = 8, ///< token: channel id; code, text: why a notification was not taken
    undelivered = 9,   ///< token: channel id; code, text: a notification taken and not written
                       ///< when the connection ended (peer_options::on_undelivered)
    release = 10,      ///< a: a batch (PyObject*) the io thread has read in place; drain()
                       ///< drops it, never Python
    stream_written = 11,  ///< token: a stream the caller writes to; a = its items handed to the
                          ///< connection so far; b = 1 when a write found the call ended
    request_item = 12,    ///< token: request id of a reading handler; data = one msgpack item
    request_in_end = 13,  ///< token: request id of a reading handler; code 0: its caller closed
                          ///< its side; else why its items ended (text)
};

struct completion {
    completion(kind w, std::uint64_t t) : what(w), token(t) {}
    kind what;
    std::uint64_t token = 0;
    int code = 0;
    std::uint64_t a = 0, b = 0;
    std::string data;
    /// Instead of data: a stream item's bytes where its connection read them, and their owner.
    std::shared_ptr<const kept_bytes> kept;
    std::string_view kept_view;
    std::string text;    ///< the whole message (what() of ordo's rpc_error)
    std::string detail;  ///< the remote message or local reason alone
};

/// One asyncio loop's completion queue.
class hub {
  public:
    hub();
    ~hub();
    hub(const hub&) = delete;
    hub& operator=(const hub&) = delete;
    /// Any thread. Writes the eventfd when the queue was empty.
    void push(completion c);
    /// Python's side: clears the eventfd and takes everything queued.
    std::vector<completion> drain();
    int fd() const noexcept { return fd_; }

  private:
    int fd_;
    std::mutex mu_;
    std::vector<completion> q_;
};

/// Bytes for the io thread: its own string, or a Python object's buffer read in place (bytes,
/// or a memoryview that exports it), whose reference a release completion to `h` lets go when
/// these are destroyed (drain() drops it, with the GIL). A stream item may come as its first
/// bytes (front(), copied: a bin's head) and the rest read in place.
class held_bytes {
  public:
    explicit held_bytes(std::string s) : owned_(std::move(s)) {}
    held_bytes(std::shared_ptr<hub> h, std::uintptr_t ref, std::string_view v,
               std::string front = {})
        : front_(std::move(front)), h_(std::move(h)), ref_(ref), view_(v) {}
    held_bytes(held_bytes&& o) noexcept
        : owned_(std::move(o.owned_)), front_(std::move(o.front_)), h_(std::move(o.h_)),
          ref_(std::exchange(o.ref_, 0)), view_(o.view_) {}
    held_bytes& operator=(held_bytes&&) = delete;
    ~held_bytes() {
        if (!ref_) return;
        completion c{kind::release, 0};
        c.a = ref_;
        h_->push(std::move(c));
    }
    std::string_view view() const noexcept { return ref_ ? view_ : std::string_view(owned_); }
    /// The bytes that go before view(), taken (then empty).
    std::string take_front() noexcept { return std::move(front_); }

  private:
    std::string owned_;
    std::string front_;
    std::shared_ptr<hub> h_;
    std::uintptr_t ref_ = 0;  ///< the PyObject*, or 0
    std::string_view view_;
};

/// A big item's bytes, kept until the connection has written them from where they are
/// (ordo::held_body).
struct held_item final : held_body {
    explicit held_item(held_bytes b) : bytes(std::move(b)) {}
    held_bytes bytes;
    /// For an item of 64 KiB or more (a smaller one is copied): its bytes, moved into a keeper
    /// (`b` is left empty; a view taken before stays valid, as such bytes do not move).
    static std::unique_ptr<held_body> keep_big(held_bytes& b) {
        if (b.view().size() < (std::size_t{64} << 10)) return nullptr;
        return std::make_unique<held_item>(std::move(b));
    }
};

class server_binding;

/// The process-wide io thread and the state it owns.
class runtime {
  public:
    /// Started on first use; never destroyed (stop() at exit ends its thread).
    static runtime& get();

    /// Any thread: runs `f` on the io thread, after everything submitted before it.
    void submit(std::function<void()> f);
    /// Closes every channel and server, then ends the io thread (waiting up to `wait_ms` for
    /// connections to flush). Later submissions are dropped. Idempotent.
    void stop(int wait_ms);
    bool stopped() const noexcept { return stopped_; }

    net::io_context io;

    // ---- io thread only ----
    std::uint64_t next_id = 1;
    std::unordered_map<std::uint64_t, channel> channels;
    std::unordered_map<std::uint64_t, std::unique_ptr<net::cancellation_signal>> calls;
    std::unordered_map<std::uint64_t, std::shared_ptr<detail::stream_core>> streams;
    std::unordered_map<std::uint64_t, std::shared_ptr<server_binding>> servers;
    /// The handler tables serving connected channels' callbacks (ordo.connect(handlers=)).
    std::unordered_map<std::uint64_t, std::shared_ptr<const handlers>> channel_handlers;
    /// Server-side peers (handlers' callers) by address and by id, held weakly: the server
    /// owns them. Forgotten once gone (swept when the maps grow).
    std::unordered_map<const void*, std::pair<std::uint64_t, std::weak_ptr<channel_impl>>>
        peer_ids;
    std::unordered_map<std::uint64_t, std::weak_ptr<channel_impl>> peers_by_id;
    std::uint64_t peer_channel(channel_impl& p);
    /// Server-side peers' identities by id, recorded by peer_channel (any thread, under the
    /// lock): a server peer's identity is settled before any of its messages is served.
    std::mutex identities_mu;
    std::unordered_map<std::uint64_t, identity> identities;
    /// A connected channel's or a live server peer's implementation, or null.
    std::shared_ptr<channel_impl> find_channel(std::uint64_t id);

  private:
    runtime();
    void run_queued();

    net::executor_work_guard<net::io_context::executor_type> work_;
    std::thread thread_;
    std::future<void> ran_out_;  ///< ready when io.run() has returned
    std::mutex mu_;
    std::vector<std::function<void()>> queued_;
    bool stopped_ = false;
};

// ---- client (_client.cpp); each runs on the io thread ----
/// Runs a batch of calls and notifications, in order: a msgpack array of
/// [0, chan, method, params] (notify; params inline, as an array), [1, chan, token, method, params,
/// timeout_ms, key] (call; with an eighth element, its metadata: [[key, str or bin], ...]),
/// [2, request, code, data] (respond), [3, request, item] (stream_write), [4, stream,
/// bytes, items] (stream_took), [5, stream, item] (stream_write_in), [6, stream]
/// (stream_close_writes) and [7, request, items] (reader_took); params, data and item are
/// msgpack bytes, as bin. Made by ordo/_hub.py (_LoopHub.flush).
void run_batch(const std::shared_ptr<hub>& h, std::string_view batch);
/// `server`: 0, or the id of a server whose handlers serve what the remote side calls back.
void start_connect(std::shared_ptr<hub> h, std::uint64_t token, std::string url,
                   std::uint64_t server);
void start_call(std::shared_ptr<hub> h, std::uint64_t chan, std::uint64_t token, std::string method,
                std::string params, long timeout_ms, std::string key, metadata meta = {});
void cancel_call(std::uint64_t token);
void send_notify(std::shared_ptr<hub> h, std::uint64_t chan, const std::string& method,
                 const std::string& params);
/// Sends a notification on channel `chan`; the report of its refusal (notify_failed) if it
/// was refused.
std::optional<completion> try_notify(std::uint64_t chan, const std::string& method,
                                     const std::string& params);
/// How a stream's caller takes part (docs/protocol.md, "Streams both ways").
enum class shape : int { reads = 0, two_way = 1, upload = 2 };
void start_stream(std::shared_ptr<hub> h, std::uint64_t chan, std::uint64_t token,
                  std::string method, std::string params, long timeout_ms, std::string key,
                  std::uint32_t window, std::uint64_t window_bytes, shape how = shape::reads);
/// One item the caller writes to stream `token` (msgpack bytes), sent in order once credit
/// allows; a stream_written completion reports each.
void stream_write_in(std::uint64_t token, held_bytes item);
/// The caller has written its last item to stream `token` (ordo.in_end goes after them).
void stream_close_writes(std::uint64_t token);
/// The reader took `items` items of `bytes` wire bytes: credit goes back (half a window at a
/// time).
void stream_took(std::uint64_t token, std::uint64_t bytes, std::uint64_t items);
void stream_cancel(std::uint64_t token);
void stream_forget(std::uint64_t token);
void close_channel(std::uint64_t chan);
/// Registers `lane` as a channel on lane `name` of channel `chan` (channel::lane).
void open_lane(std::uint64_t chan, std::uint64_t lane, const std::string& name);
/// Forgets channel `chan` without closing what it shares (a lane's channel).
void forget_channel(std::uint64_t chan);
/// Closes the connection of the caller behind peer channel `id` (peer::close: what was queued
/// to it is sent first); nothing when it has gone.
void close_peer(std::uint64_t id);
/// `o` packed into a string of its own, in one copy (a result, item or request for Python).
std::string pack_object(const msgpack::object& o);
/// Fills `c` (code, text, detail) for a failure `ec` of `method` on `peer`.
void describe_failure(completion& c, std::error_code ec, const std::string& method,
                      const std::string& peer, const std::string& detail);

// ---- server (_server.cpp); each runs on the io thread ----
/// `tokens` (token -> subject) non-empty: the server authenticates (authenticate_tokens), and
/// `introspectors` may call ordo.stats and ordo.methods.
void server_create(std::uint64_t id, std::map<std::string, std::string> tokens,
                   std::vector<std::string> introspectors);
/// The handler table of server `id` (kept alive by the returned pointer), or null; its
/// requests go to `h` if no loop listens for it yet.
std::shared_ptr<const handlers> server_handlers(std::uint64_t id, const std::shared_ptr<hub>& h);
/// Registers handler `hid` as `name`. flags: 1 concurrent, 2 streaming (it writes items), 4
/// only the callers whose subject is in `allow`, 8 reading (its caller writes items).
void server_add(std::uint64_t id, std::string name, std::uint64_t hid, int flags,
                std::string signature, std::vector<std::string> allow);
void server_listen(std::shared_ptr<hub> h, std::uint64_t id, std::uint64_t token,
                   std::string url, long resume_window_ms);
void server_stop(std::shared_ptr<hub> h, std::uint64_t id, std::uint64_t token);
/// Server `id` stops accepting (server::stop_listening); its connections go on.
void server_stop_listening(std::uint64_t id);
/// A handler's answer: code 0: `data` is the msgpack result; else an ordo::errc and message.
void respond(std::uint64_t request, int code, std::string data);
/// One item of a streaming handler (msgpack bytes), written in order.
void stream_write(std::uint64_t request, held_bytes item);
/// A reading handler's Python side has taken `items` more of the items handed to it.
void reader_took(std::uint64_t request, std::uint64_t items);
/// At exit: every server stopped.
void stop_servers();

}  // namespace ordo::py
