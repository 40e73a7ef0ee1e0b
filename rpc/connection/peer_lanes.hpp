// The lanes of one ordered connection (docs/protocol.md "Lanes"), the part of peer::state that
// sends messages as pieces and puts the other side's pieces back together: the writer and the
// reader (rpc/connection/lanes.hpp), a dispatcher per named lane, the credit each way, and a
// close that waits for the pieces. Its operations are rpc/connection/peer_lanes.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ordo/rpc/peer.hpp"
#include "rpc/connection/lanes.hpp"
#include "rpc/dispatch/dispatcher.hpp"

namespace ordo::detail {

/// A named lane's dispatcher: the lane's messages in order, independent of other lanes. It
/// answers through the connection and tells it what the default lane's dispatcher does.
struct lane_part final : dispatcher_host {
    lane_part(peer::state& st, std::string_view lane_name);
    peer::state& s;
    std::string name;
    bool paused = false;
    // Bytes of this lane's pieces read, and given back as credit (ordo.lane_credit).
    std::uint64_t received = 0, credited = 0;
    dispatcher disp;

    void send_response(const buffer& b) override;
    void send_response_parts(std::string_view head, std::string_view body,
                             std::unique_ptr<held_body> keep) override;
    void pause_reading(bool p) override;
    void handler_started() override;
    std::shared_ptr<void> keep_alive() override;
    void remote_closing(std::error_code code, std::string reason) override;
    void remote_going_away(std::chrono::milliseconds grace, std::string reason) override;
    void handler_finished() override;
    void dropped(std::string_view method, errc code, std::string reason) override;
    void remote_reads_lanes() override;
};

struct peer_lanes {
    explicit peer_lanes(peer::state& st);
    ~peer_lanes();  // gives back what it charged to the memory budget

    peer::state& s;
    lane_writer out;
    lane_reader in;
    read_area area{256};  // a whole message from pieces is decoded into it
    bool ok = false;      // the other side reads ordo.piece
    // A default-lane message larger than this goes as pieces: SIZE_MAX while the other side
    // does not read pieces, 0 while the default lane has pieces waiting (what follows them on
    // that lane waits behind them), else the piece size.
    std::size_t divert_above = std::numeric_limits<std::size_t>::max();
    // close() came while pieces waited: the session closes once they have all gone.
    bool close_after = false;
    std::error_code close_code;
    std::string close_reason;
    net::steady_timer close_timer;  // a close that waits for pieces waits close_timeout at most
    net::steady_timer piece_timer;  // message_timeout for a message in the making
    bool piece_timer_armed = false;
    // Woken (cancelled) when what waits for its pieces falls to high_water_bytes: async_drain.
    net::steady_timer drained;
    std::size_t drain_waiters = 0;
    std::vector<std::unique_ptr<lane_part>> parts;
    bool credit_owed = false;  // a grant could not be sent: the next write retries
    std::uint64_t credits_sent = 0;
    std::size_t charged = 0;  // what lanes hold, charged to the memory budget

    // A message on a named lane, or one the default lane sends as pieces (or holds behind
    // them); toward a peer that has not said it reads pieces, held until ordo.features is
    // answered, or sent plain once it said it does not.
    [[gnu::cold]] void send(std::string_view name, std::string_view head, std::string_view body,
                            std::string_view notification);
    void update_divert() {
        divert_above = !ok              ? std::numeric_limits<std::size_t>::max()
                       : out.busy({})   ? 0
                                        : out.piece_bytes();
    }
    void remote_reads() {
        ok = true;
        update_divert();
    }
    // The connection's own notifications (pieces, a lane's credit, credit for a stream this
    // side writes): taken here, true; any other goes to the dispatcher. Out of line: the read
    // path's inline code stays as small as without them.
    [[gnu::cold, gnu::noinline]] bool took_notification(message& m);
    // A piece arrived: a whole message, once its last piece is in, goes where it would have
    // gone, on its lane.
    [[gnu::cold]] void on_piece(message& m);
    void arm_piece_timer();
    // A write completed (or was acknowledged): the next pieces, and credit that could not be
    // sent.
    void written();
    // The next pieces go, as the output has room.
    void pump();
    // Connection or session ended: pieces waiting are dropped (the notifications among them
    // told undelivered), messages in the making too.
    void end(std::error_code code, const std::string& why);
    // The pieces waiting are dropped, their notifications told undelivered.
    void drop_out(std::error_code code, const std::string& why);
    // What lanes hold (pieces waiting, messages in the making), charged to the memory budget.
    void charge();
    // Closes the session, or once the pieces waiting have gone.
    void close_session(std::error_code code, std::string reason);
    // A named lane's part, made at its first piece (at most limits::max_lanes of them).
    lane_part& part_of(std::string_view lane);
    // Gives the other side credit for what `l` read and does not hold queued, in steps of a
    // quarter of the window (docs/protocol.md "Lanes").
    void grant(lane_part& l);
    [[gnu::cold]] void on_credit(message& m);
    // Messages this side wrote that are not pieces, credit or the session's own (acks): while
    // they flow, named lanes keep to the shared window (lane_writer::pump).
    std::uint64_t plain_sent();
    // Reading stops while any lane's dispatcher asks (its queue is full): `flag` is one
    // dispatcher's wish.
    void pause(bool& flag, bool paused);
    // Handlers running and messages queued on every lane, the default one's included.
    std::size_t running() const;
    std::size_t queued() const;
};

}  // namespace ordo::detail
