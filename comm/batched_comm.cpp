#include "ordo/batched_comm.hpp"

#include <algorithm>

#include "comm/framing.hpp"
#include "comm/transports.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "ordo/error.hpp"

namespace ordo {

using clock = std::chrono::steady_clock;


// The state shared by the public object and the two coroutines; the coroutines hold it alive
// until they end, so destroying the batched_comm never leaves them with a dangling pointer.
struct batched_comm::impl : std::enable_shared_from_this<batched_comm::impl> {
    enum class state { open, closing, ended };
    enum class wait { none, idle, interval, peer_eof };

    impl(std::unique_ptr<transport> tr, comm_options opt, message_fn m, closed_fn c)
        : t(std::move(tr)),
          o(std::move(opt)),
          on_message(std::move(m)),
          on_closed(std::move(c)),
          writer_wake(t->get_executor(), clock::time_point::max()),
          changed(t->get_executor(), clock::time_point::max()),
          framer(o.limits) {}

    std::unique_ptr<transport> t;
    comm_options o;
    message_fn on_message;
    taker_fn taker;
    closed_fn on_closed;
    net::steady_timer writer_wake;  // the writer sleeps on it; cancel() wakes it
    net::steady_timer changed;      // drain and close waiters sleep on it

    // Messages are kept back to back in one byte vector, with their end offsets beside: one
    // allocation per batch rather than per message, and one contiguous buffer per write.
    std::vector<char> queue, writing;
    std::vector<std::size_t> queue_ends, writing_ends;

    state st = state::open;
    wait writer_wait = wait::none;
    bool started = false, finished = false, detached = false, reader_done = false;
    bool paused = false, reader_paused = false;
    net::steady_timer reader_wake{t->get_executor(), clock::time_point::max()};
    bool has_reason = false;
    // hand_over(): where the connection goes once both loops have stopped, and the bytes read
    // past the last message delivered. preload(): bytes to deliver before reading.
    handed_fn handing;
    std::string leftover;
    bool preloaded = false;
    int drain_waiters = 0;
    clock::time_point last_write_start{};
    close_result result;
    comm_counters c;
    detail::framer framer;
    // Reads adapt between these (adapt_read_size).
    const std::size_t max_read_size = std::max<std::size_t>(1, o.read_chunk_bytes);
    const std::size_t min_read_size = std::min<std::size_t>(2048, max_read_size);
    std::size_t read_size = min_read_size;
    // message_timeout: since when the incomplete message now buffered has been waited for
    // (epoch: none is), and the timer that checks it.
    clock::time_point partial_since{};
    net::steady_timer partial_timer{t->get_executor()};
    bool partial_armed = false;
    // comm_options::budget: what this connection has charged to it, whether the reader waits
    // for it, and whether a wake-up is registered with it.
    static constexpr std::size_t budget_floor = 32 * 1024;
    static constexpr std::size_t out_step = 64 * 1024;  // output is charged in these steps
    std::size_t charged_read = 0, charged_out = 0;
    bool budget_wait = false, budget_registered = false;

    void charge_read() {
        if (o.budget) o.budget->adjust(charged_read, framer.capacity());
    }
    // Output is charged in whole steps, so that send() touches the shared counter once per
    // out_step bytes rather than once per message.
    void charge_out() {
        if (!o.budget) return;
        // What the two output vectors hold, not what is in them: they grow by doubling.
        const std::size_t held = queue.capacity() + writing.capacity();
        const std::size_t want = (held + out_step - 1) / out_step * out_step;
        if (want != charged_out) o.budget->adjust(charged_out, want);
    }

    void set_reason(std::error_code code, std::string reason) {
        if (has_reason) return;
        has_reason = true;
        result.code = code;
        result.reason = std::move(reason);
    }

    // Ends the connection now: both loops see it at their next step.
    void fail(std::error_code code, std::string reason) {
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

    // fail() for a fault of the peer's (protocol error, broken limit): with comm_options::
    // farewell, tells the peer why first (after what is queued), reads nothing more, and ends
    // once that is written or close_timeout has passed.
    bool quitting = false;
    net::steady_timer quit_timer{t->get_executor()};
    void fail_telling(std::error_code code, std::string reason) {
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

    void wake_writer() {
        writer_wait = wait::none;
        writer_wake.cancel();
    }

    net::awaitable<void> sleep_writer(wait why, clock::time_point until) {
        writer_wait = why;
        writer_wake.expires_at(until);
        co_await writer_wake.async_wait(use_tuple);
        writer_wait = wait::none;
    }

    void send(std::string_view m, std::string_view body = {}) {
        if (st != state::open) {
            auto code = has_reason ? result.code : make_error_code(errc::closed);
            throw rpc_error(code, {}, {},
                            "ordo: send to " + t->remote_address() + " refused: " +
                                (has_reason ? result.reason : "connection is closing"));
        }
        const std::size_t size = m.size() + body.size();
        if (size > o.max_buffer_bytes - std::min(c.buffered_bytes, o.max_buffer_bytes))
            throw_error(errc::overloaded, "ordo: send to " + t->remote_address() +
                                              " refused: " + std::to_string(c.buffered_bytes) +
                                              " bytes buffered + " + std::to_string(size) +
                                              " would exceed max_buffer_bytes (" +
                                              std::to_string(o.max_buffer_bytes) + ")");
        queue.insert(queue.end(), m.begin(), m.end());
        queue.insert(queue.end(), body.begin(), body.end());
        queue_ends.push_back(queue.size());
        c.buffered_bytes += size;
        c.peak_buffered_bytes = std::max(c.peak_buffered_bytes, c.buffered_bytes);
        if (o.budget && queue.capacity() > charged_out) charge_out();
        if (writer_wait == wait::idle ||
            (writer_wait == wait::interval && queue.size() >= o.max_batch_bytes))
            wake_writer();
    }

    // Moves messages [first, ends.size()) of a batch to the undelivered list.
    void hand_back(const std::vector<char>& bytes, const std::vector<std::size_t>& ends,
                   std::size_t first) {
        std::size_t begin = first == 0 ? 0 : ends[first - 1];
        for (std::size_t i = first; i < ends.size(); ++i) {
            const std::string_view m(bytes.data() + begin, ends[i] - begin);
            if (!o.keep_undelivered || o.keep_undelivered(m)) result.undelivered.emplace_back(m);
            begin = ends[i];
        }
    }

    net::awaitable<void> write_loop() {
        try {
            co_await write_batches();
        } catch (const std::exception& e) {
            fail(errc::closed, std::string("ordo: writer failed: ") + e.what());
        }
    }

    net::awaitable<void> write_batches() {
        for (;;) {
            while (queue.empty() && st == state::open && !handing)
                co_await sleep_writer(wait::idle, clock::time_point::max());
            if (st == state::ended || queue.empty()) break;
            if (o.interval.count() > 0 && st == state::open) {
                const auto due = last_write_start + o.interval;
                while (st == state::open && queue.size() < o.max_batch_bytes && clock::now() < due)
                    co_await sleep_writer(wait::interval, due);
                if (st == state::ended) break;
            }
            queue.swap(writing);
            queue_ends.swap(writing_ends);
            last_write_start = clock::now();
            if (o.on_write) o.on_write({last_write_start, writing_ends.size(), writing.size()});

            std::error_code ec;
            c.write_since = last_write_start;
            const std::size_t n = co_await t->async_write(net::buffer(writing), ec);
            c.write_since = {};
            // Messages wholly handed to the transport count as sent; the rest go back.
            const std::size_t whole =
                ec ? std::size_t(std::upper_bound(writing_ends.begin(), writing_ends.end(), n) -
                                 writing_ends.begin())
                   : writing_ends.size();
            c.messages_sent += whole;
            c.bytes_sent += n;
            ++c.writes;
            c.buffered_bytes -= writing.size();
            charge_out();
            if (budget_wait) reader_wake.cancel();  // it may wait for this output to drain
            if (ec) {
                hand_back(writing, writing_ends, whole);
                fail(errc::peer_lost,
                     "ordo: write to " + t->remote_address() + " failed: " + ec.message());
            }
            writing.clear();
            writing_ends.clear();
            // A burst must not pin its peak memory for the life of the connection.
            if (writing.capacity() > std::max<std::size_t>(4 * o.max_batch_bytes, 1 << 20)) {
                std::vector<char>().swap(writing);
                std::vector<std::size_t>().swap(writing_ends);
            }
            if (drain_waiters > 0) changed.cancel();
            if (ec) break;
        }
        if (st != state::closing) co_return;
        // Flushed after close(): end our direction, then give the peer close_timeout to end its.
        t->shutdown_send();
        const auto deadline = clock::now() + o.close_timeout;
        while (!reader_done && st == state::closing && clock::now() < deadline)
            co_await sleep_writer(wait::peer_eof, deadline);
        fail(errc::closed, "ordo: connection to " + t->remote_address() + " closed by this side");
    }

    net::awaitable<void> read_loop() {
        try {
            co_await read_messages();
        } catch (const std::system_error& e) {
            std::string why = e.what() + std::string(" (from ") + t->remote_address() + ")";
            if (e.code() == errc::protocol_error)
                fail_telling(e.code(), std::move(why));
            else
                fail(e.code(), std::move(why));
        } catch (const std::exception& e) {
            fail(errc::protocol_error, "ordo: message handler failed: " + std::string(e.what()) +
                                           " (from " + t->remote_address() + ")");
        }
        reader_done = true;
        if (writer_wait == wait::peer_eof) wake_writer();
    }

    net::awaitable<void> read_messages() {
        if (preloaded) {
            bool took = false;
            while (deliver_some(took)) co_await net::post(t->get_executor(), net::use_awaitable);
            if (!handing) delivered(took);
        }
        while (st != state::ended && !quitting && !handing) {
            while (paused && st != state::ended && !quitting) {
                reader_paused = true;
                co_await reader_wake.async_wait(use_tuple);
                reader_paused = false;
            }
            if (st == state::ended || quitting) break;
            // The budget's common case (room for the read) costs one load, not a coroutine.
            read_plan plan{read_size};
            if (o.budget && o.budget->over(framer.capacity_for(read_size) - framer.capacity()))
                plan = co_await budgeted_read();
            if (st == state::ended) break;
            auto area = framer.prepare(plan.size, plan.max_capacity);
            charge_read();
            std::error_code ec;
            const std::size_t n =
                co_await t->async_read_some(net::buffer(area.data(), area.size()), ec);
            if (ec == net::error::eof) {
                try {
                    framer.finish();  // throws if the stream ended inside a message
                } catch (const std::system_error& e) {
                    // What a dropped connection looks like (a proxy or NAT giving up mid-way),
                    // not bad bytes: lost, so that a resumable session resumes.
                    fail(errc::peer_lost,
                         e.what() + std::string(" (from ") + t->remote_address() + ")");
                    co_return;
                }
                if (st == state::open)
                    fail(errc::peer_lost,
                         "ordo: peer " + t->remote_address() + " closed the connection");
                co_return;
            }
            if (ec) {
                fail(errc::peer_lost,
                     "ordo: read from " + t->remote_address() + " failed: " + ec.message());
                co_return;
            }
            if (quitting) break;  // told the peer why it is closed: what it sent since is dropped
            framer.commit(n);
            adapt_read_size(n);
            c.bytes_received += n;
            c.last_receive = clock::now();
            bool took = false;
            while (deliver_some(took)) co_await net::post(t->get_executor(), net::use_awaitable);
            if (handing) break;
            delivered(took);
        }
    }

    // Passes on the whole messages the framer holds (`took`: any). True when it stopped after
    // messages_per_turn of them so that the writer may run first: yield, then call it again.
    bool deliver_some(bool& took) {
        std::size_t turn = 0;
        while (st != state::ended && !quitting) {
            // The taker takes the common message in one pass; the framer cuts what it declines
            // (not all there, another shape, over a limit). Counted while handled, either way.
            ++c.messages_received;
            std::size_t taken = 0;
            if (taker && !detached && framer.at_message_start())
                taken = taker(framer.unread(), o.limits);
            if (taken > 0) {
                framer.skip(taken);
            } else {
                auto m = framer.next();
                if (!m) {
                    --c.messages_received;
                    return false;
                }
                if (!detached) on_message(*m);
            }
            took = true;
            if (handing) {
                leftover.assign(framer.unread());
                wake_writer();
                return false;
            }
            // These messages' handlers queued replies: let the writer start writing them now,
            // or finish its write and take them. (`m` is not used after.)
            if (++turn == o.messages_per_turn) {
                turn = 0;
                if (!queue.empty() && writer_wait != wait::interval && st == state::open)
                    return true;
            }
        }
        return false;
    }

    // After the messages of a read were passed on.
    void delivered(bool took) {
        watch_partial(took);
        // A buffer grown for a large message or a burst goes back to the read size.
        if (framer.buffered() == 0) framer.trim(2 * read_size);
        c.read_buffer_bytes = framer.capacity();
        charge_read();
    }

    // Both loops stopped for hand_over(): the transport goes to its new owner, not closed.
    void hand_over_now() {
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

    struct read_plan {
        std::size_t size;                     // to ask of the transport
        std::size_t max_capacity = SIZE_MAX;  // for the read buffer, if it has to grow
    };

    // What the next read may take under comm_options::budget (see there); waits while it may
    // take nothing. Returns size 0 only when the connection has ended.
    net::awaitable<read_plan> budgeted_read() {
        detail::memory_budget& b = *o.budget;
        while (st != state::ended && !quitting) {
            const std::size_t cap = framer.capacity();
            if (!b.over(framer.capacity_for(read_size) - cap)) co_return read_plan{read_size};
            const bool exhausted = b.over();
            const bool output_held = c.buffered_bytes > budget_floor;
            if (!(output_held && exhausted)) {
                // Doubling does not fit: grow by what does, if that is enough for one read.
                const std::size_t used = b.used();
                const std::size_t room = used < b.limit() ? b.limit() - used : 0;
                if (framer.capacity_for(read_size, 0) - cap <= room)
                    co_return read_plan{read_size, cap + room};
                if (framer.space() > 0) co_return read_plan{std::min(read_size, framer.space())};
                if (framer.capacity_for(min_read_size) <= budget_floor)
                    co_return read_plan{min_read_size};
            }
            // Wait for room (or for this connection's own output to drain: the writer wakes
            // the reader after every write while it waits).
            const std::size_t need =
                output_held && exhausted ? 0 : framer.capacity_for(read_size, 0) - cap;
            if (!budget_registered) {
                auto wake = [w = weak_from_this(), ex = t->get_executor()] {
                    net::post(ex, [w] {
                        if (auto self = w.lock()) {
                            self->budget_registered = false;
                            self->reader_wake.cancel();
                        }
                    });
                };
                if (!b.wait_for(need, std::move(wake))) continue;
                budget_registered = true;
            }
            ++c.budget_waits;
            budget_wait = true;
            co_await reader_wake.async_wait(use_tuple);
            budget_wait = false;
        }
        co_return read_plan{0};
    }

    // A full read means a burst: the next read takes up to read_chunk_bytes, so that a burst
    // after an idle spell costs two reads, not a doubling series. Reads under a quarter full
    // halve it, down to 2 KiB: an idle connection waits with a small buffer.
    void adapt_read_size(std::size_t n) {
        if (n == read_size)
            read_size = max_read_size;
        else if (n < read_size / 4)
            read_size = std::max(read_size / 2, min_read_size);
    }

    // After a read: starts or ends the wait for the incomplete message left in the framer (a
    // new one if this read completed others).
    void watch_partial(bool took) {
        if (framer.buffered() == 0) {
            partial_since = {};
            return;
        }
        if (took || partial_since == clock::time_point{}) partial_since = c.last_receive;
        if (o.message_timeout.count() <= 0 || partial_armed) return;
        partial_armed = true;
        partial_timer.expires_at(partial_since + o.message_timeout);
        partial_timer.async_wait([w = weak_from_this()](std::error_code ec) {
            if (ec) return;
            if (auto self = w.lock()) self->check_partial();
        });
    }

    void check_partial() {
        partial_armed = false;
        if (st == state::ended || partial_since == clock::time_point{}) return;
        const auto now = clock::now();
        if (paused) partial_since = now;  // the owner holds the reader back: not the peer's delay
        if (now - partial_since >= o.message_timeout) {
            std::string why = "ordo: protocol error: " + std::to_string(framer.buffered()) +
                              " bytes of an incomplete message from " + t->remote_address() +
                              ", not completed within message_timeout (" +
                              std::to_string(o.message_timeout.count()) + " ms)";
            if (budget_wait)
                why += "; it was waiting for room in the memory budget (" +
                       std::to_string(o.budget->used()) + " of " +
                       std::to_string(o.budget->limit()) + " bytes used)";
            fail_telling(errc::protocol_error, std::move(why));
            return;
        }
        watch_partial(false);
    }

    void finish() {
        hand_back(queue, queue_ends, 0);
        // Their memory goes now, not when the owner lets go of this object.
        std::vector<char>().swap(queue);
        std::vector<std::size_t>().swap(queue_ends);
        std::vector<char>().swap(writing);
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
};

batched_comm::batched_comm(std::unique_ptr<transport> t, comm_options options,
                           message_fn on_message, closed_fn on_closed)
    : impl_(std::make_shared<impl>(std::move(t), std::move(options), std::move(on_message),
                                   std::move(on_closed))) {}

batched_comm::~batched_comm() {
    impl_->detached = true;
    if (!impl_->finished && !impl_->handing)
        impl_->fail(errc::closed,
                    "ordo: connection to " + impl_->t->remote_address() + " destroyed");
}

void batched_comm::take_messages_with(taker_fn f) {
    impl_->taker = std::move(f);
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

void batched_comm::pause_reading(bool paused) {
    impl_->paused = paused;
    if (!paused && impl_->reader_paused) impl_->reader_wake.cancel();
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

bool batched_comm::is_closing() const noexcept {
    return impl_->st != impl::state::open;
}
const std::string& batched_comm::remote_address() const noexcept {
    return impl_->t->remote_address();
}
const comm_counters& batched_comm::counters() const noexcept {
    return impl_->c;
}

}  // namespace ordo
