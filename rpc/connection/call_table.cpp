#include "rpc/connection/call_table.hpp"

#include "ordo/rpc/peer.hpp"
#include "ordo/rpc/stream_call.hpp"
#include "rpc/wire/errors.hpp"

namespace ordo::detail {

call_table::call_table(net::any_io_executor ex, options o, call_table_host& host, peer_counters& c)
    : shutdown_hook(ex), ex_(std::move(ex)), o_(o), host_(host), c_(c), next_id_(o.first_msgid) {}

// Off the context's hooks first: its destruction must not fail the calls of a table that is
// half destroyed (it waits here if that runs now, on another thread).
call_table::~call_table() {
    unhook();
}

// The context is being destroyed: each caller is told (errc::closed), through its handler's
// executor, as when the connection ends (the host fails them: what waits for ordo.features
// is then reported undelivered, not sent). A handler of this context is queued there and
// destroyed unrun with it, as Asio's own are; one elsewhere (a blocked sync_client reader, a
// future) runs. No observer is told: a router would send the call again, on a loop that is
// going away. The connection is held until every call has failed: what a call lets go may be
// the last hold on it.
void call_table::on_shutdown() noexcept {
    auto keep = host_.owner().lock();
    observer_ = nullptr;
    host_.fail_all_calls(make_error_code(errc::closed),
                         "ordo: the io_context of the connection was destroyed while the call "
                         "waited");
}

std::uint32_t call_table::next_id() {
    std::uint32_t id;
    // An id whose home slot is free is not in use, and its call sits at its home (id_table).
    do id = next_id_++;
    while (!pending_.home_free(id) || (!abandoned_.empty() && abandoned_.count(id) != 0));
    return id;
}

void call_table::count() {
    c_.pending_calls = waiting();
}

void call_table::add(std::uint32_t msgid, std::unique_ptr<pending_call> call) {
    auto& e = pending_.insert(msgid);
    auto& f = *call;
    const auto timeout = f.options.timeout.count() > 0 ? f.options.timeout : o_.default_timeout;
    if (timeout.count() > 0 || f.slot.is_connected())
        e.watch.arm(ex_, timeout, f, host_.owner(),
                    [this, msgid](errc why) { withdraw(msgid, why); });
    e.call = std::move(call);
    count();
}

void call_table::add_ping(std::uint32_t msgid) {
    pending_.insert(msgid).is_ping = true;
    ++pings_;
}

void call_table::abandon(std::uint32_t msgid) {
    abandoned_.insert(msgid);
    abandoned_order_.push_back(msgid);
    if (abandoned_order_.size() > o_.max_abandoned_ids) {
        abandoned_.erase(abandoned_order_.front());
        abandoned_order_.pop_front();
    }
}

// Two-phase, as seastar does it: the entry goes first (a response arriving later is dropped as
// abandoned), then the remote side is asked to stop, then the caller hears.
void call_table::withdraw(std::uint32_t msgid, errc why) {
    auto taken = pending_.take(msgid);
    if (!taken) return;
    entry e = std::move(*taken);
    count();
    e.watch.disarm(*e.call);
    abandon(msgid);
    host_.send_cancel(msgid, e.call->lane);
    fail(std::move(e.call), why,
         why == errc::timed_out
             ? "no response within " + std::to_string(e.watch.timeout().count()) + " ms"
             : std::string("cancelled by the caller"));
}

void call_table::fail(std::unique_ptr<pending_call> call, std::error_code ec,
                      std::string detail) {
    call_outcome out;
    out.detail = std::move(detail);
    ++c_.calls_completed;
    if (observer_ && !call->own) return end_observed(call.release(), ec, out, false);
    call->complete(ec, std::move(out));
}

void call_table::end_observed(pending_call* released, std::error_code ec, call_outcome& out,
                              bool now) {
    std::unique_ptr<pending_call> call(released);
    observer_->ended(call, ec, out, now);
    if (!call) return;  // the observer took it
    if (now)
        call->complete_inline(ec, std::move(out));
    else
        call->complete(ec, std::move(out));
}

void call_table::on_response(message& m) {
    std::unique_ptr<pending_call> call;
    bool ping = false;
    const bool found = pending_.take_with(m.msgid, [&](entry& e) {
        ping = e.is_ping;
        if (ping) return;
        e.watch.disarm(*e.call);
        call = std::move(e.call);
    });
    if (!found) {
        if (abandoned_.erase(m.msgid) != 0) return;  // a late answer to a withdrawn call
        throw_error(errc::protocol_error, "ordo: protocol error: response to msgid " +
                                              std::to_string(m.msgid) +
                                              ", which no call is waiting for");
    }
    if (ping) {  // only its arrival mattered
        --pings_;
        return;
    }
    if (!call->takes_borrowed()) own(m);
    call_outcome out;
    std::error_code ec;
    if (m.error.is_nil())
        out.result = m.result;
    else
        ec = error_from_wire(m.error, out.detail, &out.retry_after_ms, &out.over_share);
    out.borrowed = m.borrowed;
    out.message = std::move(m.handle);
    count();
    ++c_.calls_completed;
    // Last: the handler may drop the last reference to the peer, and this table with it.
    // (Released, so that the common path keeps the call in a register.)
    if (observer_ && !call->own) return end_observed(call.release(), ec, out, true);
    call->complete_inline(ec, std::move(out));
}

void call_table::on_item(const message& m, std::size_t wire_bytes) {
    const auto& a = m.params.via.array;
    if (a.size != 2 || a.ptr[0].type != msgpack::type::POSITIVE_INTEGER ||
        a.ptr[0].via.u64 > 0xffffffffu)
        throw_error(errc::protocol_error, "ordo: protocol error: ordo.item takes [msgid, item]");
    const auto msgid = static_cast<std::uint32_t>(a.ptr[0].via.u64);
    entry* e = pending_.find(msgid);
    if (!e) {
        if (abandoned_.count(msgid) != 0) return;  // the stream was cancelled: items still come
        throw_error(errc::protocol_error, "ordo: protocol error: stream item for msgid " +
                                              std::to_string(msgid) +
                                              ", which no stream is waiting for");
    }
    if (!e->call || !e->call->stream)
        throw_error(errc::protocol_error, "ordo: protocol error: stream item for msgid " +
                                              std::to_string(msgid) + ", which is not a stream");
    e->call->stream->on_item(a.ptr[1], wire_bytes);
}

void call_table::on_in_credit(const message& m) {
    const auto& a = m.params.via.array;
    if (a.size != 3 || a.ptr[0].type != msgpack::type::POSITIVE_INTEGER ||
        a.ptr[0].via.u64 > 0xffffffffu || a.ptr[1].type != msgpack::type::POSITIVE_INTEGER ||
        a.ptr[2].type != msgpack::type::POSITIVE_INTEGER)
        throw_error(errc::protocol_error,
                    "ordo: protocol error: ordo.in_credit takes [msgid, items, bytes]");
    // Credit for a call that has ended, or was withdrawn, is late: nothing to do.
    entry* e = pending_.find(static_cast<std::uint32_t>(a.ptr[0].via.u64));
    if (!e || !e->call) return;
    if (!e->call->stream || !e->call->stream->writes())
        throw_error(errc::protocol_error, "ordo: protocol error: ordo.in_credit for msgid " +
                                              std::to_string(a.ptr[0].via.u64) +
                                              ", whose caller writes no items");
    e->call->stream->grant_in(a.ptr[1].via.u64, a.ptr[2].via.u64);
}

void call_table::fail_all(std::error_code ec, const std::string& why) {
    auto calls = pending_.take_all();
    abandoned_.clear();
    abandoned_order_.clear();
    pings_ = 0;
    c_.pending_calls = 0;
    for (auto& [id, e] : calls) {
        if (e.is_ping) continue;
        e.watch.disarm(*e.call);
        fail(std::move(e.call), ec, why);
    }
    count();
}

}  // namespace ordo::detail
