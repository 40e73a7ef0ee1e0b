// A router's replicas watch their servers' health (router_options::watch_health;
// docs/protocol.md, "Health"): each connection carries one ordo.health_watch stream, whose items
// say whether the server is serving. A replica whose server says otherwise gets no new calls.
#include "ordo/rpc/router.hpp"

#include "ordo/rpc/detail/stream_core.hpp"
#include "rpc/channels/router_state.hpp"

namespace ordo {
namespace {

// The router's end of one ordo.health_watch: each item is the server's state, handed to
// `said` on the router's executor. Nobody reads it as a stream, so credit goes back as
// items arrive.
class health_stream final : public detail::stream_core {
  public:
    health_stream(std::string remote, net::any_io_executor ex,
                  std::function<void(std::string)> said)
        : stream_core("ordo.health_watch", std::move(remote), ex, 4, 0),
          ex_(std::move(ex)),
          said_(std::move(said)) {}

    /// Ends the watch now (ordo.cancel to the server), from the router's executor: unlike
    /// cancel(), not posted, so that it goes out before a close that follows.
    void stop() { signal_.emit(net::cancellation_type::terminal); }
    net::cancellation_slot own_slot() { return signal_.slot(); }

    void on_item(const msgpack::object& item, std::size_t wire_bytes) override {
        credit c;
        {
            std::lock_guard lk(mu_);
            if (ended_) return;
            if (!within_credit()) return over_credit();
            count_item(wire_bytes);
            c = took_one(wire_bytes);
        }
        if (c.items) grant(c);
        std::string state = item.type == msgpack::type::STR
                                ? std::string(item.via.str.ptr, item.via.str.size)
                                : std::string("(not a string)");
        // Not from inside the connection's read: the router may send calls on it in reply.
        net::post(ex_, [said = said_, state = std::move(state)] { said(state); });
    }

  private:
    bool ready_locked() const noexcept override { return false; }

    net::any_io_executor ex_;
    std::function<void(std::string)> said_;
    net::cancellation_signal signal_;
};

// Its pending call: the end of the stream is told to `ended` (on the router's executor).
class health_call final : public detail::pending_call {
  public:
    health_call(std::shared_ptr<health_stream> s, net::any_io_executor ex,
                std::function<void(std::error_code)> ended)
        : s_(std::move(s)), ex_(std::move(ex)), ended_(std::move(ended)) {}
    void complete(std::error_code ec, call_outcome out) override {
        s_->end(ec, out);
        net::post(ex_, [ended = std::move(ended_), ec] { ended(ec); });
    }

  private:
    std::shared_ptr<health_stream> s_;
    net::any_io_executor ex_;
    std::function<void(std::error_code)> ended_;
};

}  // namespace

void router::state::watch_health(const std::shared_ptr<replica>& r) {
    if (!o.watch_health || r->shadow || !r->conn) return;
    // Each callback acts only while the connection it watches is the replica's.
    auto same = [this, t = tasks.hold(), wr = std::weak_ptr<replica>(r),
                 gen = r->gen]() -> std::shared_ptr<replica> {
        auto rep = wr.lock();
        if (closed || !rep || rep->gen != gen || !rep->conn) return nullptr;
        return rep;
    };
    auto s = std::make_shared<health_stream>(r->url, ex, [this, same](std::string state) {
        if (auto rep = same()) heard_health(*rep, state);
    });
    auto call = std::make_unique<health_call>(s, ex, [this, same](std::error_code ec) {
        auto rep = same();
        if (!rep) return;
        rep->stop_health = nullptr;
        if (rep->ph != phase::live) return;  // draining: the connection is ending anyway
        // A whole-stream deadline (peer_options::default_timeout) ended it: watch again. Any
        // other end (a server that does not know the method, or stopped the stream) leaves
        // the replica taken as serving.
        if (ec == errc::timed_out) return watch_health(rep);
        if (rep->unwell) heard_health(*rep, "serving");
    });
    call->method = "ordo.health_watch";
    call->params = detail::pack_params();
    call->own = true;  // not one of the router's calls: the connection's observer ignores it
    call->slot = s->own_slot();
    call->stream = s;
    r->stop_health = [w = std::weak_ptr<health_stream>(s)] {
        if (auto h = w.lock()) h->stop();
    };
    r->conn->start_call(std::move(call));
}

void router::state::close_idle(replica& r) {
    auto stop = std::move(r.stop_health);
    r.stop_health = nullptr;
    if (!stop) {
        if (r.conn) r.conn->close();
        return;
    }
    // The connection withdraws the watch from a handler it posts, which sends the server its
    // ordo.cancel: the close comes after it.
    stop();
    net::post(ex, [t = tasks.hold(), wr = shared(&r)->weak_from_this(), gen = r.gen] {
        auto rep = wr.lock();
        if (rep && rep->gen == gen && rep->conn && rep->in_flight == 0) rep->conn->close();
    });
}

void router::state::heard_health(replica& r, const std::string& state) {
    const bool unwell = state != "serving";
    if (unwell == r.unwell) return;
    r.unwell = unwell;
    place.refresh();
    if (unwell) {
        event("replica " + r.url + " says it is " + state + ": no new calls");
    } else {
        event("replica " + r.url + " is serving again");
        r.failures_in_a_row = 0;
    }
    schedule_pump();  // its waiting keyed calls move on, or calls waiting for room go there
}

}  // namespace ordo
