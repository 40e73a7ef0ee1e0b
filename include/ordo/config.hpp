// What every translation unit that uses ordo must agree on, checked or set before any Asio or
// msgpack header is read: every ordo header that includes Asio or msgpack includes this first.
#pragma once

// Without this, a build that forgot C++20 fails with hundreds of lines from deep inside Asio and
// ordo, none of which says what is wrong.
#if __cplusplus < 202002L
#error "ordo needs C++20 (-std=c++20)"
// GCC and clang go on after #error; a missing header stops them here, so the line above is the
// only one the user reads.
#include <ordo-needs-cxx20>
#endif

// libordo compiles Asio once (ASIO_SEPARATE_COMPILATION) with the settings below. A translation
// unit that read Asio's headers with other settings builds and links cleanly, then crashes, so an
// Asio header that came before ordo's without them is an error.
#if defined(ASIO_DETAIL_CONFIG_HPP) &&                                                 \
    !(defined(ASIO_STANDALONE) && defined(ASIO_NO_DEPRECATED) &&                       \
      defined(ASIO_SEPARATE_COMPILATION) && defined(ASIO_DISABLE_STD_ALIGNED_ALLOC) && \
      defined(ASIO_HAS_CO_AWAIT))
#error \
    "ordo: an Asio header came before ordo's without ordo's defines: include ordo first, or compile with the cflags of `pkg-config --cflags ordo` (CMake: link ordo::ordo)"
#endif

// The same settings as ordo.pc's cflags and the CMake target ordo::ordo, set here too for builds
// that take only the include directories and libraries from pkg-config (CMake's
// ${ORDO_INCLUDE_DIRS} and ${ORDO_LIBRARIES}).
#ifndef ASIO_STANDALONE
#define ASIO_STANDALONE 1
#endif
#ifndef ASIO_NO_DEPRECATED
#define ASIO_NO_DEPRECATED 1
#endif
#ifndef ASIO_SEPARATE_COMPILATION
#define ASIO_SEPARATE_COMPILATION 1
#endif
// Asio 1.22 picks aligned_alloc or operator new per translation unit (meson.build says why this
// must be one choice for all).
#ifndef ASIO_DISABLE_STD_ALIGNED_ALLOC
#define ASIO_DISABLE_STD_ALIGNED_ALLOC 1
#endif
// Asio 1.22 turns co_await on under clang only for the Coroutines TS (<experimental/coroutine>);
// clang's C++20 coroutines with libstdc++'s <coroutine> work once it is on.
#ifndef ASIO_HAS_CO_AWAIT
#define ASIO_HAS_CO_AWAIT 1
#endif
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST 1
#endif
