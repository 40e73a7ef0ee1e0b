// A call refused before anything of it runs (detail::dispatcher, rpc/dispatch/dispatcher.hpp):
// its deadline passed while it waited, its caller may not call it, or it is over a concurrency
// limit (docs/protocol.md, "Overload"); and the answer to ordo.health, which says whether calls
// are welcome at all (docs/protocol.md, "Health").
#include "rpc/dispatch/dispatcher.hpp"

#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/dispatch/admission.hpp"
#include "rpc/context/context.hpp"
#include "rpc/wire/errors.hpp"

namespace ordo::detail {

// A notification dropped: told to the host, whose callback (the application's) must not throw;
// if it does anyway, or the reason cannot be built, dispatching goes on regardless.
void dispatcher::report_dropped(std::string_view method, errc code,
                                std::string_view failure) noexcept {
    try {
        std::string reason = failure.empty() ? "notification for \"" + std::string(method) +
                                                   "\" dropped: no such method"
                                             : "notification handler for \"" + std::string(method) +
                                                   "\" failed: " + std::string(failure);
        host_.dropped(method, code, std::move(reason));
    } catch (...) {
    }
}

void dispatcher::expired(const handler_entry& e, const message& m, const arrival& a) {
    const auto late = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - a.ctx->deadline);
    e.counters->request_done(errc::timed_out);
    refuse(m, a, errc::timed_out,
           "the deadline of the call to \"" + std::string(m.method) + "\" passed " +
               std::to_string(late.count()) + " ms before its handler could start");
}

void dispatcher::deny(const handler_entry& e, const message& m, const arrival& a) {
    const std::string why = "permission denied: " + self_.identity().name() +
                            " may not call method \"" + std::string(m.method) + "\"";
    if (m.kind == message_kind::request) {
        e.counters->request_done(errc::permission_denied);
        refuse(m, a, errc::permission_denied, why);
    } else {
        ++c_.notification_errors;
        e.counters->notification_done(true);
        report_dropped(m.method, errc::permission_denied, why);
    }
}

bool dispatcher::admit(const handler_entry& e, const message& m, const arrival& a,
                       std::shared_ptr<admission::ticket>& wait) {
    admission* mine = e.limit.get();
    admission* all = h_->limit().get();
    admission* full = nullptr;
    std::string why;
    bool over_share = false;
    if (mine && !mine->try_enter()) {
        full = mine;
    } else if (all && all->shared()) {
        if (!seat_) seat_ = all->seat_for(self_.identity());
        if (all->enter(*seat_, wait, why, over_share) == admission::verdict::refuse) {
            if (mine) mine->withdraw();
            full = all;
        }
    } else if (all && !all->try_enter()) {
        if (mine) mine->withdraw();
        full = all;
    }
    if (!full) return true;
    const std::uint64_t retry = full->retry_after_ms();
    if (why.empty())
        why = "overloaded: " +
              (full == mine ? "method \"" + std::string(m.method) + "\""
                            : std::string("the server")) +
              " has " + std::to_string(full->in_flight()) + " calls running, its limit (" +
              (full == mine ? "handler_options" : "server_options") + "::concurrency, " +
              (full->adaptive() ? "adaptive, now " : "") + std::to_string(full->limit()) +
              "); retry after " + std::to_string(retry) + " ms";
    if (m.kind == message_kind::request) {
        e.counters->request_done(errc::overloaded);
        refuse(m, a, errc::overloaded, why, retry, over_share);
    } else {
        ++c_.notification_errors;
        e.counters->notification_done(true);
        report_dropped(m.method, errc::overloaded, why);
    }
    return false;
}

void dispatcher::answer_health(const message& m) {
    const auto& a = m.params.via.array;
    if (a.size > 1 || (a.size == 1 && a.ptr[0].type != msgpack::type::STR))
        return respond_error(m.msgid, errc::bad_arguments,
                             "ordo.health takes [] or [service], the service's name as a str");
    const std::string_view service =
        a.size == 1 ? std::string_view(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size)
                    : std::string_view();
    std::optional<health_state> state;
    if (h_)
        state = h_->health(service);
    else if (service.empty())
        state = health_state::serving;
    if (!state)
        return respond_error(
            m.msgid, errc::method_not_found,
            "no service \"" + std::string(service) + "\" (server::set_health names them)");
    buffer b(small_buffer);
    encode_response(b, m.msgid, std::string_view(to_string(*state)));
    host_.send_response(b);
}

}  // namespace ordo::detail
