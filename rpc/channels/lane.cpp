// channel::lane: a channel whose calls and notifications go on a lane of what it wraps
// (docs/protocol.md "Lanes").
#include "ordo/rpc/channel.hpp"

#include "ordo/error.hpp"
#include "rpc/connection/lanes.hpp"

namespace ordo {

namespace {

// Names its lane on each call (pending_call::lane) and notification; everything else is the
// channel it wraps.
class lane_channel final : public channel_impl {
  public:
    lane_channel(std::shared_ptr<channel_impl> base, std::uint16_t lane)
        : base_(std::move(base)), lane_(lane) {}
    void start_call(std::unique_ptr<detail::pending_call> call) override {
        call->lane = lane_;
        base_->start_call(std::move(call));
    }
    void notify_raw(std::string_view method, std::string_view params) override {
        base_->notify_raw_on(lane_, method, params);
    }
    void notify_raw_on(std::uint16_t lane, std::string_view method,
                       std::string_view params) override {
        base_->notify_raw_on(lane, method, params);
    }
    std::shared_ptr<channel_impl> lane_base(const std::shared_ptr<channel_impl>&) override {
        return base_;
    }
    void close() override { base_->close(); }
    const std::string& remote_address() const noexcept override {
        return base_->remote_address();
    }
    net::any_io_executor get_executor() const override { return base_->get_executor(); }
    std::uint16_t lane() const noexcept { return lane_; }

  private:
    std::shared_ptr<channel_impl> base_;
    std::uint16_t lane_;
};

}  // namespace

channel channel::lane(std::string_view name) const {
    if (!impl_) throw_error(errc::closed, "ordo: lane of an empty channel");
    const std::uint16_t id = detail::lane_id(name);
    auto base = impl_->lane_base(impl_);
    if (id == 0) return channel(std::move(base));
    return channel(std::make_shared<lane_channel>(std::move(base), id));
}

std::uint16_t channel::lane_id() const noexcept {
    if (!impl_ || impl_->lane_base(impl_) == impl_) return 0;
    return static_cast<const lane_channel&>(*impl_).lane();
}

}  // namespace ordo
