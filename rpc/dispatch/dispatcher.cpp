// detail::dispatcher: the remote side's messages in arrival order (rpc/dispatch/dispatcher.hpp
// says which guarantees): the bounded queue, plain and coroutine handlers, cancellation. The
// reserved ordo.* methods are rpc/dispatch/reserved.cpp; streaming handlers' output is
// rpc/dispatch/dispatcher_stream.cpp.
#include "rpc/dispatch/dispatcher.hpp"

#include <algorithm>
#include <cstdlib>

#include "lib/escaped.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/peer.hpp"
#include "ordo/rpc/stream_call.hpp"
#include "rpc/dispatch/admission.hpp"
#include "rpc/context/context.hpp"
#include "rpc/context/spans.hpp"
#include "rpc/dispatch/stream_run.hpp"
#include "rpc/wire/errors.hpp"

namespace ordo::detail {

struct dispatcher::run {
    std::uint32_t msgid = 0;
    bool is_request = false;
    bool serial = false;
    bool pipelined = false;  // counted in pipelined_ (handler_entry::pipeline)
    bool cancelled = false;
    bool orphan = false;  // of a session that was lost: its answer is not sent
    // Shared: a handler may outlive the table it was registered in (a server destroyed while
    // a cancelled handler still unwinds).
    std::shared_ptr<method_counters> counters;
    std::chrono::steady_clock::time_point started;  // when handlers::time_calls is on
    net::cancellation_signal signal;
    stream_run* stream = nullptr;  // a streaming handler's output, while its body runs
    inbox* in = nullptr;           // a reading handler's input, while its body runs
    // For the access log (server_options::access_log) and spans, when it is observed.
    bool logged = false;
    std::size_t bytes_in = 0;
    std::chrono::steady_clock::time_point arrived, handler_started;
    std::shared_ptr<const call_context> ctx;
    // The limits it holds a slot of (handler_options::concurrency, server_options::concurrency),
    // given back when it ends, with how long it ran.
    // (They outlive the table: admission::make.)
    admission* method_limit = nullptr;
    admission* server_limit = nullptr;
    admission::seat* seat = nullptr;  // in a server limit shared among callers
    std::chrono::steady_clock::time_point admitted;  // set for one call in four: timed
    // Refused while it waited for a slot (server_options::shares): the answer's hint.
    std::uint64_t retry_after_ms = 0;
    bool over_share = false;
};

dispatcher::dispatcher(peer& self, net::any_io_executor ex, const handlers* h,
                       std::size_t max_queued_messages, std::size_t max_queued_bytes,
                       memory_budget* budget, dispatcher_host& host, peer_counters& c)
    : self_(self),
      h_(h),
      max_queued_(max_queued_messages),
      max_queued_bytes_(max_queued_bytes),
      budget_(budget),
      host_(host),
      c_(c),
      ex_(std::move(ex)) {}

dispatcher::~dispatcher() {
    if (budget_)
        for (const auto& q : queue_) budget_->release(q.held);
}

namespace {
bool is_stream_request(const message& m) {
    return m.kind == message_kind::request && m.method == "ordo.stream";
}
}  // namespace

dispatcher::arrival dispatcher::arrive(message& m, std::size_t bytes) {
    arrival a{nullptr, bytes, {}};
    if (m.meta.type != msgpack::type::NIL || (h_ && h_->access_log())) [[unlikely]] {
        // The clock is read for a deadline, the access log or a span; not for metadata alone.
        if (h_ && h_->access_log()) a.at = std::chrono::steady_clock::now();
        if (m.meta.type != msgpack::type::NIL) a.ctx = read_context(m, a.at, std::move(spare_ctx_));
        a.observed = observes(a.ctx.get());
        if (a.at == std::chrono::steady_clock::time_point{} && a.observed)
            a.at = std::chrono::steady_clock::now();
    }
    return a;
}

void dispatcher::on_message_slow(message& m, std::size_t bytes) {
    if (stopped_) return;
    // ordo.health_watch is a streaming handler of the table's (handlers::serve_health).
    if (m.method.starts_with("ordo.") && !is_stream_request(m) && m.method != "ordo.health_watch")
        return on_reserved(m, bytes);
    // Its deadline counts from its arrival, however long it then waits in the queue; so does
    // its duration in the access log.
    arrival a = arrive(m, bytes);
    if (serial_busy_ || !queue_.empty()) {
        own(m);
        // What it holds: its decoded copy (each msgpack object takes ~24 bytes, so a message
        // of many small values holds far more than its wire size). Its wire bytes are in the
        // read buffer, which is charged on its own and reused.
        const std::size_t held =
            sizeof(queued_message) + msgpack::aligned_zone_size(m.handle.get());
        queue_.push_back({std::move(m), std::move(a.ctx), a.at, bytes, held});
        queued_bytes_ += bytes;
        if (budget_) budget_->charge(held);
        c_.queued_messages = queue_.size();
        // Over the server's memory budget, a connection with a queue stops reading until the
        // queue has drained (its queue drains by itself; reading would only add to it).
        if (!paused_ && (queue_.size() >= max_queued_ || queued_bytes_ >= max_queued_bytes_ ||
                         (budget_ && budget_->over()))) {
            paused_ = true;
            host_.pause_reading(true);
        }
        return;
    }
    dispatch(m, std::move(a));
}

bool dispatcher::cancel_handler(std::uint32_t msgid) {
    bool had = false;
    for (auto& r : runs_) {
        had = had || (r.is_request && r.msgid == msgid);
        if (r.is_request && r.msgid == msgid && !r.cancelled) {
            r.cancelled = true;
            if (r.stream) r.stream->cancel();
            if (r.in) r.in->cancel();
            ++c_.handlers_cancelled;
            r.signal.emit(net::cancellation_type::terminal);
            return true;
        }
    }
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (it->m.kind == message_kind::request && it->m.msgid == msgid) {
            if (const handler_entry* e = h_ ? h_->find(it->m.method) : nullptr)
                e->counters->request_done(errc::cancelled);
            const message m = std::move(it->m);
            arrival a{std::move(it->ctx), it->wire, it->at};
            a.observed = observes(a.ctx.get());
            pop_queued(it);
            c_.queued_messages = queue_.size();
            refuse(m, a, errc::cancelled, "cancelled by the caller before it started");
            return true;
        }
    }
    return had;
}

void dispatcher::respond_error(std::uint32_t msgid, errc code, const std::string& text) {
    buffer b(small_buffer);
    encode_error_response(b, msgid, code, text);
    host_.send_response(b);
}

const handler_entry* dispatcher::find_and_remember(std::string_view method) {
    if (!h_) return nullptr;
    const std::size_t n = method.size();
    const handler_entry* e = h_->find(method);
    if (e && n > 0 && n <= sizeof(method_slot::name)) {
        method_slot& s =
            methods_[(n + static_cast<unsigned char>(method[n - 1])) % methods_.size()];
        s.e = e;
        s.size = static_cast<std::uint8_t>(n);
        std::copy(method.begin(), method.end(), s.name);
    }
    return e;
}

void dispatcher::on_context_message(message& m, std::size_t bytes) {
    if (stopped_ || serial_busy_ || !queue_.empty() || m.method.starts_with("ordo.")) [[unlikely]]
        return on_message_slow(m, bytes);
    // (No handler is direct while there is an access log.)
    const handler_entry* e = find(m.method);
    if (!e || !e->direct) [[unlikely]]
        return on_message_slow(m, bytes);
    // What dispatch_to does for such a handler, and no more (its deadline counts from now).
    arrival a = arrive(m, bytes);
    if (expired_already(a)) [[unlikely]]
        return expired(*e, m, a);
    run_plain(*e, m, a);
}

bool dispatcher::expired_already(const arrival& a) {
    return a.ctx && a.ctx->has_deadline() && a.ctx->deadline <= std::chrono::steady_clock::now();
}

void dispatcher::run_plain(const handler_entry& e, const message& m, arrival& a) {
    run_sync<true>(e, m, &a);
    // No one kept its context: the next request's reuses its memory.
    if (a.ctx && a.ctx.use_count() == 1)
        spare_ctx_ = std::const_pointer_cast<call_context>(std::move(a.ctx));
}

void dispatcher::dispatch(message& m, arrival a) {
    const bool req = m.kind == message_kind::request;
    stream_shape how;
    if (req && m.method.size() == 11 && m.method == "ordo.stream" && !unwrap_stream(m, how))
        return;
    dispatch_to(find(m.method), m, how, std::move(a));
}

void dispatcher::refuse(const message& m, const arrival& a, errc code, const std::string& text,
                        std::uint64_t retry_after_ms, bool over_share) {
    buffer b(small_buffer);
    if (retry_after_ms) [[unlikely]]
        encode_overloaded_response(b, m.msgid, text, retry_after_ms, over_share);
    else
        encode_error_response(b, m.msgid, code, text);
    host_.send_response(b);
    if (a.observed || spans_of(a.ctx.get())) [[unlikely]]
        log_access(m.method, a.ctx.get(), code,
                   {a.at, {}, {}, {}, a.at != span_times::time_point{}}, a.bytes, b.size());
}

bool dispatcher::spans_of(const call_context* ctx) noexcept {
    return ctx && !ctx->trace_id().empty() && recording_spans();
}

bool dispatcher::observes(const call_context* ctx) const noexcept {
    return (h_ && h_->access_log()) || (spans_of(ctx) && span_sampled(ctx->trace_id()));
}

void dispatcher::dispatch_plain(const handler_entry* e, message& m, std::size_t bytes) {
    dispatch_to(e, m, {}, arrival{nullptr, bytes, {}});
}

void dispatcher::dispatch_to(const handler_entry* e, message& m, stream_shape how, arrival a) {
    const bool req = m.kind == message_kind::request;
    // From on_message: a plain message is observed by the access log alone.
    if (!a.ctx) a.observed = observes(nullptr);
    if (!e) {
        if (h_) h_->count_unknown(req);
        if (req) {
            refuse(m, a, errc::method_not_found, "no method \"" + std::string(m.method) + "\"");
        } else {
            ++c_.unknown_notifications;
            report_dropped(m.method, errc::method_not_found, {});
        }
        return;
    }
    if (e->allow && !e->allow(self_.identity())) [[unlikely]]
        return deny(*e, m, a);
    if (req && expired_already(a)) [[unlikely]]
        return expired(*e, m, a);
    if (e->reads) {
        if (req && how.writes) return start_async(*e, m, how, std::move(a));
        const std::string why = "method \"" + std::string(m.method) +
                                "\" reads a stream of items from its caller: call it with "
                                "ordo.stream [method, params, window, window_bytes, true]";
        if (req) {
            e->counters->request_done(errc::bad_arguments);
            return refuse(m, a, errc::bad_arguments, why);
        }
        ++c_.notification_errors;
        e->counters->notification_done(true);
        return report_dropped(m.method, errc::bad_arguments, why);
    }
    if (how.writes) {
        e->counters->request_done(errc::bad_arguments);
        return refuse(m, a, errc::bad_arguments,
                      "method \"" + std::string(m.method) +
                          "\" reads no items from its caller: call it without ordo.stream's "
                          "fifth element");
    }
    if (e->stream) {
        if (req) return start_async(*e, m, how, std::move(a));
        ++c_.notification_errors;
        e->counters->notification_done(true);
        report_dropped(m.method, errc::bad_arguments,
                       "it streams its results: call it, do not notify it");
        return;
    }
    if (how.window) {
        e->counters->request_done(errc::bad_arguments);
        refuse(m, a, errc::bad_arguments,
               "method \"" + std::string(m.method) + "\" does not stream: call it as a plain call");
        return;
    }
    if (e->sync) return run_plain(*e, m, a);
    start_async(*e, m, {}, std::move(a));
}

template <bool Full>
void dispatcher::run_sync(const handler_entry& e, const message& m, const arrival* a) {
    const bool req = m.kind == message_kind::request;
    const call_context* ctx = Full ? a->ctx.get() : nullptr;
    // Taken before the handler runs: it may register its name again, which replaces `e` (the
    // counters carry over to the new entry).
    method_counters& counters = *e.counters;
    const bool timed = h_->time_calls();
    // (Handlers are not direct while there is an access log: the inline path never logs.)
    const bool logged = Full && a->observed;
    const auto started = timed || logged ? std::chrono::steady_clock::now()
                                         : std::chrono::steady_clock::time_point{};
    scratch_.clear();
    if (req) write_response_head(scratch_, m.msgid);
    bool failed = false;
    errc failure{};
    std::chrono::steady_clock::time_point ended{};
    try {
        if (Full && ctx) [[unlikely]] {
            context_scope scope(a->ctx);
            e.sync(self_, m.params, scratch_);
            if (logged) ended = std::chrono::steady_clock::now();
        } else {
            e.sync(self_, m.params, scratch_);
        }
    } catch (...) {
        failed = true;
        auto [code, text] = describe_current_exception();
        failure = code;
        scratch_.clear();
        if (req) {
            encode_error_response(scratch_, m.msgid, code, text);
            counters.request_done(code);
        } else {
            ++c_.notification_errors;
            report_dropped(m.method, code, text);
        }
    }
    if (req) {
        host_.send_response(scratch_);
        ++c_.requests_served;
        if (!failed) counters.request_done();
        if (logged) [[unlikely]]
            log_access(m.method, ctx, failed ? make_error_code(failure) : std::error_code{},
                       {a->at != std::chrono::steady_clock::time_point{} ? a->at : started,
                        started,
                        ended,
                        {}},
                       a->bytes, scratch_.size());
        else if (Full && failed && spans_of(ctx)) [[unlikely]]
            log_access(m.method, ctx, make_error_code(failure), {{}, {}, {}, {}, false}, a->bytes,
                       scratch_.size());
    } else {
        ++c_.notifications_served;
        counters.notification_done(failed);
    }
    if (timed) counters.took(std::chrono::steady_clock::now() - started);
}

// The inline path's (dispatcher.hpp, on_message) is called from other files.
template void dispatcher::run_sync<false>(const handler_entry&, const message&, const arrival*);

void dispatcher::start_async(const handler_entry& e, message& m, stream_shape how, arrival a) {
    const bool limited = (e.limit || h_->limit()) && !m.method.starts_with("ordo.");
    std::shared_ptr<admission::ticket> wait;
    if (limited && !admit(e, m, a, wait)) [[unlikely]]
        return;
    own(m);  // the handler's params live as long as its coroutine
    auto& r = runs_.emplace_back();
    if (limited) [[unlikely]] {
        r.method_limit = e.limit.get();
        r.server_limit = h_->limit().get();
        if (r.server_limit && r.server_limit->shared()) r.seat = seat_.get();
        // A call that waits is timed from when it is granted (run_handler).
        if (!wait && (limit_ticks_++ & 3) == 0) r.admitted = std::chrono::steady_clock::now();
    }
    r.msgid = m.msgid;
    r.is_request = m.kind == message_kind::request;
    r.serial = !e.concurrent;
    if (e.pipeline) [[unlikely]] {  // serial only once `pipeline` of them are out
        r.pipelined = true;
        r.serial = ++pipelined_ >= e.pipeline;
    }
    r.counters = e.counters;
    if (h_->time_calls()) r.started = std::chrono::steady_clock::now();
    // A handler that suspends costs far more than reading the clock: traced, it is timed.
    if (a.observed || spans_of(a.ctx.get())) [[unlikely]] {
        r.logged = true;
        r.bytes_in = a.bytes;
        r.handler_started = std::chrono::steady_clock::now();
        r.arrived = a.at != std::chrono::steady_clock::time_point{} ? a.at : r.handler_started;
        r.ctx = a.ctx;
    }
    auto ctx = std::move(a.ctx);
    if (r.serial) serial_busy_ = true;
    c_.running_handlers = runs_.size();
    host_.handler_started();
    auto out = std::make_unique<buffer>(small_buffer);
    if (r.is_request) write_response_head(*out, m.msgid);
    // Creating the coroutine copies the handler into its frame: re-registering the name while
    // it runs is harmless.
    net::awaitable<void> body;
    if (e.reads) {
        // Its caller's items are taken from now on (ordo.in_credit grants the window).
        auto in = std::make_unique<inbox>(*this, m.msgid, &r.in, how.grow_to);
        r.in = in.get();
        if (e.writes_items) {
            auto s = std::make_unique<stream_run>(*this, m.msgid, how.window, how.window_bytes,
                                                  &r.stream);
            r.stream = s.get();
            auto inner = e.reads(self_, m.params, *r.in, r.stream, *out);
            body = stream_body(std::move(s), inbox_body(std::move(in), std::move(inner)), *out);
        } else {
            auto inner = e.reads(self_, m.params, *r.in, nullptr, *out);
            body = inbox_body(std::move(in), std::move(inner));
        }
        r.in->open();
    } else if (e.stream) {
        auto s = std::make_unique<stream_run>(*this, m.msgid, how.window, how.window_bytes,
                                              &r.stream);
        r.stream = s.get();
        auto inner = e.stream(self_, m.params, *r.stream);
        body = stream_body(std::move(s), std::move(inner), *out);
    } else {
        body = e.async(self_, m.params, *out);
    }
    // run_handler catches what the body throws, and finish_handler throws nothing (a response
    // that cannot be sent ends the connection instead): no exception reaches the completion.
    auto handler = run_handler(this, host_.keep_alive(), std::prev(runs_.end()), std::move(m),
                               std::move(out), std::move(body), std::move(wait));
    auto done = net::bind_cancellation_slot(r.signal.slot(), [](std::exception_ptr) {});
    if (ctx) [[unlikely]] {
        // Spawned on an executor that sets the context each time the handler resumes.
        net::co_spawn(net::any_io_executor(context_executor(ex_, std::move(ctx))),
                      std::move(handler), std::move(done));
        return;
    }
    net::co_spawn(ex_, std::move(handler), std::move(done));
}

net::awaitable<void> dispatcher::run_handler(dispatcher* d, std::shared_ptr<void> keep,
                                             std::list<run>::iterator it, message m,
                                             std::unique_ptr<buffer> out,
                                             net::awaitable<void> body,
                                             std::shared_ptr<admission::ticket> wait) {
    bool failed = false;
    std::pair<errc, std::string> why;
    if (wait) [[unlikely]] {
        // Its caller's turn for a slot of the server's limit (server_options::shares).
        const auto now = co_await admission::wait(wait);
        if (now == admission::ticket::state::granted) {
            if ((d->limit_ticks_++ & 3) == 0) it->admitted = std::chrono::steady_clock::now();
        } else {
            // The body never runs: its frame (a stream's writer, an inbox) goes now, while its
            // run is still listed and `keep` holds the connection.
            { auto dropped = std::move(body); }
            // (Out of the coroutine: GCC 12 destroys some temporaries of a coroutine twice.)
            d->not_granted(it, m, *out, *wait);
            wait.reset();
            keep.reset();
            co_return;
        }
        wait.reset();
    }
    try {
        co_await std::move(body);
    } catch (...) {
        failed = true;
        why = describe_current_exception();
    }
    // `keep` holds the connection, and so `d`, until here.
    d->finish_handler(it, m, *out, failed, why);
    keep.reset();
}

void dispatcher::not_granted(std::list<run>::iterator it, const message& m, buffer& out,
                             admission::ticket& t) {
    it->server_limit = nullptr;  // it holds no slot
    std::pair<errc, std::string> why;
    if (t.now == admission::ticket::state::refused) {
        it->retry_after_ms = t.owner->retry_after_ms();
        it->over_share = t.over_share;
        why.first = errc::overloaded;
        why.second = std::move(t.why);
    } else {
        why.first = errc::cancelled;
        why.second = "call to \"" + std::string(m.method) +
                     "\" cancelled while it waited for a slot of the server's concurrency limit";
    }
    finish_handler(it, m, out, true, why);
}

void dispatcher::finish_handler(std::list<run>::iterator it, const message& m, buffer& out,
                                bool failed, const std::pair<errc, std::string>& why) {
    const bool serial = it->serial;
    if (it->pipelined) [[unlikely]]
        --pipelined_;
    const bool req = it->is_request;
    const bool orphan = it->orphan;
    const auto counters = std::move(it->counters);
    if (it->started != std::chrono::steady_clock::time_point{})
        counters->took(std::chrono::steady_clock::now() - it->started);
    const bool logged = it->logged;
    const std::size_t bytes_in = it->bytes_in;
    const span_times times{it->arrived,
                           it->handler_started,
                           logged ? std::chrono::steady_clock::now() : span_times::time_point{},
                           {}};
    const auto ctx = std::move(it->ctx);
    if (it->method_limit) [[unlikely]]
        it->method_limit->leave(it->admitted);
    if (it->server_limit) [[unlikely]] {
        if (it->seat)
            it->server_limit->leave_shared(*it->seat, it->admitted);
        else
            it->server_limit->leave(it->admitted);
    }
    const std::uint64_t retry_after_ms = it->retry_after_ms;
    const bool over_share = it->over_share;
    runs_.erase(it);
    c_.running_handlers = runs_.size();
    if (req && orphan) {
        // Its caller's session is gone: the answer has nobody to go to.
        counters->request_done(errc::cancelled);
    } else if (req) {
        if (failed) {
            out.clear();
            if (retry_after_ms) [[unlikely]]
                encode_overloaded_response(out, m.msgid, why.second, retry_after_ms, over_share);
            else
                encode_error_response(out, m.msgid, why.first, why.second);
            counters->request_done(why.first);
        } else {
            counters->request_done();
        }
        host_.send_response(out);
        ++c_.requests_served;
        if (logged) [[unlikely]]
            log_access(m.method, ctx.get(), failed ? make_error_code(why.first) : std::error_code{},
                       times, bytes_in, out.size());
    } else {
        if (failed) {
            ++c_.notification_errors;
            report_dropped(m.method, why.first, why.second);
        }
        ++c_.notifications_served;
        counters->notification_done(failed);
    }
    if (serial) {
        serial_busy_ = false;
        drain_queue();
    }
    host_.handler_finished();
}

void dispatcher::drain_queue() {
    while (!serial_busy_ && !queue_.empty() && !stopped_) {
        message m = std::move(queue_.front().m);
        arrival a{std::move(queue_.front().ctx), queue_.front().wire, queue_.front().at};
        a.observed = observes(a.ctx.get());
        pop_queued(queue_.begin());
        dispatch(m, std::move(a));
    }
    c_.queued_messages = queue_.size();
    if (paused_ && queue_.size() <= max_queued_ / 2 && queued_bytes_ <= max_queued_bytes_ / 2 &&
        (queue_.empty() || !budget_ || !budget_->over())) {
        paused_ = false;
        host_.pause_reading(false);
    }
}

void dispatcher::pop_queued(std::list<queued_message>::iterator it) {
    queued_bytes_ -= it->wire;
    if (budget_) budget_->release(it->held);
    queue_.erase(it);
}

void dispatcher::stop() {
    stopped_ = true;
    drop_all();
}

void dispatcher::restart() {
    for (auto& r : runs_) r.orphan = true;
    drop_all();
    if (paused_) {
        paused_ = false;
        host_.pause_reading(false);
    }
}

void dispatcher::drop_all() {
    for (auto& r : runs_) {
        if (r.cancelled) continue;
        r.cancelled = true;
        if (r.stream) r.stream->cancel();
        if (r.in) r.in->cancel();
        ++c_.handlers_cancelled;
        r.signal.emit(net::cancellation_type::terminal);
    }
    if (budget_)
        for (const auto& q : queue_) budget_->release(q.held);
    queue_.clear();
    queued_bytes_ = 0;
    c_.queued_messages = 0;
}

}  // namespace ordo::detail
