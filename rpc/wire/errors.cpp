#include "rpc/wire/errors.hpp"

#include <cxxabi.h>
#include <algorithm>

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string_view>

#include "ordo/net.hpp"
#include "ordo/rpc/detail/handler_shapes.hpp"
#include "ordo/rpc/detail/message_heads.hpp"

namespace ordo {

namespace detail {

// The handler machinery's words for arguments that do not fit (ordo/rpc/detail/handler_shapes.hpp)
// and for types (ordo/rpc/detail/type_traits.hpp).
std::string type_name(const std::type_info& t) {
    int status = 0;
    char* raw = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
    std::string name = status == 0 && raw ? raw : t.name();
    std::free(raw);
    if (name.find("basic_string<char") != std::string::npos) return "std::string";
    return name;
}

void throw_bad_arguments(std::string_view method, const std::string& signature,
                         const std::string& what) {
    throw_error(errc::bad_arguments,
                "bad arguments for " + std::string(method) + signature + ": " + what);
}

void throw_argument_count(std::string_view method, const std::string& signature, std::size_t got,
                          std::size_t expected) {
    throw_bad_arguments(
        method, signature,
        "got " + std::to_string(got) + " arguments, expected " + std::to_string(expected));
}

void throw_argument_type(std::string_view method, const std::string& signature, std::size_t index,
                         const std::type_info& type) {
    throw_bad_arguments(
        method, signature,
        "argument " + std::to_string(index + 1) + " does not convert to " + type_name(type));
}

}  // namespace detail

namespace detail {

std::error_code error_from_wire(const msgpack::object& e, std::string& detail,
                                std::uint32_t* retry_after_ms, bool* over_share) {
    if (e.type == msgpack::type::MAP) {
        std::optional<std::int64_t> code;
        for (std::uint32_t i = 0; i < e.via.map.size; ++i) {
            const auto& kv = e.via.map.ptr[i];
            if (kv.key.type != msgpack::type::STR) continue;
            std::string_view k(kv.key.via.str.ptr, kv.key.via.str.size);
            if (k == "code" && (kv.val.type == msgpack::type::POSITIVE_INTEGER ||
                                kv.val.type == msgpack::type::NEGATIVE_INTEGER))
                code = kv.val.via.i64;
            else if (k == "message" && kv.val.type == msgpack::type::STR)
                detail.assign(kv.val.via.str.ptr, kv.val.via.str.size);
            else if (k == "retry_after_ms" && retry_after_ms &&
                     kv.val.type == msgpack::type::POSITIVE_INTEGER)
                // A day at most: a hint longer than that is a broken peer's, not a plan.
                *retry_after_ms =
                    static_cast<std::uint32_t>(std::min<std::uint64_t>(kv.val.via.u64, 86'400'000));
            else if (k == "over_share" && over_share && kv.val.type == msgpack::type::BOOLEAN)
                *over_share = kv.val.via.boolean;
        }
        if (code && *code >= 1 && *code <= static_cast<int>(errc::permission_denied) &&
            !detail.empty())
            return static_cast<errc>(*code);
    }
    if (detail.empty()) {
        if (e.type == msgpack::type::STR) {
            detail.assign(e.via.str.ptr, e.via.str.size);
        } else if (e.type == msgpack::type::ARRAY && e.via.array.size == 2 &&
                   e.via.array.ptr[1].type == msgpack::type::STR) {
            detail.assign(e.via.array.ptr[1].via.str.ptr, e.via.array.ptr[1].via.str.size);
        } else {
            std::ostringstream text;
            text << e;
            detail = text.str();
        }
    }
    return errc::remote_error;
}

void encode_overloaded_response(buffer& out, std::uint32_t msgid, std::string_view text,
                                std::uint64_t retry_after_ms, bool over_share) {
    write_response_start(out, msgid);
    msgpack::packer<buffer> p(out);
    p.pack_map(over_share ? 4 : 3);
    p.pack_str(4).pack_str_body("code", 4).pack_int(static_cast<int>(errc::overloaded));
    p.pack_str(7).pack_str_body("message", 7);
    p.pack_str(static_cast<std::uint32_t>(text.size())).pack_str_body(text.data(), text.size());
    p.pack_str(14).pack_str_body("retry_after_ms", 14).pack_uint64(retry_after_ms);
    if (over_share) p.pack_str(10).pack_str_body("over_share", 10).pack_true();
    p.pack_nil();
}

namespace {

// A system_error as a handler's answer. std::system_error appends ": <code message>" to what();
// the code travels on its own, so that suffix is cut (`strip`), except from an rpc_error,
// whose what() is composed without it.
std::pair<errc, std::string> describe(const std::system_error& e, bool strip) {
    if (e.code().category() == error_category()) {
        std::string text = e.what();
        const std::string suffix = ": " + e.code().message();
        if (strip && text.size() > suffix.size() &&
            text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0)
            text.resize(text.size() - suffix.size());
        return {static_cast<errc>(e.code().value()), text};
    }
    if (e.code() == net::error::operation_aborted) return {errc::cancelled, "handler cancelled"};
    return {errc::remote_error, e.what()};
}

}  // namespace

std::pair<errc, std::string> describe_current_exception() {
    try {
        throw;
    } catch (const rpc_error& e) {
        // One from throw_error (no method, no peer) ends in the code's words, as system_error.
        return describe(e, e.method().empty() && e.peer().empty());
    } catch (const std::system_error& e) {
        return describe(e, true);
    } catch (const std::exception& e) {
        return {errc::remote_error, e.what()};
    } catch (...) {
        return {errc::remote_error, "unknown exception"};
    }
}

}  // namespace detail

}  // namespace ordo
