// batched_comm's reading side: the read loop, delivery to the taker and on_message, the
// memory budget's hold on reads, and the wait for an incomplete message.
#include "comm/batched_comm_impl.hpp"

namespace ordo {
namespace {

// The framer whose messages this thread is delivering (deliver_some), for keep_delivered.
thread_local detail::framer* delivering = nullptr;

}  // namespace

std::shared_ptr<const kept_bytes> keep_delivered(std::string_view part) {
    if (!delivering || part.size() < kept_bytes_min) return nullptr;
    return delivering->lend(part);
}

net::awaitable<void> batched_comm::impl::read_loop() {
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
    flush_delivered();  // a handler that threw may have sent first
    rd = reader::done;
    if (writer_wait == wait::peer_eof) wake_writer();
}

net::awaitable<void> batched_comm::impl::read_messages() {
    if (preloaded) {
        bool took = false;
        while (deliver_some(took)) co_await net::post(ex, net::use_awaitable);
        flush_delivered();
        if (!handing) delivered(took);
    }
    while (st != state::ended && !quitting && !handing) {
        while (paused && st != state::ended && !quitting) {
            rd = reader::parked;
            co_await reader_wake.async_wait(use_tuple);
            rd = reader::reading;
        }
        if (st == state::ended || quitting) break;
        // The budget's common case (room for the read) costs one load, not a coroutine.
        read_plan plan{read_size};
        if (o.budget) {
            if (o.budget->over(grows_by(read_size)))
                plan = co_await budgeted_read();
            else  // a spare buffer larger than asked for must fit too
                plan.max_capacity = framer.capacity() + budget_room();
        }
        if (st == state::ended || quitting) break;
        auto area = framer.read_area(plan.size, plan.max_capacity);
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
            // A half-close the owner serves to its end (answers still go out), or the end.
            if (st == state::open && !(on_eof && on_eof()))
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
        while (deliver_some(took)) co_await net::post(ex, net::use_awaitable);
        flush_delivered();
        if (handing) break;
        delivered(took);
    }
}

bool batched_comm::impl::deliver_some(bool& took) {
    // What a handler kept of the messages in place (keep_delivered) is given its buffer as
    // this returns or throws, before the framer reads or moves anything again.
    struct delivery {
        detail::framer& f;
        detail::framer* outer = std::exchange(delivering, &f);
        ~delivery() {
            delivering = outer;
            if (f.lending()) f.settle();
        }
    } scope{framer};
    std::size_t turn = 0;
    rd = reader::delivering;
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
            if (!queue.empty() && writer_wait != wait::interval && st == state::open) {
                flush_delivered();
                return true;
            }
        }
    }
    return false;
}

void batched_comm::impl::delivered(bool took) {
    watch_partial(took);
    // A buffer grown for a large message or a burst goes back to the read size.
    if (framer.buffered() == 0) framer.trim(2 * read_size);
    c.read_buffer_bytes = framer.capacity();
    charge_read();
}

net::awaitable<batched_comm::impl::read_plan> batched_comm::impl::budgeted_read() {
    detail::memory_budget& b = *o.budget;
    while (st != state::ended && !quitting) {
        const std::size_t cap = framer.capacity();
        if (!b.over(grows_by(read_size))) co_return read_plan{read_size, cap + budget_room()};
        const bool exhausted = b.over();
        const bool output_held = c.buffered_bytes > budget_floor;
        if (!(output_held && exhausted)) {
            // Doubling does not fit: grow by what does, if that is enough for one read.
            const std::size_t room = budget_room();
            if (grows_by(read_size, 0) <= room) co_return read_plan{read_size, cap + room};
            if (framer.space() > 0)
                co_return read_plan{std::min(read_size, framer.space()), framer.capacity()};
            if (framer.capacity_for(min_read_size) <= budget_floor)
                co_return read_plan{min_read_size};
        }
        // Wait for room (or for this connection's own output to drain: the writer wakes
        // the reader after every write while it waits).
        const std::size_t need = output_held && exhausted ? 0 : grows_by(read_size, 0);
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
        rd = reader::budget;
        co_await reader_wake.async_wait(use_tuple);
        rd = reader::reading;
    }
    co_return read_plan{0};
}

void batched_comm::impl::watch_partial(bool took) {
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

void batched_comm::impl::check_partial() {
    partial_armed = false;
    if (st == state::ended || partial_since == clock::time_point{}) return;
    const auto now = clock::now();
    if (paused) partial_since = now;  // the owner holds the reader back: not the peer's delay
    if (now - partial_since >= o.message_timeout) {
        std::string why = "ordo: protocol error: " + std::to_string(framer.buffered()) +
                          " bytes of an incomplete message from " + t->remote_address() +
                          ", not completed within message_timeout (" +
                          std::to_string(o.message_timeout.count()) + " ms)";
        if (rd == reader::budget)
            why += "; it was waiting for room in the memory budget (" +
                   std::to_string(o.budget->used()) + " of " +
                   std::to_string(o.budget->limit()) + " bytes used)";
        fail_telling(errc::protocol_error, std::move(why));
        return;
    }
    watch_partial(false);
}

}  // namespace ordo
