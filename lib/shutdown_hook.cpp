#include "ordo/detail/shutdown_hook.hpp"

#include <mutex>

namespace ordo::detail {

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

    // False once the context has shut down: the hook is not kept.
    bool add(shutdown_hook* h) {
        std::lock_guard l(m_);
        if (down_) return false;
        h->next_ = first_;
        if (first_) first_->prev_ = h;
        first_ = h;
        return true;
    }

    // Nothing if shutdown() has taken `h` off already (another thread's).
    void remove(shutdown_hook* h) {
        std::lock_guard l(m_);
        if (h->hooks_) unlink(h);
    }

  private:
    void unlink(shutdown_hook* h) {
        if (h->prev_)
            h->prev_->next_ = h->next_;
        else
            first_ = h->next_;
        if (h->next_) h->next_->prev_ = h->prev_;
        h->prev_ = h->next_ = nullptr;
    }

    // One hook at a time, taken off the list first: what it destroys may end other hooked
    // objects (they take themselves off), or make new ones (refused).
    void shutdown() override {
        for (;;) {
            shutdown_hook* h;
            {
                std::lock_guard l(m_);
                down_ = true;
                h = first_;
                if (!h) return;
                unlink(h);
                h->hooks_ = nullptr;
            }
            h->on_shutdown();
        }
    }

    std::mutex m_;
    shutdown_hook* first_ = nullptr;
    bool down_ = false;
};

net::execution_context::id shutdown_hooks::id;

shutdown_hook::shutdown_hook(const net::any_io_executor& ex)
    : hooks_(&net::use_service<shutdown_hooks>(net::query(ex, net::execution::context))) {
    if (!hooks_->add(this)) hooks_ = nullptr;
}

shutdown_hook::~shutdown_hook() {
    if (hooks_) hooks_->remove(this);
}

}  // namespace ordo::detail
