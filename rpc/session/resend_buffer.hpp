// The messages a resumable session has sent and the other side has not yet acknowledged, by
// sequence number (docs/protocol.md, "Resumable sessions"): what a resume sends again. Messages are
// copied into chunks of ~64 KiB, so that keeping one costs a copy, not an allocation.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/fifo.hpp"

namespace ordo::detail {

class resend_buffer {
  public:
    /// Appends message number end() (a head and a body, kept as one message).
    void push(std::string_view head, std::string_view body) {
        const std::size_t n = head.size() + body.size();
        if (chunks_.empty() || chunks_.back().size + n > chunks_.back().cap) add_chunk(n);
        chunk& c = chunks_.back();
        std::memcpy(c.data.get() + c.size, head.data(), head.size());
        if (!body.empty())  // an empty view may hold a null pointer, which memcpy must not get
            std::memcpy(c.data.get() + c.size + head.size(), body.data(), body.size());
        c.size += n;
        c.ends.push_back(static_cast<std::uint32_t>(c.size));
        ++end_;
        bytes_ += n;
    }

    /// Sequence number of the first message held, and one past the last.
    std::uint64_t first() const noexcept { return first_; }
    std::uint64_t end() const noexcept { return end_; }
    /// Bytes of the messages held.
    std::size_t bytes() const noexcept { return bytes_; }
    bool empty() const noexcept { return first_ == end_; }

    /// Forgets the messages before `seq` (first() <= seq <= end()): whole chunks at a time.
    void drop_until(std::uint64_t seq) {
        while (first_ < seq) {
            chunk& c = chunks_.front();
            const std::size_t left = c.ends.size() - skip_;
            const std::size_t begin = skip_ == 0 ? 0 : c.ends[skip_ - 1];
            if (seq - first_ < left) {
                const std::size_t k = static_cast<std::size_t>(seq - first_);
                bytes_ -= c.ends[skip_ + k - 1] - begin;
                skip_ += k;
                first_ = seq;
                return;
            }
            bytes_ -= c.size - begin;
            first_ += left;
            skip_ = 0;
            // The last chunk is kept for reuse: a steady stream then allocates nothing.
            if (!spare_.data || spare_.cap < c.cap) {
                spare_ = std::move(c);
                spare_.size = 0;
                spare_.ends.clear();
            }
            chunks_.pop_front();
        }
    }

    /// Calls f(message) for each message from `seq` (first() <= seq <= end()) on, in order.
    template <class F>
    void for_each_from(std::uint64_t seq, F&& f) const {
        std::uint64_t n = first_;
        std::size_t skip = skip_;
        for (const chunk& c : chunks_) {
            for (std::size_t i = skip; i < c.ends.size(); ++i, ++n) {
                if (n < seq) continue;
                const std::uint32_t begin = i == 0 ? 0 : c.ends[i - 1];
                f(std::string_view(c.data.get() + begin, c.ends[i] - begin));
            }
            skip = 0;
        }
    }

    /// Forgets everything; the next message pushed is number `next`.
    void reset(std::uint64_t next) {
        chunks_.clear();
        spare_ = {};
        skip_ = 0;
        first_ = end_ = next;
        bytes_ = 0;
    }

  private:
    static constexpr std::size_t chunk_bytes = 64 * 1024;
    struct chunk {
        std::unique_ptr<char[]> data;
        std::size_t size = 0, cap = 0;
        std::vector<std::uint32_t> ends;  ///< end offset of each message in data
    };

    void add_chunk(std::size_t n) {
        if (spare_.data && spare_.cap >= n) {
            chunks_.push_back(std::move(spare_));
            spare_ = {};
            return;
        }
        chunk c;
        c.cap = n > chunk_bytes ? n : chunk_bytes;
        c.data.reset(new char[c.cap]);  // not zero-filled
        chunks_.push_back(std::move(c));
    }

    fifo<chunk> chunks_;
    chunk spare_;
    std::size_t skip_ = 0;  ///< messages of the front chunk already dropped
    std::uint64_t first_ = 0, end_ = 0;
    std::size_t bytes_ = 0;
};

}  // namespace ordo::detail
