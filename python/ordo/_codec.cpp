// msgpack for the Python package, in the extension: Python objects to msgpack bytes and back,
// with the types and rules of msgpack-python's Packer(use_bin_type=True) and
// unpackb(raw=False, strict_map_key=False), so that `import ordo` needs no package beyond the
// standard library (a venv made with `python3 -m venv` has nothing else).
//
// Packing: None, bool, int (-2**63 .. 2**64-1), float (as float 64), str (UTF-8, as str),
// bytes, bytearray and memoryview (as bin), list and tuple (as array), dict (as map); anything
// else is a TypeError, an int out of range an OverflowError, nesting past 512 a ValueError.
// Unpacking: the bytes come from ordo's io thread, which packed them from objects its checked
// reader accepted (docs/protocol.md, "Limits"); they are read again within the same limits.
// str is decoded strictly (or with surrogateescape), bin is bytes, array a list, map a dict; ext
// types, which Python's side never sends, are refused with a ValueError.
#include "_codec.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "ordo/limits.hpp"

namespace ordo::py {
namespace {

constexpr int max_pack_depth = 512;  // msgpack-python's default nest limit

// What packb writes: the small parts in `head`, and bins of big_bin_bytes or more as references
// to their objects' memory, copied once, into the bytes object that packb returns (finish).
class packed {
  public:
    explicit packed(std::string& head) : head_(head) { head_.clear(); }
    packed(const packed&) = delete;
    packed& operator=(const packed&) = delete;
    ~packed() {
        for (auto& v : views_) PyBuffer_Release(&v);
    }

    void push_back(char c) { head_.push_back(c); }
    // `bin`: the object whose bytes these are when they cannot change (bytes, a memoryview of
    // bytes), else null.
    void append(const char* p, std::size_t n, PyObject* bin = nullptr) {
        if (n < big_bin_bytes) return void(head_.append(p, n));
        big_.push_back({head_.size(), p, n, bin});
        size_ += n;
    }
    // Keeps a buffer exported by an object being packed until the copy is made.
    Py_buffer& hold() { return views_.emplace_back(); }
    void drop_last_hold() { views_.pop_back(); }

    // The object of a bin of `min_bytes` or more that ends what was packed, or null.
    PyObject* last_bin(std::size_t min_bytes) const noexcept {
        if (big_.empty()) return nullptr;
        const ref& r = big_.back();
        return r.at == head_.size() && r.n >= min_bytes ? r.bin : nullptr;
    }
    std::size_t size() const noexcept { return head_.size() + size_; }

    // The bytes packed, in one new object, but for the last big bin's bytes when `but_last`;
    // nullptr with MemoryError set.
    PyObject* finish(bool but_last = false) const {
        const std::size_t refs = big_.size() - (but_last ? 1 : 0);
        const std::size_t n = size() - (but_last ? big_.back().n : 0);
        PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
        if (!b) return nullptr;
        char* out = PyBytes_AS_STRING(b);
        std::size_t from = 0;
        for (std::size_t i = 0; i < refs; ++i) {
            const ref& r = big_[i];
            std::memcpy(out, head_.data() + from, r.at - from);
            out += r.at - from;
            std::memcpy(out, r.p, r.n);
            out += r.n;
            from = r.at;
        }
        std::memcpy(out, head_.data() + from, head_.size() - from);
        return b;
    }

  private:
    struct ref {
        std::size_t at;  ///< where in head_ it goes
        const char* p;
        std::size_t n;
        PyObject* bin;  ///< borrowed (the object being packed holds it), or null
    };
    std::string& head_;
    std::vector<ref> big_;
    std::size_t size_ = 0;
    std::vector<Py_buffer> views_;
};

class packer {
  public:
    explicit packer(packed& out) : out_(out) {}

    // False with a Python exception set.
    bool pack(PyObject* o, int depth) {
        if (depth > max_pack_depth) {
            PyErr_SetString(PyExc_ValueError, "ordo: msgpack: recursion limit exceeded");
            return false;
        }
        if (o == Py_None) return put(0xc0), true;
        if (o == Py_True) return put(0xc3), true;
        if (o == Py_False) return put(0xc2), true;
        if (PyLong_Check(o)) return pack_int(o);
        if (PyFloat_Check(o)) {
            const double d = PyFloat_AS_DOUBLE(o);
            std::uint64_t bits;
            std::memcpy(&bits, &d, 8);
            put(0xcb);
            return put_be(bits, 8), true;
        }
        if (PyUnicode_Check(o)) {
            Py_ssize_t n = 0;
            const char* s = PyUnicode_AsUTF8AndSize(o, &n);
            if (!s) return false;
            if (!head(static_cast<std::uint64_t>(n), 0xa0, 31, 0xd9, 0xda, 0xdb)) return false;
            return out_.append(s, static_cast<std::size_t>(n)), true;
        }
        if (PyBytes_Check(o)) return bin(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o), o);
        if (PyByteArray_Check(o))  // it may change: not one to read later (packb_split)
            return bin(PyByteArray_AS_STRING(o), PyByteArray_GET_SIZE(o), nullptr);
        if (PyMemoryView_Check(o)) {
            Py_buffer& v = out_.hold();
            if (PyObject_GetBuffer(o, &v, PyBUF_SIMPLE) != 0) {  // not contiguous
                out_.drop_last_hold();  // never exported: nothing to release
                return false;
            }
            const PyObject* base = PyMemoryView_GET_BASE(o);  // a view of bytes cannot change
            return bin(static_cast<const char*>(v.buf), v.len,
                       base && PyBytes_Check(base) ? o : nullptr);
        }
        if (PyList_Check(o) || PyTuple_Check(o)) {
            const bool list = PyList_Check(o);
            const Py_ssize_t n = list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
            if (!head(static_cast<std::uint64_t>(n), 0x90, 15, 0, 0xdc, 0xdd)) return false;
            // Packing runs no Python code, so the list cannot change under the loop.
            for (Py_ssize_t i = 0; i < n; ++i)
                if (!pack(list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), depth + 1))
                    return false;
            return true;
        }
        if (PyDict_Check(o)) {
            const Py_ssize_t n = PyDict_GET_SIZE(o);
            if (!head(static_cast<std::uint64_t>(n), 0x80, 15, 0, 0xde, 0xdf)) return false;
            Py_ssize_t pos = 0;
            PyObject *k = nullptr, *v = nullptr;
            while (PyDict_Next(o, &pos, &k, &v))
                if (!pack(k, depth + 1) || !pack(v, depth + 1)) return false;
            return true;
        }
        PyErr_Format(PyExc_TypeError, "can not serialize '%.200s' object", Py_TYPE(o)->tp_name);
        return false;
    }

  private:
    void put(unsigned char c) { out_.push_back(static_cast<char>(c)); }

    void put_be(std::uint64_t v, int n) {
        char b[8];
        for (int i = n - 1; i >= 0; --i, v >>= 8) b[i] = static_cast<char>(v & 0xff);
        out_.append(b, static_cast<std::size_t>(n));
    }

    // The head of a str, bin, array or map of `n`: its fix form (fix_max and below, 0 when it
    // has none), else the 8-, 16- or 32-bit length form (op8 0 when there is no 8-bit one).
    bool head(std::uint64_t n, unsigned char fix, std::uint64_t fix_max, unsigned char op8,
              unsigned char op16, unsigned char op32) {
        if (fix && n <= fix_max) return put(static_cast<unsigned char>(fix | n)), true;
        if (op8 && n <= 0xff) return put(op8), put_be(n, 1), true;
        if (n <= 0xffff) return put(op16), put_be(n, 2), true;
        if (n <= 0xffffffffu) return put(op32), put_be(n, 4), true;
        PyErr_SetString(PyExc_ValueError, "ordo: msgpack: too long to pack (2**32 or more)");
        return false;
    }

    bool bin(const char* p, Py_ssize_t n, PyObject* o) {
        if (!head(static_cast<std::uint64_t>(n), 0, 0, 0xc4, 0xc5, 0xc6)) return false;
        return out_.append(p, static_cast<std::size_t>(n), o), true;
    }

    bool pack_int(PyObject* o) {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow == 0) {
            if (v == -1 && PyErr_Occurred()) return false;
            if (v >= 0) return put_uint(static_cast<std::uint64_t>(v)), true;
            if (v >= -32) return put(static_cast<unsigned char>(v)), true;
            const int n = v >= INT8_MIN ? 1 : v >= INT16_MIN ? 2 : v >= INT32_MIN ? 4 : 8;
            put(n == 1 ? 0xd0 : n == 2 ? 0xd1 : n == 4 ? 0xd2 : 0xd3);
            return put_be(static_cast<std::uint64_t>(v), n), true;
        }
        if (overflow > 0) {
            const unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (!(u == static_cast<unsigned long long>(-1) && PyErr_Occurred()))
                return put_uint(u), true;
            PyErr_Clear();
        }
        PyErr_SetString(PyExc_OverflowError, "Integer value out of range");
        return false;
    }

    void put_uint(std::uint64_t v) {
        if (v < 0x80) return put(static_cast<unsigned char>(v));
        const int n = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;
        put(n == 1 ? 0xcc : n == 2 ? 0xcd : n == 4 ? 0xce : 0xcf);
        put_be(v, n);
    }

    packed& out_;
};

// memoryview(data), as bytes ('B', one dimension), whatever the items `data` exports.
PyObject* bytes_view(PyObject* data) {
    PyObject* mv = PyMemoryView_FromObject(data);
    if (!mv) return nullptr;
    const Py_buffer* b = PyMemoryView_GET_BUFFER(mv);
    if (b->itemsize == 1 && b->ndim == 1 && b->format && b->format[0] == 'B' && !b->format[1])
        return mv;
    PyObject* cast = PyObject_CallMethod(mv, "cast", "s", "B");
    Py_DECREF(mv);
    return cast;
}

// Where unpacked bins of big_bin_bytes or more go when unpackb is asked for views: slices of
// one memoryview of the data, which they keep alive.
struct source {
    PyObject* data;             ///< what unpackb was given
    const char* base;           ///< its buffer
    bool views;                 ///< big bins as memoryviews
    PyObject* whole = nullptr;  ///< memoryview(data), made at the first big bin
    ~source() { Py_XDECREF(whole); }

    PyObject* bin(const char* p, std::size_t n) {
        if (!views || n < big_bin_bytes)
            return PyBytes_FromStringAndSize(p, static_cast<Py_ssize_t>(n));
        if (!whole && !(whole = bytes_view(data))) return nullptr;
        const auto at = static_cast<Py_ssize_t>(p - base);
        PyObject* lo = PyLong_FromSsize_t(at);
        PyObject* hi = lo ? PyLong_FromSsize_t(at + static_cast<Py_ssize_t>(n)) : nullptr;
        PyObject* sl = hi ? PySlice_New(lo, hi, nullptr) : nullptr;
        PyObject* r = sl ? PyObject_GetItem(whole, sl) : nullptr;
        Py_XDECREF(sl);
        Py_XDECREF(hi);
        Py_XDECREF(lo);
        return r;
    }
};

// A new reference, or nullptr with a Python exception set.
PyObject* to_python(const msgpack::object& o, const char* errors, source& src) {
    switch (o.type) {
        case msgpack::type::NIL: Py_RETURN_NONE;
        case msgpack::type::BOOLEAN: return PyBool_FromLong(o.via.boolean);
        case msgpack::type::POSITIVE_INTEGER: return PyLong_FromUnsignedLongLong(o.via.u64);
        case msgpack::type::NEGATIVE_INTEGER: return PyLong_FromLongLong(o.via.i64);
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64: return PyFloat_FromDouble(o.via.f64);
        case msgpack::type::STR: return PyUnicode_DecodeUTF8(o.via.str.ptr, o.via.str.size, errors);
        case msgpack::type::BIN: return src.bin(o.via.bin.ptr, o.via.bin.size);
        case msgpack::type::ARRAY: {
            PyObject* l = PyList_New(o.via.array.size);
            if (!l) return nullptr;
            for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
                PyObject* x = to_python(o.via.array.ptr[i], errors, src);
                if (!x) {
                    Py_DECREF(l);
                    return nullptr;
                }
                PyList_SET_ITEM(l, i, x);
            }
            return l;
        }
        case msgpack::type::MAP: {
            PyObject* d = PyDict_New();
            if (!d) return nullptr;
            for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
                PyObject* k = to_python(o.via.map.ptr[i].key, errors, src);
                PyObject* v = k ? to_python(o.via.map.ptr[i].val, errors, src) : nullptr;
                const int bad = !v || PyDict_SetItem(d, k, v) != 0;  // an unhashable key: TypeError
                Py_XDECREF(k);
                Py_XDECREF(v);
                if (bad) {
                    Py_DECREF(d);
                    return nullptr;
                }
            }
            return d;
        }
        default:
            PyErr_Format(PyExc_ValueError, "ordo: msgpack: ext type %d is not supported",
                         static_cast<int>(o.via.ext.type()));
            return nullptr;
    }
}

bool borrow_all(msgpack::type::object_type, std::size_t, void*) {
    return true;
}

}  // namespace

namespace {

PyObject* packb_fn(PyObject*, PyObject* o) {
    return packb(o);
}

PyObject* packb_split_fn(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "packb_split(obj, min_bytes)");
        return nullptr;
    }
    const Py_ssize_t min_bytes = PyLong_AsSsize_t(args[1]);
    if (min_bytes < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "min_bytes < 0");
        return nullptr;
    }
    return packb_split(args[0], static_cast<std::size_t>(min_bytes));
}

PyObject* unpackb_fn(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n < 1 || n > 3) {
        PyErr_SetString(PyExc_TypeError, "unpackb(data, surrogateescape=False, views=False)");
        return nullptr;
    }
    const int se = n >= 2 ? PyObject_IsTrue(args[1]) : 0;
    if (se < 0) return nullptr;
    const int views = n == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (views < 0) return nullptr;
    return unpackb(args[0], se != 0, views != 0);
}

// Plain CPython functions, not pybind11's: they are on every call's path, and pybind11's
// dispatch costs as much as packing a few arguments.
PyMethodDef codec_methods[] = {
    {"packb", packb_fn, METH_O,
     "msgpack bytes of an object (msgpack-python's Packer(use_bin_type=True) rules)."},
    {"packb_split", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(packb_split_fn)),
     METH_FASTCALL,
     "packb_split(obj, min_bytes) -> (front, back, size): packb(obj) is front + back's bytes, "
     "where back is the bytes-like object of a bin of min_bytes or more that ends it, not "
     "copied (else None, and front is all of it)."},
    {"unpackb", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(unpackb_fn)),
     METH_FASTCALL,
     "unpackb(data, surrogateescape=False, views=False): the object msgpack bytes hold "
     "(msgpack-python's unpackb(raw=False, strict_map_key=False) rules); views: bins of "
     "64 KiB or more as memoryviews of data."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_codec(PyObject* module) {
    return PyModule_AddFunctions(module, codec_methods) == 0;
}

PyObject* packb(PyObject* o) {
    // The head's buffer is kept from call to call: the GIL is held, and packing runs no
    // Python code that could pack again.
    thread_local std::string head;
    PyObject* r = nullptr;
    {
        packed out(head);
        if (packer(out).pack(o, 0)) r = out.finish();
    }
    if (head.capacity() > (std::size_t{1} << 20)) std::string().swap(head);  // bounded
    return r;
}

PyObject* packb_split(PyObject* o, std::size_t min_bytes) {
    thread_local std::string head;  // as packb's
    PyObject* r = nullptr;
    {
        packed out(head);
        if (packer(out).pack(o, 0)) {
            PyObject* back = out.last_bin(std::max(min_bytes, big_bin_bytes));
            PyObject* front = out.finish(back != nullptr);
            if (front)
                r = Py_BuildValue("(NOn)", front, back ? back : Py_None,
                                  static_cast<Py_ssize_t>(out.size()));
        }
    }
    if (head.capacity() > (std::size_t{1} << 20)) std::string().swap(head);
    return r;
}

PyObject* unpackb(PyObject* data, bool surrogateescape, bool views) {
    Py_buffer v;
    if (PyObject_GetBuffer(data, &v, PyBUF_SIMPLE) != 0) return nullptr;
    const limits l;
    PyObject* r = nullptr;
    try {
        std::size_t off = 0;
        // One zone for every call, its first chunk kept (clear() frees the others): the GIL
        // is held and the conversion below runs no Python code that could unpack again.
        // Strings stay in `data` (borrowed): they are copied into Python objects below, or
        // viewed (views).
        thread_local msgpack::zone zone;
        zone.clear();
        const msgpack::object h =
            msgpack::unpack(zone, static_cast<const char*>(v.buf), static_cast<std::size_t>(v.len),
                            off, borrow_all, nullptr,
                            msgpack::unpack_limit(l.max_container_length, l.max_container_length,
                                                  l.max_string_bytes, l.max_string_bytes,
                                                  l.max_string_bytes, l.max_depth));
        if (off != static_cast<std::size_t>(v.len))
            PyErr_Format(PyExc_ValueError, "ordo: msgpack: %zd bytes after the object",
                         v.len - static_cast<Py_ssize_t>(off));
        else {
            source src{data, static_cast<const char*>(v.buf), views};
            r = to_python(h, surrogateescape ? "surrogateescape" : "strict", src);
        }
    } catch (const std::exception& e) {  // incomplete, malformed or past a limit
        PyErr_Format(PyExc_ValueError, "ordo: msgpack does not decode: %s", e.what());
    }
    PyBuffer_Release(&v);
    return r;
}

}  // namespace ordo::py
