// The large buffers a thread keeps for its next large message (ordo/detail/spare_buffers.hpp).
#include "ordo/detail/spare_buffers.hpp"

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

namespace ordo::detail {
namespace {

// Room for the buffers of a 64 MiB message (its bytes and a little more) twice over: one side of
// an echo packs one while it reads the other.
constexpr std::size_t max_kept = 8;
constexpr std::size_t max_block_bytes = std::size_t{65} << 20;
constexpr std::size_t max_kept_bytes = 2 * max_block_bytes;

// Its blocks are freed when the thread ends; a block given back after that (by another
// thread_local's destructor) is freed at once.
struct spares {
    struct block {
        char* p = nullptr;
        std::size_t capacity = 0;
    };
    std::array<block, max_kept> kept{};  // oldest first
    std::size_t count = 0;
    std::size_t bytes = 0;
    bool closed = false;

    ~spares() {
        for (std::size_t i = 0; i < count; ++i) delete[] kept[i].p;
        count = 0;
        closed = true;
    }
    // Takes kept[i] out, the ones after it moving up.
    block remove(std::size_t i) noexcept {
        const block b = kept[i];
        bytes -= b.capacity;
        for (std::size_t k = i; k + 1 < count; ++k) kept[k] = kept[k + 1];
        --count;
        return b;
    }
};

thread_local spares spare;

// Blocks given back by a thread other than the one that will take them again (a read buffer
// that another thread kept: ordo::kept_bytes), for any thread: at most 2, 130 MiB together.
struct shared_spares {
    std::mutex mu;
    std::array<spares::block, 2> kept{};
    std::size_t count = 0;
    std::atomic<std::size_t> held{0};  // count, read without the lock
};
shared_spares& given_back() {
    static auto* s = new shared_spares;  // never destroyed: blocks may come back at exit
    return *s;
}

}  // namespace

std::unique_ptr<char[]> take_given_back_block(std::size_t want, std::size_t most,
                                              std::size_t& capacity) noexcept {
    shared_spares& g = given_back();
    if (g.held.load(std::memory_order_relaxed) == 0) return nullptr;
    std::lock_guard lk(g.mu);
    for (std::size_t i = 0; i < g.count; ++i) {
        if (g.kept[i].capacity < want || g.kept[i].capacity > most) continue;
        const spares::block b = g.kept[i];
        g.kept[i] = g.kept[--g.count];
        g.held.store(g.count, std::memory_order_relaxed);
        capacity = b.capacity;
        return std::unique_ptr<char[]>(b.p);
    }
    return nullptr;
}

void give_back_block(std::unique_ptr<char[]> block, std::size_t capacity) noexcept {
    if (!block || capacity < spare_min_bytes || capacity > max_block_bytes) return;
    shared_spares& g = given_back();
    std::lock_guard lk(g.mu);
    if (g.count == g.kept.size()) {  // one of them goes
        delete[] g.kept[0].p;
        g.kept[0] = g.kept[--g.count];
    }
    g.kept[g.count++] = {block.release(), capacity};
    g.held.store(g.count, std::memory_order_relaxed);
}

std::unique_ptr<char[]> take_spare_block(std::size_t want, std::size_t most,
                                         std::size_t& capacity) noexcept {
    std::size_t best = spare.count;
    for (std::size_t i = 0; i < spare.count; ++i) {
        const std::size_t c = spare.kept[i].capacity;
        if (c >= want && c <= most && (best == spare.count || c < spare.kept[best].capacity))
            best = i;
    }
    if (best == spare.count) return nullptr;
    const auto b = spare.remove(best);
    capacity = b.capacity;
    return std::unique_ptr<char[]>(b.p);
}

void keep_spare_block(std::unique_ptr<char[]> block, std::size_t capacity) noexcept {
    if (!block || capacity < spare_min_bytes || capacity > max_block_bytes || spare.closed) return;
    while (spare.count > 0 && (spare.count >= max_kept || spare.bytes + capacity > max_kept_bytes))
        delete[] spare.remove(0).p;
    spare.bytes += capacity;
    spare.kept[spare.count++] = {block.release(), capacity};
}

}  // namespace ordo::detail
