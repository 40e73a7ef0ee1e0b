// Memory for the objects ordo makes and frees once per call (pending calls): small blocks are
// kept for reuse on the thread that freed them instead of going back to malloc.
#pragma once

#include <cstddef>

namespace ordo::detail {

/// A block of at least `size` bytes (aligned as operator new's), from the calling thread's
/// cache when it holds one of that size class, else from operator new. Throws std::bad_alloc.
void* recycled_new(std::size_t size);

/// Returns a block from recycled_new(size), with the same `size`. Blocks of up to 512 bytes
/// are kept, at most 128 a size class a thread; the rest, and all of a thread's on its exit,
/// go back to operator delete. Under AddressSanitizer nothing is kept, so that a use after
/// free is still reported.
void recycled_delete(void* p, std::size_t size) noexcept;

}  // namespace ordo::detail
