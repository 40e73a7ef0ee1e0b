// Call contexts: reading one from a request, the thread's current one, and passing a deadline
// on to the calls a handler makes (rpc/connection/context.hpp).
#include "rpc/connection/context.hpp"

#include <algorithm>

#include "ordo/error.hpp"
#include "ordo/limits.hpp"

#include "ordo/rpc/detail/message_heads.hpp"

namespace ordo {

std::chrono::milliseconds call_context::time_left() const noexcept {
    if (!has_deadline()) return std::chrono::milliseconds::max();
    const auto left = deadline - clock::now();
    if (left <= clock::duration::zero()) return std::chrono::milliseconds(0);
    // Rounded up: 0 means "passed", never "less than a millisecond left".
    return std::chrono::ceil<std::chrono::milliseconds>(left);
}

const std::string* call_context::find(std::string_view key) const noexcept {
    for (const auto& [k, v] : metadata)
        if (k == key) return &v;
    return nullptr;
}

const call_context* current_context() noexcept {
    return detail::this_thread_context;
}

namespace detail {

thread_local const call_context* this_thread_context = nullptr;

namespace {
std::string_view bytes_of(const msgpack::object& o) {
    return o.type == msgpack::type::STR ? std::string_view(o.via.str.ptr, o.via.str.size)
                                        : std::string_view(o.via.bin.ptr, o.via.bin.size);
}
}  // namespace

std::shared_ptr<const call_context> read_context(const message& m,
                                                 std::chrono::steady_clock::time_point arrived) {
    if (m.meta.type != msgpack::type::MAP) return nullptr;
    auto c = std::make_shared<call_context>();
    const auto& map = m.meta.via.map;
    c->metadata.reserve(map.size);
    for (std::uint32_t i = 0; i < map.size; ++i) {
        const auto& k = map.ptr[i].key;
        const auto& v = map.ptr[i].val;
        const std::string_view key(k.via.str.ptr, k.via.str.size);
        if (key == deadline_key) {
            if (v.type != msgpack::type::POSITIVE_INTEGER) continue;
            // Clamped to a day, as every other window on the wire: no overflow, and a caller
            // that says "forever" still has a deadline.
            const auto ms = std::min<std::uint64_t>(v.via.u64, 24ull * 3600 * 1000);
            c->deadline = arrived + std::chrono::milliseconds(static_cast<std::int64_t>(ms));
        } else if (!key.starts_with("ordo-")) {
            c->metadata.emplace_back(std::string(key), std::string(bytes_of(v)));
        }
    }
    return c;
}

bool inherit_deadline(pending_call& call) {
    const call_context* c = this_thread_context;
    if (!c || !c->has_deadline() || call.options.timeout.count() > 0) return true;
    const auto left = c->time_left();
    if (left.count() == 0) return false;
    call.options.timeout = left;
    return true;
}

std::string inherited_timeout_reason(const pending_call& call) {
    return "the deadline of the call whose handler made this call to \"" + call.method +
           "\" had passed";
}

void check_metadata(std::string_view method, const metadata& meta) {
    const limits l;
    const auto fail = [&](const std::string& why) {
        throw_error(errc::bad_arguments,
                    "the metadata of a call to \"" + std::string(method) + "\" " + why);
    };
    if (meta.size() > l.max_metadata_entries)
        fail("has " + std::to_string(meta.size()) + " pairs, over max_metadata_entries (" +
             std::to_string(l.max_metadata_entries) + ")");
    std::size_t bytes = 0;
    for (const auto& [k, v] : meta) {
        if (k.empty()) fail("has an empty key");
        if (k.starts_with("ordo-")) fail("has the key \"" + k + "\": \"ordo-\" keys are reserved");
        bytes += k.size() + v.size();
    }
    if (bytes > l.max_metadata_bytes)
        fail("holds " + std::to_string(bytes) + " bytes, over max_metadata_bytes (" +
             std::to_string(l.max_metadata_bytes) + ")");
}

void write_context_request(buffer& out, std::uint32_t msgid, std::string_view method,
                           std::string_view params, const metadata& meta,
                           std::chrono::milliseconds left, bool timed) {
    out.write("\x95\x00\xce", 3);
    put_be32(out, msgid);
    put_str(out, method);
    out.write(params.data(), params.size());
    msgpack::packer<buffer> p(out);
    p.pack_map(static_cast<std::uint32_t>(meta.size() + (timed ? 1 : 0)));
    if (timed) {
        put_str(out, deadline_key);
        p.pack_uint64(static_cast<std::uint64_t>(std::max<std::int64_t>(0, left.count())));
    }
    for (const auto& [k, v] : meta) {
        put_str(out, k);
        if (k.ends_with("-bin")) {
            p.pack_bin(static_cast<std::uint32_t>(v.size()));
            p.pack_bin_body(v.data(), v.size());
        } else {
            put_str(out, v);
        }
    }
}

}  // namespace detail
}  // namespace ordo
