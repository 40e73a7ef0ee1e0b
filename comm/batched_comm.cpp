#include "comm/batched_comm_impl.hpp"

namespace ordo {

void batched_comm::impl::fail(std::error_code code, std::string reason) {
    set_reason(code, std::move(reason));
    if (st == state::ended) return;
    st = state::ended;
    t->close();
    writer_wake.cancel();
    reader_wake.cancel();
    partial_timer.cancel();
    quit_timer.cancel();
    changed.cancel();
    if (!started) finish();
}

void batched_comm::impl::fail_telling(std::error_code code, std::string reason) {
    std::string last;
    if (o.farewell && st == state::open) {
        try {
            last = o.farewell(code, reason);
        } catch (const std::exception&) {
            last.clear();
        }
    }
    if (last.empty()) return fail(code, std::move(reason));
    set_reason(code, std::move(reason));
    try {
        send(last);
    } catch (const std::system_error&) {
        return fail(code, result.reason);  // full: no room for last words
    }
    quitting = true;
    st = state::closing;
    wake_writer();
    reader_wake.cancel();
    quit_timer.expires_after(o.close_timeout);
    quit_timer.async_wait([w = weak_from_this()](std::error_code ec) {
        if (auto self = w.lock(); self && !ec) self->fail(errc::closed, {});
    });
}

void batched_comm::impl::admit(std::size_t size) {
    if (st != state::open) {
        auto code = has_reason ? result.code : make_error_code(errc::closed);
        throw rpc_error(code, {}, {},
                        "ordo: send to " + t->remote_address() +
                            " refused: " + (has_reason ? result.reason : "connection is closing"));
    }
    if (size > o.max_buffer_bytes - std::min(c.buffered_bytes, o.max_buffer_bytes))
        throw_error(errc::overloaded, "ordo: send to " + t->remote_address() +
                                          " refused: " + std::to_string(c.buffered_bytes) +
                                          " bytes buffered + " + std::to_string(size) +
                                          " would exceed max_buffer_bytes (" +
                                          std::to_string(o.max_buffer_bytes) + ")");
}

void batched_comm::impl::queued(std::size_t size) {
    queue_ends.push_back(queue.size());
    c.buffered_bytes += size;
    c.peak_buffered_bytes = std::max(c.peak_buffered_bytes, c.buffered_bytes);
    if (o.budget && queue.capacity() > charged_out) charge_out();
    if (writer_wait == wait::idle) {
        if (!direct) return wake_writer();
        if (rd == reader::delivering) {
            flush_due = true;
            return;
        }
        // A full batch goes now, from within this turn: a caller that queues many messages
        // without yielding (a loop of notifications) keeps the other side busy meanwhile.
        if (queue.size() >= o.max_batch_bytes) return flush();
        if (flush_posted) return;
        flush_posted = true;
        net::post(ex, [self = shared_from_this()] {
            self->flush_posted = false;
            self->flush();
            self->notify_written();
        });
    } else if (writer_wait == wait::interval && queue.size() >= o.max_batch_bytes) {
        wake_writer();
    } else if (room_wait && queue.size() >= retry_at && rd != reader::delivering) {
        continue_batch();
    }
}

void batched_comm::impl::send(std::string_view m, std::string_view body) {
    const std::size_t size = m.size() + body.size();
    admit(size);
    queue.append(m, body);
    queued(size);
}

void batched_comm::impl::send_held(std::string_view head, std::string_view body,
                                   std::unique_ptr<held_body> keep) {
    const std::size_t size = head.size() + body.size();
    admit(size);
    // A small body costs less to copy; one without an owner must be copied.
    if (body.size() < held_body_bytes || !keep) queue.append(head, body);
    else queue.append_held(head, body, std::move(keep));
    queued(size);
}

// The writer waits for room in the kernel's buffer, but a caller that goes on queueing without
// yielding keeps it from running: once per max_batch_bytes queued, send() writes what the
// kernel takes now. It may finish the batch and begin the next from the queue, or write both
// whole; the writer, when it wakes, goes on with whatever is left. room_wait stays set until
// then, so that the next send() writes again even if nothing was left.
void batched_comm::impl::continue_batch() {
    for (int k = 0; k < 2 && st == state::open && !handing; ++k) {  // the batch, then the queue
        if (writing.empty()) {
            if (queue.empty()) break;
            begin_batch(o.on_write ? clock::now() : clock::time_point{});
            c.write_since = clock::now();
        }
        std::error_code ec;
        try_write_batch(ec);
        if (!ec && written < writing.size()) break;
        if (end_batch(written, ec)) return;
    }
    // Counted from the queue as it is now: begin_batch() may just have emptied it.
    retry_at = queue.size() + o.max_batch_bytes;
}

void batched_comm::impl::flush() {
    if (writer_wait != wait::idle || queue.empty()) return;  // the writer is on it already
    if (st != state::open || handing) return wake_writer();
    // The clock is read for on_write only: without an interval nothing else needs the time.
    begin_batch(o.on_write ? clock::now() : clock::time_point{});
    std::error_code ec;
    std::size_t n;
    if (!writing.holds()) [[likely]] {
        n = t->try_write(writing.own(), ec);
    } else {
        try_write_batch(ec);
        n = written;
    }
    if (ec == net::error::operation_not_supported) {
        direct = false;
        return wake_writer();
    }
    if (n == writing.size() || ec) {
        if (!ec) ++c.direct_writes;
        end_batch(n, ec);
        return;
    }
    written = n;  // the kernel's buffer is full: the writer waits for room
    room_wait = true;
    retry_at = queue.size() + o.max_batch_bytes;
    wake_writer();
}

void batched_comm::impl::begin_batch(clock::time_point now) {
    queue.swap(writing);
    queue_ends.swap(writing_ends);
    written = 0;
    last_write_start = now;
    if (o.on_write) o.on_write({now, writing_ends.size(), writing.size()});
}

bool batched_comm::impl::end_batch(std::size_t n, const std::error_code& ec) {
    // Messages wholly handed to the transport count as sent; the rest go back.
    const std::size_t whole =
        ec ? std::size_t(std::upper_bound(writing_ends.begin(), writing_ends.end(), n) -
                         writing_ends.begin())
           : writing_ends.size();
    c.write_since = {};
    c.messages_sent += whole;
    c.bytes_sent += n;
    ++c.writes;
    c.buffered_bytes -= writing.size();
    charge_out();
    if (rd == reader::budget) reader_wake.cancel();  // it may wait for this output to drain
    if (ec) {
        hand_back(writing, writing_ends, whole);
        fail(errc::peer_lost, "ordo: write to " + t->remote_address() + " failed: " + ec.message());
    }
    writing.clear();
    writing_ends.clear();
    written = 0;
    // A burst must not pin its peak memory for the life of the connection.
    if (writing.capacity() > std::max<std::size_t>(4 * o.max_batch_bytes, 1 << 20)) {
        writing.release();
        std::vector<std::size_t>().swap(writing_ends);
    }
    if (drain_waiters > 0) changed.cancel();
    return bool(ec);
}

net::awaitable<void> batched_comm::impl::write_loop() {
    try {
        co_await write_batches();
    } catch (const std::exception& e) {
        fail(errc::closed, std::string("ordo: writer failed: ") + e.what());
    }
}

net::awaitable<void> batched_comm::impl::write_batches() {
    for (;;) {
        while (queue.empty() && writing.empty() && st == state::open && !handing) {
            room_wait = false;  // flush() set it, and send() wrote the batch meanwhile
            co_await sleep_writer(wait::idle, clock::time_point::max());
        }
        if (st == state::ended) break;
        if (writing.empty()) {  // else flush() began this batch and the kernel took a part
            if (queue.empty()) break;
            if (o.interval.count() > 0 && st == state::open) {
                const auto due = last_write_start + o.interval;
                while (st == state::open && queue.size() < o.max_batch_bytes && clock::now() < due)
                    co_await sleep_writer(wait::interval, due);
                if (st == state::ended) break;
            }
            begin_batch(clock::now());
            c.write_since = last_write_start;
        } else {
            c.write_since = clock::now();
        }
        if (direct && co_await write_in_steps()) break;
        if (writing.empty()) {
            notify_written();
            continue;
        }
        std::error_code ec;
        // A piece at a time: held bodies are pieces of their own.
        while (!ec && written < writing.size())
            written += co_await t->async_write(writing.piece(written), ec);
        if (end_batch(written, ec)) break;
        notify_written();
    }
    if (st != state::closing) co_return;
    // Flushed after close(): end our direction, then give the peer close_timeout to end its.
    t->shutdown_send();
    const auto deadline = clock::now() + o.close_timeout;
    while (rd != reader::done && st == state::closing && clock::now() < deadline)
        co_await sleep_writer(wait::peer_eof, deadline);
    fail(errc::closed, "ordo: connection to " + t->remote_address() + " closed by this side");
}

net::awaitable<bool> batched_comm::impl::write_in_steps() {
    while (!writing.empty()) {
        std::error_code ec;
        try_write_batch(ec);
        if (ec == net::error::operation_not_supported) {
            direct = false;
            co_return false;
        }
        if (ec || written == writing.size()) co_return end_batch(written, ec);
        // The kernel's buffer is full. send() may write while this waits (continue_batch).
        room_wait = true;
        retry_at = queue.size() + o.max_batch_bytes;
        std::tie(ec) = co_await t->async_wait_writable();
        room_wait = false;
        if (ec == net::error::operation_not_supported) {
            direct = false;
            co_return false;
        }
        if (writing.empty()) co_return st == state::ended;  // send() wrote it all meanwhile
        // Ended while waiting (the wait was cancelled): the batch's rest goes back, counted.
        if (st == state::ended && !ec) ec = net::error::operation_aborted;
        if (ec) co_return end_batch(written, ec);
    }
    co_return false;
}

void batched_comm::impl::hand_over_now() {
    auto done = std::move(handing);
    handing = nullptr;
    std::unique_ptr<transport> moved;
    if (st == state::open) {
        moved = std::move(t);
        t = detail::handed_transport(moved->remote_address(), moved->get_executor());
    }
    detached = true;
    finish();
    done(std::move(moved), std::move(leftover));
}

void batched_comm::impl::finish() {
    hand_back(queue, queue_ends, 0);
    // Their memory goes now, not when the owner lets go of this object.
    queue.release();
    std::vector<std::size_t>().swap(queue_ends);
    writing.release();
    std::vector<std::size_t>().swap(writing_ends);
    c.buffered_bytes = 0;
    if (o.budget) {
        o.budget->adjust(charged_out, 0);
        o.budget->adjust(charged_read, 0);
    }
    st = state::ended;
    finished = true;
    set_reason(errc::closed, "ordo: connection to " + t->remote_address() + " closed");
    t->close();
    changed.cancel();
    if (!detached && on_closed) on_closed(result);
}

batched_comm::batched_comm(std::unique_ptr<transport> t, comm_options options,
                           message_fn on_message, closed_fn on_closed)
    : impl_(std::make_shared<impl>(std::move(t), std::move(options), std::move(on_message),
                                   std::move(on_closed))),
      state_(&impl_->st) {}

batched_comm::~batched_comm() {
    impl_->detached = true;
    if (!impl_->finished && !impl_->handing)
        impl_->fail(errc::closed,
                    "ordo: connection to " + impl_->t->remote_address() + " destroyed");
}

void batched_comm::take_messages_with(taker_fn f) {
    impl_->taker = std::move(f);
}

void batched_comm::on_end_of_stream(std::function<bool()> f) {
    impl_->on_eof = std::move(f);
}

void batched_comm::start() {
    if (impl_->started || impl_->finished) return;
    impl_->started = true;
    using namespace net::experimental::awaitable_operators;
    auto self = impl_;
    net::co_spawn(
        self->t->get_executor(),
        [self]() -> net::awaitable<void> { co_await (self->read_loop() && self->write_loop()); },
        [self](std::exception_ptr) {
            if (self->handing)
                self->hand_over_now();
            else
                self->finish();
        });
}

void batched_comm::preload(std::string_view bytes) {
    if (bytes.empty() || impl_->started) return;
    impl_->framer.feed(bytes);
    impl_->preloaded = true;
}

void batched_comm::hand_over(handed_fn done) {
    impl_->handing = std::move(done);
}

void batched_comm::send(std::string_view message) {
    impl_->send(message);
}
void batched_comm::send(std::string_view head, std::string_view body) {
    impl_->send(head, body);
}
void batched_comm::send(std::string_view head, std::string_view body,
                        std::unique_ptr<held_body> keep) {
    impl_->send_held(head, body, std::move(keep));
}

void batched_comm::set_limits(const limits& l) {
    impl_->o.limits = l;
    impl_->framer.set_limits(l);
}

void batched_comm::want_written(bool on) noexcept {
    impl_->want_written = on;
}

void batched_comm::pause_reading(bool paused) {
    impl_->paused = paused;
    if (!paused && impl_->rd == impl::reader::parked) impl_->reader_wake.cancel();
}

net::awaitable<void> batched_comm::async_drain() {
    auto self = impl_;
    ++self->drain_waiters;
    while (self->st != impl::state::ended && self->c.buffered_bytes > self->o.high_water_bytes)
        co_await self->changed.async_wait(use_tuple);
    --self->drain_waiters;
    if (self->st == impl::state::ended)
        throw std::system_error(self->result.code, self->result.reason);
}

void batched_comm::close() {
    if (impl_->st != impl::state::open) return;
    impl_->st = impl::state::closing;
    impl_->wake_writer();
}

void batched_comm::abort(std::error_code code) {
    impl_->fail(code,
                "ordo: connection to " + impl_->t->remote_address() + " aborted by this side");
}

void batched_comm::abort(std::error_code code, std::string reason) {
    impl_->fail(code, std::move(reason));
}

net::awaitable<close_result> batched_comm::async_close() {
    close();
    co_return co_await async_wait_closed();
}

net::awaitable<close_result> batched_comm::async_wait_closed() {
    auto self = impl_;
    while (!self->finished) co_await self->changed.async_wait(use_tuple);
    co_return self->result;
}

const close_result* batched_comm::ended() const noexcept {
    return impl_->st == impl::state::ended ? &impl_->result : nullptr;
}
const std::string& batched_comm::remote_address() const noexcept {
    return impl_->t->remote_address();
}
const comm_counters& batched_comm::counters() const noexcept {
    return impl_->c;
}

}  // namespace ordo
