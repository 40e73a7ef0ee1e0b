// The caller's side of the Python binding, on the io thread: connect, calls, notifications,
// streams. Results go to the caller's hub as msgpack bytes (see _core.hpp).
#include "_core.hpp"

#include <algorithm>
#include <deque>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>

namespace ordo::py {

namespace {

// At least the bytes `o` packs into (msgpack's longest heads: 9 bytes).
std::size_t packed_bound(const msgpack::object& o) {
    switch (o.type) {
        case msgpack::type::STR: return 5 + o.via.str.size;
        case msgpack::type::BIN: return 5 + o.via.bin.size;
        case msgpack::type::EXT: return 6 + o.via.ext.size;
        case msgpack::type::ARRAY: {
            std::size_t n = 5;
            for (const auto& x : o.via.array) n += packed_bound(x);
            return n;
        }
        case msgpack::type::MAP: {
            std::size_t n = 5;
            for (const auto& kv : o.via.map) n += packed_bound(kv.key) + packed_bound(kv.val);
            return n;
        }
        default: return 9;
    }
}

struct string_sink {
    std::string* s;
    void write(const char* p, std::size_t n) { s->append(p, n); }
};

// Packs `o` after what `out` holds (reserved first: big bins are copied once).
void pack_into(std::string& out, const msgpack::object& o) {
    out.reserve(out.size() + packed_bound(o));
    string_sink sink{&out};
    msgpack::pack(sink, o);
}

bool borrow(msgpack::type::object_type, std::size_t, void*) {
    return true;  // the batch outlives its unpacked objects: run_batch reads it in place
}

// One call in flight: completes into its hub, and lets its cancellation signal go afterwards
// (posted: the channel may still touch the slot while it completes the call).
class py_call final : public detail::pending_call {
  public:
    py_call(std::shared_ptr<hub> h, std::uint64_t token, std::string method, std::string remote)
        : hub_(std::move(h)), token_(token), method_(std::move(method)), remote_(std::move(remote)) {}

    void complete(std::error_code ec, call_outcome out) override {
        completion c{kind::call_done, token_};
        if (!ec)
            c.data = pack_object(out.result);
        else
            describe_failure(c, ec, method_, remote_, out.detail);  // `method` may be moved
        hub_->push(std::move(c));
        auto& rt = runtime::get();
        net::post(rt.io, [token = token_] { runtime::get().calls.erase(token); });
    }
    bool takes_borrowed() const noexcept override { return true; }  // packed at once

  private:
    std::shared_ptr<hub> hub_;
    std::uint64_t token_;
    std::string method_;
    std::string remote_;
};

// A stream whose items go to a hub as they arrive; the reader (Python) gives credit back with
// stream_took as it takes them, so the window bounds what waits in Python too.
class py_stream final : public detail::stream_core {
  public:
    class end_waiter final : public detail::parked {
      public:
        end_waiter(std::shared_ptr<hub> h, std::uint64_t token)
            : hub_(std::move(h)), token_(token) {}
        // Called once, when the stream ends (with or without stream_core's mutex held): the
        // outcome was set before, and is read by finish() on the io thread.
        void wake() override {
            net::post(runtime::get().io, [h = hub_, token = token_] {
                auto& rt = runtime::get();
                auto it = rt.streams.find(token);
                if (it == rt.streams.end()) return;  // the reader has gone
                auto s = std::move(it->second);
                rt.streams.erase(it);
                static_cast<py_stream&>(*s).finish(*h);
            });
        }

      private:
        std::shared_ptr<hub> hub_;
        std::uint64_t token_;
    };

    py_stream(std::shared_ptr<hub> h, std::uint64_t token, std::string method,
              const channel_impl& ch, std::uint32_t window, std::uint64_t window_bytes,
              shape how)
        : stream_core(std::move(method), ch.remote_address(), ch.get_executor(), window,
                      window_bytes),
          hub_(std::move(h)),
          token_(token),
          upload_(how == shape::upload) {
        if (how != shape::reads) set_writes();
        std::lock_guard lk(mu_);
        waiter_ = std::make_unique<end_waiter>(hub_, token_);
    }

    void on_item(const msgpack::object& item, std::size_t wire_bytes) override {
        {
            std::lock_guard lk(mu_);
            if (ended_) return;
            if (upload_) return fail_and_cancel("the server sent an item on a client stream");
            if (!within_credit()) return over_credit();
            count_item(wire_bytes);
        }
        completion c{kind::stream_item, token_};
        c.a = wire_bytes;
        // A big item is handed over where it was read, when its connection gives that up.
        if (wire_bytes < kept_bytes_min ||
            (c.kept_view = detail::keep_delivered_item(item, c.kept)).empty())
            c.data = pack_object(item);
        hub_->push(std::move(c));
    }

    // The reader took `items` items of `bytes` wire bytes together (Python reports them
    // once they make the credit that is due).
    void took(std::uint64_t bytes, std::uint64_t items) {
        credit c;
        {
            std::lock_guard lk(mu_);
            for (std::uint64_t i = 0; i < items; ++i) {  // the bytes spread over the items
                const credit one = took_one(bytes / items + (i < bytes % items ? 1 : 0));
                c.items += one.items;
                c.bytes += one.bytes;
            }
        }
        if (c.items) grant(c);
    }

    void finish(hub& h) {
        completion c{kind::stream_end, token_};
        std::lock_guard lk(mu_);
        if (ec_)
            describe_failure(c, ec_, method(), remote(), detail_);
        else if (upload_)
            c.data = std::move(result_);  // the handler's answer (ordo.Upload.finish)
        h.push(std::move(c));
    }

    // ---- the caller's items (two-way and client streams), on the io thread ----
    void write(held_bytes item) {
        if (closing_) return;  // the Python side writes nothing after close(): not reached
        out_.push_back(std::move(item));
        if (!pumping_) start_pump();
    }
    void close() {
        closing_ = true;
        if (pumping_) return;  // after the items queued
        report_written(true);
        close_writes();
    }

  private:
    bool ready_locked() const noexcept override { return ended_; }
    std::string check_result(const msgpack::object& result) override {
        if (!upload_) return stream_core::check_result(result);
        result_ = pack_object(result);
        return {};
    }

    void start_pump() {
        pumping_ = true;
        auto self = std::static_pointer_cast<py_stream>(shared_from_this());
        net::co_spawn(runtime::get().io, pump(std::move(self)), net::detached);
    }

    // Sends the queued items in order, each once credit allows (stream_core::write_item), and
    // reports them to Python, which bounds what it has handed over and not yet seen sent
    // (ordo/_writing.py, _Writes: 64 items or 1 MiB; it waits until fewer than half are
    // unreported). Reported every 16 items, and when the queue is empty with 256 KiB or more
    // unreported: a writer that is waiting hears of its items in time, and one that writes a
    // message at a time and waits for the answer (a Dask comm) is not woken once more for each.
    static net::awaitable<void> pump(std::shared_ptr<py_stream> s) {
        bool ok = true;
        while (ok && !s->out_.empty()) {
            std::size_t size = 0;
            try {
                // Sent from Python's bytes: a big item's are kept until the connection has
                // written them from there, a smaller one's until it is copied.
                held_bytes item = std::move(s->out_.front());
                s->out_.pop_front();
                const std::string front = item.take_front();  // before a big bin's bytes
                const std::string_view bytes = item.view();
                size = front.size() + bytes.size();
                std::unique_ptr<held_body> keep = held_item::keep_big(item);
                ok = co_await write_item(s, front, bytes, keep);
            } catch (const std::exception&) {  // not cancelled, never closed here: not reached
                ok = false;
            }
            if (ok) {
                ++s->sent_;
                s->unreported_bytes_ += size;
            }
            if (!ok || s->sent_ - s->reported_ >= 16 ||
                (s->out_.empty() && (s->unreported_bytes_ >= (256u << 10) || s->closing_)))
                s->report_written(ok);
        }
        s->out_.clear();  // the call ended: what is left goes nowhere, as Python is told
        s->pumping_ = false;
        if (s->closing_) s->close_writes();
    }

    void report_written(bool ok) {
        if (ok && sent_ == reported_) return;
        completion c{kind::stream_written, token_};
        c.a = sent_;
        c.b = ok ? 0 : 1;
        hub_->push(std::move(c));
        reported_ = sent_;
        unreported_bytes_ = 0;
    }

    std::shared_ptr<hub> hub_;
    std::uint64_t token_;
    bool upload_;
    std::string result_;  // an upload's answer, packed
    std::deque<held_bytes> out_;
    bool pumping_ = false;
    bool closing_ = false;
    std::uint64_t sent_ = 0;
    std::uint64_t reported_ = 0;  // sent_ as Python last heard it
    std::size_t unreported_bytes_ = 0;
};

net::awaitable<void> connect_into(std::shared_ptr<hub> h, std::uint64_t token, std::string url,
                                  std::uint64_t server) {
    completion c{kind::connected, token};
    try {
        std::shared_ptr<const handlers> table;
        if (server) {
            table = server_handlers(server, h);
            if (!table) throw_error(errc::closed, "ordo: connect to " + url +
                                                      ": the handlers' server has stopped");
        }
        // A named lvalue: GCC 12 relocates a temporary passed by value to a coroutine
        // bitwise (docs/calls-and-channels.md, "GCC 12 note"), which breaks its strings.
        peer_options po;
        // Notifications taken and never written (the connection ended first) are told to the
        // channel: its next notify raises why, and Channel.undelivered counts them. Runs on
        // this thread, after the id is set below.
        auto id = std::make_shared<std::uint64_t>(0);
        po.on_undelivered = [h, id](const undelivered_notification& u) {
            completion d{kind::undelivered, *id};
            d.code = u.code.category() == error_category() ? u.code.value()
                                                           : static_cast<int>(errc::peer_lost);
            d.text = "ordo: notification " + u.method + " was taken and not delivered: " + u.reason;
            h->push(std::move(d));
        };
        channel ch = co_await async_connect(url, po, table.get());
        auto& rt = runtime::get();
        // The table must outlive the connection: kept with the channel.
        if (table) rt.channel_handlers[rt.next_id] = table;
        *id = rt.next_id;
        c.a = rt.next_id++;
        c.text = ch.remote_address();
        rt.channels.emplace(c.a, std::move(ch));
    } catch (const rpc_error& e) {
        c.code = e.code().category() == error_category() ? e.code().value() : 0;
        c.text = e.what();
        c.detail = e.detail();
    } catch (const std::exception& e) {
        c.code = static_cast<int>(errc::bad_address);
        c.text = e.what();
    }
    h->push(std::move(c));
}

call_options options(long timeout_ms, std::string key, std::uint32_t window = 0) {
    call_options o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    o.key = std::move(key);
    o.window = window;
    return o;
}

}  // namespace

void describe_failure(completion& c, std::error_code ec, const std::string& method,
                      const std::string& peer, const std::string& detail) {
    c.code = ec.category() == error_category() ? ec.value() : 0;
    c.text = rpc_error(ec, method, peer, detail).what();
    c.detail = detail;
}

void start_connect(std::shared_ptr<hub> h, std::uint64_t token, std::string url,
                   std::uint64_t server) {
    net::co_spawn(runtime::get().io, connect_into(std::move(h), token, std::move(url), server),
                  net::detached);  // connect_into catches everything
}

void start_call(std::shared_ptr<hub> h, std::uint64_t chan, std::uint64_t token, std::string method,
                std::string params, long timeout_ms, std::string key, metadata meta) {
    auto impl = runtime::get().find_channel(chan);
    if (!impl) {
        completion c{kind::call_done, token};
        describe_failure(c, make_error_code(errc::closed), method, "", "the channel is closed");
        h->push(std::move(c));
        return;
    }
    auto op = std::make_unique<py_call>(std::move(h), token, method, impl->remote_address());
    auto& rt = runtime::get();
    auto sig = std::make_unique<net::cancellation_signal>();
    op->slot = sig->slot();
    rt.calls[token] = std::move(sig);
    op->method = std::move(method);
    op->params.write(params.data(), params.size());
    op->options = options(timeout_ms, std::move(key));
    op->options.metadata = std::move(meta);
    impl->start_call(std::move(op));  // `impl` keeps it alive across a completion at once
}

namespace {

std::string_view str(const msgpack::object& o) {
    if (o.type == msgpack::type::STR) return {o.via.str.ptr, o.via.str.size};
    if (o.type == msgpack::type::BIN) return {o.via.bin.ptr, o.via.bin.size};
    throw std::invalid_argument("ordo: a batch entry's string is not a string");
}

}  // namespace

std::string pack_object(const msgpack::object& o) {
    std::string s;
    pack_into(s, o);
    return s;
}

void run_batch(const std::shared_ptr<hub>& h, std::string_view batch) {
    auto handle = msgpack::unpack(batch.data(), batch.size(), borrow);
    const auto& all = handle.get();
    if (all.type != msgpack::type::ARRAY) return;
    // A channel that refused a notification of this batch is not offered the rest of its
    // notifications here: most would be refused the same way, at the cost of an exception
    // each, and one that fitted (after an oversized one) would arrive after a gap. The
    // channel's one report counts them; its notify() raises from then on (ordo/_api.py).
    struct refusal {
        std::uint64_t chan;
        completion c;
        std::size_t more = 0;
    };
    // Reported however the loop ends (an entry that does not decode throws).
    struct reports {
        const std::shared_ptr<hub>& h;
        std::vector<refusal> all;
        ~reports() {
            for (auto& r : all) {
                if (r.more > 0)
                    r.c.text += " (and the " + std::to_string(r.more) +
                                " notifications after it in the same batch were not sent)";
                h->push(std::move(r.c));
            }
        }
    } rep{h, {}};
    auto& refused = rep.all;
    std::string params;  // a notification's, packed again (its buffer used for them all)
    for (std::uint32_t i = 0; i < all.via.array.size; ++i) {
        const auto& e = all.via.array.ptr[i];
        if (e.type != msgpack::type::ARRAY || e.via.array.size < 3) continue;
        const auto* f = e.via.array.ptr;
        if (f[0].as<int>() == 0 && e.via.array.size == 4) {
            // Notifications carry their params array inline (packed with the batch).
            const auto chan = f[1].as<std::uint64_t>();
            auto r = std::find_if(refused.begin(), refused.end(),
                                  [chan](const refusal& x) { return x.chan == chan; });
            if (r != refused.end()) {
                ++r->more;
                continue;
            }
            params.clear();
            if (f[3].type == msgpack::type::ARRAY)
                pack_into(params, f[3]);
            else
                params = str(f[3]);
            if (auto c = try_notify(chan, std::string(str(f[2])), params))
                refused.push_back({chan, std::move(*c)});
        } else if (f[0].as<int>() == 2) {  // [2, request, code, data]: a handler's answer
            respond(f[1].as<std::uint64_t>(), f[2].as<int>(), std::string(str(f[3])));
        } else if (f[0].as<int>() == 3) {  // [3, request, item]: a streaming handler's item
            stream_write(f[1].as<std::uint64_t>(), held_bytes(std::string(str(f[2]))));
        } else if (f[0].as<int>() == 4 && e.via.array.size == 4) {
            // [4, stream, bytes, items]: the reader took items
            stream_took(f[1].as<std::uint64_t>(), f[2].as<std::uint64_t>(),
                        f[3].as<std::uint64_t>());
        } else if (f[0].as<int>() == 5) {  // [5, stream, item]: the caller writes an item
            stream_write_in(f[1].as<std::uint64_t>(), held_bytes(std::string(str(f[2]))));
        } else if (f[0].as<int>() == 6) {  // [6, stream, 0]: the caller's last item was written
            stream_close_writes(f[1].as<std::uint64_t>());
        } else if (f[0].as<int>() == 7) {  // [7, request, items]: a reading handler took items
            reader_took(f[1].as<std::uint64_t>(), f[2].as<std::uint64_t>());
        } else if (e.via.array.size == 7 || e.via.array.size == 8) {
            // The eighth: the call's metadata, [[key, value], ...] (ordo/_api.py, call()).
            metadata meta;
            if (e.via.array.size == 8 && f[7].type == msgpack::type::ARRAY)
                for (const auto& kv : f[7].via.array)
                    if (kv.type == msgpack::type::ARRAY && kv.via.array.size == 2)
                        meta.emplace_back(std::string(str(kv.via.array.ptr[0])),
                                          std::string(str(kv.via.array.ptr[1])));
            start_call(h, f[1].as<std::uint64_t>(), f[2].as<std::uint64_t>(),
                       std::string(str(f[3])), std::string(str(f[4])), f[5].as<long>(),
                       std::string(str(f[6])), std::move(meta));
        }
    }
}

void cancel_call(std::uint64_t token) {
    auto& rt = runtime::get();
    auto it = rt.calls.find(token);
    if (it != rt.calls.end()) it->second->emit(net::cancellation_type::terminal);
}

std::optional<completion> try_notify(std::uint64_t chan, const std::string& method,
                                     const std::string& params) {
    auto impl = runtime::get().find_channel(chan);
    try {
        if (!impl) throw_error(errc::closed, "ordo: notify " + method + ": the channel is closed");
        impl->notify_raw(method, params);
        return std::nullopt;
    } catch (const std::system_error& e) {
        completion c{kind::notify_failed, chan};
        c.code = e.code().category() == error_category() ? e.code().value() : 0;
        c.text = e.what();
        return c;
    }
}

void send_notify(std::shared_ptr<hub> h, std::uint64_t chan, const std::string& method,
                 const std::string& params) {
    if (auto c = try_notify(chan, method, params)) h->push(std::move(*c));
}

void start_stream(std::shared_ptr<hub> h, std::uint64_t chan, std::uint64_t token,
                  std::string method, std::string params, long timeout_ms, std::string key,
                  std::uint32_t window, std::uint64_t window_bytes, shape how) {
    auto impl = runtime::get().find_channel(chan);
    if (!impl) {
        completion c{kind::stream_end, token};
        describe_failure(c, make_error_code(errc::closed), method, "", "the channel is closed");
        h->push(std::move(c));
        return;
    }
    auto o = options(timeout_ms, std::move(key), window);
    o.window_bytes = window_bytes ? window_bytes : default_stream_window_bytes;
    auto s = std::make_shared<py_stream>(std::move(h), token, method, *impl,
                                         o.window ? o.window : default_stream_window,
                                         o.window_bytes, how);
    runtime::get().streams[token] = s;
    detail::params_buffer p;
    p.write(params.data(), params.size());
    detail::start_stream(impl, std::move(s), std::move(p), std::move(o));
}

void stream_took(std::uint64_t token, std::uint64_t bytes, std::uint64_t items) {
    auto& rt = runtime::get();
    auto it = rt.streams.find(token);
    if (it != rt.streams.end()) static_cast<py_stream&>(*it->second).took(bytes, items);
}

void stream_write_in(std::uint64_t token, held_bytes item) {
    auto& rt = runtime::get();
    auto it = rt.streams.find(token);
    if (it != rt.streams.end()) static_cast<py_stream&>(*it->second).write(std::move(item));
}

void stream_close_writes(std::uint64_t token) {
    auto& rt = runtime::get();
    auto it = rt.streams.find(token);
    if (it != rt.streams.end()) static_cast<py_stream&>(*it->second).close();
}

void stream_cancel(std::uint64_t token) {
    auto& rt = runtime::get();
    auto it = rt.streams.find(token);
    if (it != rt.streams.end()) it->second->cancel();
}

void stream_forget(std::uint64_t token) {
    auto& rt = runtime::get();
    auto it = rt.streams.find(token);
    if (it == rt.streams.end()) return;
    it->second->cancel();  // does nothing once it has ended
    rt.streams.erase(it);
}

void open_lane(std::uint64_t chan, std::uint64_t lane, const std::string& name) {
    auto& rt = runtime::get();
    auto it = rt.channels.find(chan);
    if (it == rt.channels.end()) return;  // closed: the lane's calls fail as its channel's
    try {
        rt.channels.emplace(lane, it->second.lane(name));
    } catch (const std::system_error&) {
        // A name the Python side checked: not reached. Its calls fail as on a closed channel.
    }
}

void forget_channel(std::uint64_t chan) {
    runtime::get().channels.erase(chan);
}

void close_peer(std::uint64_t id) {
    auto& rt = runtime::get();
    auto it = rt.peers_by_id.find(id);
    if (it == rt.peers_by_id.end()) return;
    if (auto p = it->second.lock()) p->close();
}

void close_channel(std::uint64_t chan) {
    auto& rt = runtime::get();
    auto it = rt.channels.find(chan);
    if (it == rt.channels.end()) return;
    const auto impl = it->second.impl();
    rt.channels.erase(it);
    auto table = rt.channel_handlers.find(chan);
    if (table != rt.channel_handlers.end()) {
        // Kept until the connection has ended: its handlers may still run meanwhile.
        auto keep = std::move(table->second);
        rt.channel_handlers.erase(table);
        if (auto p = std::dynamic_pointer_cast<peer>(impl))
            p->on_closed([keep](const std::error_code&, const std::string&) {});
    }
    if (impl) impl->close();  // an ordered peer sends what is queued first
}

}  // namespace ordo::py
