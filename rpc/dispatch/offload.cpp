// Bodies that run elsewhere (handler_options::run_on): the call's cancellation carried over to
// them (a stop token they can poll, Asio cancellation where they await), and a streaming body's
// items carried back to the connection's loop.
#include "ordo/rpc/detail/handler_entry.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/strand.hpp>

#include "ordo/error.hpp"
#include "ordo/rpc/stream_call.hpp"
#include "rpc/context/context.hpp"

namespace ordo::detail {

namespace {

// One offloaded body. `signal` is bound to the body's coroutine and emitted on its strand only;
// `body_done` is the strand's; `waiting` is the awaiting coroutine's (on its executor).
struct offload_state : std::enable_shared_from_this<offload_state> {
    explicit offload_state(const net::any_io_executor& ex) : strand(net::make_strand(ex)) {}

    // On the awaiting coroutine's executor: its cancellation slot fired.
    void cancel() {
        if (!waiting || stop.stop_requested()) return;
        stop.request_stop();
        net::post(strand, [self = shared_from_this()] {
            if (!self->body_done) self->signal.emit(net::cancellation_type::terminal);
        });
    }

    net::strand<net::any_io_executor> strand;
    std::stop_source stop;
    net::cancellation_signal signal;
    bool body_done = false;
    bool waiting = true;
    // The call's context, if it has one: the body runs with it too, and anything the body
    // leaves running on its executor keeps it.
    std::shared_ptr<const call_context> ctx;
};

net::awaitable<void> run_body(std::shared_ptr<offload_state> st, offload_body body) {
    try {
        co_await body(st->stop.get_token());
    } catch (...) {
        st->body_done = true;
        throw;
    }
    st->body_done = true;
}

}  // namespace

namespace {
// Starts the body on its strand; the awaiting coroutine's cancellation slot gets a handler of
// its own, which passes cancellation over to the body's strand. Holds plain pointers: GCC 12
// destroys the temporaries of a co_await expression too early (a shared_ptr here freed the
// state under the coroutine's feet).
struct start_body {
    offload_state* st;
    offload_body* body;
    template <class Handler>
    void operator()(Handler handler) const {
        auto self = st->shared_from_this();
        auto slot = net::get_associated_cancellation_slot(handler);
        if (slot.is_connected()) slot.assign([self](net::cancellation_type) { self->cancel(); });
        // Started from the strand itself: co_spawn dispatches, and from a thread of `ex` (a
        // batch's home strand on a worker pool) the body would run inline there, holding that
        // strand until it ends. co_spawn posts the completion to the awaiting coroutine's
        // executor.
        net::post(st->strand, [self, body = std::move(*body), h = std::move(handler)]() mutable {
            auto done = net::bind_cancellation_slot(self->signal.slot(), std::move(h));
            if (self->ctx) {
                net::co_spawn(net::any_io_executor(context_executor(self->strand, self->ctx)),
                              run_body(self, std::move(body)), std::move(done));
                return;
            }
            net::co_spawn(self->strand, run_body(self, std::move(body)), std::move(done));
        });
    }
};
}  // namespace

net::awaitable<void> run_offloaded(net::any_io_executor ex, offload_body body) {
    if (!ex) ex = co_await net::this_coro::executor;
    auto st = std::make_shared<offload_state>(ex);
    if (this_thread_context_owner) st->ctx = *this_thread_context_owner;
    std::exception_ptr failure;
    try {
        co_await net::async_initiate<const net::use_awaitable_t<>&, void(std::exception_ptr)>(
            start_body{st.get(), &body}, net::use_awaitable);
    } catch (...) {
        failure = std::current_exception();
    }
    st->waiting = false;
    if (st->stop.stop_requested())
        throw_error(errc::cancelled, "handler cancelled while its body ran on run_on");
    if (failure) std::rethrow_exception(failure);
}

net::awaitable<void> stream_out::hand_over() {
    throw_error(errc::remote_error, "ordo: nothing to hand over");
    co_return;
}

net::awaitable<void> offload_out::wait_credit() {
    co_return;  // has_credit() is true: credit is waited for on the loop (hand_over)
}

buffer& offload_out::begin_item() {
    if (stop_.stop_requested()) throw_error(errc::cancelled, "the stream was cancelled");
    item_.clear();
    return item_;
}

namespace {
// On the connection's loop: the item as the loop's own writer would send it.
net::awaitable<void> send_on_loop(stream_out& out, const buffer& item) {
    if (!out.has_credit()) co_await out.wait_credit();
    buffer& b = out.begin_item();
    b.write(item.data(), item.size());
    out.end_item();
}
}  // namespace

net::awaitable<void> offload_out::hand_over() {
    // Not bound to this coroutine's cancellation: that is emitted on this side, and the wait on
    // the loop is the loop's. The call's cancellation reaches it there (stream_run::cancel).
    co_await net::co_spawn(
        loop_, send_on_loop(loop_side_, item_),
        net::bind_cancellation_slot(net::cancellation_slot(), net::use_awaitable));
    ++written_;
}

}  // namespace ordo::detail
