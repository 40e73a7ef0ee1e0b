#include "ordo/detail/shutdown_hook.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace ordo::detail {

// The hooks of one execution context. Shared by its service and every hook made there, so that
// a hook destroyed on another thread after the context has gone still finds its lock.
struct hook_list {
    std::atomic<std::size_t> refs{1};  // the service's, and one per hook not yet unhooked
    std::mutex m;
    std::condition_variable cv;
    shutdown_hook* first = nullptr;
    bool down = false;                 // the context has shut down: no hook is taken
    shutdown_hook* running = nullptr;  // whose on_shutdown() may still touch it...
    std::thread::id running_on;        // ...on this thread

    void release() noexcept {
        if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
    }
    void unlink(shutdown_hook* h) noexcept {
        if (h->prev_)
            h->prev_->next_ = h->next_;
        else
            first = h->next_;
        if (h->next_) h->next_->prev_ = h->prev_;
        h->prev_ = h->next_ = nullptr;
        h->linked_ = false;
    }
    void done(shutdown_hook* h) noexcept {
        {
            std::lock_guard l(m);
            if (running != h) return;
            running = nullptr;
        }
        cv.notify_all();
    }

    // One hook at a time, taken off the list first: what it destroys may end other hooked
    // objects (they take themselves off), or make new ones (refused).
    void shut_down() {
        for (;;) {
            shutdown_hook* h;
            {
                std::lock_guard l(m);
                down = true;
                h = first;
                if (!h) return;
                unlink(h);
                running = h;
                running_on = std::this_thread::get_id();
            }
            h->on_shutdown();  // may free h
            done(h);           // compares the pointer only
        }
    }
};

// One per execution context, made by the first hook there (asio::use_service). Services shut
// down in the reverse order of their making: this one always goes before the io_context's
// scheduler, made with the context, which destroys what the hooks queue on it. A reactor or a
// strand service made later than this one has shut down first; Asio's objects still cancel,
// close and post after that (a post to a strand then destroys its handler at once).
class shutdown_hooks final : public net::execution_context::service {
  public:
    using key_type = shutdown_hooks;
    static net::execution_context::id id;

    explicit shutdown_hooks(net::execution_context& ctx) : service(ctx) {}
    ~shutdown_hooks() override { list_->release(); }

    hook_list* attach() noexcept {
        list_->refs.fetch_add(1, std::memory_order_relaxed);
        return list_;
    }

  private:
    void shutdown() override { list_->shut_down(); }

    hook_list* list_ = new hook_list;
};

net::execution_context::id shutdown_hooks::id;

shutdown_hook::shutdown_hook(const net::any_io_executor& ex)
    : list_(net::use_service<shutdown_hooks>(net::query(ex, net::execution::context)).attach()) {
    std::lock_guard l(list_->m);
    if (list_->down) return;  // the context has shut down: not kept
    next_ = list_->first;
    if (next_) next_->prev_ = this;
    list_->first = this;
    linked_ = true;
}

shutdown_hook::~shutdown_hook() {
    unhook();
}

void shutdown_hook::unhook() noexcept {
    if (!list_) return;
    {
        std::unique_lock l(list_->m);
        if (linked_) {
            list_->unlink(this);
        } else {
            // Taken by the context's shutdown. Its on_shutdown() may free this object on its
            // own thread (then it is done with it); on another, wait until it is.
            const auto me = std::this_thread::get_id();
            list_->cv.wait(l, [&] { return list_->running != this || list_->running_on == me; });
        }
    }
    std::exchange(list_, nullptr)->release();
}

void shutdown_hook::shutdown_done() noexcept {
    if (list_) list_->done(this);
}

}  // namespace ordo::detail
