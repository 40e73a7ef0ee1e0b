// The serving side of the Python binding, on the io thread: an ordo::server whose handlers are
// Python coroutines. Each request goes to the listening loop's hub as msgpack bytes; the
// handler's coroutine here waits (a timer) until Python answers with respond(), so that a
// serial handler keeps its connection serial exactly as a C++ coroutine handler does.
#include "_core.hpp"

#include <chrono>
#include <deque>
#include <limits>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>

namespace ordo::py {

class server_binding {
  public:
    explicit server_binding(server_options o) : srv(runtime::get().io.get_executor(), o) {}
    ordo::server srv;
    std::shared_ptr<hub> h;  ///< the hub of the loop that listened first
};

namespace {

// One request waiting for its Python handler.
struct request_state {
    explicit request_state(net::any_io_executor ex) : timer(std::move(ex)) {}
    net::steady_timer timer;
    bool done = false;  ///< Python answered (or the stream ended)
    int code = 0;
    std::string data;               ///< the result, or the error message
    std::deque<held_bytes> items;  ///< streaming: items not yet written
    // A reading handler: the sizes of the items handed to Python and not yet taken by it.
    std::deque<std::size_t> handed;
    std::size_t handed_bytes = 0;
};

// What a reading handler's Python side may hold that it has not taken (its Reader's queue),
// beyond the items the connection holds for it: at most this many items, or one item and more
// bytes than this.
constexpr std::size_t reader_room_items = 64;
constexpr std::size_t reader_room_bytes = 1 << 20;

std::unordered_map<std::uint64_t, std::shared_ptr<request_state>>& requests() {
    static std::unordered_map<std::uint64_t, std::shared_ptr<request_state>> m;  // io thread
    return m;
}

// A handler's call context, for Python (ordo/_context.py, CallContext): [deadline (steady_clock
// nanoseconds, CLOCK_MONOTONIC as Python's time.monotonic(); -1: none), [[key, value], ...] (a
// value whose key ends in -bin as bin), trace id, parent id, span id, trace flags] (the ids empty
// when the call is not traced).
std::string pack_context(const call_context& ctx) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> p(b);
    p.pack_array(6);
    p.pack(ctx.has_deadline()
               ? static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            ctx.deadline.time_since_epoch())
                                            .count())
               : -1LL);
    p.pack_array(static_cast<std::uint32_t>(ctx.metadata.size()));
    for (const auto& [k, v] : ctx.metadata) {
        p.pack_array(2);
        p.pack(k);
        if (k.ends_with("-bin")) {
            p.pack_bin(static_cast<std::uint32_t>(v.size()));
            p.pack_bin_body(v.data(), v.size());
        } else {
            p.pack(v);
        }
    }
    p.pack(ctx.trace_id());
    p.pack(ctx.parent_id());
    p.pack(ctx.span_id());
    p.pack(static_cast<int>(ctx.trace_flags));
    return std::string(b.data(), b.size());
}

// Hands the request to Python; returns its id.
std::uint64_t announce(server_binding& b, std::uint64_t hid, const std::string& method, peer& p,
                       const msgpack::object& params, int shape,
                       std::shared_ptr<request_state>& st) {
    auto& rt = runtime::get();
    st = std::make_shared<request_state>(rt.io.get_executor());
    const std::uint64_t id = rt.next_id++;
    requests()[id] = st;
    completion c{kind::request, id};
    c.a = hid;
    c.b = rt.peer_channel(p);
    c.code = shape;  // 1: it writes items (a stream); | 2: it reads items (run_reading)
    c.data = pack_object(params);
    c.text = method;
    if (const call_context* ctx = current_context()) c.detail = pack_context(*ctx);
    b.h->push(std::move(c));
    return id;
}

// Waits until respond() or stream_write() wakes the timer. False: this handler was cancelled
// (ordo.cancel, the caller's deadline, the connection ending, the server stopping).
net::awaitable<bool> wait_for_python(request_state& st) {
    st.timer.expires_at(net::steady_timer::time_point::max());
    try {
        co_await st.timer.async_wait(net::experimental::as_tuple(net::use_awaitable));
    } catch (const std::system_error&) {  // cancelled before it began
        co_return false;
    }
    auto cs = co_await net::this_coro::cancellation_state;
    co_return cs.cancelled() == net::cancellation_type::none;
}

[[noreturn]] void cancelled(server_binding& b, std::uint64_t id) {
    requests().erase(id);
    b.h->push(completion{kind::request_gone, id});
    throw std::system_error(make_error_code(errc::cancelled), "ordo: handler cancelled");
}

void throw_answer(const request_state& st) {
    if (st.code)
        throw std::system_error(make_error_code(static_cast<errc>(st.code)), st.data);
}

net::awaitable<void> run_unary(server_binding* b, std::uint64_t hid, std::string method, peer& p,
                               msgpack::object params, buffer& out) {
    std::shared_ptr<request_state> st;
    const std::uint64_t id = announce(*b, hid, method, p, params, 0, st);
    while (!st->done)
        if (!co_await wait_for_python(*st)) cancelled(*b, id);
    requests().erase(id);
    throw_answer(*st);
    out.write(st->data.data(), st->data.size());
}

net::awaitable<void> write_items(server_binding& b, std::uint64_t id, request_state& st,
                                 detail::stream_out& out, std::uint64_t& written,
                                 bool once = false);

net::awaitable<void> run_stream(server_binding* b, std::uint64_t hid, std::string method, peer& p,
                                msgpack::object params, detail::stream_out& out) {
    std::shared_ptr<request_state> st;
    const std::uint64_t id = announce(*b, hid, method, p, params, 1, st);
    std::uint64_t written = 0;
    try {
        co_await write_items(*b, id, *st, out, written);
    } catch (...) {  // cancelled while it waited for credit or sent: Python's task goes too
        if (requests().erase(id)) b->h->push(completion{kind::request_gone, id});
        throw;
    }
    requests().erase(id);
    throw_answer(*st);
}

// Writes what Python gives, in order, until it ends the stream (`once`: until none is left).
net::awaitable<void> write_items(server_binding& b, std::uint64_t id, request_state& st_,
                                 detail::stream_out& out, std::uint64_t& written, bool once) {
    auto* st = &st_;
    for (;;) {
        while (!st->items.empty()) {
            // As ordo::writer<T>::write: wait for credit, write the item, let it go out.
            if (!out.has_credit()) co_await out.wait_credit();
            held_bytes item = std::move(st->items.front());
            st->items.pop_front();
            // A big item (or its big last bin, behind a front) is written from Python's
            // bytes, kept until then.
            const std::string front = item.take_front();
            const std::string_view bytes = item.view();
            auto keep = held_item::keep_big(item);
            if (!out.write_packed(front, bytes, std::move(keep))) co_await out.hand_over();
            completion c{kind::item_written, id};
            c.a = ++written;
            b.h->push(std::move(c));
        }
        if (st->done || once) co_return;
        if (!co_await wait_for_python(*st)) cancelled(b, id);
    }
}

// Hands Python the items that have come, while its Reader has room; false once the items have
// ended (Python is told: the caller closed its side, or why they failed).
bool hand_items(server_binding& b, std::uint64_t id, request_state& st, detail::stream_in& in) {
    while (st.handed.size() < reader_room_items && st.handed_bytes < reader_room_bytes) {
        completion c{kind::request_item, id};
        detail::stream_in::took t;
        try {
            // A big item comes as the bytes the connection kept: not copied again here.
            detail::packed_bytes packed;
            t = in.take_packed(packed);
            c.data = std::move(packed.own);
            c.kept = std::move(packed.kept);
            c.kept_view = packed.kept_view;
        } catch (const std::system_error& e) {  // cancelled, protocol_error, peer_lost
            c.what = kind::request_in_end;
            c.code = e.code().category() == error_category()
                         ? e.code().value()
                         : static_cast<int>(errc::remote_error);
            c.text = e.what();
            b.h->push(std::move(c));
            return false;
        }
        if (t == detail::stream_in::took::none) return true;
        if (t == detail::stream_in::took::end) {
            // The caller closed its side, and every item has been handed over.
            c.what = kind::request_in_end;
            b.h->push(std::move(c));
            return false;
        }
        const std::size_t size = c.kept ? c.kept_view.size() : c.data.size();
        st.handed.push_back(size);
        st.handed_bytes += size;
        b.h->push(std::move(c));
    }
    return true;
}

// A handler that reads what its caller writes (a client stream: `out` null, the answer goes
// to `result`; a two-way stream: Python's items go to `out`). Items go to Python as they come,
// up to its Reader's room; the coroutine waits for Python and for items together.
net::awaitable<void> run_reading(server_binding* b, std::uint64_t hid, std::string method, peer& p,
                                 msgpack::object params, detail::stream_in& in,
                                 detail::stream_out* out, buffer& result) {
    using namespace net::experimental::awaitable_operators;
    std::shared_ptr<request_state> st;
    const std::uint64_t id = announce(*b, hid, method, p, params, out ? 3 : 2, st);
    std::uint64_t written = 0;
    bool reading = true;
    try {
        for (;;) {
            if (reading) reading = hand_items(*b, id, *st, in);
            if (out && !st->items.empty()) {
                // Python's items; a wait for credit here may miss wake-ups (items, the end,
                // Python's reports): look at everything again before waiting.
                co_await write_items(*b, id, *st, *out, written, true);
                continue;
            }
            if (st->done) break;
            const bool room = st->handed.size() < reader_room_items &&
                              st->handed_bytes < reader_room_bytes;
            if (reading && room) {
                st->timer.expires_at(net::steady_timer::time_point::max());
                co_await (st->timer.async_wait(net::experimental::as_tuple(net::use_awaitable)) ||
                          in.wait());
                auto cs = co_await net::this_coro::cancellation_state;
                if (cs.cancelled() != net::cancellation_type::none) cancelled(*b, id);
            } else if (!co_await wait_for_python(*st)) {
                cancelled(*b, id);
            }
        }
    } catch (...) {  // cancelled while it waited: Python's task goes too
        if (requests().erase(id)) b->h->push(completion{kind::request_gone, id});
        throw;
    }
    requests().erase(id);
    throw_answer(*st);
    if (!out) result.write(st->data.data(), st->data.size());
}

server_binding* find_server(std::uint64_t id) {
    auto& rt = runtime::get();
    auto it = rt.servers.find(id);
    return it == rt.servers.end() ? nullptr : it->second.get();
}

net::awaitable<void> stop_then(std::shared_ptr<server_binding> b, std::shared_ptr<hub> h,
                               std::uint64_t token) {
    try {
        co_await b->srv.async_stop();
    } catch (const std::exception&) {  // async_stop does not fail; nothing is left to stop
    }
    if (h) h->push(completion{kind::done, token});
}

}  // namespace

void server_create(std::uint64_t id, std::map<std::string, std::string> tokens,
                   std::vector<std::string> introspectors) {
    server_options o;
    if (!tokens.empty()) {
        o.authenticate = authenticate_tokens(std::move(tokens));
        o.allow_introspection = allow_subjects(std::move(introspectors));
    }
    runtime::get().servers[id] = std::make_shared<server_binding>(std::move(o));
}

std::shared_ptr<const handlers> server_handlers(std::uint64_t id, const std::shared_ptr<hub>& h) {
    auto& rt = runtime::get();
    auto it = rt.servers.find(id);
    if (it == rt.servers.end()) return nullptr;
    auto b = it->second;
    if (!b->h) b->h = h;
    return std::shared_ptr<const handlers>(b, &b->srv.handlers());  // aliasing: holds b
}

// How many messages of one connection a serial method may have handed to the loop and not yet
// answered; more wait in the connection's queue, whose bound pauses reading.
constexpr std::uint32_t serial_pipeline = 256;

void server_add(std::uint64_t id, std::string name, std::uint64_t hid, int flags,
                std::string signature, std::vector<std::string> allow) {
    auto* b = find_server(id);
    if (!b) return;
    detail::handler_entry e;
    e.signature = std::move(signature);
    e.concurrent = (flags & 1) != 0;
    // A serial method's messages cross to the loop many at a time: the loop runs a
    // connection's handlers one at a time, in order (ordo/_server.py, _arrive).
    if (!e.concurrent && !(flags & (2 | 8))) e.pipeline = serial_pipeline;
    if (flags & 4) e.allow = allow_subjects(std::move(allow));
    if (flags & 8) {
        e.writes_items = (flags & 2) != 0;
        e.signature += e.writes_items ? " [two-way stream]" : " [client stream]";
        e.reads = [b, hid, name](peer& p, msgpack::object params, detail::stream_in& in,
                                 detail::stream_out* out, buffer& result) {
            return run_reading(b, hid, name, p, params, in, out, result);
        };
    } else if (flags & 2) {
        e.signature += " [stream]";
        e.stream = [b, hid, name](peer& p, msgpack::object params, detail::stream_out& out) {
            return run_stream(b, hid, name, p, params, out);
        };
    } else {
        e.async = [b, hid, name](peer& p, msgpack::object params, buffer& out) {
            return run_unary(b, hid, name, p, params, out);
        };
    }
    b->srv.handlers().on_entry(std::move(name), std::move(e));
}

void server_listen(std::shared_ptr<hub> h, std::uint64_t id, std::uint64_t token,
                   std::string url, long) {
    completion c{kind::done, token};
    auto* b = find_server(id);
    try {
        if (!b) throw_error(errc::closed, "ordo: listen on " + url + ": the server has stopped");
        if (!b->h) b->h = h;
        c.text = b->srv.listen(url);
    } catch (const std::system_error& e) {
        // The system's own errors (a port in use, no permission) as their errno, negated:
        // Python raises OSError with it, which is what asyncio's servers raise and what Dask
        // catches to try the next port of a range.
        const auto& cat = e.code().category();
        if (cat == error_category())
            c.code = e.code().value();
        else if (cat == net::error::get_system_category() || cat == std::system_category() ||
                 cat == std::generic_category())
            c.code = -e.code().value();
        else
            c.code = static_cast<int>(errc::bad_address);
        c.text = e.what();
    }
    h->push(std::move(c));
}

void server_stop(std::shared_ptr<hub> h, std::uint64_t id, std::uint64_t token) {
    auto& rt = runtime::get();
    auto it = rt.servers.find(id);
    if (it == rt.servers.end()) {
        h->push(completion{kind::done, token});
        return;
    }
    auto b = std::move(it->second);
    rt.servers.erase(it);
    net::co_spawn(rt.io, stop_then(std::move(b), std::move(h), token), net::detached);
}

void server_stop_listening(std::uint64_t id) {
    if (auto* b = find_server(id)) b->srv.stop_listening();
}

void stop_servers() {
    auto& rt = runtime::get();
    for (auto& [id, b] : rt.servers) net::co_spawn(rt.io, stop_then(b, nullptr, 0), net::detached);
    rt.servers.clear();
}

void respond(std::uint64_t request, int code, std::string data) {
    auto it = requests().find(request);
    if (it == requests().end()) return;  // cancelled meanwhile: the caller was told
    auto& st = *it->second;
    st.done = true;
    st.code = code;
    st.data = std::move(data);
    st.timer.cancel();
}

void reader_took(std::uint64_t request, std::uint64_t items) {
    auto it = requests().find(request);
    if (it == requests().end()) return;
    auto& st = *it->second;
    for (; items > 0 && !st.handed.empty(); --items) {
        st.handed_bytes -= st.handed.front();
        st.handed.pop_front();
    }
    st.timer.cancel();  // room again: the handler's coroutine hands over more
}

void stream_write(std::uint64_t request, held_bytes item) {
    auto it = requests().find(request);
    if (it == requests().end()) return;
    it->second->items.push_back(std::move(item));
    it->second->timer.cancel();
}

}  // namespace ordo::py
