#include "ordo/detail/recycle.hpp"

#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define ORDO_RECYCLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ORDO_RECYCLE 0
#endif
#endif
#ifndef ORDO_RECYCLE
#define ORDO_RECYCLE 1
#endif

namespace ordo::detail {

#if ORDO_RECYCLE
namespace {

constexpr std::size_t step = 64;      // size classes: 64, 128, ..., 512 bytes
constexpr std::size_t classes = 8;
constexpr std::size_t per_class = 128;

// Trivially destructible, so that a block freed after the thread's cleanup ran (by a
// thread_local or static destructor) still finds it; `closed` then sends it to the heap.
struct cache {
    void* blocks[classes][per_class];
    unsigned short count[classes];
    bool registered;
    bool closed;
};
thread_local cache tl_cache;

// Its destructor gives the thread's blocks back when the thread ends.
struct cleanup {
    bool armed = false;
    ~cleanup() {
        for (std::size_t c = 0; c < classes; ++c)
            while (tl_cache.count[c] > 0)
                ::operator delete(tl_cache.blocks[c][--tl_cache.count[c]]);
        tl_cache.closed = true;
    }
};
thread_local cleanup tl_cleanup;

std::size_t class_of(std::size_t size) {
    return (size + step - 1) / step - 1;
}

}  // namespace

void* recycled_new(std::size_t size) {
    const std::size_t c = class_of(size);
    if (size == 0 || c >= classes) return ::operator new(size);
    cache& k = tl_cache;
    if (k.count[c] > 0) return k.blocks[c][--k.count[c]];
    return ::operator new((c + 1) * step);
}

void recycled_delete(void* p, std::size_t size) noexcept {
    const std::size_t c = class_of(size);
    cache& k = tl_cache;
    if (size == 0 || c >= classes || k.closed || k.count[c] == per_class) {
        ::operator delete(p);
        return;
    }
    if (!k.registered) {
        k.registered = true;
        // Constructs it on this thread, so that it runs at the thread's end.
        tl_cleanup.armed = true;
    }
    k.blocks[c][k.count[c]++] = p;
}
#else
void* recycled_new(std::size_t size) {
    return ::operator new(size);
}

void recycled_delete(void* p, std::size_t) noexcept {
    ::operator delete(p);
}
#endif

}  // namespace ordo::detail
