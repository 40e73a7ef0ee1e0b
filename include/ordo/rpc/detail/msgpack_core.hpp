// The parts of msgpack-c that call sites need, and no more: objects and zones, the packer, and
// the adaptors for the types most calls carry (integers, bool, floating point, strings, string
// views and C arrays, nil, vectors, and vectors of char or unsigned char as bin).
// <msgpack.hpp> costs a call site about half a second more to compile, mostly adaptors it
// never uses.
//
// Any other type (std::map, std::tuple, std::optional, a struct with MSGPACK_DEFINE) needs its
// msgpack-c adaptor in the translation unit that calls with it: include <msgpack.hpp> (or
// <ordo/ordo.hpp>, which does). Without it the call does not compile. It must never pack
// differently: so every adaptor msgpack-c has for a more specialised form of a type included
// here is included too (std::vector<unsigned char> is bin, not an array of ints, in every
// translation unit), as tests/rpc/wire/codec_test.cpp checks against <msgpack.hpp>.
#pragma once

#include <msgpack/object.hpp>
#include <msgpack/pack.hpp>
#include <msgpack/sbuffer.hpp>

// After object.hpp, which completes the types it iterates.
#include <msgpack/iterator.hpp>

#include <msgpack/adaptor/bool.hpp>
#include <msgpack/adaptor/carray.hpp>
#include <msgpack/adaptor/char_ptr.hpp>
#include <msgpack/adaptor/cpp17/string_view.hpp>
#include <msgpack/adaptor/float.hpp>
#include <msgpack/adaptor/int.hpp>
#include <msgpack/adaptor/nil.hpp>
#include <msgpack/adaptor/string.hpp>
#include <msgpack/adaptor/vector.hpp>
#include <msgpack/adaptor/vector_bool.hpp>
#include <msgpack/adaptor/vector_char.hpp>
#include <msgpack/adaptor/vector_unsigned_char.hpp>

namespace ordo {

/// The buffer messages are encoded into (msgpack's growing byte buffer).
using buffer = msgpack::sbuffer;
/// What ordo's own buffers start with (msgpack's default is 8 KiB per buffer: per connection
/// and per request, that was most of an idle connection's memory). They double as they grow.
inline constexpr std::size_t small_buffer = 256;

}  // namespace ordo
