// Lanes: the names, the writer's round robin of pieces, the reader's reassembly
// (rpc/connection/lanes.hpp; docs/protocol.md "Lanes").
#include "rpc/connection/lanes.hpp"

#include <algorithm>
#include <deque>
#include <mutex>

#include "ordo/error.hpp"
#include "ordo/rpc/codec.hpp"
#include "rpc/wire/msgid.hpp"

namespace ordo::detail {

namespace {

// Interned for the life of the process: a call names its lane by a 2-byte id, and the name is
// read only where a piece is written. A deque: the names never move once made.
struct lane_names {
    std::mutex m;
    std::deque<std::string> names{std::string()};
};

lane_names& names() {
    static lane_names* n = new lane_names;  // never destroyed: calls may outlive statics
    return *n;
}


}  // namespace

std::uint16_t lane_id(std::string_view name) {
    if (name.empty()) return 0;
    if (name.size() > max_lane_name_bytes)
        throw rpc_error(errc::bad_arguments, {}, {},
                        "ordo: lane name of " + std::to_string(name.size()) +
                            " bytes, over the most of " + std::to_string(max_lane_name_bytes));
    auto& n = names();
    std::lock_guard lock(n.m);
    for (std::size_t i = 1; i < n.names.size(); ++i)
        if (n.names[i] == name) return static_cast<std::uint16_t>(i);
    if (n.names.size() >= max_lane_names)
        throw rpc_error(errc::bad_arguments, {}, {},
                        "ordo: more than " + std::to_string(max_lane_names) +
                            " lane names in one process");
    n.names.emplace_back(name);
    return static_cast<std::uint16_t>(n.names.size() - 1);
}

const std::string& lane_name(std::uint16_t id) {
    auto& n = names();
    std::lock_guard lock(n.m);
    return n.names.at(id);
}

void write_piece_head(std::string& out, std::string_view lane, std::uint64_t remaining,
                      std::size_t size) {
    buffer b(small_buffer);
    write_notification_head(b, "ordo.piece");
    msgpack::packer<buffer> p(b);
    p.pack_array(3);
    p.pack(lane);
    p.pack(remaining);
    p.pack_bin(static_cast<std::uint32_t>(size));
    out.assign(b.data(), b.size());
}

// ---- lane_writer ----

bool lane_writer::busy(std::string_view name) const noexcept {
    for (const auto& l : lanes_)
        if (l.name == name) return !l.messages.empty();
    return false;
}

namespace {

// The msgid of a request ([0, msgid, method, params] or with a fifth element, its context) at
// the start of `m`, or nothing.
std::optional<std::uint32_t> request_id(std::string_view m) {
    if (m.size() < 3 || (m[0] != '\x94' && m[0] != '\x95') || m[1] != '\x00') return std::nullopt;
    const auto* p = reinterpret_cast<const unsigned char*>(m.data()) + 2;
    std::uint32_t id = 0;
    if (!read_small_msgid(p, reinterpret_cast<const unsigned char*>(m.data()) + m.size(), id))
        return std::nullopt;
    return id;
}

}  // namespace

bool lane_writer::holds_request(std::string_view name, std::uint32_t msgid) const noexcept {
    for (const auto& l : lanes_) {
        if (l.name != name) continue;
        for (const auto& w : l.messages)
            if (request_id(w.bytes.view()) == msgid) return true;
    }
    return false;
}

void lane_writer::push(std::string_view name, std::string_view head, std::string_view body,
                       std::string_view notification) {
    auto it =
        std::find_if(lanes_.begin(), lanes_.end(), [&](const lane& l) { return l.name == name; });
    if (it == lanes_.end()) {
        lanes_.push_back({std::string(name), {}});
        it = lanes_.end() - 1;
    }
    waiting w;
    const std::size_t size = head.size() + body.size();
    if (size >= spare_min_bytes) w.bytes = take_spare(size, 2 * size);
    w.bytes.reserve(size);
    w.bytes.append(head);
    w.bytes.append(body);
    w.notification.assign(notification);
    bytes_ += w.bytes.size();
    it->messages.push_back(std::move(w));
}

void lane_writer::credit(std::string_view name, std::uint64_t bytes) {
    for (auto& l : lanes_) {
        if (l.name != name) continue;
        if (bytes > l.in_flight) break;
        l.in_flight -= bytes;
        return;
    }
    throw_error(errc::protocol_error, "ordo.lane_credit: credit for " + std::to_string(bytes) +
                                          " bytes of lane \"" + std::string(name) +
                                          "\", more than were sent");
}

std::uint64_t lane_writer::window_of(const lane& l, clock::time_point now) const noexcept {
    if (now - plain_at_ < shared_lane_hold) return shared_window_;
    for (const auto& o : lanes_)
        if (&o != &l && now - o.sent_at < shared_lane_hold) return shared_window_;
    return lane_window_bytes;
}

std::uint64_t lane_writer::window(std::string_view name, clock::time_point now) const noexcept {
    for (const auto& l : lanes_)
        if (l.name == name) return window_of(l, now);
    lane none{std::string(name), {}};
    return window_of(none, now);
}

std::uint64_t lane_writer::in_flight(std::string_view name) const noexcept {
    for (const auto& l : lanes_)
        if (l.name == name) return l.in_flight;
    return 0;
}

void lane_writer::pump(clock::time_point now) {
    if (pumping_) return;
    pumping_ = true;
    struct reset {
        bool& b;
        ~reset() { b = false; }
    } r{pumping_};
    if (plain_) {
        // Other messages went out since the last look: the lanes share the connection.
        const std::uint64_t plain = plain_();
        if (plain > plain_seen_) {
            plain_seen_ = plain;
            plain_at_ = now;
        }
    }
    while (bytes_ > 0 && backlog_() < piece_bytes_) {
        // Lanes with nothing waiting and nothing in flight are dropped; the next lane in turn
        // that may send goes.
        // (kept for shared_lane_hold after their last piece, which the others' windows
        // count).
        std::erase_if(lanes_, [now](const lane& l) {
            return l.messages.empty() && l.in_flight == 0 && now - l.sent_at >= shared_lane_hold;
        });
        std::size_t k = 0;
        while (k < lanes_.size() && !ready(lanes_[(next_ + k) % lanes_.size()], now)) ++k;
        if (k == lanes_.size()) break;  // every lane with messages waits for credit
        lane& l = lanes_[(next_ + k) % lanes_.size()];
        next_ = (next_ + k + 1) % lanes_.size();
        waiting& w = l.messages.front();
        const std::size_t n = std::min(piece_bytes_, w.bytes.size() - w.sent);
        const std::uint64_t remaining = w.bytes.size() - w.sent - n;
        write_piece_head(head_, l.name, remaining, n);
        try {
            send_(head_, w.bytes.view().substr(w.sent, n));
        } catch (const std::system_error&) {
            break;  // full (the next write or acknowledgement pumps again) or ending
        }
        w.sent += n;
        bytes_ -= n;
        ++pieces_;
        l.sent_at = now;
        if (!l.name.empty()) l.in_flight += n + piece_overhead_bytes;
        if (remaining == 0) {
            if (w.bytes.capacity() >= spare_min_bytes) keep_spare(std::move(w.bytes));
            l.messages.pop_front();
        }
    }
}

std::vector<std::string> lane_writer::clear() {
    std::vector<std::string> never;
    for (auto& l : lanes_)
        for (const auto& w : l.messages)
            if (!w.notification.empty()) never.push_back(w.notification);
    lanes_.clear();
    bytes_ = 0;
    return never;
}

// ---- lane_reader ----

// Grown by four times at a step up to what the first piece announced: few copies for a large
// message, and never more memory than four times the bytes that have arrived (nothing is
// allocated on the strength of a header alone).
void lane_reader::append(partial& p, std::string_view bytes) {
    const std::size_t need = p.bytes.size() + bytes.size();
    if (p.bytes.capacity() == 0 && p.total >= spare_min_bytes)
        p.bytes = take_spare(std::size_t(p.total), std::size_t(2 * p.total));
    if (need > p.bytes.capacity())
        p.bytes.reserve(std::size_t(std::min<std::uint64_t>(
            p.total, std::max<std::uint64_t>(need, 4 * std::uint64_t(p.bytes.capacity())))));
    p.bytes.append(bytes);
}

std::optional<std::string_view> lane_reader::take(std::string_view lane, std::uint64_t remaining,
                                   std::string_view bytes, const limits& l) {
    // The last whole message has been handled: its buffer is free. One too small to keep
    // is kept here, for the next: freed now (before the next is allocated) it would be the
    // top of the heap, which malloc gives back to the system, and the next one's page
    // faults would cost as much as its copy.
    if (done_.capacity() >= spare_min_bytes)
        keep_spare(std::move(done_));
    else
        done_.clear();
    if (lane.size() > max_lane_name_bytes)
        throw_error(errc::protocol_error, "ordo.piece: a lane name of " +
                                              std::to_string(lane.size()) + " bytes (the most is " +
                                              std::to_string(max_lane_name_bytes) + ")");
    auto it = std::find_if(partials_.begin(), partials_.end(),
                           [&](const partial& p) { return p.lane == lane; });
    if (it == partials_.end()) {
        // Compared without adding: a `remaining` near 2^64 must not wrap to a small total.
        if (remaining > l.max_message_bytes || bytes.size() > l.max_message_bytes - remaining)
            throw_error(errc::protocol_error,
                        "ordo.piece: a message of more than max_message_bytes (" +
                            std::to_string(l.max_message_bytes) + ") announced on lane \"" +
                            std::string(lane) + "\"");
        const std::uint64_t total = std::uint64_t(bytes.size()) + remaining;
        done_lane_.assign(lane);
        if (remaining == 0) return bytes;  // one piece: the message itself, not copied
        if (partials_.size() >= l.max_lanes)
            throw_error(errc::protocol_error,
                        "ordo.piece: more than max_lanes (" + std::to_string(l.max_lanes) +
                            ") lanes with a message in the making");
        if (held_ + total > 2 * l.max_message_bytes)
            throw_error(errc::protocol_error,
                        "ordo.piece: " + std::to_string(held_ + total) +
                            " bytes of messages in the making, over twice max_message_bytes");
        partial p;
        p.lane.assign(lane);
        p.total = total;
        p.since = std::chrono::steady_clock::now();
        append(p, bytes);
        held_ += total;
        partials_.push_back(std::move(p));
        return std::nullopt;
    }
    const std::uint64_t left = it->total - it->bytes.size();  // never negative: checked below
    if (bytes.size() > left || remaining != left - bytes.size())
        throw_error(errc::protocol_error,
                    "ordo.piece: lane \"" + it->lane + "\" announced a message of " +
                        std::to_string(it->total) + " bytes, and a piece of " +
                        std::to_string(bytes.size()) + " says " + std::to_string(remaining) +
                        " more after it where " + std::to_string(left) + " were left");
    append(*it, bytes);
    if (remaining > 0) return std::nullopt;
    held_ -= it->total;
    done_ = std::move(it->bytes);
    done_lane_ = std::move(it->lane);
    partials_.erase(it);
    return done_.view();
}

void lane_reader::restart_clocks(std::chrono::steady_clock::time_point now) noexcept {
    for (auto& p : partials_) p.since = now;
}

std::chrono::steady_clock::time_point lane_reader::oldest() const noexcept {
    std::chrono::steady_clock::time_point t{};
    for (const auto& p : partials_)
        if (t == std::chrono::steady_clock::time_point{} || p.since < t) t = p.since;
    return t;
}

void lane_reader::clear() noexcept {
    partials_.clear();
    held_ = 0;
    done_.release();
}

}  // namespace ordo::detail
