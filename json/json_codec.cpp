#include "json/json_codec.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace ordo::json_codec {
namespace {

using packer = msgpack::packer<detail::params_buffer>;

// msgpack-c 4.1's pack_double writes an integral double as an integer, and for 2^64 (which
// passes its range check, as uint64's maximum rounds up to it) converts out of range: undefined
// behaviour (the fuzz target found [18446744073709551635]). Doubles from 2^64 up are written
// as float 64 here.
void pack_double(detail::params_buffer& out, packer& p, double d) {
    if (!(d >= 18446744073709551616.0)) {
        p.pack_double(d);
        return;
    }
    std::uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    char buf[9];
    buf[0] = static_cast<char>(0xcb);
    for (int i = 0; i < 8; ++i) buf[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
    out.write(buf, sizeof buf);
}

// Iterative: a body nested thousands deep costs a vector, not the stack of the thread that
// serves the request (civetweb's are 100 KiB).
void pack_json(detail::params_buffer& out, const json& root, const limits& l, std::size_t depth,
               std::size_t objects_around) {
    packer p(out);
    struct frame {
        const json* container;
        json::const_iterator next;
    };
    std::vector<frame> open;
    // Every msgpack object counts, map keys too, as the server's reader counts them.
    std::size_t objects = objects_around;
    auto over = [](const char* what, std::size_t found, const char* name, std::size_t limit) {
        throw over_limit(std::string(what) + " " + std::to_string(found) + " is over " + name +
                         " (" + std::to_string(limit) + ")");
    };
    auto put = [&](const json& j) {
        if (++objects > l.max_objects)
            over("msgpack objects (map keys too): more than", l.max_objects, "max_objects",
                 l.max_objects);
        switch (j.type()) {
            case json::value_t::null: p.pack_nil(); break;
            case json::value_t::boolean: p.pack(j.get<bool>()); break;
            // nlohmann keeps non-negative integers unsigned, so the full uint64 range survives.
            case json::value_t::number_unsigned: p.pack(j.get<std::uint64_t>()); break;
            case json::value_t::number_integer: p.pack(j.get<std::int64_t>()); break;
            case json::value_t::number_float: pack_double(out, p, j.get<double>()); break;
            case json::value_t::string: {
                const auto& str = j.get_ref<const std::string&>();
                if (str.size() > l.max_string_bytes)
                    over("a string of bytes:", str.size(), "max_string_bytes", l.max_string_bytes);
                p.pack(str);
                break;
            }
            case json::value_t::array:
            case json::value_t::object:
                if (depth + open.size() + 1 > l.max_depth)
                    over("nesting: depth", depth + open.size() + 1, "max_depth", l.max_depth);
                if (j.size() > l.max_container_length)
                    over("a container of items:", j.size(), "max_container_length",
                         l.max_container_length);
                if (j.is_array())
                    p.pack_array(static_cast<std::uint32_t>(j.size()));
                else
                    p.pack_map(static_cast<std::uint32_t>(j.size()));
                if (!j.empty()) open.push_back({&j, j.cbegin()});
                break;
            case json::value_t::binary: {
                const auto& b = j.get_binary();
                if (b.size() > l.max_string_bytes)
                    over("a binary of bytes:", b.size(), "max_string_bytes", l.max_string_bytes);
                p.pack_bin(static_cast<std::uint32_t>(b.size()));
                p.pack_bin_body(reinterpret_cast<const char*>(b.data()),
                                static_cast<std::uint32_t>(b.size()));
                break;
            }
            case json::value_t::discarded: p.pack_nil(); break;
        }
    };
    put(root);
    while (!open.empty()) {
        frame& f = open.back();
        if (f.next == f.container->cend()) {
            open.pop_back();
            continue;
        }
        const auto it = f.next++;
        if (f.container->is_object()) {
            if (++objects > l.max_objects)
                over("msgpack objects (map keys too): more than", l.max_objects, "max_objects",
                     l.max_objects);
            if (it.key().size() > l.max_string_bytes)
                over("a key of bytes:", it.key().size(), "max_string_bytes", l.max_string_bytes);
            p.pack(it.key());
        }
        put(*it);  // may grow `open`: `f` is not used after it
    }
}

bool valid_utf8(std::string_view s) {
    // nlohmann checks UTF-8 when it writes a string: reuse that instead of another decoder.
    try {
        (void)json(std::string(s)).dump();
        return true;
    } catch (const json::type_error&) {
        return false;
    }
}

json byte_array(const char* p, std::size_t n) {
    json a = json::array();
    for (std::size_t i = 0; i < n; ++i) a.push_back(static_cast<unsigned char>(p[i]));
    return a;
}

}  // namespace

std::size_t nesting_depth(std::string_view text, std::size_t limit) {
    std::size_t depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (const char ch : text) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (ch == '\\')
                escaped = true;
            else if (ch == '"')
                in_string = false;
            continue;
        }
        if (ch == '"') {
            in_string = true;
        } else if (ch == '[' || ch == '{') {
            deepest = std::max(deepest, ++depth);
            if (deepest > limit) return limit + 1;
        } else if ((ch == ']' || ch == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

void pack(detail::params_buffer& out, const json& j, const limits& l, std::size_t depth) {
    pack_json(out, j, l, depth, 0);
}

detail::params_buffer pack_params(const json& params, const limits& l) {
    detail::params_buffer out;
    // Inside the message's array, after its array header, type, msgid and method: 4 objects.
    pack_json(out, params, l, 1, 4);
    return out;
}

detail::params_buffer params_from_body(std::string_view body, const limits& l) {
    const auto first = body.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return pack_params(json::array(), l);
    // The message's array is around the params, and a lone value gets the params' array too.
    const std::size_t around = body[first] == '[' ? 1 : 2;
    if (const auto d = nesting_depth(body, l.max_depth); d + around > l.max_depth)
        throw over_limit(
            "nesting: the body nests " +
            (d > l.max_depth ? "more than " + std::to_string(l.max_depth) : std::to_string(d)) +
            " deep; max_depth is " + std::to_string(l.max_depth) +
            " with the message's array around the params");
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
        try {
            const json again = json::parse(body);  // again, for the reason (where, what)
        } catch (const json::exception& e) {       // parse_error, or out_of_range (1e400)
            throw bad_json(e.what());
        }
        throw bad_json("not JSON");
    }
    // No copy of the tree: nlohmann copies recursively (a civetweb thread's stack is 100 KiB).
    if (j.is_array()) return pack_params(j, l);
    json wrapped = json::array();
    wrapped.push_back(std::move(j));
    return pack_params(wrapped, l);
}

json to_json(const msgpack::object& o) {
    switch (o.type) {
        case msgpack::type::NIL: return nullptr;
        case msgpack::type::BOOLEAN: return o.via.boolean;
        case msgpack::type::POSITIVE_INTEGER: return o.via.u64;
        case msgpack::type::NEGATIVE_INTEGER: return o.via.i64;
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64: return o.via.f64;
        case msgpack::type::STR: return std::string(o.via.str.ptr, o.via.str.size);
        case msgpack::type::BIN:
            // Many peers (neovim among them) send text as bin: show it as text when it is.
            if (valid_utf8({o.via.bin.ptr, o.via.bin.size}))
                return std::string(o.via.bin.ptr, o.via.bin.size);
            return byte_array(o.via.bin.ptr, o.via.bin.size);
        case msgpack::type::ARRAY: {
            json a = json::array();
            for (std::uint32_t i = 0; i < o.via.array.size; ++i)
                a.push_back(to_json(o.via.array.ptr[i]));
            return a;
        }
        case msgpack::type::MAP: {
            json m = json::object();
            for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
                const auto& kv = o.via.map.ptr[i];
                // JSON keys are strings: any other key is written as its JSON text.
                json k = to_json(kv.key);
                m[k.is_string() ? k.get<std::string>() : k.dump()] = to_json(kv.val);
            }
            return m;
        }
        case msgpack::type::EXT:
            return {{"ext", o.via.ext.type()},
                    {"data", byte_array(o.via.ext.data(), o.via.ext.size)}};
    }
    return nullptr;
}

std::string dump(const msgpack::object& o) {
    // A msgpack str need not be UTF-8: replace bad bytes rather than fail on output.
    return to_json(o).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace ordo::json_codec
