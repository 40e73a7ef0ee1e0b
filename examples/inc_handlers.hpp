// The handlers ordo-inc-server serves (counter, echo, square_batch), for every program that
// needs the same server: the tool itself and the fuzz targets.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "counter.hpp"

/// What the `context` method answers: the call's own context as the server read it
/// (ordo::current_context(); docs/protocol.md, "Call context").
struct context_answer {
    std::optional<long long> deadline_left_ms;  ///< nil: the call had no deadline
    std::optional<std::string> trace_id;        ///< from a W3C traceparent, if one came
    std::map<std::string, std::string> metadata;
    MSGPACK_DEFINE_MAP(deadline_left_ms, trace_id, metadata)
};

/// The context of the call whose handler runs now, as context_answer.
inline context_answer answer_context() {
    context_answer a;
    const ordo::call_context* c = ordo::current_context();
    if (!c) return a;
    if (c->has_deadline()) a.deadline_left_ms = c->time_left().count();
    // traceparent: version-traceid-parentid-flags, the trace id 32 hex digits.
    if (const std::string* tp = c->find("traceparent"); tp && tp->size() >= 35 && (*tp)[2] == '-')
        a.trace_id = tp->substr(3, 32);
    for (const auto& [k, v] : c->metadata) a.metadata.emplace(k, v);
    return a;
}

/// What `context` answers on a server that passes the call on (ordo-inc-server --next): its own
/// context, and the answer of the server it called from inside the handler.
struct context_via_answer {
    std::optional<long long> deadline_left_ms;
    std::optional<std::string> trace_id;
    std::map<std::string, std::string> metadata;
    context_answer next;
    MSGPACK_DEFINE_MAP(deadline_left_ms, trace_id, metadata, next)
};

/// The body of serve_context_via's handler (a function, so that its frame owns its argument). A
/// connection per call: no connection shared by calls that run at once, and none to close.
inline ordo::net::awaitable<context_via_answer> context_via(std::string next_url) {
    const context_answer own = answer_context();
    context_via_answer a{own.deadline_left_ms, own.trace_id, own.metadata, {}};
    ordo::channel next = co_await ordo::async_connect(next_url);
    a.next = co_await next.async_call<context_answer>("context");
    next.impl()->close();
    co_return a;
}

/// Serves `context` as a handler that calls `context` at `next_url` and answers both: the
/// nested call takes the handler's deadline and trace.
inline void serve_context_via(ordo::server& srv, std::string next_url) {
    srv.on("context", [next_url] { return context_via(next_url); });
}

/// Registers counter (examples/counter.hpp, count_to included), echo(any), whoami(), context()
/// and square_batch(int) on `srv`. `total`
/// is the process-wide sum that add() changes; it must outlive the server. `shared` is how add()
/// and total() run: on a server with several loops, give them a strand (run_on) so that calls
/// from every loop take turns at `total`.
inline void serve_counter(ordo::server& srv, long& total, ordo::handler_options shared = {}) {
    namespace net = ordo::net;
    srv.on(counter{}.inc, [](int x) { return x + 1; });
    srv.on(
        counter{}.add, [&total](int x) { return total += x; }, shared);
    srv.on(
        counter{}.total, [&total] { return total; }, shared);
    srv.on(counter{}.sleep_ms, [](int ms) -> net::awaitable<int> {
        net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
        co_await t.async_wait(net::use_awaitable);
        co_return ms;
    });
    srv.on(counter{}.fail, [](std::string why) { throw std::runtime_error(why); });
    srv.on("echo", [](msgpack::object v) { return v; });
    // Who the server took the caller to be (server_options::authenticate): empty without it.
    srv.on("whoami", [](ordo::peer& p) { return p.identity().subject; });
    // The call's context: deadline left, trace id and metadata (try it from the shell).
    srv.on("context", [] { return answer_context(); });
    // A stream: 0 .. n-1, each item sent as soon as the caller has credit for it.
    srv.on(counter{}.count_to, [](ordo::writer<int>& out, int n) -> net::awaitable<void> {
        for (int i = 0; i < n; ++i) co_await out.write(i);
    });
    // A client stream: the sum of the items the caller writes. A two-way stream: each item back
    // times k, as it comes.
    srv.on(counter{}.sum, [](ordo::reader<long>& in) -> net::awaitable<long> {
        long total = 0;
        while (auto v = co_await in.next()) total += *v;
        co_return total;
    });
    srv.on(counter{}.scale,
           [](ordo::reader<long>& in, ordo::writer<long>& out, long k) -> net::awaitable<void> {
               while (auto v = co_await in.next()) co_await out.write(*v * k);
           });
    // Single calls from every peer, squared in batches of up to 64 (or after 1 ms).
    srv.on_batch("square_batch", {.max_batch_size = 64, .max_wait = std::chrono::milliseconds(1)},
                 [](std::vector<int> xs) {
                     for (auto& x : xs) x *= x;
                     return xs;
                 });
    // Streams of callers batched together: step k gives every caller still open its item k,
    // or the end of its stream once it has n items.
    srv.on_batch_stream(
        counter{}.count_batch.name(),
        {.max_batch_size = 64, .max_wait = std::chrono::milliseconds(1)},
        [](ordo::batch_writer<int>& out, std::vector<int> ns) -> net::awaitable<void> {
            for (int k = 0; !out.open().empty(); ++k) {
                std::vector<ordo::stream_step<int>> step;
                step.reserve(out.open().size());
                for (std::size_t i : out.open()) {
                    if (k < ns[i])
                        step.emplace_back(k);
                    else
                        step.emplace_back(ordo::stream_end{});
                }
                co_await out.step(std::move(step));
            }
        });
}
