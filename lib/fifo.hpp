// A first-in first-out queue on a vector: nothing is allocated until the first push (a
// std::deque allocates on construction, and every connection has a few queues that most
// connections never use), and popped slots are reclaimed once they are half of the vector.
#pragma once

#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

namespace ordo::detail {

template <class T>
class fifo {
  public:
    bool empty() const noexcept { return head_ == items_.size(); }
    std::size_t size() const noexcept { return items_.size() - head_; }
    T& front() { return items_[head_]; }
    T& back() { return items_.back(); }
    void push_back(T v) { items_.push_back(std::move(v)); }
    void pop_front() {
        if (++head_ == items_.size()) {
            clear();
        } else if (head_ >= 8 && 2 * head_ >= items_.size()) {
            items_.erase(items_.begin(), items_.begin() + std::ptrdiff_t(head_));
            head_ = 0;
        }
    }
    void clear() noexcept {
        items_.clear();
        head_ = 0;
    }
    auto begin() const { return items_.begin() + std::ptrdiff_t(head_); }
    auto end() const { return items_.end(); }

  private:
    std::vector<T> items_;
    std::size_t head_ = 0;
};

}  // namespace ordo::detail
