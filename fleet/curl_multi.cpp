#include "fleet/curl_multi.hpp"

#include <curl/curl.h>

#include <asio/posix/stream_descriptor.hpp>

#include <limits>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

// libcurl's global state, set up once (thread-safe through the static's initialization).
void init_curl_once() {
    static const bool done = [] {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            throw std::runtime_error("ordo: curl_global_init failed");
        return true;
    }();
    (void)done;
}

[[noreturn]] void fail(errc code, const http_request& r, const std::string& why) {
    throw std::system_error(make_error_code(code),
                            (r.label.empty() ? "" : r.label + " ") + r.url + ": " + why);
}

}  // namespace

// One curl socket, watched through a descriptor that never owns the fd: curl opens and closes
// it, and tells us (CURL_POLL_REMOVE) before it does.
struct curl_multi::socket_state {
    socket_state(const net::any_io_executor& ex, int fd_) : sd(ex, fd_), fd(fd_) {}
    net::posix::stream_descriptor sd;
    int fd;
    int what = 0;  // CURL_POLL_IN, _OUT or _INOUT: what curl waits for
    bool reading = false;
    bool writing = false;
    bool gone = false;  // curl removed it: pending waits end without calling curl
};

// One request: lives in the frame of the coroutine that awaits it.
struct curl_multi::transfer {
    explicit transfer(const net::any_io_executor& ex, http_request r)
        : req(std::move(r)), wake(ex, net::steady_timer::time_point::max()) {}
    ~transfer() {
        if (owner) owner->remove(*this);
        if (easy) curl_easy_cleanup(easy);
        if (headers) curl_slist_free_all(headers);
    }
    transfer(const transfer&) = delete;
    transfer& operator=(const transfer&) = delete;

    curl_multi* owner = nullptr;  // set while curl runs it
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    http_request req;
    std::string body;
    std::function<void(std::string_view)> on_chunk;  // set for a stream
    std::exception_ptr chunk_error;
    bool too_big = false;
    bool done = false;
    CURLcode result = CURLE_OK;
    char error[CURL_ERROR_SIZE] = {};
    net::steady_timer wake;  // never expires: cancelled when the transfer is done

    static std::size_t on_write(char* data, std::size_t, std::size_t n, void* self) {
        auto& t = *static_cast<transfer*>(self);
        if (t.on_chunk) {
            try {
                t.on_chunk(std::string_view(data, n));
            } catch (...) {
                t.chunk_error = std::current_exception();
                return 0;  // not n: curl aborts the transfer (CURLE_WRITE_ERROR)
            }
            return n;
        }
        if (n > t.req.max_body - t.body.size()) {
            t.too_big = true;
            return 0;
        }
        t.body.append(data, n);
        return n;
    }
};

curl_multi::curl_multi(net::any_io_executor ex)
    : ex_(std::move(ex)), timer_(ex_), self_(std::make_shared<curl_multi*>(this)) {
    init_curl_once();
    multi_ = curl_multi_init();
    if (!multi_) throw std::runtime_error("ordo: curl_multi_init failed");
    curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &curl_multi::on_socket);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &curl_multi::on_timer);
    curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
}

curl_multi::~curl_multi() {
    *self_ = nullptr;
    for (transfer* t : transfers_) {
        curl_multi_remove_handle(multi_, t->easy);
        t->owner = nullptr;
        t->wake.cancel();
    }
    transfers_.clear();
    curl_multi_cleanup(
        multi_);  // closes cached connections (their sockets leave through on_socket)
    for (auto& [fd, s] : sockets_) {
        s->gone = true;
        s->sd.release();
    }
}

void curl_multi::add(transfer& t) {
    t.easy = curl_easy_init();
    if (!t.easy) fail(errc::overloaded, t.req, "curl_easy_init failed");
    CURL* e = t.easy;
    curl_easy_setopt(e, CURLOPT_URL, t.req.url.c_str());
    curl_easy_setopt(e, CURLOPT_PRIVATE, &t);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t.error);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &transfer::on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &t);
    const long ms = static_cast<long>(t.req.timeout.count());
    if (t.on_chunk) {
        // A stream may stay quiet for as long as nothing changes: bound the connect only, and
        // let TCP keep-alives find a peer that vanished.
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, ms);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        const long idle = std::max(1L, ms / 1000);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, idle);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, idle);
    } else {
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, ms);
        curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(t.req.max_body));
    }
    if (!t.req.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, t.req.ca_file.c_str());
    if (!t.req.cert_file.empty()) curl_easy_setopt(e, CURLOPT_SSLCERT, t.req.cert_file.c_str());
    if (!t.req.key_file.empty()) curl_easy_setopt(e, CURLOPT_SSLKEY, t.req.key_file.c_str());
    if (!t.req.authorization.empty()) {
        t.headers = curl_slist_append(t.headers, ("Authorization: " + t.req.authorization).c_str());
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
    }
    if (t.req.post) {
        t.headers = curl_slist_append(t.headers, "Content-Type: application/json");
        t.headers = curl_slist_append(t.headers, "Expect:");
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, t.headers);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
                         static_cast<curl_off_t>(t.req.post->size()));
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, t.req.post->data());
    }
    if (const CURLMcode c = curl_multi_add_handle(multi_, e); c != CURLM_OK)
        fail(errc::overloaded, t.req, curl_multi_strerror(c));
    t.owner = this;
    transfers_.insert(&t);
}

void curl_multi::remove(transfer& t) noexcept {
    if (!t.owner) return;
    curl_multi_remove_handle(multi_, t.easy);
    transfers_.erase(&t);
    t.owner = nullptr;
}

net::awaitable<long> curl_multi::perform(transfer& t) {
    add(t);
    // Completes when finish_done() cancels it, or when the awaiting coroutine is cancelled.
    co_await t.wake.async_wait(use_tuple);
    const http_request& r = t.req;
    if (!t.done) {
        remove(t);
        fail(errc::cancelled, r, "request cancelled");
    }
    if (t.chunk_error) std::rethrow_exception(t.chunk_error);
    if (t.too_big || t.result == CURLE_FILESIZE_EXCEEDED)
        fail(errc::protocol_error, r,
             "response body over " + std::to_string(t.req.max_body) + " bytes");
    if (t.result != CURLE_OK) {
        const std::string why = t.error[0] ? t.error : curl_easy_strerror(t.result);
        fail(t.result == CURLE_OPERATION_TIMEDOUT ? errc::timed_out : errc::peer_lost, r, why);
    }
    long status = 0;
    curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
    co_return status;
}

net::awaitable<http_response> curl_multi::async_request(http_request r) {
    transfer t(ex_, std::move(r));
    http_response out;
    out.status = co_await perform(t);
    out.body = std::move(t.body);
    co_return out;
}

net::awaitable<long> curl_multi::async_stream(http_request r,
                                              std::function<void(std::string_view)> on_chunk) {
    transfer t(ex_, std::move(r));
    t.on_chunk = std::move(on_chunk);
    co_return co_await perform(t);
}

void curl_multi::socket_action(int fd, int events) {
    int running = 0;
    curl_multi_socket_action(multi_, fd, events, &running);
    finish_done();
}

void curl_multi::finish_done() {
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi_, &left)) {
        if (m->msg != CURLMSG_DONE) continue;
        void* p = nullptr;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &p);
        auto* t = static_cast<transfer*>(p);
        t->result = m->data.result;
        t->done = true;
        remove(*t);
        t->wake.cancel();  // the awaiting coroutine resumes later, outside curl
    }
}

void curl_multi::watch(socket_state& s) {
    auto on_ready = [](std::shared_ptr<curl_multi*> self, std::shared_ptr<socket_state> sp,
                       bool read) {
        return [self = std::move(self), sp = std::move(sp), read](std::error_code ec) {
            (read ? sp->reading : sp->writing) = false;
            if (ec || sp->gone || !*self) return;
            (*self)->socket_action(sp->fd, read ? CURL_CSELECT_IN : CURL_CSELECT_OUT);
            if (!sp->gone && *self) (*self)->watch(*sp);
        };
    };
    const auto sp = sockets_.at(s.fd);
    if ((s.what & CURL_POLL_IN) && !s.reading) {
        s.reading = true;
        s.sd.async_wait(net::posix::stream_descriptor::wait_read, on_ready(self_, sp, true));
    }
    if ((s.what & CURL_POLL_OUT) && !s.writing) {
        s.writing = true;
        s.sd.async_wait(net::posix::stream_descriptor::wait_write, on_ready(self_, sp, false));
    }
}

int curl_multi::on_socket(void*, int fd, int what, void* self, void*) {
    auto& m = *static_cast<curl_multi*>(self);
    if (what == CURL_POLL_REMOVE) {
        if (auto it = m.sockets_.find(fd); it != m.sockets_.end()) {
            it->second->gone = true;
            it->second->sd.release();  // pending waits end with operation_aborted
            m.sockets_.erase(it);
        }
        return 0;
    }
    auto& sp = m.sockets_[fd];
    if (!sp) {
        try {
            sp = std::make_shared<socket_state>(m.ex_, fd);
        } catch (const std::exception&) {
            m.sockets_.erase(fd);
            return -1;  // curl fails the transfer on this socket
        }
    }
    sp->what = what;
    m.watch(*sp);
    return 0;
}

int curl_multi::on_timer(void*, long timeout_ms, void* self) {
    auto& m = *static_cast<curl_multi*>(self);
    if (timeout_ms < 0) {
        m.timer_.cancel();
        return 0;
    }
    // Never calls curl from inside its own callback: even a 0 ms timeout runs from the loop.
    m.timer_.expires_after(std::chrono::milliseconds(timeout_ms));
    m.timer_.async_wait([self = m.self_](std::error_code ec) {
        if (ec || !*self) return;
        (*self)->socket_action(CURL_SOCKET_TIMEOUT, 0);
    });
    return 0;
}

}  // namespace ordo::detail
