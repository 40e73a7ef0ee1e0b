// msgpack for the Python package (_codec.cpp): what ordo/_hub.py packs and unpacks with.
#pragma once

#include <Python.h>

#include <cstddef>

namespace ordo::py {

/// `o` as msgpack bytes (a new reference), or nullptr with TypeError, OverflowError or
/// ValueError set.
PyObject* packb(PyObject* o);

/// packb(o) as a tuple (front, back, size): when what `o` packs to ends with a bin of
/// `min_bytes` (and big_bin_bytes) or more that cannot change (bytes, a memoryview of bytes),
/// `back` is that bin's object and `front` the bytes before its bytes (copied); else `back` is
/// None and `front` all of it. `size`: the packed size. A new reference, or nullptr with an
/// exception set, as packb.
PyObject* packb_split(PyObject* o, std::size_t min_bytes);

/// Bins this long or longer are copied once when packed, and viewed when unpacked with views.
inline constexpr std::size_t big_bin_bytes = 64 * 1024;

/// The object `data` (a bytes-like object) holds, all of it, or nullptr with ValueError (or
/// UnicodeDecodeError, TypeError for an unhashable map key) set. `surrogateescape`: str payloads
/// that are not UTF-8 keep their bytes as surrogates, as the call context's keys may. `views`:
/// bins of big_bin_bytes or more are memoryviews of `data` (which they keep alive), not bytes.
PyObject* unpackb(PyObject* data, bool surrogateescape, bool views = false);

/// Adds packb(obj) and unpackb(data, surrogateescape=False, views=False) to `module`; false
/// with a Python exception set.
bool add_codec(PyObject* module);

}  // namespace ordo::py
