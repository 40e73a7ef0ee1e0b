// call_op: the pending_call that converts the outcome (convert_result) and completes the caller.
#pragma once

#include "ordo/config.hpp"

#include <exception>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <asio/associated_executor.hpp>

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/detail/pending_call.hpp"
#include "ordo/error.hpp"
#include "ordo/net.hpp"

namespace ordo::detail {

/// Converts a successful outcome to R; throws ordo::rpc_error(errc::bad_result) naming the
/// expected type and the msgpack type received if it does not convert.
template <class R>
R convert_result(call_outcome& out) {
    if constexpr (std::is_same_v<R, value>) {
        return value(out.result, std::move(out.message.zone()));
    } else if constexpr (std::is_same_v<R, std::string>) {
        // What msgpack's conversion does (str or bin), built at once rather than assigned.
        const auto& o = out.result;
        if (o.type == msgpack::type::STR) return std::string(o.via.str.ptr, o.via.str.size);
        if (o.type == msgpack::type::BIN) return std::string(o.via.bin.ptr, o.via.bin.size);
        throw_bad_result(typeid(R), o);
    } else {
        try {
            return out.result.as<R>();
        } catch (const std::exception&) {
            throw_bad_result(typeid(R), out.result);
        }
    }
}

/// Where a coroutine call (detail::call_awaitable) wants its result: `convert` turns the
/// outcome into the caller's value at `out` (nothing for void); on failure `detail` gets the
/// remote message or the local reason, and `thrown` what the conversion threw that is not an
/// rpc_error (rethrown to the caller). A call_op<call_sink, H> completes with void(error_code).
struct call_sink {
    void* out = nullptr;
    void (*convert)(call_outcome&, void*) = nullptr;
    std::string detail;
    std::exception_ptr thrown;
    std::uint32_t retry_after_ms = 0;  // call_outcome::retry_after_ms, on failure
};

template <class R, class Handler>
class call_op final : public pending_call {
  public:
    call_op(Handler h, const net::any_io_executor& channel_ex, call_sink* sink = nullptr)
        : sink_(sink),
          handler_(std::move(h)),
          ex_(net::get_associated_executor(handler_, channel_ex)),
          inline_ok_(same_executor(ex_, channel_ex)) {}
    // With the call's method and options (detail::start_with_handler). A handler with no
    // executor of its own takes the channel's as it is, with no copy.
    call_op(std::string_view method, call_options&& o, Handler h, net::any_io_executor&& channel_ex)
        : pending_call(method, std::move(o)),
          sink_(nullptr),
          handler_(std::move(h)),
          ex_(associated(handler_, std::move(channel_ex))),
          inline_ok_(!has_own_executor || same_executor(ex_, channel_ex)) {}

    // The same for a call given no options: the defaults are made in place, not moved in.
    call_op(std::string_view method, Handler h, net::any_io_executor&& channel_ex)
        : pending_call(method),
          sink_(nullptr),
          handler_(std::move(h)),
          ex_(associated(handler_, std::move(channel_ex))),
          inline_ok_(!has_own_executor || same_executor(ex_, channel_ex)) {}

    /// The channel's executor, when the handler has none of its own (it is kept); else null.
    const net::any_io_executor* channel_executor() const noexcept {
        if constexpr (has_own_executor)
            return nullptr;
        else
            return &ex_;
    }

    void complete(std::error_code ec, call_outcome out) override { finish(false, ec, out); }
    void complete_inline(std::error_code ec, call_outcome&& out) override {
        finish(inline_ok_, ec, out);
    }
    bool takes_borrowed() const noexcept override { return true; }

  private:
    // Whether Handler is associated with an executor (asio::bind_executor, a strand, a
    // type with executor_type): the associated type then does not follow the default's.
    static constexpr bool has_own_executor =
        !std::is_same_v<net::associated_executor_t<Handler, net::system_executor>,
                        net::system_executor> ||
        !std::is_same_v<net::associated_executor_t<Handler, net::any_io_executor>,
                        net::any_io_executor>;
    static auto associated(const Handler& h, net::any_io_executor&& channel_ex) {
        if constexpr (has_own_executor)
            return net::get_associated_executor(h, channel_ex);
        else
            return std::move(channel_ex);
    }

    // Handlers with an executor of their own kind (use_future's, a strand) are always posted.
    template <class E>
    static bool same_executor(const E& a, const net::any_io_executor& b) {
        if constexpr (std::is_same_v<E, net::any_io_executor>)
            return a == b;
        else
            return false;
    }

    void finish(bool now, std::error_code ec, call_outcome& out) {
        // Typed results are converted here, before the read zone is reused; raw ones are kept.
        if constexpr (std::is_same_v<R, call_outcome> || std::is_same_v<R, value>) {
            if (out.borrowed) {
                out.message = msgpack::clone(out.result);
                out.result = out.message.get();
                out.borrowed = false;
            }
        }
        if constexpr (std::is_same_v<R, call_sink>) {
            if (!ec && sink_->convert) {
                try {
                    sink_->convert(out, sink_->out);
                } catch (const rpc_error& e) {
                    ec = e.code();
                    sink_->detail = e.detail();
                } catch (...) {  // not on the read path: the caller gets it
                    ec = make_error_code(errc::bad_result);
                    sink_->thrown = std::current_exception();
                }
            } else if (ec) {
                sink_->detail = std::move(out.detail);
                sink_->retry_after_ms = out.retry_after_ms;
            }
            deliver(now, ec);
        } else if constexpr (std::is_same_v<R, call_outcome>) {
            deliver(now, ec, std::move(out));
        } else if constexpr (std::is_void_v<R>) {
            deliver(now, ec);
        } else {
            if (!ec) {
                // Built by the conversion in place, not assigned over a default nor moved.
                struct converted {
                    call_outcome& out;
                    operator R() const { return convert_result<R>(out); }
                };
                std::optional<R> r;
                try {
                    r.emplace(converted{out});
                } catch (const std::system_error& e) {
                    ec = e.code();
                }
                if (r) return deliver(now, ec, std::move(*r));
            }
            deliver(now, ec, R{});
        }
    }

    // The result is passed on by reference: the handler's parameter is its only copy (a
    // std::string was moved twice on the way).
    template <class... A>
    void deliver(bool now, std::error_code ec, A&&... a) {
        if (!now) {
            net::post(ex_, [h = std::move(handler_), ec, ... a = std::forward<A>(a)]() mutable {
                std::move(h)(ec, std::move(a)...);
            });
            return;
        }
        Handler h = std::move(handler_);
        try {
            std::move(h)(ec, std::forward<A>(a)...);
        } catch (...) {
            net::post(ex_, [e = std::current_exception()] { std::rethrow_exception(e); });
        }
    }

    call_sink* sink_;  // R = call_sink only
    Handler handler_;
    net::associated_executor_t<Handler, net::any_io_executor> ex_;
    bool inline_ok_;
};

}  // namespace ordo::detail
