// Fuzz target 1: the streaming decoder (framer + msgpack-rpc validation) fed arbitrary bytes in
// arbitrary chunks. The first byte picks the chunk sizes. Any outcome but a clean message or a
// protocol_error (a crash, another exception, a leak, a hang) is a finding. Then the whole input
// is decoded as one message twice: by the hand decoder of the envelope (what connections use,
// into a zone) and by the general way (decode_message without a zone); any difference between
// the two (one throws and the other not, other error text, another message) is a finding too,
// as is a message that the one-pass decoder of connections takes and the framer would not cut
// or would decode otherwise.
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ordo/rpc/codec.hpp"

namespace {
// Equal as msgpack: the same bytes when packed (operator== says a NaN differs from itself).
bool same(const msgpack::object& a, const msgpack::object& b) {
    msgpack::sbuffer x, y;
    msgpack::pack(x, a);
    msgpack::pack(y, b);
    return x.size() == y.size() && std::equal(x.data(), x.data() + x.size(), y.data());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::size_t step = 1 + data[0] % 64;  // 1..64-byte chunks, or one chunk when 64
    std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
    // Small limits, so that the fuzzer reaches every limit with short inputs.
    ordo::limits l;
    l.max_message_bytes = 4096;
    l.max_string_bytes = 1024;
    l.max_container_length = 64;
    l.max_depth = 8;
    l.max_objects = 256;
    std::string fast_error, general_error;
    msgpack::zone z;
    std::optional<ordo::message> fast, general;
    try {
        fast = ordo::decode_message(rest, l, z);
    } catch (const std::system_error& e) {
        if (e.code() != ordo::errc::protocol_error) __builtin_trap();
        fast_error = e.what();
    }
    try {
        general = ordo::decode_message(rest, l);
    } catch (const std::system_error& e) {
        if (e.code() != ordo::errc::protocol_error) __builtin_trap();
        general_error = e.what();
    }
    if (fast_error != general_error || fast.has_value() != general.has_value()) __builtin_trap();
    if (fast && (fast->kind != general->kind || fast->msgid != general->msgid ||
                 fast->method != general->method ||
                 !same(fast->handle.get(), general->handle.get())))
        __builtin_trap();
    // The one-pass decoder connections use first (detail::decode_prefix): whatever it takes
    // must be the first message the framer cuts, of that size, decoded alike.
    {
        ordo::detail::read_area pz;
        ordo::message pm;
        const std::size_t n = ordo::detail::decode_prefix(rest, l, pz, pm);
        if (n > 0) {
            ordo::decoder first(l);
            first.feed(rest.substr(0, n));
            std::optional<ordo::message> cut;
            try {
                cut = first.next();
            } catch (const std::system_error&) {
                __builtin_trap();  // taken, yet the framer's way refuses it
            }
            if (!cut || pm.kind != cut->kind || pm.msgid != cut->msgid ||
                pm.method != cut->method || !same(pm.params, cut->params) ||
                !same(pm.error, cut->error) || !same(pm.result, cut->result) ||
                !same(pm.meta, cut->meta))
                __builtin_trap();
        }
    }
    ordo::decoder d(l);
    try {
        while (!rest.empty()) {
            const std::size_t n = step == 64 ? rest.size() : std::min(step, rest.size());
            d.feed(rest.substr(0, n));
            rest.remove_prefix(n);
            while (auto m = d.next()) (void)m->method.size();
        }
        d.finish();
    } catch (const std::system_error& e) {
        if (e.code() != ordo::errc::protocol_error) __builtin_trap();
    }
    return 0;
}
