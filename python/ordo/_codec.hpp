// msgpack for the Python package (_codec.cpp): what ordo/_api.py packs and unpacks with.
#pragma once

#include <Python.h>

namespace ordo::py {

/// `o` as msgpack bytes (a new reference), or nullptr with TypeError, OverflowError or
/// ValueError set.
PyObject* packb(PyObject* o);

/// The object `data` (a bytes-like object) holds, all of it, or nullptr with ValueError (or
/// UnicodeDecodeError, TypeError for an unhashable map key) set. `surrogateescape`: str payloads
/// that are not UTF-8 keep their bytes as surrogates, as the call context's keys may.
PyObject* unpackb(PyObject* data, bool surrogateescape);

/// Adds packb(obj) and unpackb(data, surrogateescape=False) to `module`; false with a Python
/// exception set.
bool add_codec(PyObject* module);

}  // namespace ordo::py
