// Fuzz target 4: a resumable session and a second connection that claims it with ordo.hello
// (docs/protocol.md, "Resumable sessions": the take-over path). The input is two connections'
// bytes:
//   byte 0      flags; bit 0 set: the first connection is reset before the second connects (the
//               server holds the session detached); clear: it stays open and the second takes
//               the session over from it (the server drops the first). Bit 1 set: the second
//               connection ends its sending side right after its bytes; clear: once the server
//               has answered them
//   bytes 1-2   n, big-endian: the first connection's bytes are the next n (fewer if the input
//               ends), the second connection's are the rest
// Raw clients write them over inproc:// (no sockets) to a server with ordo-inc-server's handlers
// that resumes sessions. The first connection is written, and the server left to answer, before
// the second connects. The second cannot know the 16-byte session id the server gives out:
// every occurrence of `id_placeholder` in its bytes becomes the id of the server's first answer
// to ordo.hello on the first connection (tests/fuzz/make_seeds.py writes it where an id goes).
// A crash, a leak or a server that does not stop is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "inc_handlers.hpp"

namespace net = ordo::net;

namespace {

constexpr std::string_view id_placeholder = "ordo-fuzz-sessid";
constexpr std::size_t max_answer_bytes = std::size_t{1} << 20;

template <class Cond>
void run_until(net::io_context& io, Cond done, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && !io.stopped() && std::chrono::steady_clock::now() < deadline)
        io.run_one_for(std::chrono::milliseconds(1));
}

// Runs what is ready until nothing is (timers aside): everything over inproc:// has been
// written, read and answered by then. Bounded in handlers.
void run_ready(net::io_context& io) {
    for (int i = 0; i < 1'000'000 && io.poll_one() != 0; ++i) {
    }
}

// The session id in the server's answer to ordo.hello, [1, msgid, nil, [1, id, received,
// window_ms]], among the messages in `answers`; empty if there is none.
std::string session_id(const std::string& answers) {
    msgpack::unpacker u;
    u.reserve_buffer(answers.size());
    std::copy(answers.begin(), answers.end(), u.buffer());
    u.buffer_consumed(answers.size());
    msgpack::object_handle m;
    try {
        while (u.next(m)) {
            const auto& o = m.get();
            if (o.type != msgpack::type::ARRAY || o.via.array.size != 4) continue;
            const auto& r = o.via.array.ptr[3];
            if (o.via.array.ptr[0].type != msgpack::type::POSITIVE_INTEGER ||
                o.via.array.ptr[0].via.u64 != 1 || r.type != msgpack::type::ARRAY ||
                r.via.array.size != 4 || r.via.array.ptr[1].type != msgpack::type::BIN ||
                r.via.array.ptr[1].via.bin.size != id_placeholder.size())
                continue;
            return std::string(r.via.array.ptr[1].via.bin.ptr, r.via.array.ptr[1].via.bin.size);
        }
    } catch (const std::exception&) {
        // Answers cut short: no id.
    }
    return {};
}

// One raw client: connects, writes `bytes` (ends its sending side then if `end`), and reads the
// answers into `answers` until the server closes (or max_answer_bytes). `live` points at its
// transport meanwhile.
net::awaitable<void> raw_client(const std::string& url, const std::string& bytes, bool end,
                                ordo::transport*& live, std::string& answers, bool& done) {
    auto t = co_await ordo::async_connect_transport(url);
    live = t.get();
    std::error_code ec;
    co_await t->async_write(net::buffer(bytes), ec);
    if (end) t->shutdown_send();
    char buf[4096];
    while (!ec && answers.size() < max_answer_bytes) {
        const std::size_t n = co_await t->async_read_some(net::buffer(buf), ec);
        answers.append(buf, n);
    }
    live = nullptr;
    done = true;
}

int run_one(const std::uint8_t* data, std::size_t size) {
    static int runs = 0;
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const bool reset_first = !in.empty() && (in[0] & 1) != 0;
    const bool end_second_at_once = !in.empty() && (in[0] & 2) != 0;
    const std::size_t n1 = in.size() < 3 ? 0
                                         : (std::size_t{static_cast<std::uint8_t>(in[1])} << 8) |
                                               static_cast<std::uint8_t>(in[2]);
    const std::string_view rest = in.substr(std::min<std::size_t>(in.size(), 3));
    const std::string first(rest.substr(0, n1));
    std::string second(rest.substr(std::min(n1, rest.size())));

    net::io_context io;
    ordo::server_options o;
    o.peer.comm.limits.max_message_bytes = 1 << 16;  // reach the limits with short inputs
    o.peer.comm.limits.max_container_length = 256;
    o.peer.comm.limits.max_depth = 16;
    o.resume_window = std::chrono::milliseconds(10'000);
    o.max_detached_sessions = 4;
    ordo::server srv(io.get_executor(), o);
    long total = 0;
    serve_counter(srv, total);
    const std::string url = srv.listen("inproc://fuzz-resume-" + std::to_string(runs++));

    // The first connection: written, left open (the server sees no end of it).
    bool first_done = false, second_done = false, stopped = false;
    ordo::transport* first_transport = nullptr;
    std::string first_answers, second_answers;
    net::co_spawn(io, raw_client(url, first, false, first_transport, first_answers, first_done),
                  net::detached);
    run_ready(io);
    if (reset_first && first_transport) {
        first_transport->reset();
        run_ready(io);
    }

    // The second: the session id put in, written, ended.
    if (const std::string id = session_id(first_answers); !id.empty())
        for (std::size_t at = second.find(id_placeholder); at != std::string::npos;
             at = second.find(id_placeholder, at + id.size()))
            second.replace(at, id.size(), id);
    ordo::transport* second_transport = nullptr;
    net::co_spawn(
        io,
        raw_client(url, second, end_second_at_once, second_transport, second_answers, second_done),
        net::detached);
    if (!end_second_at_once) {
        run_ready(io);
        if (second_transport) second_transport->shutdown_send();
    }
    // Until the server has closed the second connection; handlers such as sleep_ms may hold it
    // open, so after 20 ms the server is stopped anyway (that cancels them). Stopping closes
    // the first connection too, if it is still open.
    run_until(
        io, [&] { return second_done; }, std::chrono::milliseconds(20));
    net::co_spawn(io, srv.async_stop(), [&](std::exception_ptr) { stopped = true; });
    run_until(
        io, [&] { return stopped && first_done && second_done; }, std::chrono::seconds(5));
    if (!stopped || !first_done || !second_done) __builtin_trap();  // not stopped within 5 s
    return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return run_one(data, size);
}
