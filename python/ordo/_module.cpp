// ordo._ordo: the pybind11 edge. Python objects are converted here, with the GIL held, and the
// work is submitted to the io thread with it held too: a hand-over takes a mutex for a moment
// (the io thread never takes the GIL), and releasing the GIL for that would let another Python
// thread (Dask's profiler, an offload thread) take it and keep the loop waiting up to a switch
// interval. Only what waits (stop_listening, shutdown) releases it.
// ordo/__init__.py builds the public API on it.
#include <algorithm>
#include <chrono>
#include <future>
#include <memory>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "_codec.hpp"
#include "_core.hpp"

namespace pyb = pybind11;
using ordo::py::hub;
using ordo::py::runtime;

namespace {

using release = pyb::call_guard<pyb::gil_scoped_release>;

std::shared_ptr<hub> make_hub() {
    runtime::get();  // the io thread starts with the first hub
    return std::make_shared<hub>();
}

pyb::object text(const std::string& s) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
    if (!o) throw pyb::error_already_set();
    return pyb::reinterpret_steal<pyb::object>(o);
}

// Received bytes of big_bin_bytes or more, kept as the io thread made them, or where the
// connection read them (`kept`): Python reads them through the buffer protocol (unpackb,
// memoryview), and views of them keep them alive.
struct blob {
    std::string bytes;
    std::shared_ptr<const ordo::kept_bytes> kept;
    std::string_view view;  ///< with `kept`: its bytes
    char* data() noexcept { return kept ? const_cast<char*>(view.data()) : bytes.data(); }
    std::size_t size() const noexcept { return kept ? view.size() : bytes.size(); }
};

// A completion's data as a Python object: bytes, or a Blob when it is big (no copy).
PyObject* data_object(ordo::py::completion& c) {
    if (c.kept) return pyb::cast(blob{{}, std::move(c.kept), c.kept_view}).release().ptr();
    std::string& data = c.data;
    if (data.size() < ordo::py::big_bin_bytes)
        return PyBytes_FromStringAndSize(data.data(), static_cast<Py_ssize_t>(data.size()));
    return pyb::cast(blob{std::move(data), nullptr, {}}).release().ptr();
}

// (kind, token, code, a, b, data, text, detail) per completion; a call's result, the common
// case, as (token, data) alone. A release completion is handled here: it drops the batch that
// the io thread read in place (submit).
pyb::list drain(hub& h) {
    std::vector<ordo::py::completion> done = h.drain();
    std::size_t n = done.size();
    for (auto& c : done)
        if (c.what == ordo::py::kind::release) {
            Py_DECREF(reinterpret_cast<PyObject*>(c.a));
            --n;
        }
    pyb::list out(n);
    std::size_t i = 0;
    for (auto& c : done) {
        if (c.what == ordo::py::kind::release) continue;
        if (c.what == ordo::py::kind::call_done && c.code == 0) {  // (token, result)
            PyObject* t = PyTuple_New(2);
            if (!t) throw pyb::error_already_set();
            out[i++] = pyb::reinterpret_steal<pyb::object>(t);
            PyObject* token = PyLong_FromUnsignedLongLong(c.token);
            PyObject* data = token ? data_object(c) : nullptr;
            if (!data) {
                Py_XDECREF(token);
                throw pyb::error_already_set();
            }
            PyTuple_SET_ITEM(t, 0, token);
            PyTuple_SET_ITEM(t, 1, data);
            continue;
        }
        pyb::tuple t(8);
        t[0] = pyb::int_(static_cast<int>(c.what));
        t[1] = pyb::int_(c.token);
        t[2] = pyb::int_(c.code);
        t[3] = pyb::int_(c.a);
        t[4] = pyb::int_(c.b);
        PyObject* data = data_object(c);
        if (!data) throw pyb::error_already_set();
        t[5] = pyb::reinterpret_steal<pyb::object>(data);
        t[6] = c.text.empty() ? pyb::none() : text(c.text);
        // A request's detail is its call context, as msgpack (_server.cpp, pack_context).
        t[7] = c.detail.empty()                    ? pyb::none()
               : c.what == ordo::py::kind::request ? pyb::object(pyb::bytes(c.detail))
                                                   : text(c.detail);
        out[i++] = std::move(t);
    }
    return out;
}

// A bytes object for the io thread to read in place, and the hub that lets it go.
struct held {
    std::shared_ptr<hub> h;
    ordo::py::held_bytes bytes;
};
held hold(std::shared_ptr<hub> h, pyb::bytes b) {
    const std::string_view v(PyBytes_AS_STRING(b.ptr()),
                             static_cast<std::size_t>(PyBytes_GET_SIZE(b.ptr())));
    const auto ref = reinterpret_cast<std::uintptr_t>(b.release().ptr());
    return {h, ordo::py::held_bytes(h, ref, v)};
}
// `back`'s bytes after `front`, read in place through a memoryview of their own, which keeps
// the exporter from changing size until it is let go.
held hold_back(std::shared_ptr<hub> h, std::string front, const pyb::object& back) {
    PyObject* mv = PyMemoryView_FromObject(back.ptr());
    if (!mv) throw pyb::error_already_set();
    const Py_buffer* b = PyMemoryView_GET_BUFFER(mv);
    if (!PyBuffer_IsContiguous(b, 'C')) {
        Py_DECREF(mv);
        throw pyb::value_error("stream_write: back is not contiguous");
    }
    const std::string_view v(static_cast<const char*>(b->buf), static_cast<std::size_t>(b->len));
    return {h, ordo::py::held_bytes(h, reinterpret_cast<std::uintptr_t>(mv), v, std::move(front))};
}

// Batches this big are read by the io thread in place, from the bytes object itself, which a
// release completion lets go afterwards; smaller ones are copied (cheaper than a wake-up).
constexpr std::size_t in_place_batch_bytes = 256 * 1024;

}  // namespace

PYBIND11_MODULE(_ordo, m) {
    m.doc() = "ordo's C++ core; use the ordo package, not this module";
    m.attr("__version__") = ORDO_PY_VERSION;  // meson.build's project version
    {
        // ordo::errc by name ("peer_lost": 1, ...): the codes _errors.py's classes carry.
        pyb::dict codes;
        const std::string unknown = ordo::to_string(static_cast<ordo::errc>(0));
        for (int i = 1; i < 256; ++i) {
            std::string name = ordo::to_string(static_cast<ordo::errc>(i));
            if (name == unknown) continue;
            std::replace(name.begin(), name.end(), ' ', '_');
            codes[pyb::str(name)] = i;
        }
        m.attr("errc") = codes;
    }
    namespace op = ordo::py;

    pyb::class_<blob>(m, "Blob", pyb::buffer_protocol())
        .def_buffer([](blob& b) {
            return pyb::buffer_info(reinterpret_cast<unsigned char*>(b.data()),
                                   static_cast<pyb::ssize_t>(b.size()));
        })
        .def("__len__", [](const blob& b) { return b.size(); });

    pyb::class_<hub, std::shared_ptr<hub>>(m, "Hub")
        .def(pyb::init(&make_hub))
        .def("fileno", &hub::fd)
        .def("drain", &drain)
        .def(
            "connect",
            [](std::shared_ptr<hub> h, std::uint64_t token, std::string url,
               std::uint64_t server) {
                runtime::get().submit(
                    [h = std::move(h), token, url = std::move(url), server]() mutable {
                        op::start_connect(std::move(h), token, std::move(url), server);
                    });
            })
        .def(
            "call",
            [](std::shared_ptr<hub> h, std::uint64_t chan, std::uint64_t token,
               std::string method, std::string params, long timeout_ms, std::string key) {
                runtime::get().submit([h = std::move(h), chan, token, method = std::move(method),
                                       params = std::move(params), timeout_ms,
                                       key = std::move(key)]() mutable {
                    op::start_call(std::move(h), chan, token, std::move(method),
                                   std::move(params), timeout_ms, std::move(key));
                });
            })
        .def("submit",
             [](std::shared_ptr<hub> h, pyb::bytes batch) {
                 const char* p = PyBytes_AS_STRING(batch.ptr());
                 const auto n = static_cast<std::size_t>(PyBytes_GET_SIZE(batch.ptr()));
                 if (n < in_place_batch_bytes) {
                     std::string copy(p, n);
                     runtime::get().submit([h = std::move(h), copy = std::move(copy)] {
                         op::run_batch(h, copy);
                     });
                     return;
                 }
                 // A shared_ptr: the queue holds copyable closures.
                 auto held = std::make_shared<struct held>(hold(std::move(h), std::move(batch)));
                 runtime::get().submit([held] { op::run_batch(held->h, held->bytes.view()); });
             })
        .def(
            "cancel",
            [](const hub&, std::uint64_t token) {
                runtime::get().submit([token] { op::cancel_call(token); });
            })
        .def(
            "notify",
            [](std::shared_ptr<hub> h, std::uint64_t chan, std::string method,
               std::string params) {
                runtime::get().submit([h = std::move(h), chan, method = std::move(method),
                                       params = std::move(params)] {
                    op::send_notify(h, chan, method, params);
                });
            })
        .def(
            "stream",
            [](std::shared_ptr<hub> h, std::uint64_t chan, std::uint64_t token,
               std::string method, std::string params, long timeout_ms, std::string key,
               std::uint32_t window, std::uint64_t window_bytes, int shape) {
                if (shape < 0 || shape > 2) throw pyb::value_error("ordo: no such stream shape");
                runtime::get().submit([h = std::move(h), chan, token, method = std::move(method),
                                       params = std::move(params), timeout_ms,
                                       key = std::move(key), window, window_bytes,
                                       shape]() mutable {
                    op::start_stream(std::move(h), chan, token, std::move(method),
                                     std::move(params), timeout_ms, std::move(key), window,
                                     window_bytes, static_cast<op::shape>(shape));
                });
            })
        .def(
            "stream_write_in",
            [](std::shared_ptr<hub> h, std::uint64_t token, pyb::bytes item, pyb::object back) {
                // Big items only (ordo/_writing.py); the others go with the turn's batch. With
                // `back`, as stream_write.
                auto held = std::make_shared<struct held>(
                    back.is_none() ? hold(std::move(h), std::move(item))
                                   : hold_back(std::move(h), std::string(item), back));
                runtime::get().submit(
                    [token, held] { op::stream_write_in(token, std::move(held->bytes)); });
            },
            pyb::arg("token"), pyb::arg("item"), pyb::arg("back") = pyb::none())
        .def(
            "stream_cancel",
            [](const hub&, std::uint64_t token) {
                runtime::get().submit([token] { op::stream_cancel(token); });
            })
        .def(
            "stream_forget",
            [](const hub&, std::uint64_t token) {
                runtime::get().submit([token] { op::stream_forget(token); });
            })
        .def(
            "open_lane",
            [](const hub&, std::uint64_t chan, std::uint64_t lane, std::string name) {
                runtime::get().submit([chan, lane, name = std::move(name)] {
                    op::open_lane(chan, lane, name);
                });
            })
        .def(
            "forget_channel",
            [](const hub&, std::uint64_t chan) {
                runtime::get().submit([chan] { op::forget_channel(chan); });
            })
        .def(
            "close_peer",
            [](const hub&, std::uint64_t id) {
                runtime::get().submit([id] { op::close_peer(id); });
            })
        .def(
            "close_channel",
            [](const hub&, std::uint64_t chan) {
                runtime::get().submit([chan] { op::close_channel(chan); });
            })
        .def(
            "server_create",
            [](const hub&, std::uint64_t id, std::map<std::string, std::string> tokens,
               std::vector<std::string> introspectors) {
                runtime::get().submit([id, t = std::move(tokens),
                                       i = std::move(introspectors)]() mutable {
                    op::server_create(id, std::move(t), std::move(i));
                });
            })
        .def(
            "server_add",
            [](const hub&, std::uint64_t id, std::string name, std::uint64_t hid, int flags,
               std::string signature, std::vector<std::string> allow) {
                runtime::get().submit([id, name = std::move(name), hid, flags,
                                       sig = std::move(signature),
                                       allow = std::move(allow)]() mutable {
                    op::server_add(id, std::move(name), hid, flags, std::move(sig),
                                   std::move(allow));
                });
            })
        .def(
            "listen",
            [](std::shared_ptr<hub> h, std::uint64_t id, std::uint64_t token, std::string url) {
                runtime::get().submit([h = std::move(h), id, token, url = std::move(url)]() mutable {
                    op::server_listen(std::move(h), id, token, std::move(url), 0);
                });
            })
        .def(
            "server_stop",
            [](std::shared_ptr<hub> h, std::uint64_t id, std::uint64_t token) {
                runtime::get().submit([h = std::move(h), id, token]() mutable {
                    op::server_stop(std::move(h), id, token);
                });
            })
        .def(
            "server_stop_listening",
            [](const hub&, std::uint64_t id) {
                // Done when it returns: the caller may bind the port again at once.
                auto done = std::make_shared<std::promise<void>>();
                auto ran = done->get_future();
                // Dropped (and so the promise broken, at once) once ordo has stopped.
                runtime::get().submit([id, done = std::move(done)] {
                    op::server_stop_listening(id);
                    done->set_value();
                });
                (void)ran.wait_for(std::chrono::seconds(10));
            },
            release())
        .def(
            "respond",
            [](const hub&, std::uint64_t request, int code, std::string data) {
                runtime::get().submit([request, code, data = std::move(data)]() mutable {
                    op::respond(request, code, std::move(data));
                });
            })
        .def(
            "stream_write",
            [](std::shared_ptr<hub> h, std::uint64_t request, pyb::bytes item, pyb::object back) {
                // Big items only (ordo/_hub.py); the others go with the turn's batch. With
                // `back` (packb_split), `item` is the front of an item whose last bytes are
                // back's, which are read in place.
                auto held = std::make_shared<struct held>(
                    back.is_none() ? hold(std::move(h), std::move(item))
                                   : hold_back(std::move(h), std::string(item), back));
                runtime::get().submit(
                    [request, held] { op::stream_write(request, std::move(held->bytes)); });
            },
            pyb::arg("request"), pyb::arg("item"), pyb::arg("back") = pyb::none());

    if (!ordo::py::add_codec(m.ptr())) throw pyb::error_already_set();
    m.def(
        "read_token_file",
        [](const std::string& path) {
            try {
                return ordo::read_token_file(path);
            } catch (const std::system_error& e) {
                throw pyb::value_error(e.what());
            }
        },
        "The token -> subject table of a token file (lines `TOKEN SUBJECT`).");
    m.def(
        "peer_identity",
        [](std::uint64_t id) -> pyb::object {
            auto& rt = runtime::get();
            std::lock_guard l(rt.identities_mu);
            auto it = rt.identities.find(id);
            if (it == rt.identities.end()) return pyb::none();
            const ordo::identity& w = it->second;
            pyb::dict d;
            d["subject"] = w.subject;
            d["address"] = w.address;
            d["cert_subject"] = w.cert_subject;
            d["cert_sans"] = w.cert_sans;
            d["cert_sha256"] = w.cert_sha256;
            d["token_subject"] = w.token_subject;
            if (w.unix_peer)
                d["unix"] = pyb::make_tuple(w.unix_peer->uid, w.unix_peer->gid, w.unix_peer->pid);
            else
                d["unix"] = pyb::none();
            return d;
        },
        "What the server knows of the caller behind a handler's peer channel, or None.");
    m.def(
        "shutdown", [](int wait_ms) { runtime::get().stop(wait_ms); }, release(),
        "Closes every channel and server and ends ordo's io thread (at exit).");
}
