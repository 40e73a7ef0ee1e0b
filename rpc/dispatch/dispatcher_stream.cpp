// The server's side of streaming calls (docs/protocol.md, "Streams"): a streaming handler's
// output (dispatcher::stream_run, rpc/dispatch/stream_run.hpp) sending items as ordo.item while
// the caller gives credit, or collecting them into one response for a caller that does not
// stream; a reading handler's input (dispatcher::inbox, "Streams both ways"), ordo.in queued
// for its reader and ordo.in_credit granted back as it reads; and the ordo.stream request
// unwrapped into the call inside.
#include "rpc/dispatch/stream_run.hpp"

#include <algorithm>

#include "ordo/detail/memory_budget.hpp"
#include "ordo/rpc/detail/message_heads.hpp"
#include "rpc/wire/read.hpp"

namespace ordo::detail {

namespace {
// A streaming handler called by a caller that does not stream (any msgpack-rpc client) answers
// its items collected into one array, of at most this many bytes (docs/protocol.md, "Streams").
constexpr std::size_t max_collected_bytes = std::size_t{16} << 20;
constexpr std::size_t collect_charge_step = std::size_t{64} << 10;

// Packs `o` after what `out` holds (an item kept as bytes: its size is reserved first).
void append_packed(std::string& out, const msgpack::object& o) {
    struct sink {
        std::string& s;
        void write(const char* p, std::size_t n) { s.append(p, n); }
    } w{out};
    msgpack::pack(w, o);
}

// An item kept as bytes, read again: it passed the connection's limits when it came, so only
// the reader's own bounds apply.
limits reread_limits() {
    limits l;
    l.max_message_bytes = l.max_string_bytes = l.max_objects = SIZE_MAX;
    l.max_container_length = l.max_depth = SIZE_MAX;
    return l;
}
}  // namespace

dispatcher::stream_run::stream_run(dispatcher& d, std::uint32_t msgid, std::uint32_t window,
                                   std::uint64_t window_bytes, stream_run** back)
    : d_(d),
      msgid_(msgid),
      streaming_(window > 0),
      credit_(window),
      bytes_limited_(window_bytes > 0),
      bytes_credit_(static_cast<std::int64_t>(std::min<std::uint64_t>(window_bytes, max_bytes))),
      back_(back),
      wake_(d.ex_) {
    if (streaming_) d_.streams_.emplace(msgid, this);
}

dispatcher::stream_run::~stream_run() {
    if (streaming_) d_.streams_.erase(msgid_);
    if (charged_ && d_.budget_) d_.budget_->release(charged_);
    *back_ = nullptr;
}

bool dispatcher::stream_run::has_credit() const noexcept {
    return !streaming_ || (credit_ > 0 && (!bytes_limited_ || bytes_credit_ > 0));
}

net::awaitable<void> dispatcher::stream_run::wait_credit() {
    while (!has_credit()) {
        if (cancelled) throw_cancelled();
        wake_.expires_at(net::steady_timer::time_point::max());
        waiting_ = true;
        // Ends with operation_aborted both when credit comes (grant) and when the handler
        // is cancelled (the coroutine's cancellation reaches the wait).
        co_await wake_.async_wait(use_tuple);
        waiting_ = false;
    }
    if (cancelled) throw_cancelled();
}

buffer& dispatcher::stream_run::begin_item() {
    if (cancelled) throw_cancelled();
    if (!streaming_) return collected_;
    item_.clear();
    detail::write_notification_head(item_, "ordo.item");
    msgpack::packer<buffer> p(item_);
    p.pack_array(2);
    p.pack(msgid_);
    return item_;
}

bool dispatcher::stream_run::write_packed(std::string_view front, std::string_view back,
                                         std::unique_ptr<held_body> keep) {
    if (!streaming_) return stream_out::write_packed(front, back, std::move(keep));
    begin_item();  // the head, in item_, and then the item's front
    if (!front.empty()) item_.write(front.data(), front.size());
    ++written_;
    --credit_;
    bytes_credit_ -= static_cast<std::int64_t>(item_.size() + back.size());
    d_.host_.send_response_parts(std::string_view(item_.data(), item_.size()), back,
                                 std::move(keep));
    return true;
}

bool dispatcher::stream_run::end_item() {
    ++written_;
    if (streaming_) {
        --credit_;
        bytes_credit_ -= static_cast<std::int64_t>(item_.size());
        d_.host_.send_response(item_);
        return true;
    }
    if (collected_.size() > max_collected_bytes)
        throw_error(errc::overloaded,
                    "stream of " + std::to_string(written_) + " items (" +
                        std::to_string(collected_.size()) +
                        " bytes) is too long to answer as one response (at most " +
                        std::to_string(max_collected_bytes) +
                        " bytes): call it as a stream (ordo.stream)");
    while (collected_.size() > charged_) {
        if (d_.budget_) {
            if (d_.budget_->over(collect_charge_step))
                throw_error(errc::overloaded,
                            "the server's memory budget is used up: the stream's items "
                            "cannot be collected into one response");
            d_.budget_->charge(collect_charge_step);
        }
        charged_ += collect_charge_step;
    }
    return true;
}

void dispatcher::stream_run::cancel() {
    cancelled = true;
    if (waiting_) wake_.cancel();
}

void dispatcher::stream_run::grant(std::uint64_t n, std::uint64_t bytes) {
    credit_ = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(std::uint64_t{credit_} + n, std::uint64_t{max_stream_window} * 2));
    bytes_credit_ = std::min<std::int64_t>(
        bytes_credit_ + static_cast<std::int64_t>(std::min<std::uint64_t>(bytes, max_bytes)),
        static_cast<std::int64_t>(max_bytes));
    if (waiting_ && has_credit()) wake_.cancel();
}

void dispatcher::stream_run::finish(buffer& out) const {
    msgpack::packer<buffer> p(out);
    if (streaming_) {
        p.pack(written_);
    } else {
        p.pack_array(static_cast<std::uint32_t>(written_));
        out.write(collected_.data(), collected_.size());
    }
}

// [method, params, window], [method, params, window, window_bytes], [method, params, window,
// window_bytes, writes] or [..., writes, grow_to]: the call inside, which the caller reads as a
// stream (and, `writes` true, writes items to, with credit that may grow toward grow_to bytes:
// docs/protocol.md, "Streams both ways").
bool dispatcher::unwrap_stream(message& m, stream_shape& how) {
    own(m);  // the views set here point into the message's own zone, which moves with it
    const auto& a = m.params.via.array;
    if ((a.size < 3 || a.size > 6) ||
        (a.ptr[0].type != msgpack::type::STR && a.ptr[0].type != msgpack::type::BIN) ||
        a.ptr[1].type != msgpack::type::ARRAY || a.ptr[2].type != msgpack::type::POSITIVE_INTEGER ||
        (a.size >= 4 && a.ptr[3].type != msgpack::type::POSITIVE_INTEGER) ||
        (a.size >= 5 && a.ptr[4].type != msgpack::type::BOOLEAN) ||
        (a.size == 6 && a.ptr[5].type != msgpack::type::POSITIVE_INTEGER)) {
        respond_error(m.msgid, errc::bad_arguments,
                      "ordo.stream takes [method, params, window], [method, params, window, "
                      "window_bytes] or [method, params, window, window_bytes, writes] (and "
                      "grow_to)");
        return false;
    }
    how.window_bytes = a.size >= 4 ? a.ptr[3].via.u64 : 0;
    how.writes = a.size >= 5 && a.ptr[4].via.boolean;
    how.grow_to = a.size == 6 ? a.ptr[5].via.u64 : 0;
    if (streams_.count(m.msgid) != 0 || inboxes_.count(m.msgid) != 0) {
        respond_error(m.msgid, errc::bad_arguments,
                      "msgid " + std::to_string(m.msgid) + " already streams");
        return false;
    }
    const auto& name = a.ptr[0];
    m.method =
        std::string_view(name.type == msgpack::type::STR ? name.via.str.ptr : name.via.bin.ptr,
                         name.type == msgpack::type::STR ? name.via.str.size : name.via.bin.size);
    const msgpack::object inner = a.ptr[1];
    how.window = static_cast<std::uint32_t>(
        std::clamp<std::uint64_t>(a.ptr[2].via.u64, 1, max_stream_window));
    m.params = inner;
    return true;
}

net::awaitable<void> dispatcher::inbox_body([[maybe_unused]] std::unique_ptr<inbox> in,
                                            net::awaitable<void> body) {
    co_await std::move(body);
}

net::awaitable<void> dispatcher::stream_body(std::unique_ptr<stream_run> s,
                                             net::awaitable<void> body, buffer& out) {
    co_await std::move(body);
    s->finish(out);
}

// ---- a reading handler's input ----
dispatcher::inbox::inbox(dispatcher& d, std::uint32_t msgid, inbox** back, std::uint64_t grow_to)
    : d_(d), msgid_(msgid), back_(back), grow_to_(std::min(grow_to, max_grown_bytes)), wake_(d.ex_) {
    d_.inboxes_.emplace(msgid, this);
}

dispatcher::inbox::~inbox() {
    if (d_.budget_ && charged_) d_.budget_->release(charged_);
    d_.grown_bytes_ -= window_bytes_ - window_bytes;
    d_.inboxes_.erase(msgid_);
    *back_ = nullptr;
}

void dispatcher::inbox::grant(std::uint64_t items, std::uint64_t bytes, bool timed) {
    if (timed && grow_to_ > window_bytes_ && granted_bytes_ > 0)
        grants_.emplace_back(granted_bytes_, std::chrono::steady_clock::now());
    granted_items_ += items;
    granted_bytes_ += bytes;
    buffer b(small_buffer);
    encode_notification(b, "ordo.in_credit", msgid_, items, bytes);
    d_.host_.send_response(b);
}

void dispatcher::inbox::crossed(std::uint64_t before, bool caught_up,
                                std::chrono::steady_clock::time_point now) {
    bool waited = false;
    while (!grants_.empty() && before >= grants_.front().first) {
        const auto took = now - grants_.front().second;
        grants_.pop_front();
        if (samples_++ == 0 || took < round_trip_) round_trip_ = took;
        waited = samples_ > 1 && took <= round_trip_ + round_trip_ / 2 &&
                 now - last_item_ >= took / 2;
    }
    if (waited && caught_up) grow();
}

void dispatcher::inbox::grow() {
    std::uint64_t bytes = std::min(grow_to_, window_bytes_ * 2);
    // Within what the connection's windows may grow by together, and the memory budget.
    bytes = std::min(bytes, window_bytes_ + (max_grown_bytes - d_.grown_bytes_));
    if (bytes <= window_bytes_ || (d_.budget_ && d_.budget_->over(bytes - window_bytes_))) {
        grants_.clear();  // no more now; a later grant is timed again while it may grow
        return;
    }
    const std::uint64_t items = std::min<std::uint64_t>(max_stream_window, window_items_ * 2);
    grant(items - window_items_, bytes - window_bytes_, false);
    d_.grown_bytes_ += bytes - window_bytes_;
    window_items_ = items;
    window_bytes_ = bytes;
    if (window_bytes_ >= grow_to_) grants_.clear();  // grown: nothing more to time
}

void dispatcher::inbox::open() {
    // A handler that starts after its connection's input ended (it was queued) gets nothing.
    if (!d_.input_end_.empty())
        return fail(d_.input_end_ + " before it closed the stream it writes", errc::peer_lost);
    grant(window, window_bytes);
}

void dispatcher::inbox::wake() {
    if (waiting_) wake_.cancel();
}

void dispatcher::inbox::fail(std::string what, errc code) {
    if (failure_.empty()) {
        failure_ = std::move(what);
        failure_code_ = code;
    }
    wake();
}

void dispatcher::inbox::push(const msgpack::object& item, std::size_t bytes) {
    if (cancelled_ || !failure_.empty()) return;  // what follows a failure is dropped
    if (closed_)
        return fail("the caller sent item " + std::to_string(received_ + 1) +
                    " after ordo.in_end");
    // Within the credit: an item needs one item and some bytes left (it may take more bytes
    // than were left).
    if (received_ >= granted_items_ || received_bytes_ >= granted_bytes_)
        return fail("the caller sent item " + std::to_string(received_ + 1) +
                    " beyond the credit granted (" + std::to_string(granted_items_) +
                    " items and " + std::to_string(granted_bytes_) + " bytes in all, of which " +
                    std::to_string(received_bytes_) + " bytes received)");
    const std::uint64_t before = received_bytes_;
    ++received_;
    received_bytes_ += bytes;
    if (grow_to_ > window_bytes_) [[unlikely]] {  // the window may grow: items are timed
        const auto now = std::chrono::steady_clock::now();
        if (!grants_.empty() && before >= grants_.front().first)
            crossed(before, items_.empty(), now);
        last_item_ = now;
    }
    if (bytes >= packed_item_bytes) {
        // Kept as bytes, which take_packed() hands on: where the connection read them, when it
        // gives them up, else copied once.
        packed_bytes packed;
        if (bytes >= kept_bytes_min) packed.kept_view = keep_delivered_item(item, packed.kept);
        if (!packed.kept) {
            packed.own.reserve(bytes);
            append_packed(packed.own, item);
        }
        const std::size_t held_bytes =
            (packed.kept ? packed.kept->capacity() : packed.own.capacity()) + sizeof(held);
        charged_ += held_bytes;
        if (d_.budget_) d_.budget_->charge(held_bytes);
        items_.push_back({msgpack::object(), bytes, held_bytes, std::move(packed)});
        return wake();
    }
    // What the copy holds (its objects take far more than their wire bytes), charged to the
    // server's memory budget while it is held.
    const std::size_t held_bytes = msgpack::aligned_zone_size(item) + sizeof(held);
    charged_ += held_bytes;
    if (d_.budget_) d_.budget_->charge(held_bytes);
    if (zones_.empty() || zones_.back().items >= zone_items || zones_.back().bytes >= zone_bytes)
        zones_.push_back({std::make_unique<msgpack::zone>(), 0, 0, 0});
    zone_of_items& z = zones_.back();
    ++z.items;
    ++z.left;
    z.bytes += bytes;
    items_.push_back({msgpack::object(item, *z.zone), bytes, held_bytes, {}});
    wake();
}

void dispatcher::inbox::end(std::uint64_t count) {
    if (cancelled_ || !failure_.empty() || closed_) return;
    closed_ = true;
    if (count != received_)
        return fail("the caller closed its stream after " + std::to_string(received_) +
                    " items, but counted " + std::to_string(count));
    wake();
}

void dispatcher::inbox::cancel() {
    cancelled_ = true;
    wake();
}

dispatcher::inbox::held dispatcher::inbox::pop() {
    held h = std::move(items_.front());
    items_.pop_front();
    unreported_bytes_ += h.bytes;
    charged_ -= h.held;
    if (d_.budget_) d_.budget_->release(h.held);
    // Its zone, once all of its items are taken, lives until the next call.
    if (h.packed.empty() && --zones_.front().left == 0 &&
        (zones_.size() > 1 || zones_.front().items >= zone_items ||
         zones_.front().bytes >= zone_bytes)) {
        taken_zone_ = std::move(zones_.front().zone);
        zones_.pop_front();
    }
    ++taken_;
    // Credit goes back in steps of half the window, in items or bytes.
    if (++unreported_items_ >= window_items_ / 2 || unreported_bytes_ >= window_bytes_ / 2) {
        grant(unreported_items_, unreported_bytes_);
        unreported_items_ = unreported_bytes_ = 0;
    }
    return h;
}

bool dispatcher::inbox::try_next(const msgpack::object*& item) {
    if (cancelled_) throw_error(errc::cancelled, "the stream was cancelled");
    if (!items_.empty()) {
        held h = pop();
        if (h.packed.empty()) {
            current_ = h.item;
            if (!taken_packed_.empty()) taken_packed_ = {};  // not held on
        } else {  // read in place: its bins are views of the bytes kept
            taken_packed_ = std::move(h.packed);
            // The zone holds what the item before it left (nothing that is still read).
            if (taken_zone_) taken_zone_->clear();
            else taken_zone_ = std::make_unique<msgpack::zone>();
            static const limits any = reread_limits();
            current_ = unpack_checked(taken_packed_.view(), any, *taken_zone_, true);
        }
        item = &current_;
        return true;
    }
    if (!failure_.empty()) throw_error(failure_code_, failure_);
    if (!closed_) return false;
    item = nullptr;
    return true;
}

stream_in::took dispatcher::inbox::take_packed(packed_bytes& packed) {
    if (cancelled_) throw_error(errc::cancelled, "the stream was cancelled");
    if (!items_.empty()) {
        held h = pop();
        if (h.packed.empty()) {
            packed = {};
            append_packed(packed.own, h.item);
        } else {
            packed = std::move(h.packed);
        }
        return took::item;
    }
    if (!failure_.empty()) throw_error(failure_code_, failure_);
    return closed_ ? took::end : took::none;
}

net::awaitable<void> dispatcher::inbox::wait() {
    // Something came while the reader did other things (wake() reaches only a waiting reader).
    if (!items_.empty() || !failure_.empty() || closed_ || cancelled_) co_return;
    wake_.expires_at(net::steady_timer::time_point::max());
    waiting_ = true;
    // Ends with operation_aborted both when an item comes (wake) and when the handler is
    // cancelled (the coroutine's cancellation reaches the wait).
    co_await wake_.async_wait(use_tuple);
    waiting_ = false;
    auto cs = co_await net::this_coro::cancellation_state;
    if (cs.cancelled() != net::cancellation_type::none)
        throw_error(errc::cancelled, "the stream was cancelled");
}

void dispatcher::input_ended(const std::string& why) {
    input_end_ = why;
    for (auto& [msgid, in] : inboxes_)
        if (!in->closed()) in->fail(why + " before it closed the stream it writes", errc::peer_lost);
}

// [msgid, item] or [msgid, count]: for a reading handler of this connection's, else maybe for
// another lane's (docs/protocol.md "Lanes"), else late (the handler has ended) and dropped.
void dispatcher::on_in(const message& m, std::size_t bytes) {
    const auto& a = m.params.via.array;
    if (a.size != 2 || a.ptr[0].type != msgpack::type::POSITIVE_INTEGER ||
        a.ptr[0].via.u64 > 0xffffffffu)
        return;  // a reserved notification that does not have this shape is ignored
    const auto it = inboxes_.find(static_cast<std::uint32_t>(a.ptr[0].via.u64));
    if (it == inboxes_.end()) return host_.not_mine(m, bytes);
    if (m.method == "ordo.in") {
        // The item's own bytes, as the caller counts them: the message less its head,
        // [2, "ordo.in", [msgid, (11 bytes and the msgid's).
        const std::uint64_t id = a.ptr[0].via.u64;
        const std::size_t head = 11 + (id < 128 ? 1 : id < 256 ? 2 : id < 65536 ? 3 : 5);
        it->second->push(a.ptr[1], bytes > head ? bytes - head : 0);
    } else if (a.ptr[1].type == msgpack::type::POSITIVE_INTEGER) {
        it->second->end(a.ptr[1].via.u64);
    } else {
        it->second->fail("ordo.in_end takes [msgid, count]");
    }
}

}  // namespace ordo::detail
