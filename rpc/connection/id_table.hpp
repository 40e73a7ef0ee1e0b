// The table of a peer's calls waiting for a response, keyed by msgid: no node allocation per
// call (an std::unordered_map cost one, and a hash lookup, on the hot path). Open addressing in a
// power-of-two array, with Robin Hood placement: along a run, entries keep the order of their
// home slots, so a lookup and an erase stop at the first entry that sits at its home. An entry's
// home is its msgid's low bits: the caller picks each new msgid with a free home (home_free), so
// a call sits at its home, its lookup is one compare, and its erase moves nothing. Any other id
// still works (it is placed by probing). It grows at half full and shrinks at an eighth (never
// below 8 slots): memory follows the number of calls in flight, not its high-water mark.
#pragma once

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

    /// Whether the slot where `id` would sit is empty: then `id` is not in the table, and
    /// inserting it next (with no insert or take in between) needs no probing.
    bool home_free(std::uint32_t id) const noexcept { return !slots_[home(id)].value; }

    /// Adds `id` (which must be absent) with a default value and returns it. References to
    /// values stay valid until the next insert or take.
    T& insert(std::uint32_t id) {
        if ((size_ + 1) * 2 > slots_.size()) [[unlikely]]
            rehash(slots_.size() * 2);
        ++size_;
        std::size_t i = home(id);
        if (slots_[i].value) [[unlikely]]
            i = place(id);
        slots_[i].id = id;
        return slots_[i].value.emplace();
    }

    /// Removes `id` and returns its value, or nothing if absent.
    std::optional<T> take(std::uint32_t id) {
        std::size_t i = find_slot(id);
        if (i == npos) return std::nullopt;
        std::optional<T> out(std::move(slots_[i].value));
        erase_at(i);
        return out;
    }

    /// If `id` is there: runs f(value) on its value in place, then removes it; true. Else
    /// false. What take() does, without moving the value out and back.
    template <class F>
    bool take_with(std::uint32_t id, F&& f) {
        const std::size_t i = find_slot(id);
        if (i == npos) return false;
        f(*slots_[i].value);
        erase_at(i);
        return true;
    }

    /// Empties the table and returns every (id, value), in no particular order.
    std::vector<std::pair<std::uint32_t, T>> take_all() {
        std::vector<std::pair<std::uint32_t, T>> all;
        all.reserve(size_);
        for (auto& s : slots_)
            if (s.value) all.emplace_back(s.id, std::move(*s.value));
        slots_.clear();
        slots_.resize(min_slots);
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
    std::size_t home(std::uint32_t id) const noexcept { return id & mask(); }
    // How far the entry in slot i sits from its home.
    std::size_t distance(std::size_t i) const noexcept { return (i - home(slots_[i].id)) & mask(); }

    std::size_t find_slot(std::uint32_t id) const noexcept {
        // Entries along a run are in the order of their homes: past one that is nearer its
        // home than `id` would be, `id` cannot be.
        for (std::size_t i = home(id), d = 0; slots_[i].value && distance(i) >= d;
             i = (i + 1) & mask(), ++d)
            if (slots_[i].id == id) return i;
        return npos;
    }

    // Backward shift: the entries after the hole that are away from their homes move one slot
    // down, up to the first empty slot or entry at its home.
    [[gnu::always_inline]] void erase_at(std::size_t i) noexcept {
        slots_[i].value.reset();
        --size_;
        for (std::size_t j = (i + 1) & mask(); slots_[j].value && distance(j) > 0;
             j = (j + 1) & mask()) {
            slots_[i] = std::move(slots_[j]);
            slots_[j].value.reset();
            i = j;
        }
        if (slots_.size() > min_slots && size_ * 8 < slots_.size()) [[unlikely]]
            rehash(slots_.size() / 2);
    }

    void rehash(std::size_t n) {
        std::vector<slot> old(n);
        old.swap(slots_);
        for (auto& s : old)
            if (s.value) slots_[place(s.id)] = std::move(s);
    }

    // The slot where `id` goes, emptied for it (Robin Hood): past the entries at least as far
    // from their homes as `id` would be; the entries from there to the next empty slot move
    // one slot up, keeping their order.
    std::size_t place(std::uint32_t id) {
        std::size_t i = home(id);
        for (std::size_t d = 0; slots_[i].value && distance(i) >= d; ++d) i = (i + 1) & mask();
        std::size_t j = i;
        while (slots_[j].value) j = (j + 1) & mask();
        for (; j != i; j = (j - 1) & mask()) slots_[j] = std::move(slots_[(j - 1) & mask()]);
        return i;
    }

    std::vector<slot> slots_;
    std::size_t size_ = 0;
};

}  // namespace ordo::detail
