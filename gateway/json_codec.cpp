#include "gateway/json_codec.hpp"

#include <cstdint>
#include <string_view>

namespace ordo::json_codec {
namespace {

using packer = msgpack::packer<detail::params_buffer>;

void pack_json(packer& p, const json& j) {
    switch (j.type()) {
        case json::value_t::null: p.pack_nil(); break;
        case json::value_t::boolean: p.pack(j.get<bool>()); break;
        // nlohmann keeps non-negative integers unsigned, so the full uint64 range survives.
        case json::value_t::number_unsigned: p.pack(j.get<std::uint64_t>()); break;
        case json::value_t::number_integer: p.pack(j.get<std::int64_t>()); break;
        case json::value_t::number_float: p.pack(j.get<double>()); break;
        case json::value_t::string: p.pack(j.get_ref<const std::string&>()); break;
        case json::value_t::array:
            p.pack_array(static_cast<std::uint32_t>(j.size()));
            for (const auto& e : j) pack_json(p, e);
            break;
        case json::value_t::object:
            p.pack_map(static_cast<std::uint32_t>(j.size()));
            for (const auto& [k, v] : j.items()) {
                p.pack(k);
                pack_json(p, v);
            }
            break;
        case json::value_t::binary: {
            const auto& b = j.get_binary();
            p.pack_bin(static_cast<std::uint32_t>(b.size()));
            p.pack_bin_body(reinterpret_cast<const char*>(b.data()),
                            static_cast<std::uint32_t>(b.size()));
            break;
        }
        case json::value_t::discarded: p.pack_nil(); break;
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

void pack(detail::params_buffer& out, const json& j) {
    packer p(out);
    pack_json(p, j);
}

detail::params_buffer pack_params(const json& params) {
    detail::params_buffer out;
    pack(out, params);
    return out;
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
