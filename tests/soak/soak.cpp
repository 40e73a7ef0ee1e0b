// ordo-soak: clients and servers under faults for a while, checking that nothing hangs, leaks or
// vanishes. Not part of the default test run; .ci/run runs it for 60 s.
//
//   ordo-soak [--seconds N] [--clients C] [--cuts] [--server-threads T]
//
// --server-threads T: the servers serve on T event loops (server_options::threads; default 1),
// so that a client cut through a proxy comes back on another loop than its session's.
// It starts two server processes (itself with --serve) and C client processes (itself with
// --client). Server 0 lives throughout: the chaos loop stops it (SIGSTOP for 1.5 s) and makes it
// drop every connection (SIGUSR1); its RSS and open descriptors are sampled. Server 1 is also
// killed (SIGKILL) and restarted on the same port. Each client loops: an ordered channel and a
// pooled one to a server, pipelined inc calls (results checked), 64 KiB echoes, notifications,
// then, on the ordered channel, how many of its notifications the server saw. Every call has a
// 2 s deadline.
//
// Checks: every call ends (none pending 5 s after it started: "hung"); on a connection that
// stayed up, the server saw every notification taken ("lost" otherwise); on one that broke,
// notifications not written were reported (on_undelivered); server 0's RSS and descriptors are
// flat (end within 16 MiB and 16 descriptors of the values after warm-up). Prints one summary
// line and exits 1 if a check failed.
//
// --cuts: C more client processes (itself with --cut-client), each connecting to server 0 through
// its own cutting_proxy (tests/support/cutting_proxy.hpp; client k resets, stalls or drops one
// direction, by k % 3) that cuts every connection after 20 KB to 400 KB, with resume_ms=10000.
// Each round is one channel and one stream: notifications seq_note(stream, 0, 1, ...), calls
// seq_call(stream, 0, 1, ...) and 64 KiB echoes. The server records each stream's arrivals and
// says on stderr when a number arrives twice or out of order. At the end of a round the client
// asks for them on the channel itself (so after everything sent on it), or over a fresh
// connection if the channel has ended, and checks: numbers only rose, nothing arrived that was
// not sent, and every number that never arrived was reported lost to the client (a notification
// to on_undelivered, a call failed with peer_lost, session_lost or shutting_down). A session is
// lost only when server 0 drops its connections (SIGUSR1: a restarted server no longer has it) or
// a window passes; cuts alone lose nothing. A call failing otherwise, a wrong answer, a call
// pending 30 s after the round, no cut or no resume at all fail the run. Prints a second
// summary line.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/signal_set.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "inc_handlers.hpp"
#include "support/cutting_proxy.hpp"
#include "support/processes.hpp"

namespace net = ordo::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// ---- server: ordo-inc-server's handlers, plus per-connection notification counts ----

// A cut client's stream (one round): what arrived. Numbers must rise; skipped ones are kept
// as [from, to) pairs (the client checks that it was told each was lost).
// What seq_check answers: [notes, calls, out of order, next note, next call], then the skipped
// notifications and calls as [from, to) pairs.
using stream_counts = std::vector<std::vector<std::uint64_t>>;

struct stream_state {
    std::uint64_t next_note = 0, next_call = 0;
    std::uint64_t notes = 0, calls = 0, out_of_order = 0;
    std::vector<std::uint64_t> note_gaps, call_gaps;
};

// Counts an arrival of number `i` on `s`, whose next expected number is `next`.
void arrived(std::uint64_t stream, stream_state& s, const char* what, std::uint64_t i,
             std::uint64_t& next, std::vector<std::uint64_t>& gaps) {
    if (i < next) {
        if (s.out_of_order++ == 0)
            std::fprintf(stderr,
                         "ordo-soak server: stream %llu: %s %llu arrived after %llu (twice, or "
                         "out of order)\n",
                         static_cast<unsigned long long>(stream), what,
                         static_cast<unsigned long long>(i),
                         static_cast<unsigned long long>(next - 1));
        return;
    }
    if (i > next) gaps.insert(gaps.end(), {next, i});
    next = i + 1;
}

int serve(const std::string& url, std::size_t threads) {
    net::io_context io;
    long total = 0;
    // With several loops the handlers below run on any of them: they take turns at `m`.
    std::mutex m;
    std::map<const ordo::peer*, long> notes;  // per connection
    // Kept across SIGUSR1 restarts: a stream is checked after its session ended too.
    std::map<std::uint64_t, stream_state> streams;
    std::unique_ptr<ordo::server> srv;
    auto start = [&](const std::string& where) {
        ordo::server_options o;
        o.peer.liveness_timeout = 1000ms;
        o.threads = threads;
        srv = std::make_unique<ordo::server>(io.get_executor(), o);
        ordo::handler_options shared;
        if (threads > 1) shared.run_on = net::make_strand(io);
        serve_counter(*srv, total, shared);
        srv->on("note", [&](ordo::peer& p, int) {
            std::lock_guard l(m);
            // A new peer may get the address of one that is gone: forget each when it ends.
            if (notes[&p]++ == 0)
                p.on_closed([&notes, &m, key = &p](const std::error_code&, const std::string&) {
                    std::lock_guard l(m);
                    notes.erase(key);
                });
        });
        srv->on("note_count", [&](ordo::peer& p) {
            std::lock_guard l(m);
            const long n = notes[&p];
            notes.erase(&p);
            return n;
        });
        srv->on("seq_note", [&](std::uint64_t stream, std::uint64_t i) {
            std::lock_guard l(m);
            auto& s = streams[stream];
            ++s.notes;
            arrived(stream, s, "notification", i, s.next_note, s.note_gaps);
        });
        srv->on("seq_call", [&](std::uint64_t stream, std::uint64_t i) {
            std::lock_guard l(m);
            auto& s = streams[stream];
            ++s.calls;
            arrived(stream, s, "call", i, s.next_call, s.call_gaps);
            return i;
        });
        srv->on("seq_check", [&](std::uint64_t stream) {
            std::lock_guard l(m);
            const auto& s = streams[stream];
            return stream_counts{{s.notes, s.calls, s.out_of_order, s.next_note, s.next_call},
                                 s.note_gaps,
                                 s.call_gaps};
        });
        return srv->listen(where);
    };
    // The address bound, real port included: clients keep connecting there after a restart.
    const std::string bound = start(url);
    std::printf("listening on %s\n", bound.c_str());
    std::fflush(stdout);
    // SIGUSR1: drop every connection (a graceful stop), then listen again on the same address.
    net::signal_set usr1(io, SIGUSR1);
    std::function<void()> arm = [&] {
        usr1.async_wait([&](std::error_code ec, int) {
            if (ec) return;
            net::co_spawn(
                io,
                [&]() -> net::awaitable<void> {
                    co_await srv->async_stop();
                    {
                        std::lock_guard l(m);
                        notes.clear();
                    }
                    start(bound);
                    arm();
                },
                [&](std::exception_ptr e) {
                    if (!e) return;
                    try {
                        std::rethrow_exception(e);
                    } catch (const std::exception& x) {
                        // The parent sees a dead server (its RSS and descriptors are gone).
                        std::fprintf(stderr, "ordo-soak server: no restart: %s\n", x.what());
                    }
                    io.stop();
                });
        });
    };
    arm();
    net::signal_set term(io, SIGTERM, SIGINT);
    term.async_wait([&](std::error_code, int) { io.stop(); });
    io.run();
    return 0;
}

// ---- client ----

struct tally {
    long calls = 0, ok = 0, wrong = 0, hung = 0;
    std::map<std::string, long> errors;  // by errc name
    long notes = 0, undelivered = 0, lost = 0, checked_connections = 0;
};

net::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    net::steady_timer t(co_await net::this_coro::executor, d);
    co_await t.async_wait(ordo::use_tuple);
}

std::string error_name(const std::error_code& ec) {
    return ec.category() == ordo::error_category()
               ? ordo::to_string(static_cast<ordo::errc>(ec.value()))
               : ec.message();
}

// One round on one server: an ordered and a pooled channel, mixed work, then the note check.
net::awaitable<void> round(const std::string& url, tally& t, std::mt19937& rng) {
    ordo::peer_options o;
    o.liveness_timeout = 500ms;
    o.default_timeout = 2000ms;
    long undelivered_here = 0;
    o.on_undelivered = [&](const ordo::undelivered_notification&) { ++undelivered_here; };
    ordo::channel ordered, pooled;
    try {
        ordered = co_await ordo::async_connect(url, o);
        pooled = co_await ordo::async_connect(url + "?mode=pooled&max_connections=4", o);
    } catch (const std::system_error& e) {
        ++t.errors[std::string("connect: ") + e.code().message()];
    }
    if (!ordered || !pooled) {  // the server is down or restarting: try again soon
        co_await sleep_for(100ms);
        co_return;
    }
    long notes_taken = 0;
    // Shared with the calls' handlers, which may (if a call hung) run after this round.
    auto pending_ptr = std::make_shared<long>(0);
    long& pending = *pending_ptr;
    static const std::string big(64 * 1024, 'b');
    auto call = [&](const ordo::channel& ch, bool echo) {
        ++pending;
        ++t.calls;
        const int x = static_cast<int>(rng() % 1000);
        auto done = [&t, pending_ptr, x, echo](std::error_code ec, ordo::value v) {
            --*pending_ptr;
            if (ec) {
                ++t.errors[error_name(ec)];
                return;
            }
            const bool right = echo ? v.get().type == msgpack::type::STR &&
                                          v.get().via.str.size == big.size()
                                    : v.get().as<int>() == x + 1;
            ++(right ? t.ok : t.wrong);
        };
        if (echo)
            ch.async_call<ordo::value>("echo", big, done);
        else
            ch.async_call<ordo::value>("inc", x, done);
    };
    for (int i = 0; i < 400; ++i) {
        const int what = static_cast<int>(rng() % 20);
        if (what == 0) {
            call(rng() % 2 ? ordered : pooled, true);
        } else if (what < 5) {
            try {
                ordered.notify("note", i);
                ++notes_taken;
            } catch (const std::system_error& e) {
                ++t.errors[std::string("notify: ") + e.code().message()];
            }
        } else {
            call(rng() % 2 ? ordered : pooled, false);
        }
        if (pending >= 32) {
            for (int w = 0; w < 400 && pending >= 16; ++w) co_await sleep_for(5ms);
        }
    }
    // Every call ends: by its answer or its 2 s deadline, so none may be left after 5 s.
    for (int w = 0; w < 1000 && pending > 0; ++w) co_await sleep_for(5ms);
    t.hung += pending;
    t.notes += notes_taken;
    // The check: on a connection that stayed up, the server saw every notification.
    auto& p = static_cast<ordo::peer&>(*ordered.impl());
    auto [ec, seen] = co_await ordered.async_call<long>(
        "note_count", net::experimental::as_tuple(net::use_awaitable));
    if (!ec && p.is_open()) {
        ++t.checked_connections;
        if (seen != notes_taken) t.lost += notes_taken - seen;
    }
    co_await p.async_close();
    t.undelivered += undelivered_here;
    if (auto* pl = dynamic_cast<ordo::pool*>(pooled.impl().get())) pl->close();
    if (pending > 0) co_await sleep_for(100ms);
}

// " kind=n" for each, then the end of the line; kinds made one word (the parent splits on spaces).
void print_errors(const std::map<std::string, long>& errors) {
    for (const auto& [kind, v] : errors) {
        std::string k = kind;
        for (auto& c : k)
            if (c == ' ' || c == '=') c = '_';
        std::printf(" %s=%ld", k.c_str(), v);
    }
    std::printf("\n");
}

int client(const std::vector<std::string>& urls, double seconds, unsigned seed) {
    net::io_context io;
    tally t;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            std::mt19937 rng(seed);
            const auto end = clock_type::now() + std::chrono::duration<double>(seconds);
            for (std::size_t i = 0; clock_type::now() < end; ++i)
                co_await round(urls[i % urls.size()], t, rng);
        },
        [](std::exception_ptr e) {
            if (!e) return;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                std::fprintf(stderr, "ordo-soak client: %s\n", x.what());
            }
        });
    io.run();
    std::printf("%ld %ld %ld %ld %ld %ld %ld %ld", t.calls, t.ok, t.wrong, t.hung, t.notes,
                t.undelivered, t.lost, t.checked_connections);
    print_errors(t.errors);
    return 0;
}

// ---- cut client: resumable sessions through a cutting proxy ----

struct cut_tally {
    long rounds = 0, checked_open = 0, checked_ended = 0, notes = 0, calls = 0, failures = 0,
         hung = 0, resumes = 0, resent = 0, lossy = 0, undelivered = 0, failed_calls = 0;
    std::map<std::string, long> errors;  // by errc name
};

// A broken guarantee: said at once, loudly, and counted.
void failed(cut_tally& t, const std::string& what) {
    ++t.failures;
    std::fprintf(stderr, "ordo-soak cut client: FAILED: %s\n", what.c_str());
}

// One round's outcome, shared with callbacks that may (if a call hung) run after the round.
struct round_state {
    long pending = 0;
    std::set<std::uint64_t> undelivered_notes;  // reported through on_undelivered
    std::set<std::uint64_t> failed_calls;       // seq_call numbers that ended with a loss
};

// The losses a resumable session reports: its window passed, or the other side no longer has
// it (its pending calls fail with these); or the server was stopping.
bool is_loss(const std::error_code& ec) {
    return ec == ordo::errc::peer_lost || ec == ordo::errc::session_lost ||
           ec == ordo::errc::shutting_down;
}

// Checks what the server saw of a round's stream: numbers rose (nothing twice, nothing out of
// order), nothing was seen that was not sent, and every number the server did not see was
// reported lost to this side (a notification undelivered, a call failed).
void check_stream(cut_tally& t, const std::string& name, const stream_counts& seen,
                  std::uint64_t notes, std::uint64_t calls, const round_state& st) {
    if (seen.size() != 3 || seen[0].size() != 5 || seen[1].size() % 2 || seen[2].size() % 2)
        return failed(t, name + "malformed counts from the server");
    const auto& c = seen[0];
    if (c[2] > 0) failed(t, name + std::to_string(c[2]) + " arrived twice or out of order");
    if (c[3] > notes || c[4] > calls) return failed(t, name + "the server saw numbers never sent");
    auto unreported = [&](const std::vector<std::uint64_t>& gaps, std::uint64_t next,
                          std::uint64_t sent, const std::set<std::uint64_t>& reported) {
        std::uint64_t n = 0;
        auto range = [&](std::uint64_t from, std::uint64_t to) {
            for (auto i = from; i < to; ++i) n += reported.count(i) == 0;
        };
        for (std::size_t k = 0; k < gaps.size(); k += 2) range(gaps[k], gaps[k + 1]);
        range(next, sent);
        return n;
    };
    if (auto n = unreported(seen[1], c[3], notes, st.undelivered_notes); n > 0)
        failed(t, name + std::to_string(n) + " of " + std::to_string(notes) +
                      " notifications never arrived and were not reported undelivered");
    if (auto n = unreported(seen[2], c[4], calls, st.failed_calls); n > 0)
        failed(t, name + std::to_string(n) + " of " + std::to_string(calls) +
                      " calls never ran and did not fail");
}

// The server's counts of `stream` over a fresh plain connection. Empty if the server did not
// answer within about 10 s (it may be stopped or restarting).
net::awaitable<stream_counts> counts_over_new_connection(const std::string& url,
                                                         std::uint64_t stream) {
    ordo::peer_options o;
    o.default_timeout = 2000ms;
    for (int attempt = 0; attempt < 20; ++attempt) {
        try {
            auto ch = co_await ordo::async_connect(url, o);
            auto counts = co_await ch.async_call<stream_counts>("seq_check", stream);
            co_await static_cast<ordo::peer&>(*ch.impl()).async_close();
            co_return counts;
        } catch (const std::system_error&) {
        }
        co_await sleep_for(500ms);
    }
    co_return stream_counts{};
}

// One channel with resume_ms, one stream, then its check.
net::awaitable<void> cut_round(const std::string& proxy_url, const std::string& direct_url,
                               std::uint64_t stream, cut_tally& t, std::mt19937& rng) {
    auto st = std::make_shared<round_state>();
    ordo::peer_options o;
    o.liveness_timeout = 500ms;  // a stopped server is a lost connection, then a resume
    o.on_undelivered = [st](const ordo::undelivered_notification& u) {
        // params [stream, number]
        auto h = msgpack::unpack(u.params.data(), u.params.size());
        const auto& a = h.get();
        if (u.method == "seq_note" && a.type == msgpack::type::ARRAY && a.via.array.size == 2 &&
            a.via.array.ptr[1].type == msgpack::type::POSITIVE_INTEGER)
            st->undelivered_notes.insert(a.via.array.ptr[1].via.u64);
    };
    ordo::channel ch;
    try {
        ch = co_await ordo::async_connect(proxy_url + "?resume_ms=10000", o);
    } catch (const std::system_error& e) {
        ++t.errors[std::string("connect: ") + e.code().message()];
    }
    if (!ch) {
        co_await sleep_for(100ms);
        co_return;
    }
    auto& p = static_cast<ordo::peer&>(*ch.impl());
    ++t.rounds;
    static const std::string big(64 * 1024, 'c');
    std::uint64_t notes = 0, calls = 0;
    // Up to `limit` for calls in flight to drop to `at_most`: a resume may take a while.
    auto wait_pending = [&](long at_most, std::chrono::milliseconds limit) -> net::awaitable<void> {
        for (auto end = clock_type::now() + limit;
             st->pending > at_most && clock_type::now() < end;)
            co_await sleep_for(5ms);
    };
    try {
        for (int i = 0; i < 600; ++i) {
            const int what = static_cast<int>(rng() % 20);
            if (what < 9) {
                ch.notify("seq_note", stream, notes);
                ++notes;
                continue;
            }
            const bool echo = what == 19;
            const std::uint64_t n = calls;
            auto done = [&t, st, echo, n, stream](std::error_code ec, ordo::value v) {
                --st->pending;
                const std::string what = echo ? "an echo" : "call " + std::to_string(n);
                if (ec) {
                    ++t.errors[error_name(ec)];
                    if (!is_loss(ec))
                        failed(t, "stream " + std::to_string(stream) + ": " + what +
                                      " failed: " + ec.message());
                    else if (!echo)
                        st->failed_calls.insert(n);
                    return;
                }
                const msgpack::object& r = v.get();
                const bool right =
                    echo ? r.type == msgpack::type::STR && r.via.str.size == big.size()
                         : r.type == msgpack::type::POSITIVE_INTEGER && r.via.u64 == n;
                if (!right)
                    failed(t, "stream " + std::to_string(stream) + ": wrong answer to " + what);
            };
            ++st->pending;
            if (echo) {
                ch.async_call<ordo::value>("echo", big, done);
            } else {
                ch.async_call<ordo::value>("seq_call", stream, n, done);
                ++calls;
            }
            if (st->pending >= 32) co_await wait_pending(16, 30s);
        }
    } catch (const std::system_error& e) {
        // Not taken: the channel has ended (the check below says whether it ended well).
        ++t.errors[std::string("notify: ") + error_name(e.code())];
    }
    // A call ends with its answer or with its session, which waits at most resume_ms for a
    // connection: none may be left after 30 s.
    co_await wait_pending(0, 30s);
    t.hung += st->pending;
    t.notes += static_cast<long>(notes);
    t.calls += static_cast<long>(calls);
    const std::string name = "stream " + std::to_string(stream) + ": ";
    // On the channel itself the check comes after everything sent on it. If the channel has
    // ended, a fresh connection asks (its session ended too: nothing more of it arrives).
    auto [ec, seen] = co_await ch.async_call<stream_counts>(
        "seq_check", stream, net::experimental::as_tuple(net::use_awaitable));
    if (!ec) {
        ++t.checked_open;
        if (!p.is_resumable()) failed(t, name + "the session was not resumable");
    } else {
        seen = co_await counts_over_new_connection(direct_url, stream);
        ++t.checked_ended;
    }
    if (seen.empty())
        failed(t, name + "no counts from the server after the channel ended");
    else
        check_stream(t, name, seen, notes, calls, *st);
    const long lost = static_cast<long>(st->undelivered_notes.size() + st->failed_calls.size());
    t.lossy += lost > 0;
    t.undelivered += static_cast<long>(st->undelivered_notes.size());
    t.failed_calls += static_cast<long>(st->failed_calls.size());
    t.resumes += static_cast<long>(p.counters().resumes);
    t.resent += static_cast<long>(p.counters().messages_resent);
    co_await p.async_close();
}

int cut_client(const std::string& url, double seconds, unsigned seed) {
    const auto host_at = url.find("://") + 3, colon = url.rfind(':');
    ordo::test::cut_options co;
    co.seed = seed;
    co.min_bytes = 20'000;
    co.max_bytes = 400'000;
    co.mode = static_cast<ordo::test::cut_options::how>(seed % 3);
    ordo::test::cutting_proxy proxy(url.substr(host_at, colon - host_at),
                                    static_cast<std::uint16_t>(std::stoi(url.substr(colon + 1))),
                                    co);
    net::io_context io;
    cut_tally t;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            std::mt19937 rng(seed);
            const auto end = clock_type::now() + std::chrono::duration<double>(seconds);
            for (std::uint64_t i = 0; clock_type::now() < end; ++i)
                co_await cut_round(proxy.url(), url, std::uint64_t{seed} << 32 | i, t, rng);
        },
        [&](std::exception_ptr e) {
            if (!e) return;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                failed(t, std::string("the client's loop threw: ") + x.what());
            }
        });
    io.run();  // (a failure of the proxy itself aborts this process: the parent reports it)
    std::printf("%ld %ld %ld %ld %ld %ld %ld %ld %ld %zu %ld %ld %ld", t.rounds, t.checked_open,
                t.checked_ended, t.notes, t.calls, t.failures, t.hung, t.resumes, t.resent,
                proxy.cuts(), t.lossy, t.undelivered, t.failed_calls);
    print_errors(t.errors);
    return 0;
}

// ---- parent: processes, chaos, accounting ----

// This program again, in another role; its stdout on a pipe.
std::unique_ptr<ordo::test::child> spawn(std::vector<std::string> args) {
    args.insert(args.begin(), "/proc/self/exe");
    return std::make_unique<ordo::test::child>(std::move(args));
}

long rss_kb(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string key;
    long v = 0;
    while (f >> key)
        if (key == "VmRSS:" && f >> v) return v;
    return -1;
}

long fds(pid_t pid) {
    std::error_code ec;
    long n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
        ++n;
    return n;
}

// The " kind=n" words after a client's numbers, added to `errors`.
void read_errors(std::istream& in, std::map<std::string, long>& errors) {
    std::string kv;
    while (in >> kv) {
        const auto eq = kv.rfind('=');
        errors[kv.substr(0, eq)] += std::stol(kv.substr(eq + 1));
    }
}

std::string joined(const std::map<std::string, long>& counts) {
    std::string s;
    for (auto& [k, v] : counts) s += (s.empty() ? "" : ", ") + k + " " + std::to_string(v);
    return s.empty() ? "none" : s;
}

int run(double seconds, int clients, bool cuts, std::size_t server_threads) {
    std::vector<std::unique_ptr<ordo::test::child>> servers(2);
    std::vector<std::string> urls(2);
    auto start_server = [&](int i, const std::string& listen) {
        servers[i] = spawn({"--serve", listen, std::to_string(server_threads)});
        const std::string line = servers[i]->read_line(10s);
        if (line.rfind("listening on ", 0) != 0)
            throw std::runtime_error("server " + std::to_string(i) + " said: " + line);
        urls[i] = line.substr(13);
    };
    start_server(0, "tcp://127.0.0.1:0");
    start_server(1, "tcp://127.0.0.1:0");
    std::vector<std::unique_ptr<ordo::test::child>> cs;
    for (int i = 0; i < clients; ++i)
        cs.push_back(spawn({"--client", urls[0], urls[1], std::to_string(seconds),
                            std::to_string(1000 + i)}));
    std::vector<std::unique_ptr<ordo::test::child>> cut_clients;
    for (int i = 0; cuts && i < clients; ++i)
        cut_clients.push_back(
            spawn({"--cut-client", urls[0], std::to_string(seconds), std::to_string(2000 + i)}));
    std::mt19937 rng(42);
    const auto t0 = clock_type::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    long rss_start = -1, fds_start = -1, rss_end = 0, fds_end = 0;
    std::map<std::string, long> chaos;
    std::string curve;  // server 0's RSS and descriptors over time
    auto last_sample = t0 - 1h;
    while (clock_type::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 2000));
        if (clock_type::now() - last_sample >= 30s || curve.empty()) {
            last_sample = clock_type::now();
            char b[80];
            std::snprintf(b, sizeof b, " %.0fs:%.1fMiB/%ldfd",
                          std::chrono::duration<double>(last_sample - t0).count(),
                          rss_kb(servers[0]->pid()) / 1024.0, fds(servers[0]->pid()));
            curve += b;
        }
        const auto warm_up = std::min<clock_type::duration>(
            5s, std::chrono::duration_cast<clock_type::duration>((end - t0) / 4));
        if (rss_start < 0 && clock_type::now() - t0 > warm_up) {
            rss_start = rss_kb(servers[0]->pid());
            fds_start = fds(servers[0]->pid());
        }
        switch (rng() % 4) {
            case 0:  // server 1 crashes and comes back on its port
                servers[1].reset();  // SIGKILL, reaped
                start_server(1, urls[1]);
                ++chaos["kill"];
                break;
            case 1: {  // a server hangs for 1.5 s
                auto& s = *servers[rng() % 2];
                s.signal(SIGSTOP);
                std::this_thread::sleep_for(1500ms);
                s.signal(SIGCONT);
                ++chaos["stop"];
                break;
            }
            default:  // a server drops every connection
                servers[rng() % 2]->signal(SIGUSR1);
                ++chaos["drop"];
        }
    }
    tally all;
    bool clients_ok = true;
    for (auto& c : cs) {
        const std::string line = c->read_line(30s);
        if (c->wait_exit(10s) != 0 || line.empty()) {
            clients_ok = false;
            continue;
        }
        std::istringstream in(line);
        long v[8];
        for (auto& x : v) in >> x;
        all.calls += v[0], all.ok += v[1], all.wrong += v[2], all.hung += v[3];
        all.notes += v[4], all.undelivered += v[5], all.lost += v[6];
        all.checked_connections += v[7];
        read_errors(in, all.errors);
    }
    // A cut client's last round may wait 30 s for calls and 10 s for the server's counts.
    cut_tally cut;
    long proxy_cuts = 0;
    bool cut_clients_ok = true;
    for (auto& c : cut_clients) {
        const std::string line = c->read_line(60s);
        if (c->wait_exit(10s) != 0 || line.empty()) {
            cut_clients_ok = false;
            continue;
        }
        std::istringstream in(line);
        long v[13];
        for (auto& x : v) in >> x;
        cut.rounds += v[0], cut.checked_open += v[1], cut.checked_ended += v[2];
        cut.notes += v[3], cut.calls += v[4], cut.failures += v[5], cut.hung += v[6];
        cut.resumes += v[7], cut.resent += v[8], proxy_cuts += v[9];
        cut.lossy += v[10], cut.undelivered += v[11], cut.failed_calls += v[12];
        read_errors(in, cut.errors);
    }
    rss_end = rss_kb(servers[0]->pid());
    fds_end = fds(servers[0]->pid());
    servers.clear();
    const bool flat = rss_start > 0 && rss_end - rss_start < 16 * 1024 && fds_end - fds_start < 16;
    const bool cuts_ok = !cuts || (cut_clients_ok && cut.failures == 0 && cut.hung == 0 &&
                                   cut.checked_open > 0 && proxy_cuts > 0 && cut.resumes > 0);
    const bool ok = clients_ok && all.hung == 0 && all.lost == 0 && all.wrong == 0 && flat &&
                    all.ok > 0 && all.checked_connections > 0 && cuts_ok;
    const std::string errs = joined(all.errors), ch = joined(chaos);
    std::printf(
        "soak: %.0f s, %d clients; calls %ld (ok %ld, wrong %ld, hung %ld; errors: %s); "
        "notifications %ld (undelivered reported %ld, lost %ld, over %ld checked connections); "
        "chaos: %s; server 0 RSS %.1f -> %.1f MiB, fds %ld -> %ld: %s\n",
        seconds, clients, all.calls, all.ok, all.wrong, all.hung, errs.c_str(), all.notes,
        all.undelivered, all.lost, all.checked_connections, ch.c_str(), rss_start / 1024.0,
        rss_end / 1024.0, fds_start, fds_end,
        ok ? "ok" : (clients_ok ? "FAILED" : "FAILED (a client died)"));
    std::printf("soak: server 0 over time:%s\n", curve.c_str());
    if (cuts)
        std::printf(
            "soak cuts: %d clients through cutting proxies, resume_ms=10000; %ld channels (%ld "
            "checked on themselves, %ld after they ended), %ld notifications, %ld calls, %ld "
            "cuts, %ld resumes, %ld messages resent; sessions lost on %ld channels (%ld "
            "notifications reported undelivered, %ld calls failed); hung %ld; errors: %s; failed "
            "checks %ld: %s\n",
            clients, cut.rounds, cut.checked_open, cut.checked_ended, cut.notes, cut.calls,
            proxy_cuts, cut.resumes, cut.resent, cut.lossy, cut.undelivered, cut.failed_calls,
            cut.hung, joined(cut.errors).c_str(), cut.failures,
            cuts_ok ? "ok" : (cut_clients_ok ? "FAILED" : "FAILED (a cut client died)"));
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> a(argv + 1, argv + argc);
    try {
        if (a.size() == 3 && a[0] == "--serve")
            return serve(a[1], static_cast<std::size_t>(std::stoul(a[2])));
        if (a.size() == 5 && a[0] == "--client")
            return client({a[1], a[2]}, std::stod(a[3]), static_cast<unsigned>(std::stoul(a[4])));
        if (a.size() == 4 && a[0] == "--cut-client")
            return cut_client(a[1], std::stod(a[2]), static_cast<unsigned>(std::stoul(a[3])));
        double seconds = 60;
        int clients = 3;
        bool cuts = false;
        std::size_t server_threads = 1;
        for (std::size_t i = 0; i < a.size(); ++i) {
            if (a[i] == "--cuts") {
                cuts = true;
                continue;
            }
            if (i + 1 == a.size()) throw std::runtime_error("flag " + a[i] + " needs a value");
            if (a[i] == "--seconds")
                seconds = std::stod(a[++i]);
            else if (a[i] == "--clients")
                clients = std::stoi(a[++i]);
            else if (a[i] == "--server-threads")
                server_threads = static_cast<std::size_t>(std::stoul(a[++i]));
            else
                throw std::runtime_error("unknown flag " + a[i]);
        }
        return run(seconds, clients, cuts, server_threads);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ordo-soak: %s\n", e.what());
        return 2;
    }
}
