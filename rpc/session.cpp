#include "rpc/session.hpp"

#include "ordo/peer.hpp"

namespace ordo::detail {

session::session(std::unique_ptr<transport> t, const comm_options& o, message_fn on_message,
                 ended_fn on_ended)
    : limits_(o.limits), on_ended_(std::move(on_ended)) {
    comm_ = std::make_unique<batched_comm>(std::move(t), o, std::move(on_message),
                                           [this](const close_result& r) { on_comm_closed(r); });
}

session::~session() = default;

void session::on_comm_closed(const close_result& r) {
    open_ = false;
    close_code_ = r.code;
    close_reason_ = r.reason;
    if (!remote_reason_.empty()) close_reason_ += " (the peer said: " + remote_reason_ + ")";
    if (on_ended_) on_ended_(r);
}

void session::end_locally(std::error_code code, std::string reason) {
    open_ = false;
    close_code_ = code;
    close_reason_ = std::move(reason);
}

void session::report_undelivered(const close_result& r,
                                 const std::function<void(const undelivered_notification&)>& report,
                                 peer_counters& c) const {
    for (const auto& bytes : r.undelivered) {
        // Only notifications are reported (calls fail on their own): ordo writes their heads
        // as fixarray 3, kind 2, so every other message is skipped without being decoded.
        if (bytes.size() < 2 || bytes[0] != '\x93' || bytes[1] != '\x02') continue;
        try {
            message m = decode_message(bytes, limits_);
            if (m.kind != message_kind::notification) continue;
            ++c.notifications_undelivered;
            if (!report) continue;
            buffer params;
            msgpack::pack(params, m.params);
            report({std::string(m.method), std::string(params.data(), params.size()), r.code,
                    r.reason});
        } catch (const std::exception&) {
            // Only this side's own encodings get here; nothing else to report.
        }
    }
}

}  // namespace ordo::detail
