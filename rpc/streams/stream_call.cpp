// The caller's side of streaming calls (include/ordo/rpc/stream_call.hpp): what the reader and the
// connection share, and how the call is started.
#include "ordo/rpc/stream_call.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <utility>

#include "ordo/rpc/detail/async_call.hpp"
#include "ordo/rpc/detail/type_traits.hpp"
#include "ordo/error.hpp"
#include "rpc/wire/read.hpp"

namespace ordo::detail {

namespace {

// Whether `a` and `b` are the same value, their strs, bins and exts the same bytes in memory.
bool same_in_place(const msgpack::object& a, const msgpack::object& b) {
    if (a.type != b.type) return false;
    switch (a.type) {
        case msgpack::type::STR:
        case msgpack::type::BIN:
            return a.via.bin.ptr == b.via.bin.ptr && a.via.bin.size == b.via.bin.size;
        case msgpack::type::EXT:
            return a.via.ext.ptr == b.via.ext.ptr && a.via.ext.size == b.via.ext.size;
        case msgpack::type::ARRAY:
            if (a.via.array.size != b.via.array.size) return false;
            for (std::uint32_t i = 0; i < a.via.array.size; ++i)
                if (!same_in_place(a.via.array.ptr[i], b.via.array.ptr[i])) return false;
            return true;
        case msgpack::type::MAP:
            if (a.via.map.size != b.via.map.size) return false;
            for (std::uint32_t i = 0; i < a.via.map.size; ++i)
                if (!same_in_place(a.via.map.ptr[i].key, b.via.map.ptr[i].key) ||
                    !same_in_place(a.via.map.ptr[i].val, b.via.map.ptr[i].val))
                    return false;
            return true;
        default: return a == b;
    }
}

}  // namespace

// The item ends where its last str or bin ends, and starts its packed size before. Read again
// from there (its strs and bins borrowed), it must be the same item in the same place: a
// sender's longer heads than msgpack's shortest fail this, and the item is copied.
std::string_view keep_delivered_item(const msgpack::object& item,
                                     std::shared_ptr<const kept_bytes>& kept) {
    const msgpack::object* last = &item;
    for (;;) {
        if (last->type == msgpack::type::ARRAY && last->via.array.size > 0)
            last = &last->via.array.ptr[last->via.array.size - 1];
        else if (last->type == msgpack::type::MAP && last->via.map.size > 0)
            last = &last->via.map.ptr[last->via.map.size - 1].val;
        else
            break;
    }
    if (last->type != msgpack::type::BIN && last->type != msgpack::type::STR) return {};
    struct counter {
        std::size_t n = 0;
        void write(const char*, std::size_t k) { n += k; }
    } size;
    msgpack::pack(size, item);
    if (size.n < kept_bytes_min) return {};
    // As addresses: where the item would start may be outside any object.
    const auto end = reinterpret_cast<std::uintptr_t>(last->via.bin.ptr) + last->via.bin.size;
    if (end < size.n) return {};
    const std::string_view bytes(reinterpret_cast<const char*>(end - size.n), size.n);
    // Within the read buffer (or nothing is read), then checked.
    std::shared_ptr<const kept_bytes> k = keep_delivered(bytes);
    if (!k) return {};
    try {
        // The item passed its connection's limits; these only bound the reading of bytes that
        // turn out not to be it.
        limits l;
        l.max_message_bytes = l.max_string_bytes = l.max_objects = l.max_container_length =
            SIZE_MAX;
        msgpack::zone zone;
        if (!same_in_place(item, unpack_checked(bytes, l, zone, true))) return {};
    } catch (const std::exception&) {
        return {};
    }
    kept = std::move(k);
    return bytes;
}


stream_core::stream_core(std::string method, std::string remote, net::any_io_executor channel_ex,
                         std::uint32_t window, std::uint64_t window_bytes)
    : method_(std::move(method)),
      remote_(std::move(remote)),
      channel_ex_(std::move(channel_ex)),
      // The server caps what it grants itself at max_stream_window: asking for more would wait
      // for credit this side never sends.
      window_(std::clamp<std::uint32_t>(window, 1, max_stream_window)),
      window_bytes_(window_bytes),
      granted_items_(window_),
      granted_bytes_(window_bytes) {}

stream_core::~stream_core() = default;

void stream_core::attach(std::function<void(std::uint32_t, std::uint64_t)> grant) {
    std::lock_guard lk(mu_);
    grant_ = std::move(grant);
}

void stream_core::end(std::error_code ec, call_outcome& out) {
    std::unique_ptr<parked> w, ww;
    {
        std::lock_guard lk(mu_);
        if (ended_) return;
        ended_ = true;
        if (ec) {
            ec_ = ec;
            detail_ = std::move(out.detail);
        } else if (std::string wrong = check_result(out.result); !wrong.empty()) {
            ec_ = make_error_code(errc::protocol_error);
            detail_ = std::move(wrong);
        }
        grant_ = nullptr;
        w = take_waiter();
        ww = std::move(write_waiter_);
    }
    if (w) w->wake();
    if (ww) ww->wake();
}

std::string stream_core::check_result(const msgpack::object& result) {
    // The final response counts the items sent: a mismatch is a broken peer.
    if (result.type == msgpack::type::POSITIVE_INTEGER && result.via.u64 != received_)
        return "the stream ended after " + std::to_string(received_) +
               " items, but the server counted " + std::to_string(result.via.u64);
    return {};
}

void stream_core::fail_and_cancel(std::string what) {
    // With mu_ held.
    ended_ = true;
    ec_ = make_error_code(errc::protocol_error);
    detail_ = std::move(what);
    std::unique_ptr<parked> w = take_waiter();
    if (w) w->wake();
    if (write_waiter_) std::exchange(write_waiter_, nullptr)->wake();
    net::post(channel_ex_, [self = shared_from_this()] {
        self->signal_.emit(net::cancellation_type::terminal);
    });
}

std::optional<std::uint64_t> stream_core::attach_writer(item_sender send) {
    std::lock_guard lk(mu_);
    send_ = std::move(send);
    // Closed before the call went out (a pool dialing, a request held): the end goes now.
    if (writes_closed_ && !ended_) return in_items_;
    return std::nullopt;
}

void stream_core::grant_in(std::uint64_t items, std::uint64_t bytes) {
    std::unique_ptr<parked> w;
    {
        std::lock_guard lk(mu_);
        // Capped: a server cannot make the counts wrap.
        constexpr std::uint64_t cap = std::uint64_t{1} << 62;
        in_granted_items_ = std::min(cap, in_granted_items_ + std::min(items, cap));
        in_granted_bytes_ = std::min(cap, in_granted_bytes_ + std::min(bytes, cap));
        if (writable_locked()) w = std::move(write_waiter_);
    }
    if (w) w->wake();
}

std::uint64_t stream_core::written() const {
    std::lock_guard lk(mu_);
    return in_items_;
}

net::awaitable<bool> stream_core::write_item(std::shared_ptr<stream_core> s) {
    const std::string_view item(s->item_.data(), s->item_.size());
    return write_item(std::move(s), item);
}

net::awaitable<bool> stream_core::write_item_kept(std::shared_ptr<stream_core> s,
                                                  std::string_view front, std::string_view item,
                                                  std::unique_ptr<held_body>* keep) {
    for (;;) {
        item_sender* send = nullptr;
        {
            std::lock_guard lk(s->mu_);
            if (s->writes_closed_)
                throw std::logic_error("ordo: write to a stream of " + s->method() +
                                       " after its side was closed");
            if (s->ended_) co_return false;
            if (s->writable_locked()) {
                ++s->in_items_;
                s->in_bytes_ += front.size() + item.size();
                // Set before the call started, and never changed: used unlocked.
                send = &s->send_;
            }
        }
        if (send) {
            if (*send) (*send)(front, item, false, keep);
            co_return true;
        }
        co_await s->wait_writable();
        auto cs = co_await net::this_coro::cancellation_state;
        if (cs.cancelled() != net::cancellation_type::none)
            throw std::system_error(make_error_code(net::error::operation_aborted),
                                    "ordo: waiting for credit to write to " + s->method());
    }
}

void stream_core::close_writes() {
    item_sender send;
    buffer count;  // the body of ordo.in_end: how many items were written
    {
        std::lock_guard lk(mu_);
        if (writes_closed_) return;
        writes_closed_ = true;
        if (!ended_) send = send_;
        if (send) msgpack::pack(count, in_items_);
    }
    if (send) send({}, std::string_view(count.data(), count.size()), true, nullptr);
}

void throw_bad_item(std::uint64_t index, const std::type_info& expected, const std::exception& e) {
    throw_error(errc::bad_arguments, "item " + std::to_string(index) +
                                         " written to the stream does not convert to " +
                                         type_name(expected) + ": " + e.what());
}

void stream_core::bad_item(const std::exception& e, const msgpack::object& item) {
    std::unique_ptr<parked> w, ww;
    {
        std::lock_guard lk(mu_);
        if (ended_) return;
        ended_ = true;
        ec_ = make_error_code(errc::bad_result);
        detail_ = "item " + std::to_string(received_ + 1) + " does not convert: " + e.what();
        (void)item;
        w = take_waiter();
        ww = std::move(write_waiter_);  // a writer waiting for credit: the call has ended
    }
    if (w) w->wake();
    if (ww) ww->wake();
    // The items that follow have nowhere to go: stop the handler.
    net::post(channel_ex_, [self = shared_from_this()] {
        self->signal_.emit(net::cancellation_type::terminal);
    });
}

stream_core::credit stream_core::took_one(std::size_t bytes) {
    // Credit goes back in steps of half the window (in items or in bytes, whichever comes
    // first): one ordo.credit per half window read.
    ++unreported_.items;
    unreported_.bytes += bytes;
    ++taken_;
    const bool items_due = unreported_.items >= std::max<std::uint32_t>(1, window_ / 2);
    const bool bytes_due = window_bytes_ != 0 && unreported_.bytes >= window_bytes_ / 2;
    if (ended_ || (!items_due && !bytes_due)) return {};
    // Counted as granted now, before it is sent: the server can only have sent less.
    granted_items_ += unreported_.items;
    granted_bytes_ += unreported_.bytes;
    return std::exchange(unreported_, credit{});
}

namespace {

// The ordo.ping of a window probe (stream_core::grow_toward).
class probe_call final : public pending_call {
  public:
    explicit probe_call(std::shared_ptr<stream_core> s) : pending_call("ordo.ping"), s_(std::move(s)) {
        params = pack_params();
    }
    void complete(std::error_code ec, call_outcome) override { s_->on_pong(ec); }

  private:
    std::shared_ptr<stream_core> s_;
};

}  // namespace

void stream_core::grant(credit c) {
    // Under mu_ (grant_ only posts to the connection's executor): once end() has returned, no
    // reader posts credit any more, so whoever ends a stream may then let its executor go
    // (ordo::sync_client's destructor does).
    std::lock_guard lk(mu_);
    if (ended_ || !grant_) return;
    grant_(c.items, c.bytes);
    // A probe goes with a grant: the time until its ping is answered is a round trip, and what
    // arrives meanwhile shows whether the window, not the sender, held the stream back.
    if (probing_ || sampling_ || max_window_bytes_ <= window_bytes_) return;
    probing_ = true;
    probe_start_ = std::chrono::steady_clock::now();
    net::post(channel_ex_, [w = probe_ch_, self = shared_from_this()] {
        auto ch = w.lock();
        if (ch)
            ch->start_call(std::make_unique<probe_call>(self));
        else
            self->on_pong(make_error_code(errc::peer_lost));
    });
}

void stream_core::grow_toward(std::uint64_t max_bytes) {
    std::lock_guard lk(mu_);
    max_window_bytes_ = max_bytes;
}

void stream_core::probe_through(std::weak_ptr<channel_impl> ch) {
    std::lock_guard lk(mu_);
    probe_ch_ = std::move(ch);
}

std::uint64_t stream_core::current_window_bytes() const {
    std::lock_guard lk(mu_);
    return window_bytes_;
}

void stream_core::on_pong(std::error_code ec) {
    std::lock_guard lk(mu_);
    probing_ = false;
    // A peer that does not answer ordo.ping (a plain msgpack-rpc server) is not asked again:
    // the window stays as it is.
    if (ec) max_window_bytes_ = window_bytes_;
    if (ec || ended_ || !grant_) return;
    // The round trip; what arrives over the next one shows what the path carries (the ping
    // itself may overtake a large item on its way, so the sample starts here).
    const auto now = std::chrono::steady_clock::now();
    probe_rtt_ = std::max(now - probe_start_, std::chrono::steady_clock::duration(1));
    sampling_ = true;
    probe_start_ = now;
    probe_items_ = received_;
    probe_bytes_ = received_bytes_;
}

void stream_core::sample() {
    // With mu_ held, as an item arrives.
    const auto elapsed = std::chrono::steady_clock::now() - probe_start_;
    if (elapsed < probe_rtt_) return;
    sampling_ = false;
    // A reader that falls behind (half a window unread) is what the stream waits for, not the
    // window.
    if (2 * (received_ - taken_) > window_) return;
    // What arrived, per round trip.
    const double per_rtt = static_cast<double>(probe_rtt_.count()) / elapsed.count();
    const double items = static_cast<double>(received_ - probe_items_) * per_rtt;
    const double bytes = static_cast<double>(received_bytes_ - probe_bytes_) * per_rtt;
    // A third of the window or more in one round trip: the window is near what the path holds
    // (credit goes back every half window, so a stream that waits for credit gets about half
    // of it each round trip), and the stream may soon wait for credit: it doubles.
    if (3 * items < window_ && 3 * bytes < static_cast<double>(window_bytes_)) return;
    const std::uint64_t grown_bytes = std::min(max_window_bytes_, 2 * window_bytes_);
    const auto grown_items = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(max_stream_window, 2 * std::uint64_t{window_}));
    const std::uint64_t more_bytes = grown_bytes - window_bytes_;
    const std::uint32_t more_items = grown_items - window_;
    window_bytes_ = grown_bytes;
    window_ = grown_items;
    granted_items_ += more_items;
    granted_bytes_ += more_bytes;
    if (grant_ && (more_items || more_bytes)) grant_(more_items, more_bytes);
}

void stream_core::over_credit() {
    // With mu_ held (on_item).
    fail_and_cancel("the server sent item " + std::to_string(received_ + 1) +
                    " beyond the credit granted (" + std::to_string(granted_items_) +
                    " items and " + std::to_string(granted_bytes_) + " bytes in all, of which " +
                    std::to_string(received_bytes_) + " bytes received; window " +
                    std::to_string(window_) + " items, " + std::to_string(window_bytes_) +
                    " bytes)");
}

void stream_core::wake_parked(std::unique_ptr<parked>& slot) {
    std::unique_ptr<parked> w;
    {
        std::lock_guard lk(mu_);
        w = std::move(slot);
    }
    if (w) w->wake();
}

namespace {

// A thread blocked in stream_core::wait_ready, parked as a reader is: wake() may come with
// stream_core's mutex held (over_credit), so the thread waits on a mutex of its own.
struct blocked_reader {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;
};

class blocked_waiter final : public parked {
  public:
    explicit blocked_waiter(std::shared_ptr<blocked_reader> r) : r_(std::move(r)) {}
    void wake() override {
        {
            std::lock_guard lk(r_->mu);
            r_->woken = true;
        }
        r_->cv.notify_one();
    }

  private:
    std::shared_ptr<blocked_reader> r_;
};

}  // namespace

bool stream_core::wait_ready(std::optional<std::chrono::steady_clock::time_point> deadline) {
    auto r = std::make_shared<blocked_reader>();
    {
        std::lock_guard lk(mu_);
        if (ready_locked()) return true;
        waiter_ = std::make_unique<blocked_waiter>(r);
    }
    {
        std::unique_lock lk(r->mu);
        if (!deadline) {
            r->cv.wait(lk, [&] { return r->woken; });
            return true;
        }
        if (r->cv.wait_until(lk, *deadline, [&] { return r->woken; })) return true;
    }
    // The deadline passed: withdraw the waiter (unless a wake-up took it meanwhile), and say
    // whether something came in the meantime after all.
    std::lock_guard lk(mu_);
    waiter_.reset();
    return ready_locked();
}

bool stream_core::write_item_blocking() {
    const std::string_view item(item_.data(), item_.size());
    for (;;) {
        auto r = std::make_shared<blocked_reader>();
        item_sender* send = nullptr;
        {
            std::lock_guard lk(mu_);
            if (writes_closed_)
                throw std::logic_error("ordo: write to a stream of " + method() +
                                       " after its side was closed");
            if (ended_) return false;
            if (writable_locked()) {
                ++in_items_;
                in_bytes_ += item.size();
                send = &send_;  // set before the call started, never changed: used unlocked
            } else {
                write_waiter_ = std::make_unique<blocked_waiter>(r);
            }
        }
        if (send) {
            if (*send) (*send)({}, item, false, nullptr);  // posted, with a copy: not its thread
            return true;
        }
        std::unique_lock lk(r->mu);
        r->cv.wait(lk, [&] { return r->woken; });  // credit came, or the call ended
    }
}

void stream_core::throw_if_failed() const {
    if (ec_) throw rpc_error(ec_, method_, remote_, detail_);
}

void stream_core::cancel() {
    {
        std::lock_guard lk(mu_);
        if (ended_ || cancel_sent_) return;
        cancel_sent_ = true;
    }
    // The call's watch (rpc/connection/call_watch.hpp) is installed in and cleared from this slot
    // on the channel's executor: emit it there too.
    net::post(channel_ex_, [self = shared_from_this()] {
        self->signal_.emit(net::cancellation_type::terminal);
    });
}

std::uint64_t stream_core::received() const {
    std::lock_guard lk(mu_);
    return received_;
}

void start_stream(const std::shared_ptr<channel_impl>& ch, std::shared_ptr<stream_core> s,
                  params_buffer params, call_options o) {
    auto call = std::make_unique<stream_call>(s);
    call->method = s->method();
    call->params = std::move(params);
    call->options = std::move(o);
    call->slot = s->slot();
    call->stream = std::move(s);
    auto ex = ch->get_executor();
    if (running_in(ex))
        ch->start_call(std::move(call));
    else
        net::dispatch(ex,
                      [ch, call = std::move(call)]() mutable { ch->start_call(std::move(call)); });
}

}  // namespace ordo::detail
