// Client and two-way streams through the gateway (docs/gateway.md, "Client and two-way
// streams"): the lines of an NDJSON request body are the items the caller writes, each sent
// within the server's credit (the body is read no faster than the handler reads), and a
// two-way stream's items go back as NDJSON lines of a chunked response while the body is still
// being read. A client that goes away, or a gateway that stops, cancels the stream.
#include <asio/experimental/awaitable_operators.hpp>

#include "gateway/gateway_state.hpp"
#include "json/json_codec.hpp"

namespace ordo::gw {
namespace {

using json = nlohmann::json;

// The caller's end of a client stream, as the gateway holds it: items written, then one answer
// kept as it came.
class upload_end final : public detail::stream_core {
  public:
    upload_end(std::string method, std::string remote, net::any_io_executor ex)
        : stream_core(std::move(method), std::move(remote), std::move(ex), 1, 0) {
        set_writes();
    }
    void on_item(const msgpack::object&, std::size_t) override {
        std::lock_guard lk(mu_);
        if (!ended_) fail_and_cancel("the server sent an item on a client stream");
    }
    /// Completes once the call has ended, or when the awaiting coroutine is cancelled.
    static net::awaitable<void> ended(std::shared_ptr<upload_end> s) { co_await s->wait_more(); }
    bool has_ended() const {
        std::lock_guard lk(mu_);
        return ended_;
    }
    /// Once it has ended: the failure, if it failed.
    std::optional<rpc_error> failure() const {
        std::lock_guard lk(mu_);
        if (!ec_) return std::nullopt;
        return rpc_error(ec_, method(), remote(), detail_);
    }
    const msgpack::object& answer() const { return result_.get(); }

  private:
    bool ready_locked() const noexcept override { return ended_; }
    std::string check_result(const msgpack::object& result) override {
        result_ = msgpack::clone(result);
        return {};
    }
    msgpack::object_handle result_;
};

// Lines of the body as they come: the reader is fed what the connection has read, within
// max_body_bytes of bytes fed and not yet taken (so a line longer than that is refused, 413).
class body_lines {
  public:
    enum class got { line, end, more, failed };
    body_lines(connection& c, std::size_t max_line) : c_(c), max_(max_line) {}

    // The next line (without its end), the end of the body, or that more must be read first.
    got next(std::string& line) {
        auto& body = c_.reader.request().body;
        for (;;) {
            if (const auto nl = body.find('\n', scanned_); nl != std::string::npos) {
                line.assign(body, 0, nl);
                body.erase(0, nl + 1);
                scanned_ = 0;
                if (!line.empty() && line.back() == '\r') line.pop_back();
                return got::line;
            }
            scanned_ = body.size();
            if (c_.reader.failed()) return got::failed;
            if (c_.reader.ready()) {
                if (body.empty()) return got::end;
                line = std::move(body);  // the last line, without a line end
                body.clear();
                scanned_ = 0;
                return got::line;
            }
            if (c_.unread() == 0) return got::more;
            // Raw bytes: their body bytes are no more than that (chunk heads aside). With no room
            // left, one byte more: the reader refuses a body byte beyond max_body (413).
            const std::size_t room = max_ > body.size() ? max_ - body.size() : 1;
            const std::string_view pending(c_.in.data() + c_.in_taken,
                                           std::min(c_.unread(), room));
            c_.in_taken += c_.reader.feed(pending);
            c_.wake.cancel();  // the connection's reader, waiting for room, reads on
            c_.deadline = std::chrono::steady_clock::time_point::max();  // the body moves
        }
    }

  private:
    connection& c_;
    std::size_t max_;
    std::size_t scanned_ = 0;  // of the body, searched for a line end already
};

// Packs line `n` of the body into the stream's next item; the reply that refuses it, if not.
std::optional<reply> pack_item(detail::stream_core& st, const std::string& method,
                               const std::string& text, std::uint64_t n) {
    const limits l{};
    const std::string where = "ordo gateway: stream " + method + ": line " + std::to_string(n);
    try {
        // Depth first, before the parser builds a tree; the item travels two containers deep
        // ([2, "ordo.in", [msgid, item]]).
        if (json_codec::nesting_depth(text, l.max_depth) + 2 > l.max_depth)
            throw json_codec::over_limit("nested deeper than max_depth (" +
                                         std::to_string(l.max_depth) + ")");
        const json j = json::parse(text);
        detail::params_buffer b;
        json_codec::pack(b, j, l, 2);
        st.item_buffer().write(b.data(), b.size());
    } catch (const json_codec::over_limit& e) {
        return request_error(413, "too_large", where + " is over a limit: " + e.what());
    } catch (const json::exception& e) {
        return request_error(400, "bad_json", where + " is not JSON (" + e.what() + ")");
    }
    return std::nullopt;
}

// The reader refused the body (a line over max_body_bytes, malformed chunks): JSON, as the
// other failures of a stream.
reply body_refused(connection& c) {
    const int st = c.reader.error_status();
    return request_error(st, st == 413 ? "too_large" : "bad_request", c.reader.error_reason());
}

// Writes the item packed into `st`'s item buffer: true once sent, false when the call has ended
// (its answer or failure came), nothing when cancelled first (by the connection's event; the
// item stays packed for the next try).
net::awaitable<std::optional<bool>> write_step(std::shared_ptr<detail::stream_core> st) {
    try {
        co_return co_await detail::stream_core::write_item(std::move(st));
    } catch (const std::system_error&) {
        co_return std::nullopt;
    }
}

// One client stream: the body's lines are written, then the answer is the reply.
net::awaitable<int> serve_upload(gateway::state& s, const http_request& req, const call_request& r,
                                 detail::params_buffer params) {
    using namespace net::experimental::awaitable_operators;
    connection& c = *r.conn;
    auto up = std::make_shared<upload_end>(r.method, s.remote(), r.via.get_executor());
    ++s.calls;
    detail::start_stream(r.via.impl(), up, std::move(params), options_of(s, r));
    auto gone = [&] {
        up->cancel();
        ++s.abandoned;
        s.event("ordo gateway: client stream " + r.method + " cancelled: its client " + c.remote +
                " went away");
        return 200;
    };
    body_lines lines(c, s.o.max_body_bytes);
    std::optional<reply> refused;  // a line, or the body, that cannot be written
    std::string line;
    std::uint64_t n = 0;
    for (bool writing = true; writing;) {
        const auto g = lines.next(line);
        if (g == body_lines::got::line) {
            ++n;
            if (line.find_first_not_of(" \t") == std::string::npos) continue;  // a blank line
            if ((refused = pack_item(*up, r.method, line, n))) break;
            for (;;) {  // within the server's credit, while the client is there
                const std::uint64_t before = up->written();
                auto w = co_await (write_step(up) || wait_event(c));
                if (up->written() > before) break;  // sent (whichever side completed first)
                if (w.index() == 0) {
                    if (auto sent = std::get<0>(w); sent && !*sent) {
                        writing = false;  // the call has ended (its answer came)
                        break;
                    }
                    continue;
                }
                if (c.eof) co_return gone();
                if (s.stopping) up->cancel();
            }
        } else if (g == body_lines::got::end) {
            up->close_writes();
            break;
        } else if (g == body_lines::got::failed) {
            refused = body_refused(c);
            break;
        } else {  // more of the body must come: wait for it (or for the call to end)
            if (up->has_ended()) break;
            if (c.eof) co_return gone();
            if (c.expired) {
                ++s.limit_closes;
                refused = request_error(408, "request_timeout",
                                        "ordo gateway: client stream " + r.method +
                                            ": the body stopped for idle_timeout (" +
                                            std::to_string(s.o.idle_timeout.count()) + " ms)");
                break;
            }
            if (s.stopping) up->cancel();
            if (c.deadline == std::chrono::steady_clock::time_point::max())
                c.set_deadline(s.o.idle_timeout);
            co_await (upload_end::ended(up) || wait_event(c));
        }
    }
    c.deadline = std::chrono::steady_clock::time_point::max();
    if (refused) {
        up->cancel();
        refused->close = !c.reader.ready();  // the rest of the body is not read: it closes
        co_await send_reply(s, c, req, *refused);
        co_return refused->status;
    }
    while (!up->has_ended()) {
        co_await (upload_end::ended(up) || wait_event(c));
        if (c.eof && !up->has_ended()) co_return gone();
        if (s.stopping) up->cancel();
    }
    reply rep;
    if (auto f = up->failure())
        rep = error_reply(f->code(), f->what(), f->detail());
    else
        rep = reply{200, "application/json", json_codec::dump(up->answer()) + "\n"};
    rep.close = !c.reader.ready();  // answered before the body's end: the rest is not read
    co_await send_reply(s, c, req, rep);
    co_return rep.status;
}

// One two-way stream: the response (NDJSON, chunked) starts at once; the body's lines are
// written and the handler's items sent back as they come, each way in order.
net::awaitable<int> serve_two_way(gateway::state& s, const call_request& r,
                                  detail::params_buffer params) {
    using namespace net::experimental::awaitable_operators;
    connection& c = *r.conn;
    auto st = std::make_shared<detail::stream_state<value>>(
        r.method, s.remote(), r.via.get_executor(), default_stream_window,
        default_stream_window_bytes);
    st->set_writes();
    ++s.calls;
    detail::start_stream(r.via.impl(), st, std::move(params), options_of(s, r));
    auto gone = [&] {
        st->cancel();
        ++s.abandoned;
        s.event("ordo gateway: two-way stream " + r.method + " cancelled: its client " +
                c.remote + " went away");
        return 200;
    };
    static constexpr std::string_view head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    if (!co_await write_all(c, head)) co_return gone();
    body_lines lines(c, s.o.max_body_bytes);
    std::string line;
    std::uint64_t n = 0;
    bool writes_open = true;
    bool packed = false;  // an item is packed and waits for credit
    for (;;) {
        while (writes_open && !packed) {
            const auto g = lines.next(line);
            if (g == body_lines::got::more) {  // the body must go on within idle_timeout
                if (c.deadline == std::chrono::steady_clock::time_point::max())
                    c.set_deadline(s.o.idle_timeout);
                break;
            }
            std::optional<reply> refused;
            if (g == body_lines::got::line) {
                ++n;
                if (line.find_first_not_of(" \t") == std::string::npos) continue;
                refused = pack_item(*st, r.method, line, n);
                packed = !refused;
            } else if (g == body_lines::got::end) {
                st->close_writes();
                writes_open = false;
            } else {
                refused = body_refused(c);
            }
            if (refused) {  // the stream ends with why, as its last line
                st->cancel();
                co_await end_with_error(c, *refused);
                co_return 200;
            }
        }
        std::optional<stream_step> step;
        if (packed) {
            // The write may go even when another side completes first (Asio starts all
            // three): whether it went is read from the count, not from who won.
            const std::uint64_t before = st->written();
            auto got = co_await (next_step(st) || write_step(st) || wait_event(c));
            if (got.index() == 0) step = std::move(std::get<0>(got));
            if (st->written() > before) {
                packed = false;
            } else if (got.index() == 1) {
                if (auto sent = std::get<1>(got); sent && !*sent)
                    packed = writes_open = false;  // the call has ended
            }
        } else {
            auto got = co_await (next_step(st) || wait_event(c));
            if (got.index() == 0) step = std::move(std::get<0>(got));
        }
        if (!step) {  // an event of the connection (or a write went)
            if (c.eof) co_return gone();
            if (s.stopping) st->cancel();
            if (c.expired && writes_open) {
                ++s.limit_closes;
                st->cancel();
                co_await end_with_error(
                    c, request_error(408, "request_timeout",
                                     "ordo gateway: two-way stream " + r.method +
                                         ": the body stopped for idle_timeout (" +
                                         std::to_string(s.o.idle_timeout.count()) + " ms)"));
                co_return 200;
            }
            continue;
        }
        if (step->failed) {
            co_await end_with_error(c, error_reply(step->failed->code(), step->failed->what(),
                                                   step->failed->detail()));
            co_return 200;
        }
        if (!step->item) {
            co_await write_chunk(c, "");
            co_return 200;
        }
        if (!co_await write_chunk(c, json_codec::dump(step->item->get()) + "\n"))
            co_return gone();
    }
}

}  // namespace

net::awaitable<int> serve_body_stream(gateway::state& s, const http_request& req,
                                      const call_request& r, bool two_way) {
    connection& c = *r.conn;
    std::optional<reply> bad;
    auto params = params_of(r, r.params ? std::string_view(*r.params) : std::string_view(), bad);
    // Refused before the body is read: the connection closes after the reply.
    if (!params) {
        bad->close = !c.reader.ready();
        co_await send_reply(s, c, req, *bad);
        co_return bad->status;
    }
    if (r.already_due) {
        reply rep = timed_out_before(s, r);
        rep.close = !c.reader.ready();
        co_await send_reply(s, c, req, rep);
        co_return rep.status;
    }
    if (two_way) co_return co_await serve_two_way(s, r, std::move(*params));
    co_return co_await serve_upload(s, req, r, std::move(*params));
}

}  // namespace ordo::gw
