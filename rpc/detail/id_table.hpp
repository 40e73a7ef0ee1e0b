// The table of a peer's calls waiting for a response, keyed by msgid: no node allocation per
// call (an std::unordered_map cost one, and a hash lookup, on the hot path). Open addressing with
// linear probing in a power-of-two array; erase shifts later entries back, so there are no
// tombstones. msgids are handed out in sequence, so the live ones form dense runs: placed by
// their low bits they would fill one long cluster, and every erase would walk all of it. They
// are placed by Fibonacci hashing instead (multiply by 2^32/phi, keep the top bits), which
// spreads consecutive ids evenly over the array. It grows at half full and shrinks at an eighth
// (never below 8 slots): memory follows the number of calls in flight, not its high-water mark.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace ordo::detail {

template <class T>
class id_table {
  public:
    id_table() { slots_.resize(min_slots); }

    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    std::size_t capacity() const noexcept { return slots_.size(); }
    bool contains(std::uint32_t id) const noexcept { return find_slot(id) != npos; }

    /// The value under `id`, or nullptr.
    T* find(std::uint32_t id) noexcept {
        const std::size_t i = find_slot(id);
        return i == npos ? nullptr : &*slots_[i].value;
    }

    /// Adds `id` (which must be absent) with a default value and returns it. References to
    /// values stay valid until the next insert or take.
    T& insert(std::uint32_t id) {
        if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
        std::size_t i = home(id);
        while (slots_[i].value) i = (i + 1) & mask();
        slots_[i].id = id;
        slots_[i].value.emplace();
        ++size_;
        return *slots_[i].value;
    }

    /// Removes `id` and returns its value, or nothing if absent.
    std::optional<T> take(std::uint32_t id) {
        std::size_t i = find_slot(id);
        if (i == npos) return std::nullopt;
        std::optional<T> out(std::move(slots_[i].value));
        slots_[i].value.reset();
        --size_;
        // Backward shift: move up every later entry of the run whose home is at or before the
        // hole, so that each entry stays reachable from its home by probing forward.
        for (std::size_t j = (i + 1) & mask(); slots_[j].value; j = (j + 1) & mask()) {
            const std::size_t h = home(slots_[j].id);
            if (((j - h) & mask()) >= ((j - i) & mask())) {
                slots_[i] = std::move(slots_[j]);
                slots_[j].value.reset();
                i = j;
            }
        }
        if (slots_.size() > min_slots && size_ * 8 < slots_.size()) rehash(slots_.size() / 2);
        return out;
    }

    /// Empties the table and returns every (id, value), in no particular order.
    std::vector<std::pair<std::uint32_t, T>> take_all() {
        std::vector<std::pair<std::uint32_t, T>> all;
        all.reserve(size_);
        for (auto& s : slots_)
            if (s.value) all.emplace_back(s.id, std::move(*s.value));
        slots_.clear();
        slots_.resize(min_slots);
        shift_ = 32 - std::countr_zero(min_slots);
        size_ = 0;
        return all;
    }

  private:
    static constexpr std::size_t min_slots = 8;  // an idle connection keeps ~0.5 KiB here
    static constexpr std::size_t npos = ~std::size_t(0);
    struct slot {
        std::uint32_t id = 0;
        std::optional<T> value;
    };

    std::size_t mask() const noexcept { return slots_.size() - 1; }
    std::size_t home(std::uint32_t id) const noexcept {
        return std::uint32_t(id * 2654435769u) >> shift_;
    }

    std::size_t find_slot(std::uint32_t id) const noexcept {
        for (std::size_t i = home(id); slots_[i].value; i = (i + 1) & mask())
            if (slots_[i].id == id) return i;
        return npos;
    }

    void rehash(std::size_t n) {
        std::vector<slot> old(n);
        old.swap(slots_);
        shift_ = 32 - std::countr_zero(n);
        for (auto& s : old) {
            if (!s.value) continue;
            std::size_t i = home(s.id);
            while (slots_[i].value) i = (i + 1) & mask();
            slots_[i] = std::move(s);
        }
    }

    std::vector<slot> slots_;
    int shift_ = 32 - std::countr_zero(min_slots);
    std::size_t size_ = 0;
};

}  // namespace ordo::detail
