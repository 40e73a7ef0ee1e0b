// runtime (the io thread) and hub (one asyncio loop's completion queue): see _core.hpp.
#include "_core.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <system_error>

#include <asio/post.hpp>

namespace ordo::py {

hub::hub() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "ordo: eventfd");
}

hub::~hub() {
    ::close(fd_);
}

void hub::push(completion c) {
    bool was_empty;
    {
        std::lock_guard lk(mu_);
        was_empty = q_.empty();
        q_.push_back(std::move(c));
    }
    if (was_empty) {
        const std::uint64_t one = 1;
        // EAGAIN only when the counter is near overflow: the reader is woken anyway.
        while (::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
        }
    }
}

std::vector<completion> hub::drain() {
    std::uint64_t n;
    // Cleared before the queue is taken: a push after the swap writes it again.
    while (::read(fd_, &n, sizeof n) < 0 && errno == EINTR) {
    }
    std::vector<completion> out;
    std::lock_guard lk(mu_);
    out.swap(q_);
    return out;
}

namespace {

// The io thread serves the Python threads that wake it, which can use only what it makes once
// they wait. As a batch thread (SCHED_BATCH) its wake-ups never preempt the thread that woke it
// (the kernel skips wake-up preemption for batch threads): it runs at once on an idle core,
// and on a busy one when that thread waits or its time slice ends (docs/python.md, Threading).
void run_beside_the_waker() noexcept {
    sched_param none{};
    (void)::pthread_setschedparam(::pthread_self(), SCHED_BATCH, &none);  // best effort
}

}  // namespace

runtime::runtime() : work_(io.get_executor()) {
    std::promise<void> ran_out;
    ran_out_ = ran_out.get_future();
    thread_ = std::thread([this, p = std::move(ran_out)]() mutable {
        run_beside_the_waker();
        io.run();
        p.set_value();
    });
}

runtime& runtime::get() {
    // Never destroyed: Python may drop its last handles after the interpreter's exit hooks,
    // and those post to a stopped io_context harmlessly.
    static runtime* rt = new runtime();
    return *rt;
}

void runtime::submit(std::function<void()> f) {
    bool was_empty;
    {
        std::lock_guard lk(mu_);
        if (stopped_) return;
        was_empty = queued_.empty();
        queued_.push_back(std::move(f));
    }
    if (was_empty) net::post(io, [this] { run_queued(); });
}

void runtime::run_queued() {
    std::vector<std::function<void()>> batch;
    {
        std::lock_guard lk(mu_);
        batch.swap(queued_);
    }
    for (auto& f : batch) f();
}

std::uint64_t runtime::peer_channel(channel_impl& p) {
    auto it = peer_ids.find(&p);
    if (it != peer_ids.end() && !it->second.second.expired()) return it->second.first;
    if (peer_ids.size() > 1024) {  // forget the peers that have gone
        for (auto i = peer_ids.begin(); i != peer_ids.end();)
            i = i->second.second.expired() ? peer_ids.erase(i) : std::next(i);
        std::lock_guard l(identities_mu);
        for (auto i = peers_by_id.begin(); i != peers_by_id.end();) {
            if (!i->second.expired()) {
                ++i;
                continue;
            }
            identities.erase(i->first);
            i = peers_by_id.erase(i);
        }
    }
    auto* as_peer = dynamic_cast<peer*>(&p);
    std::shared_ptr<channel_impl> sp;
    if (as_peer) sp = as_peer->shared_from_this();
    const std::uint64_t id = next_id++;
    peer_ids[&p] = {id, sp};
    peers_by_id[id] = sp;
    if (as_peer) {
        std::lock_guard l(identities_mu);
        identities[id] = as_peer->identity();
    }
    return id;
}

std::shared_ptr<channel_impl> runtime::find_channel(std::uint64_t id) {
    auto it = channels.find(id);
    if (it != channels.end()) return it->second.impl();
    auto p = peers_by_id.find(id);
    return p == peers_by_id.end() ? nullptr : p->second.lock();
}

void runtime::stop(int wait_ms) {
    {
        std::lock_guard lk(mu_);
        if (stopped_) return;
    }
    std::promise<void> closed;
    submit([this, &closed] {
        for (auto& [id, ch] : channels) {
            const auto& impl = ch.impl();
            if (impl) impl->close();  // an ordered peer sends what is queued first
        }
        channels.clear();
        for (auto& [id, s] : streams) s->cancel();
        streams.clear();
        for (auto& [id, sig] : calls) sig->emit(net::cancellation_type::terminal);
        stop_servers();
        closed.set_value();
    });
    {
        std::lock_guard lk(mu_);
        stopped_ = true;
    }
    closed.get_future().wait_for(std::chrono::milliseconds(wait_ms));
    work_.reset();
    // io.run() returns once every connection has ended; one that does not end within the
    // wait (a peer that does not read) is not waited for.
    if (ran_out_.wait_for(std::chrono::milliseconds(wait_ms)) != std::future_status::ready)
        io.stop();
    thread_.join();
}

}  // namespace ordo::py
