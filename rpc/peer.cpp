#include "ordo/peer.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "ordo/handlers.hpp"
#include "rpc/detail/id_table.hpp"

namespace ordo {

channel_impl::~channel_impl() = default;

namespace detail {

std::string type_name(const std::type_info& t) {
    int status = 0;
    char* raw = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
    std::string name = status == 0 && raw ? raw : t.name();
    std::free(raw);
    if (name.find("basic_string<char") != std::string::npos) return "std::string";
    return name;
}

void throw_bad_arguments(std::string_view method, const std::string& signature,
                         const std::string& what) {
    throw_error(errc::bad_arguments,
                "bad arguments for " + std::string(method) + signature + ": " + what);
}

}  // namespace detail

namespace {

// The bytes of a message before its params, built on the stack: one is made per call and per
// notification, and a std::string cost an allocation and several appends there. Methods too
// long for the inline bytes spill to a string.
class head {
  public:
    void push_back(char c) {
        if (n_ < sizeof inline_) inline_[n_++] = c;
        else spill().push_back(c);
    }
    void append(std::string_view s) {
        if (n_ + s.size() <= sizeof inline_) {
            std::memcpy(inline_ + n_, s.data(), s.size());
            n_ += s.size();
        } else {
            spill().append(s);
        }
    }
    operator std::string_view() const {
        return long_ ? std::string_view(*long_) : std::string_view(inline_, n_);
    }

  private:
    std::string& spill() {
        if (!long_) long_.emplace(inline_, n_);
        return *long_;
    }
    char inline_[48];
    std::size_t n_ = 0;
    std::optional<std::string> long_;
};

void put_be32(head& h, std::uint32_t v) {
    const char be[4] = {char(v >> 24), char((v >> 16) & 0xff), char((v >> 8) & 0xff),
                        char(v & 0xff)};
    h.append(std::string_view(be, 4));
}

void put_str(head& h, std::string_view str) {
    const auto n = static_cast<std::uint32_t>(str.size());
    if (n < 32) {
        h.push_back(char(0xa0 | n));
    } else if (n < 256) {
        h.push_back('\xd9');
        h.push_back(char(n));
    } else if (n < 65536) {
        h.push_back('\xda');
        h.push_back(char(n >> 8));
        h.push_back(char(n & 0xff));
    } else {
        h.push_back('\xdb');
        put_be32(h, n);
    }
    h.append(str);
}

// The part of a request before its params: [0, msgid, method, ...
head request_head(std::uint32_t id, std::string_view method) {
    head h;
    h.append(std::string_view("\x94\x00\xce", 3));
    put_be32(h, id);
    put_str(h, method);
    return h;
}

// [2, method, ...
head notification_head(std::string_view method) {
    head h;
    h.append(std::string_view("\x93\x02", 2));
    put_str(h, method);
    return h;
}

// [1, msgid, nil, ... (the result follows)
void response_head(buffer& out, std::uint32_t id) {
    msgpack::packer<buffer>(out).pack_array(4).pack_uint8(1).pack_uint32(id).pack_nil();
}

// The error object of a response as an error code and a detail. ordo's own {code, message}
// map keeps its code; anything else from a foreign peer is a remote_error, its text surfaced:
// neovim's [type, message] arrays give their message, other values their msgpack text form.
std::error_code error_from_wire(const msgpack::object& e, std::string& detail) {
    if (e.type == msgpack::type::MAP) {
        std::optional<std::int64_t> code;
        for (std::uint32_t i = 0; i < e.via.map.size; ++i) {
            const auto& kv = e.via.map.ptr[i];
            if (kv.key.type != msgpack::type::STR) continue;
            std::string_view k(kv.key.via.str.ptr, kv.key.via.str.size);
            if (k == "code" && (kv.val.type == msgpack::type::POSITIVE_INTEGER ||
                                kv.val.type == msgpack::type::NEGATIVE_INTEGER))
                code = kv.val.via.i64;
            else if (k == "message" && kv.val.type == msgpack::type::STR)
                detail.assign(kv.val.via.str.ptr, kv.val.via.str.size);
        }
        if (code && *code >= 1 && *code <= static_cast<int>(errc::bad_result) && !detail.empty())
            return static_cast<errc>(*code);
    }
    if (detail.empty()) {
        if (e.type == msgpack::type::STR) {
            detail.assign(e.via.str.ptr, e.via.str.size);
        } else if (e.type == msgpack::type::ARRAY && e.via.array.size == 2 &&
                   e.via.array.ptr[1].type == msgpack::type::STR) {
            detail.assign(e.via.array.ptr[1].via.str.ptr, e.via.array.ptr[1].via.str.size);
        } else {
            std::ostringstream text;
            text << e;
            detail = text.str();
        }
    }
    return errc::remote_error;
}

// What a handler's exception answers: ordo's codes keep their code; a cancelled operation is
// errc::cancelled; anything else is errc::remote_error with the exception's message.
std::pair<errc, std::string> describe_current_exception() {
    try {
        throw;
    } catch (const std::system_error& e) {
        if (e.code().category() == error_category()) {
            // std::system_error appends ": <code message>"; the code travels on its own.
            std::string text = e.what();
            const std::string suffix = ": " + e.code().message();
            if (!dynamic_cast<const rpc_error*>(&e) && text.size() > suffix.size() &&
                text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0)
                text.resize(text.size() - suffix.size());
            return {static_cast<errc>(e.code().value()), text};
        }
        if (e.code() == net::error::operation_aborted)
            return {errc::cancelled, "handler cancelled"};
        return {errc::remote_error, e.what()};
    } catch (const std::exception& e) {
        return {errc::remote_error, e.what()};
    } catch (...) {
        return {errc::remote_error, "unknown exception"};
    }
}

}  // namespace

struct peer::state {
    using clock = std::chrono::steady_clock;

    struct pending_entry {
        std::unique_ptr<detail::pending_call> call;
        std::unique_ptr<net::steady_timer> timer;
        std::chrono::milliseconds timeout{0};
        bool is_ping = false;
    };
    struct running {
        std::uint32_t msgid = 0;
        bool is_request = false;
        bool serial = false;
        bool cancelled = false;
        net::cancellation_signal signal;
    };

    // A liveness probe: only its arrival matters.
    class ping_call final : public detail::pending_call {
      public:
        explicit ping_call(std::size_t& outstanding) : outstanding_(outstanding) {}
        void complete(std::error_code, call_outcome) override { --outstanding_; }
        bool takes_borrowed() const noexcept override { return true; }

      private:
        std::size_t& outstanding_;
    };

    state(peer& p, std::unique_ptr<transport> t, peer_options opt, const handlers* hs)
        : self(p),
          o(std::move(opt)),
          h(hs),
          ex(t->get_executor()),
          remote(t->remote_address()),
          next_id(o.first_msgid),
          closed_event(ex, clock::time_point::max()),
          live_timer(ex) {
        if (o.heartbeat_interval.count() <= 0)
            o.heartbeat_interval = std::max(std::chrono::milliseconds(1), o.liveness_timeout / 4);
        if (o.liveness_timeout.count() > 0) t->set_liveness(o.liveness_timeout);
        comm = std::make_unique<batched_comm>(
            std::move(t), o.comm, [this](std::string_view bytes) { on_message(bytes); },
            [this](const close_result& r) { on_comm_closed(r); });
    }

    ~state() {
        if (open) {
            open = false;
            close_code = errc::closed;
            close_reason = "ordo: peer " + remote + " destroyed";
            fail_all_pending();
        }
    }

    peer& self;
    peer_options o;
    const handlers* h;
    net::any_io_executor ex;
    std::string remote;
    std::unique_ptr<batched_comm> comm;

    detail::id_table<pending_entry> pending;
    std::unordered_set<std::uint32_t> abandoned;
    std::deque<std::uint32_t> abandoned_order;
    std::uint32_t next_id;

    msgpack::zone read_zone;  // every incoming message is decoded into it (reused)
    std::deque<message> queue;
    bool serial_busy = false;
    bool paused = false;
    std::list<running> runs;
    buffer scratch;

    bool open = true;
    bool ended = false;
    std::error_code close_code;
    std::string close_reason;
    peer_counters c;
    std::vector<std::function<void(const std::error_code&, const std::string&)>> closed_fns;
    net::steady_timer closed_event;

    net::steady_timer live_timer;
    bool live_armed = false;
    clock::time_point work_since{};
    clock::time_point last_ping{};
    std::size_t pings_pending = 0;

    // ---- liveness (DESIGN.md section 7) ----

    std::size_t calls_waiting() const { return pending.size() - pings_pending; }
    bool has_work() const { return calls_waiting() > 0 || !runs.empty(); }
    void count_pending() { c.pending_calls = calls_waiting(); }

    // Called whenever work may have started: arms the check if it is not armed yet.
    void note_work() {
        if (live_armed || !open || o.liveness_timeout.count() <= 0) return;
        live_armed = true;
        work_since = clock::now();
        arm_liveness(work_since + o.heartbeat_interval);
    }

    void arm_liveness(clock::time_point at) {
        live_timer.expires_at(at);
        std::weak_ptr<peer> w = self.weak_from_this();
        live_timer.async_wait([w](std::error_code ec) {
            if (ec) return;
            if (auto p = w.lock()) p->s_->check_liveness();
        });
    }

    void check_liveness() {
        live_armed = false;
        if (!open || !has_work()) return;
        const auto now = clock::now();
        const auto silent_since = std::max(comm->counters().last_receive, work_since);
        const auto silence = now - silent_since;
        if (silence >= o.liveness_timeout) {
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silence).count();
            comm->abort(errc::peer_lost, "no bytes from " + remote + " for " + std::to_string(ms) +
                                             " ms while " + std::to_string(calls_waiting()) +
                                             " calls were pending and " +
                                             std::to_string(runs.size()) + " handlers running");
            return;
        }
        if (silence >= o.heartbeat_interval && now - last_ping >= o.heartbeat_interval)
            send_ping(now);
        live_armed = true;
        arm_liveness(std::min(silent_since + o.liveness_timeout, now + o.heartbeat_interval));
    }

    void send_ping(clock::time_point now) {
        const std::uint32_t id = allocate_id();
        try {
            comm->send(request_head(id, "ordo.ping"), std::string_view("\x90", 1));
        } catch (const std::system_error&) {
            return;  // full or ending: the silence check decides
        }
        auto& e = pending.insert(id);
        e.call = std::make_unique<ping_call>(pings_pending);
        e.is_ping = true;
        ++pings_pending;
        ++c.pings_sent;
        last_ping = now;
    }

    void report_undelivered(const close_result& r) {
        for (const auto& bytes : r.undelivered) {
            try {
                message m = decode_message(bytes, o.comm.limits);
                if (m.kind != message_kind::notification) continue;
                ++c.notifications_undelivered;
                if (!o.on_undelivered) continue;
                buffer params;
                msgpack::pack(params, m.params);
                o.on_undelivered({std::string(m.method), std::string(params.data(), params.size()),
                                  r.code, r.reason});
            } catch (const std::exception&) {
                // Only this side's own encodings get here; nothing else to report.
            }
        }
    }

    // ---- calls made by this side ----

    std::uint32_t allocate_id() {
        std::uint32_t id;
        do id = next_id++;
        while (pending.contains(id) || abandoned.count(id) != 0);
        return id;
    }

    void complete(detail::pending_call& call, std::error_code ec, std::string detail) {
        call_outcome out;
        out.detail = std::move(detail);
        call.complete(ec, std::move(out));
        ++c.calls_completed;
    }

    void start_call(std::unique_ptr<detail::pending_call> call) {
        ++c.calls_started;
        if (!open) return complete(*call, close_code, close_reason);
        const std::uint32_t id = allocate_id();
        try {
            comm->send(request_head(id, call->method),
                       std::string_view(call->params.data(), call->params.size()));
        } catch (const std::system_error& e) {
            return complete(*call, e.code(), e.what());
        }
        call->params.clear();  // sent: the copy in the batch is enough
        auto& e = pending.insert(id);
        e.timeout = call->options.timeout.count() > 0 ? call->options.timeout : o.default_timeout;
        std::weak_ptr<peer> w = self.weak_from_this();
        if (e.timeout.count() > 0) {
            e.timer = std::make_unique<net::steady_timer>(ex, e.timeout);
            e.timer->async_wait([w, id](std::error_code ec) {
                if (ec) return;
                if (auto p = w.lock()) p->s_->expire(id, errc::timed_out);
            });
        }
        if (call->slot.is_connected()) {
            // Posted, never run inside emit(): expire() clears this very slot.
            call->slot.assign([w, id, ex = ex](net::cancellation_type) {
                net::post(ex, [w, id] {
                    if (auto p = w.lock()) p->s_->expire(id, errc::cancelled);
                });
            });
        }
        e.call = std::move(call);
        count_pending();
        note_work();
    }

    void abandon(std::uint32_t id) {
        abandoned.insert(id);
        abandoned_order.push_back(id);
        if (abandoned_order.size() > o.max_abandoned_ids) {
            abandoned.erase(abandoned_order.front());
            abandoned_order.pop_front();
        }
    }

    // A deadline passed or the caller cancelled: withdraw the call and tell the remote side.
    void expire(std::uint32_t id, errc why) {
        auto taken = pending.take(id);
        if (!taken) return;
        pending_entry e = std::move(*taken);
        count_pending();
        if (e.timer) e.timer->cancel();
        e.call->slot.clear();
        abandon(id);
        if (open) {
            try {
                buffer b;
                encode_notification(b, "ordo.cancel", id);
                comm->send(std::string_view(b.data(), b.size()));
            } catch (const std::system_error&) {
                // The connection is ending or full: the remote handler ends with it.
            }
        }
        complete(*e.call, why,
                 why == errc::timed_out
                     ? "no response within " + std::to_string(e.timeout.count()) + " ms"
                     : std::string("cancelled by the caller"));
    }

    void on_response(message m) {
        auto taken = pending.take(m.msgid);
        if (!taken) {
            if (abandoned.erase(m.msgid) != 0) return;  // a late answer to a withdrawn call
            throw_error(errc::protocol_error, "ordo: protocol error: response to msgid " +
                                                  std::to_string(m.msgid) +
                                                  ", which no call is waiting for");
        }
        pending_entry e = std::move(*taken);
        if (e.timer) e.timer->cancel();
        e.call->slot.clear();
        if (!e.call->takes_borrowed()) own(m);
        call_outcome out;
        std::error_code ec;
        if (m.error.is_nil())
            out.result = m.result;
        else
            ec = error_from_wire(m.error, out.detail);
        out.borrowed = m.borrowed;
        out.message = std::move(m.handle);
        // The handler may run now and drop the last reference to this peer.
        auto keep = self.shared_from_this();
        e.call->complete_inline(ec, std::move(out));
        count_pending();
        if (!e.is_ping) ++c.calls_completed;
    }

    void fail_all_pending() {
        auto calls = pending.take_all();
        abandoned.clear();
        abandoned_order.clear();
        c.pending_calls = 0;
        for (auto& [id, e] : calls) {
            if (e.timer) e.timer->cancel();
            e.call->slot.clear();
            if (e.is_ping)
                e.call->complete(close_code, {});
            else
                complete(*e.call, close_code, close_reason);
        }
        count_pending();
    }

    // ---- messages from the remote side ----

    void on_message(std::string_view bytes) {
        // Borrowed from read_zone: what outlives this call (a queued message, an async
        // handler's params, a raw result) is own()ed on the way.
        message m = decode_message(bytes, o.comm.limits, read_zone);
        if (m.kind == message_kind::response) return on_response(std::move(m));
        if (m.method.starts_with("ordo.")) return on_reserved(std::move(m));
        if (serial_busy || !queue.empty()) {
            own(m);
            queue.push_back(std::move(m));
            c.queued_messages = queue.size();
            if (!paused && queue.size() >= o.max_queued_messages) {
                paused = true;
                comm->pause_reading(true);
            }
            return;
        }
        dispatch(std::move(m));
    }

    void on_reserved(message m) {
        const bool req = m.kind == message_kind::request;
        if (m.method == "ordo.ping") {
            if (req) {
                buffer b;
                encode_response(b, m.msgid, msgpack::type::nil_t());
                send_response(b);
            }
        } else if (m.method == "ordo.cancel") {
            if (m.params.via.array.size == 1 &&
                m.params.via.array.ptr[0].type == msgpack::type::POSITIVE_INTEGER)
                cancel_handler(static_cast<std::uint32_t>(m.params.via.array.ptr[0].via.u64));
        } else if (req) {
            respond_error(m.msgid, errc::method_not_found,
                          "no method \"" + std::string(m.method) + "\" (reserved name)");
        }
    }

    void cancel_handler(std::uint32_t id) {
        for (auto& r : runs) {
            if (r.is_request && r.msgid == id && !r.cancelled) {
                r.cancelled = true;
                ++c.handlers_cancelled;
                r.signal.emit(net::cancellation_type::terminal);
                return;
            }
        }
        for (auto it = queue.begin(); it != queue.end(); ++it) {
            if (it->kind == message_kind::request && it->msgid == id) {
                queue.erase(it);
                c.queued_messages = queue.size();
                respond_error(id, errc::cancelled, "cancelled by the caller before it started");
                return;
            }
        }
    }

    void send_response(const buffer& b) {
        if (!open) return;
        try {
            comm->send(std::string_view(b.data(), b.size()));
        } catch (const std::system_error& e) {
            // Refusing a response would leave its caller waiting: end the connection loudly.
            if (e.code() == errc::overloaded) comm->abort(errc::overloaded);
        }
    }

    void respond_error(std::uint32_t id, errc code, const std::string& text) {
        buffer b;
        encode_error_response(b, id, code, text);
        send_response(b);
    }

    void dispatch(message m) {
        const bool req = m.kind == message_kind::request;
        const detail::handler_entry* e = h ? h->find(m.method) : nullptr;
        if (!e) {
            if (req)
                respond_error(m.msgid, errc::method_not_found,
                              "no method \"" + std::string(m.method) + "\"");
            else
                ++c.unknown_notifications;
            return;
        }
        if (e->sync) return run_sync(*e, m);
        start_async(*e, std::move(m));
    }

    void run_sync(const detail::handler_entry& e, const message& m) {
        const bool req = m.kind == message_kind::request;
        scratch.clear();
        if (req) response_head(scratch, m.msgid);
        try {
            e.sync(self, m.params, scratch);
        } catch (...) {
            auto [code, text] = describe_current_exception();
            scratch.clear();
            if (req)
                encode_error_response(scratch, m.msgid, code, text);
            else
                ++c.notification_errors;
        }
        if (req) {
            send_response(scratch);
            ++c.requests_served;
        } else {
            ++c.notifications_served;
        }
    }

    void start_async(const detail::handler_entry& e, message m) {
        own(m);  // the handler's params live as long as its coroutine
        auto& r = runs.emplace_back();
        r.msgid = m.msgid;
        r.is_request = m.kind == message_kind::request;
        r.serial = !e.concurrent;
        if (r.serial) serial_busy = true;
        c.running_handlers = runs.size();
        note_work();
        auto out = std::make_unique<buffer>();
        if (r.is_request) response_head(*out, m.msgid);
        // Creating the coroutine copies the handler into its frame: re-registering the name
        // while it runs is harmless.
        auto body = e.async(self, m.params, *out);
        net::co_spawn(ex,
                      run_handler(self.shared_from_this(), std::prev(runs.end()), std::move(m),
                                  std::move(out), std::move(body)),
                      net::bind_cancellation_slot(r.signal.slot(), [](std::exception_ptr) {}));
    }

    static net::awaitable<void> run_handler(std::shared_ptr<peer> keep,
                                            std::list<running>::iterator it, message m,
                                            std::unique_ptr<buffer> out,
                                            net::awaitable<void> body) {
        bool failed = false;
        std::pair<errc, std::string> why;
        try {
            co_await std::move(body);
        } catch (...) {
            failed = true;
            why = describe_current_exception();
        }
        keep->s_->finish_handler(it, m, *out, failed, why);
    }

    void finish_handler(std::list<running>::iterator it, const message& m, buffer& out, bool failed,
                        const std::pair<errc, std::string>& why) {
        const bool serial = it->serial;
        const bool req = it->is_request;
        runs.erase(it);
        c.running_handlers = runs.size();
        if (req) {
            if (failed) {
                out.clear();
                encode_error_response(out, m.msgid, why.first, why.second);
            }
            send_response(out);
            ++c.requests_served;
        } else {
            if (failed) ++c.notification_errors;
            ++c.notifications_served;
        }
        if (serial) {
            serial_busy = false;
            drain_queue();
        }
    }

    void drain_queue() {
        while (!serial_busy && !queue.empty() && open) {
            message m = std::move(queue.front());
            queue.pop_front();
            dispatch(std::move(m));
        }
        c.queued_messages = queue.size();
        if (paused && queue.size() <= o.max_queued_messages / 2) {
            paused = false;
            comm->pause_reading(false);
        }
    }

    // ---- the end ----

    void on_comm_closed(const close_result& r) {
        open = false;
        close_code = r.code;
        close_reason = r.reason;
        live_timer.cancel();
        fail_all_pending();
        report_undelivered(r);
        for (auto& run : runs) {
            if (run.cancelled) continue;
            run.cancelled = true;
            ++c.handlers_cancelled;
            run.signal.emit(net::cancellation_type::terminal);
        }
        queue.clear();
        c.queued_messages = 0;
        ended = true;
        closed_event.cancel();
        auto fns = std::move(closed_fns);
        for (auto& f : fns) f(close_code, close_reason);
    }
};

peer::peer(private_tag, std::unique_ptr<transport> t, peer_options o, const handlers* h)
    : s_(std::make_unique<state>(*this, std::move(t), std::move(o), h)) {}

peer::~peer() = default;

void peer::start() {
    s_->comm->start();
}

void peer::start_call(std::unique_ptr<detail::pending_call> call) {
    s_->start_call(std::move(call));
}

void peer::notify_raw(std::string_view method, std::string_view params) {
    if (!s_->open)
        throw std::system_error(s_->close_code, "ordo: notify " + std::string(method) + " to " +
                                                    s_->remote + " failed: " + s_->close_reason);
    s_->comm->send(notification_head(method), params);
}

const std::string& peer::remote_address() const noexcept {
    return s_->remote;
}
net::any_io_executor peer::get_executor() const {
    return s_->ex;
}

void peer::close() {
    s_->comm->close();
}
void peer::abort() {
    s_->comm->abort();
}

net::awaitable<void> peer::async_close() {
    close();
    co_await async_wait_closed();
}

net::awaitable<void> peer::async_drain() {
    auto keep = shared_from_this();
    co_await s_->comm->async_drain();
}

net::awaitable<std::pair<std::error_code, std::string>> peer::async_wait_closed() {
    auto keep = shared_from_this();
    while (!s_->ended) co_await s_->closed_event.async_wait(use_tuple);
    co_return std::make_pair(s_->close_code, s_->close_reason);
}

void peer::on_closed(std::function<void(const std::error_code&, const std::string&)> f) {
    if (s_->ended)
        f(s_->close_code, s_->close_reason);
    else
        s_->closed_fns.push_back(std::move(f));
}

bool peer::is_open() const noexcept {
    return s_->open;
}
const peer_counters& peer::counters() const noexcept {
    return s_->c;
}
const comm_counters& peer::comm() const noexcept {
    return s_->comm->counters();
}

std::shared_ptr<peer> make_peer(std::unique_ptr<transport> t) {
    return make_peer(std::move(t), peer_options{}, nullptr);
}

std::shared_ptr<peer> make_peer(std::unique_ptr<transport> t, peer_options o, const handlers* h) {
    return std::make_shared<peer>(peer::private_tag{}, std::move(t), std::move(o), h);
}

}  // namespace ordo
