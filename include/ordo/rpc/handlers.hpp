// Handler registration: plain functions, lambdas and coroutines, typed at registration and
// reduced to one type-erased entry each.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <stdexcept>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ordo/error.hpp"
#include "ordo/net.hpp"
#include "ordo/rpc/batch_handler.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/rpc/detail/batcher.hpp"
#include "ordo/rpc/detail/handler_entry.hpp"
#include "ordo/rpc/detail/handler_shapes.hpp"
#include "ordo/rpc/detail/type_traits.hpp"
#include "ordo/rpc/health.hpp"
#include "ordo/rpc/interface.hpp"
#include "ordo/rpc/stats.hpp"
#include "ordo/rpc/stream_call.hpp"

namespace ordo {

class peer;
namespace detail {
class health_board;
}

/// One request as a server's access log records it (server_options::access_log), once it has
/// been answered, or refused without running. The views are valid during the call only.
struct access_record {
    std::chrono::system_clock::time_point when;  ///< when the answer went out
    std::string_view trace_id;  ///< from the W3C traceparent the call carried; empty: none
    std::string_view method;
    std::string_view peer;     ///< the caller's address
    std::string_view subject;  ///< identity::subject; empty without authentication
    std::error_code status;    ///< empty: answered with a result; else the error answered
    /// From the moment it was read (its wait behind earlier messages included) to its answer.
    std::chrono::microseconds duration{0};
    std::size_t bytes_in = 0;   ///< the request, as on the wire
    std::size_t bytes_out = 0;  ///< the answer, as on the wire
};
/// Runs on the connection's loop (several at once on a server with several loops); must not
/// throw.
using access_log_fn = std::function<void(const access_record&)>;

struct handler_options {
    /// false (default): serial. The handler runs to completion before the next message of that
    /// peer is dispatched. true: started in order, but the next message is dispatched while it is
    /// suspended.
    bool concurrent = false;
    /// Where the handler's body runs. Empty (default): on the connection's loop. A strand
    /// (net::make_strand(ex)): every call of the handler, from every connection and loop, runs
    /// one at a time there, for state they share. An ordo::worker_pool's executor: the body runs
    /// off the loop, so that a long computation does not stall the loop's other connections.
    /// Arguments are converted on the loop; the result is packed and sent from it. A serial
    /// handler stays serial (the connection's next message waits for it). Streaming handlers
    /// too: each writer.write() hands its item to the connection's loop and suspends until it
    /// has been sent there, credit and order as on the loop. On run_on the body must not use the
    /// `ordo::peer&` it may take (post to its get_executor() instead).
    ///
    /// Cancellation (ordo.cancel, the caller's deadline, the connection ending) reaches the
    /// body: a body that takes a `std::stop_token` (after peer& and the writer, before its
    /// arguments) sees stop requested at once, from any thread, and one that awaits gets Asio
    /// terminal cancellation there (emitted on the body's own strand of run_on). A cancelled
    /// call's answer is never sent: its caller gets errc::cancelled whatever the body returns.
    /// A body that ignores both still runs to its end: it holds its worker thread, a serial
    /// handler holds its connection's next messages, and the connection's teardown waits for
    /// it. Its answer is posted back to the connection's loop: after async_stop(), join the
    /// worker_pool (worker_pool::join()) before the server and its io_context are destroyed
    /// (a server with threads > 1 also waits up to 10 s for such bodies before its own loops
    /// go). A handler on the loop may take a std::stop_token too: its body then runs on a
    /// strand of the loop, as if on run_on.
    net::any_io_executor run_on{};
    /// Who may call it: a rule on the caller's identity (peer::identity(); on a server that
    /// authenticates, identity::subject is who it accepted), e.g. ordo::allow_subjects({"alice"}).
    /// A caller it refuses gets errc::permission_denied naming the method, and nothing runs (a
    /// notification is dropped, as peer_options::on_dropped reports). Null: everyone.
    allow_fn allow{};
    /// How many calls of this method run at once, from every connection and loop together: a
    /// fixed number, or ordo::adaptive (ordo/rpc/concurrency.hpp). A call over it is answered
    /// errc::overloaded with a retry-after hint before anything of it runs (a notification is
    /// dropped, as peer_options::on_dropped reports). It bounds what a handler holds while it
    /// is suspended: a coroutine, a body on run_on, a stream. A plain function on the loop
    /// runs to its end before the loop reads on, and is not counted. Default: none.
    concurrency_limit concurrency{};
};

namespace detail {

template <class F>
net::awaitable<void> run_stream_handler(F f, std::string method, std::string signature, peer& p,
                                        msgpack::object params, stream_out& out) {
    using shape = handler_shape<typename fn_traits<F>::args>;
    auto values = convert_args<F>(params, method, signature);
    writer<typename shape::item> w(out);
    co_await invoke_stream_handler(f, p, w, values);
}

/// A streaming handler's body on `ex` (handler_options::run_on; empty: a strand of this loop,
/// for a body that takes a std::stop_token); its items come back here (offload_out).
template <class F>
net::awaitable<void> run_stream_handler_on(F f, net::any_io_executor ex, std::string method,
                                           std::string signature, peer& p, msgpack::object params,
                                           stream_out& out) {
    using shape = handler_shape<typename fn_traits<F>::args>;
    auto values = convert_args<F>(params, method, signature);
    const auto loop = co_await net::this_coro::executor;
    // The body borrows this frame's f and values: run_offloaded returns only once it has ended.
    co_await run_offloaded(std::move(ex), [&](std::stop_token st) -> net::awaitable<void> {
        offload_out off(out, loop, st);
        writer<typename shape::item> w(off);
        co_await invoke_stream_handler(f, p, w, values, st);
    });
}

/// A handler that reads its caller's items: a client stream (its result packed into `result`)
/// or a two-way stream (`out`: its writer's).
template <class F>
net::awaitable<void> run_reading_handler(F f, std::string method, std::string signature, peer& p,
                                         msgpack::object params, stream_in& in, stream_out* out,
                                         buffer& result) {
    using shape = handler_shape<typename fn_traits<F>::args>;
    auto values = convert_args<F>(params, method, signature);
    reader<typename shape::in_item> r(in);
    if constexpr (shape::streams) {
        writer<typename shape::item> w(*out);
        co_await invoke_reading_handler(f, p, r, &w, values);
    } else {
        using T = typename is_awaitable<typename fn_traits<F>::result>::value_type;
        if constexpr (std::is_void_v<T>) {
            co_await invoke_reading_handler(f, p, r, static_cast<void*>(nullptr), values);
            pack_nil(result);
        } else {
            T v = co_await invoke_reading_handler(f, p, r, static_cast<void*>(nullptr), values);
            pack_result(result, v);
        }
    }
}

template <class F>
handler_entry make_handler_entry(std::string method, F f, handler_options o) {
    using traits = fn_traits<F>;
    using shape = handler_shape<typename traits::args>;
    using values_t = typename shape::values;
    handler_entry e;
    e.signature = signature_of<values_t>::get();
    e.concurrent = o.concurrent;
    e.allow = o.allow;
    e.concurrency = o.concurrency;
    if constexpr (shape::reads) {
        static_assert(is_awaitable<typename traits::result>::value && !shape::takes_stop,
                      "a handler taking ordo::reader<T>& is a coroutine returning "
                      "net::awaitable<R>, without a std::stop_token");
        static_assert(!shape::streams ||
                          std::is_same_v<typename traits::result, net::awaitable<void>>,
                      "a two-way streaming handler returns net::awaitable<void>");
        // Its reader and writer live on the connection's loop.
        if (o.run_on)
            throw std::invalid_argument("ordo: \"" + method +
                                        "\" reads a stream: it runs on the connection's loop "
                                        "(handler_options::run_on is not for it)");
        e.signature += shape::streams ? " [two-way stream]" : " [client stream]";
        e.writes_items = shape::streams;
        e.reads = [f, method, sig = e.signature](peer& p, msgpack::object params, stream_in& in,
                                                 stream_out* out, buffer& result) {
            return run_reading_handler(f, method, sig, p, params, in, out, result);
        };
    } else if constexpr (shape::streams) {
        static_assert(std::is_same_v<typename traits::result, net::awaitable<void>>,
                      "a streaming handler (one taking ordo::writer<T>&) is a coroutine "
                      "returning net::awaitable<void>");
        e.signature += " [stream]";
        if (o.run_on || shape::takes_stop)
            e.stream = [f, method, sig = e.signature, ex = o.run_on](
                           peer& p, msgpack::object params, stream_out& out) {
                return run_stream_handler_on(f, ex, method, sig, p, params, out);
            };
        else
            e.stream = [f, method, sig = e.signature](peer& p, msgpack::object params,
                                                      stream_out& out) {
                return run_stream_handler(f, method, sig, p, params, out);
            };
    } else if (o.run_on || shape::takes_stop) {
        e.async = [f, method, sig = e.signature, ex = o.run_on](peer& p, msgpack::object params,
                                                                buffer& out) {
            return run_handler_on(f, ex, method, sig, p, params, out);
        };
    } else if constexpr (is_awaitable<typename traits::result>::value) {
        e.async = [f, method, sig = e.signature](peer& p, msgpack::object params, buffer& out) {
            return run_async_handler(f, method, sig, p, params, out);
        };
    } else {
        e.sync = [f, method, sig = e.signature](peer& p, const msgpack::object& params,
                                                buffer& out) mutable {
            auto values = convert_args<F>(params, method, sig);
            if constexpr (std::is_void_v<typename traits::result>) {
                invoke_handler(f, p, values);
                pack_nil(out);
            } else {
                pack_result(out, invoke_handler(f, p, values));
            }
        };
    }
    return e;
}

}  // namespace detail

/// Controls a registered batch handler (what on_batch returns): limits can change at run time.
class batch_handle {
  public:
    explicit batch_handle(std::shared_ptr<detail::batcher_core> core) : core_(std::move(core)) {}
    void set_max_batch_size(std::size_t n) { core_->set_max_batch_size(n); }
    void set_max_wait(std::chrono::milliseconds w) { core_->set_max_wait(w); }
    batch_stats stats() const { return core_->stats(); }

  private:
    std::shared_ptr<detail::batcher_core> core_;
};

/// A table of handlers by method name. Registering a name again replaces its handler (for
/// messages dispatched afterwards).
class handlers {
  public:
    /// Registers `f` for `name`. f is a function, a lambda (not generic) or a coroutine returning
    /// net::awaitable<T>; it may take `ordo::peer&` first (the calling peer, to call back over
    /// the same ordered stream), and then a std::stop_token (stop is requested when the call is
    /// cancelled: handler_options::run_on). Arguments are converted with msgpack-c: a mismatch
    /// answers errc::bad_arguments naming the method and the expected signature; an exception
    /// answers an error with its message (errc::remote_error, or the ordo::errc of a system_error).
    /// On a server with several loops (server_options::threads) the same handler may run on
    /// several threads at once: guard what it shares, or give it a strand (handler_options::
    /// run_on). Register handlers before the server listens; the table is read, not locked.
    template <class F>
    handlers& on(std::string name, F f, handler_options o = {}) {
        auto e = detail::make_handler_entry(name, std::move(f), o);
        add(std::move(name), std::move(e));
        return *this;
    }

    /// Registers `f` for an interface method, checking at compile time that f takes its
    /// arguments and returns (or co_returns) its result type.
    template <class R, class... A, class F>
    handlers& on(const method<R(A...)>& m, F f, handler_options o = {}) {
        using traits = detail::fn_traits<F>;
        using shape = detail::handler_shape<typename traits::args>;
        static_assert(std::is_same_v<typename shape::values, std::tuple<std::decay_t<A>...>>,
                      "handler arguments do not match the interface method's");
        using ret = typename traits::result;
        if constexpr (detail::is_upload<R>::value) {
            static_assert(shape::reads && !shape::streams,
                          "a method returning ordo::upload<In, R> takes a handler whose first "
                          "argument (after an optional peer&) is ordo::reader<In>&");
            if constexpr (shape::reads && !shape::streams) {
                static_assert(
                    std::is_same_v<typename shape::in_item, typename detail::is_upload<R>::in>,
                    "the handler's reader takes another item type than the method's upload");
                using got = typename detail::is_awaitable<ret>::value_type;
                using want = typename detail::is_upload<R>::result;
                static_assert(std::is_convertible_v<got, want> || std::is_void_v<want>,
                              "handler result does not match the interface method's");
            }
        } else if constexpr (detail::is_two_way<R>::value) {
            static_assert(shape::reads && shape::streams,
                          "a method returning ordo::two_way<In, Out> takes a handler whose first "
                          "arguments (after an optional peer&) are ordo::reader<In>& and "
                          "ordo::writer<Out>&");
            if constexpr (shape::reads && shape::streams)
                static_assert(
                    std::is_same_v<typename shape::in_item,
                                   typename detail::is_two_way<R>::in> &&
                        std::is_same_v<typename shape::item, typename detail::is_two_way<R>::item>,
                    "the handler's reader or writer takes other item types than the method's");
        } else if constexpr (shape::reads) {
            static_assert(detail::is_upload<R>::value || detail::is_two_way<R>::value,
                          "a handler taking ordo::reader<T>& serves a method returning "
                          "ordo::upload<T, R> or ordo::two_way<T, U>");
        } else if constexpr (detail::is_stream<R>::value)
            static_assert(
                shape::streams && !shape::reads &&
                    std::is_same_v<typename detail::is_stream<R>::item, typename shape::item>,
                "a method returning ordo::stream<T> takes a handler whose first "
                "argument (after an optional peer&) is ordo::writer<T>&");
        else if constexpr (shape::streams)
            static_assert(detail::is_stream<R>::value,
                          "a handler taking ordo::writer<T>& serves a method returning "
                          "ordo::stream<T>");
        else if constexpr (detail::is_awaitable<ret>::value)
            static_assert(
                std::is_convertible_v<typename detail::is_awaitable<ret>::value_type, R> ||
                    std::is_void_v<R>,
                "handler result does not match the interface method's");
        else
            static_assert(std::is_convertible_v<ret, R> || std::is_void_v<R>,
                          "handler result does not match the interface method's");
        return on(m.name(), std::move(f), o);
    }

    /// Registers a batch handler for `name`: callers make single calls with one argument (or
    /// several, taken as a tuple); `f` takes std::vector<Arg> and returns, or co_returns,
    /// std::vector<R> or std::vector<ordo::element<R>> of the same length (an element_error fails
    /// only its call). A throw, or a result of the wrong length, fails every call of that batch
    /// with a message naming the handler and the sizes. Calls from every peer are gathered;
    /// batches run when full or max_wait after their first call. From one ordered peer, calls
    /// keep their order inside and across batches (with max_concurrent_batches 1). A cancelled
    /// call, or one whose peer died, leaves a batch that has not started; a running batch that
    /// all its callers left is cancelled (f may take a std::stop_token after the vector:
    /// batch_options::run_on).
    template <class F>
    batch_handle on_batch(std::string name, batch_options o, F f) {
        using Arg = typename detail::batch_arg<F>::type;
        auto core = std::make_shared<detail::batcher<Arg, F>>(name, o, std::move(f));
        detail::handler_entry e;
        e.signature = "(" + detail::type_name(typeid(Arg)) + ") [batch]";
        e.concurrent = true;
        e.allow = o.allow;
        e.async = [core, name](peer&, msgpack::object params, buffer& out) {
            return detail::submit_batch<Arg>(core, name, params, out);
        };
        batchers_.push_back({name, core});
        add(std::move(name), std::move(e));
        return batch_handle(core);
    }

    /// Registers a streaming batch handler for `name` (Ray Serve's generator batching): callers
    /// call it as a stream, one argument each (or several, taken as a tuple); batches form as
    /// for on_batch. `f(ordo::batch_writer<T>& out, std::vector<Arg> args)` is a coroutine
    /// (net::awaitable<void>) that gives, step by step, one stream_step<T> per caller still open
    /// (out.open(): indices into args): an item, stream_end, or an element_error ending that
    /// caller alone. Callers that ended, failed or cancelled are left out of later steps; new
    /// calls never join a running batch; callers still open when f returns end normally, and if
    /// f throws they fail with its message. A step waits while a caller holds 16 items its
    /// reader has no credit for. A caller that does not stream gets its items as one array.
    /// When the server stops, running batches close: their callers end with errc::cancelled,
    /// out.closed() turns true, open() empty and out.step() throws errc::cancelled; f may take
    /// a std::stop_token last, which is requested then (batch_options::run_on says more).
    template <class F>
    batch_handle on_batch_stream(std::string name, batch_options o, F f) {
        using sig = detail::batch_stream_sig<F>;
        using Arg = typename sig::arg;
        using T = typename sig::item;
        static_assert(std::is_same_v<typename sig::result, net::awaitable<void>>,
                      "a streaming batch handler is a coroutine returning net::awaitable<void>");
        auto core = std::make_shared<detail::stream_batcher<Arg, T, F>>(name, o, std::move(f));
        detail::handler_entry e;
        e.signature = "(" + detail::type_name(typeid(Arg)) + ") [batch stream]";
        e.concurrent = true;
        e.allow = o.allow;
        e.stream = [core, name](peer&, msgpack::object params, detail::stream_out& out) {
            return detail::submit_batch_stream<Arg>(core, name, params, out);
        };
        batchers_.push_back({name, core});
        add(std::move(name), std::move(e));
        return batch_handle(core);
    }

    /// Registers a handler already reduced to its type-erased entry: for bindings to other
    /// languages (python/ordo), whose handlers take and give msgpack bytes. The entry's
    /// signature is shown by ordo.methods; its counters are set here.
    handlers& on_entry(std::string name, detail::handler_entry e) {
        add(std::move(name), std::move(e));
        return *this;
    }
    /// Gives every batch handler without a home executor `ex` as its home (a server over
    /// several loops calls it before it listens).
    void home_batches(const net::any_io_executor& ex) const {
        for (const auto& b : batchers_) b.core->set_home(ex);
    }

    /// Fails the calls queued in every batch handler with errc::shutting_down, and closes their
    /// running streaming batches (their callers end with errc::cancelled) (server stop).
    void stop_batches() const {
        for (const auto& b : batchers_) b.core->stop();
    }
    /// Calls still waiting for their batch outcome, over all batch handlers.
    std::size_t batch_waiters() const {
        std::size_t n = 0;
        for (const auto& b : batchers_) n += b.core->waiters();
        return n;
    }
    /// Completes when no call waits for its batch outcome in any batch handler; cancellable.
    net::awaitable<void> async_wait_batches() const;

    /// The entry for `name`, or null.
    const detail::handler_entry* find(std::string_view name) const {
        auto it = map_.find(name);
        return it == map_.end() ? nullptr : &it->second;
    }

    /// Whether the reserved method ordo.methods answers (on by default): it lists every
    /// method's name with the types of its parameters (`ordo methods URL` shows them). Turn it
    /// off where the list is not for every caller to see.
    handlers& introspection(bool on) {
        introspection_ = on;
        return *this;
    }
    bool introspection() const noexcept { return introspection_; }
    /// Calls f(name, signature) for every method, in name order (not the reserved ordo.*
    /// ones the table serves itself, such as ordo.health_watch).
    template <class F>
    void for_each_method(F&& f) const {
        for (const auto& [name, e] : map_)
            if (!name.starts_with("ordo.")) f(name, e.signature);
    }

    /// Whether handler latency is measured (method_stats' histogram; two clock reads per
    /// message). Off by default; the Prometheus exporter turns it on. May be set from any thread.
    handlers& time_calls(bool on) noexcept {
        timed_.set(on);
        return *this;
    }
    bool time_calls() const noexcept { return timed_.get() != 0; }

    /// Told of every request answered (access_record); null (default): nothing is recorded,
    /// and nothing is paid for it. Set before serving.
    handlers& access_log(access_log_fn f);
    const access_log_fn& access_log() const noexcept { return access_log_; }

    /// How many calls of all methods together run at once (server_options::concurrency; see
    /// handler_options::concurrency, which a method's calls must pass too). Set before serving.
    handlers& concurrency(const concurrency_limit& l, const caller_shares& shares = {});
    /// Where that limit stands (what none: no limit).
    concurrency_stats concurrency() const;
    /// The limit itself, for the dispatcher (null: none).
    const std::shared_ptr<detail::admission>& limit() const noexcept { return limit_; }

    /// Answers ordo.health and serves ordo.health_watch (docs/protocol.md, "Health") from now
    /// on, with the whole server ("") serving (a server does this when constructed). Without
    /// it, ordo.health answers "serving" for "" and nothing else.
    void serve_health();
    /// Sets what ordo.health says of `service` ("": the whole server) and tells its watchers.
    /// A name set once stays known. Any thread.
    void set_health(std::string_view service, health_state s);
    /// Sets every service known, and the whole server, to `s` (server::async_drain: draining).
    void set_every_health(health_state s);
    /// What ordo.health says of `service`; nothing for a name never set.
    std::optional<health_state> health(std::string_view service) const;
    /// The states and their watchers (null before serve_health()).
    const std::shared_ptr<detail::health_board>& health_board() const noexcept { return health_; }

    /// Every method's counters, in name order, and every batch handler's.
    std::vector<ordo::method_stats> stats_by_method() const;
    std::vector<batch_handler_stats> stats_by_batch() const;
    /// Requests and notifications for names with no handler (answered method_not_found, or
    /// dropped).
    std::uint64_t unknown_requests() const noexcept { return unknown_requests_.get(); }
    std::uint64_t unknown_notifications() const noexcept { return unknown_notifications_.get(); }
    void count_unknown(bool request) const noexcept {
        (request ? unknown_requests_ : unknown_notifications_).add(1);
    }

    /// What ordo.stats answers beyond the methods' counters: a server sets it to its own
    /// figures (server_stats without methods and batches). Started on the executor of the
    /// connection that asks; a server over several loops gathers from each of them.
    using stats_fn = std::function<net::awaitable<server_stats>()>;
    void stats_source(stats_fn f) { stats_source_ = std::move(f); }
    const stats_fn& stats_source() const noexcept { return stats_source_; }

  private:
    void add(std::string name, detail::handler_entry e);

    std::map<std::string, detail::handler_entry, std::less<>> map_;
    bool introspection_ = true;
    detail::relaxed_counter timed_;
    mutable detail::relaxed_counter unknown_requests_, unknown_notifications_;
    struct named_batcher {
        std::string name;
        std::shared_ptr<detail::batcher_core> core;
    };
    std::vector<named_batcher> batchers_;
    stats_fn stats_source_;
    access_log_fn access_log_;
    std::shared_ptr<detail::admission> limit_;
    std::shared_ptr<detail::health_board> health_;
};

}  // namespace ordo
