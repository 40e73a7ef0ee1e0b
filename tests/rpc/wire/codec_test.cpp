#include "ordo/rpc/codec.hpp"

#include "ordo/rpc/detail/message_heads.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace ordo {
namespace {

std::string bytes_of(const buffer& b) {
    return {b.data(), b.size()};
}

template <class T>
std::string packed(const T& v) {
    buffer b;
    msgpack::pack(b, v);
    return bytes_of(b);
}

TEST(Codec, RequestRoundTrips) {
    buffer b;
    encode_request(b, 42, "inc", 1, std::string("x"));
    auto m = decode_message(bytes_of(b));
    EXPECT_EQ(m.kind, message_kind::request);
    EXPECT_EQ(m.msgid, 42u);
    EXPECT_EQ(m.method, "inc");
    auto params = m.params.as<std::tuple<int, std::string>>();
    EXPECT_EQ(std::get<0>(params), 1);
    EXPECT_EQ(std::get<1>(params), "x");
}

TEST(Codec, ResponseAndErrorResponseRoundTrip) {
    buffer b;
    encode_response(b, 0xffffffffu, std::vector<int>{1, 2});
    auto ok = decode_message(bytes_of(b));
    EXPECT_EQ(ok.kind, message_kind::response);
    EXPECT_EQ(ok.msgid, 0xffffffffu);
    EXPECT_TRUE(ok.error.is_nil());
    EXPECT_EQ(ok.result.as<std::vector<int>>(), (std::vector<int>{1, 2}));

    buffer e;
    encode_error_response(e, 7, errc::method_not_found, "no method \"dec\"");
    auto err = decode_message(bytes_of(e));
    EXPECT_EQ(err.msgid, 7u);
    auto map = err.error.as<std::map<std::string, msgpack::object>>();
    EXPECT_EQ(map.at("code").as<int>(), static_cast<int>(errc::method_not_found));
    EXPECT_EQ(map.at("message").as<std::string>(), "no method \"dec\"");
    EXPECT_TRUE(err.result.is_nil());
}

TEST(Codec, NotificationRoundTrips) {
    buffer b;
    encode_notification(b, "add", 5);
    auto m = decode_message(bytes_of(b));
    EXPECT_EQ(m.kind, message_kind::notification);
    EXPECT_EQ(m.method, "add");
    EXPECT_EQ(m.params.via.array.size, 1u);
}

TEST(Codec, MethodSentAsBinIsAccepted) {
    buffer b;
    msgpack::packer<buffer> p(b);
    p.pack_array(4).pack(0).pack(1);
    p.pack_bin(3).pack_bin_body("inc", 3);
    p.pack_array(0);
    auto m = decode_message(bytes_of(b));
    EXPECT_EQ(m.method, "inc");
}

void expect_bad(const std::string& bytes, const std::string& words) {
    try {
        decode_message(bytes);
        ADD_FAILURE() << "no error; expected one mentioning \"" << words << "\"";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::protocol_error);
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
}

TEST(Codec, EachMalformedMessageSaysWhatIsWrong) {
    using msgpack::type::nil_t;
    expect_bad(packed(std::map<int, int>{{1, 2}}), "not an array (got map)");
    expect_bad(packed(5), "not an array (got positive int)");
    expect_bad(packed(std::make_tuple(0, 1, "inc")), "request has 3 elements, expected 4");
    expect_bad(packed(std::make_tuple(1, 1, nil_t())), "response has 3 elements, expected 4");
    expect_bad(packed(std::make_tuple(2, "x", std::vector<int>{}, 1)),
               "notification has 4 elements, expected 3");
    expect_bad(packed(std::make_tuple(0)), "message has 1 elements");
    expect_bad(packed(std::make_tuple(3, 1, "inc", std::vector<int>{})), "unknown message kind");
    expect_bad(packed(std::make_tuple("0", 1, "inc", std::vector<int>{})), "unknown message kind");
    expect_bad(packed(std::make_tuple(0, -1, "inc", std::vector<int>{})), "msgid is not a uint32");
    expect_bad(packed(std::make_tuple(0, std::uint64_t(1) << 32, "inc", std::vector<int>{})),
               "msgid is not a uint32");
    expect_bad(packed(std::make_tuple(0, "1", "inc", std::vector<int>{})), "msgid is not a uint32");
    expect_bad(packed(std::make_tuple(0, 1, 5, std::vector<int>{})), "method is not a string");
    expect_bad(packed(std::make_tuple(0, 1, "inc", 5)), "params of \"inc\" is not an array");
    expect_bad(packed(std::make_tuple(2, "add", nil_t())), "params of \"add\" is not an array");
}

// docs/protocol.md, "Call context": [0, msgid, method, params, meta], meta a map of str keys to
// str or bin values (an unsigned value for reserved "ordo-" keys), within the limits.
TEST(Codec, ARequestWithAContextDecodesAndABadContextSaysWhatIsWrong) {
    using msgpack::type::nil_t;
    using pairs = std::map<std::string, std::string>;
    const std::vector<int> none;
    for (bool borrowed : {false, true}) {
        const std::string bytes =
            packed(std::make_tuple(0, 9, "inc", std::vector<int>{1}, pairs{{"tenant", "acme"}}));
        msgpack::zone z;
        auto m = borrowed ? decode_message(bytes, limits{}, z) : decode_message(bytes);
        EXPECT_EQ(m.kind, message_kind::request);
        EXPECT_EQ(m.msgid, 9u);
        EXPECT_EQ(m.method, "inc");
        ASSERT_EQ(m.meta.type, msgpack::type::MAP);
        EXPECT_EQ(m.meta.as<pairs>(), (pairs{{"tenant", "acme"}}));
        own(m);
        EXPECT_EQ(m.meta.as<pairs>(), (pairs{{"tenant", "acme"}}));
    }
    EXPECT_EQ(decode_message(packed(std::make_tuple(0, 1, "inc", none))).meta.type,
              msgpack::type::NIL);
    expect_bad(packed(std::make_tuple(0, 1, "inc", none, 5)),
               "the context of a call to \"inc\" is not a map");
    expect_bad(packed(std::make_tuple(0, 1, "inc", none, std::map<int, std::string>{{1, "x"}})),
               "has a key that is not a non-empty str");
    expect_bad(packed(std::make_tuple(0, 1, "inc", none, std::map<std::string, int>{{"k", 1}})),
               "has a value for \"k\" that is not a str or bin");
    // A reserved key may hold a number; ordinary keys may not.
    EXPECT_NO_THROW(decode_message(packed(
        std::make_tuple(0, 1, "inc", none, std::map<std::string, int>{{"ordo-deadline-ms", 5}}))));
    expect_bad(packed(std::make_tuple(2, "add", none, pairs{})),
               "notification has 4 elements, expected 3");
    limits l;
    l.max_metadata_entries = 2;
    l.max_metadata_bytes = 10;
    const auto expect_over = [&](const pairs& meta, const std::string& what) {
        try {
            decode_message(packed(std::make_tuple(0, 1, "inc", none, meta)), l);
            ADD_FAILURE() << "no error for " << what;
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::protocol_error);
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    expect_over({{"a", "1"}, {"b", "2"}, {"c", "3"}}, "over max_metadata_entries");
    expect_over({{"key", "0123456789"}}, "over max_metadata_bytes");
}

TEST(Codec, DecodeMessageEnforcesLimitsOnItsOwn) {
    limits l;
    l.max_message_bytes = 16;
    buffer b;
    encode_request(b, 1, "inc", std::string(100, 'x'));
    try {
        decode_message(bytes_of(b), l);
        ADD_FAILURE() << "no error";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::protocol_error);
    }
}

TEST(Codec, StreamingDecoderYieldsMessagesInOrderAcrossEverySplit) {
    buffer b;
    for (std::uint32_t i = 0; i < 20; ++i) {
        if (i % 3 == 0)
            encode_notification(b, "note", i);
        else if (i % 3 == 1)
            encode_request(b, i, "call", i, std::string(i * 7, 'p'));
        else
            encode_response(b, i, i);
    }
    const std::string stream = bytes_of(b);
    for (std::size_t split = 0; split <= stream.size(); ++split) {
        decoder d;
        std::vector<std::uint32_t> seen;
        auto take = [&] {
            while (auto m = d.next()) {
                if (m->kind == message_kind::notification)
                    seen.push_back(m->params.via.array.ptr[0].as<std::uint32_t>());
                else
                    seen.push_back(m->msgid);
            }
        };
        d.feed(std::string_view(stream).substr(0, split));
        take();
        d.feed(std::string_view(stream).substr(split));
        take();
        d.finish();
        ASSERT_EQ(seen.size(), 20u) << "split " << split;
        for (std::uint32_t i = 0; i < 20; ++i) ASSERT_EQ(seen[i], i) << "split " << split;
    }
}

TEST(Codec, StreamingDecoderReportsTruncationAtEnd) {
    buffer b;
    encode_request(b, 1, "inc", 1);
    decoder d;
    d.feed(std::string_view(b.data(), b.size() - 1));
    EXPECT_FALSE(d.next().has_value());
    try {
        d.finish();
        ADD_FAILURE() << "no error";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::protocol_error);
        EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos);
    }
}

TEST(Codec, StreamingDecoderRejectsA4GiBStringAtOnce) {
    decoder d;
    EXPECT_THROW(
        {
            d.feed(std::string("\x94\x00\x01\xdb\xff\xff\xff\xff", 8));
            d.next();
        },
        std::system_error);
}

// request_head writes the common head (a fixstr method that fits inline) in place; its bytes
// must be write_request_head's, for every method length on both sides of the inline limit and
// msgids in every byte.
TEST(Codec, RequestHeadInPlaceIsTheGeneralEncodersBytes) {
    struct bytes {
        std::string s;
        void write(const char* p, std::size_t n) { s.append(p, n); }
    };
    for (std::size_t len = 0; len <= 300; len += len < 48 ? 1 : 50) {
        const std::string method(len, 'm');
        for (std::uint32_t id : {0u, 1u, 0x7fu, 0x80u, 0xffu, 0x100u, 0x12345678u, 0xffffffffu}) {
            bytes want;
            detail::write_request_head(want, id, method);
            EXPECT_EQ(std::string_view(detail::request_head(id, method)), want.s)
                << "method length " << len << ", msgid " << id;
        }
    }
}

}  // namespace
}  // namespace ordo

namespace ordo {
namespace {

// ordo decodes with a reader of its own (rpc/wire/codec.cpp); msgpack-c's unpack is the reference.
// Every msgpack type and every length form, in params of a notification, must decode to the
// same msgpack::object both ways, owned and borrowed.
TEST(Codec, OwnReaderMatchesMsgpackUnpackForEveryTypeAndLengthForm) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> p(b);
    p.pack_array(3).pack_uint8(2).pack_str(1).pack_str_body("m", 1);
    const std::string s31(31, 'a'), s200(200, 'b'), s70k(70000, 'c');
    std::vector<char> bin300(300, 'x');
    p.pack_array(33);
    p.pack_nil().pack_true().pack_false();
    p.pack(0).pack(127).pack(128).pack(255).pack(256).pack(65535).pack(65536);
    p.pack(std::uint64_t{1} << 40).pack(std::numeric_limits<std::uint64_t>::max());
    p.pack(-1).pack(-32).pack(-33).pack(-128).pack(-129).pack(-40000).pack(
        -(std::int64_t{1} << 40));
    p.pack(std::numeric_limits<std::int64_t>::min());
    p.pack(1.5f).pack(-2.25);
    p.pack(std::string()).pack(s31).pack(s200).pack(s70k);
    p.pack(bin300);
    p.pack_ext(1, 7).pack_ext_body("\x01", 1);
    p.pack_ext(16, 3).pack_ext_body("0123456789abcdef", 16);
    p.pack_ext(3, 2).pack_ext_body("xyz", 3);
    p.pack_array(0);
    p.pack_array(20);
    for (int i = 0; i < 20; ++i) p.pack_map(1).pack(i).pack_array(1).pack_nil();
    p.pack_map(0);
    const std::string_view bytes(b.data(), b.size());

    msgpack::object_handle reference = msgpack::unpack(b.data(), b.size());
    const message owned = decode_message(bytes);
    EXPECT_FALSE(owned.borrowed);
    EXPECT_EQ(owned.handle.get(), reference.get());
    msgpack::zone z;
    message borrowed = decode_message(bytes, limits{}, z);
    EXPECT_TRUE(borrowed.borrowed);
    EXPECT_EQ(borrowed.handle.get(), reference.get());
    EXPECT_EQ(borrowed.method, "m");
    // Borrowed strings point into the input; own() copies them out.
    EXPECT_GE(borrowed.params.via.array.ptr[25].via.str.ptr, b.data());
    EXPECT_LT(borrowed.params.via.array.ptr[25].via.str.ptr, b.data() + b.size());
    own(borrowed);
    EXPECT_FALSE(borrowed.borrowed);
    EXPECT_EQ(borrowed.handle.get(), reference.get());
    const char* copied = borrowed.params.via.array.ptr[25].via.str.ptr;
    EXPECT_TRUE(copied < b.data() || copied >= b.data() + b.size());
    EXPECT_EQ(borrowed.method, "m");
}

// Cut anywhere, or with a reserved byte, or with a length past the input: a protocol error,
// never a crash or an allocation of what the header claims.
TEST(Codec, OwnReaderRefusesEveryTruncationAndLyingLengths) {
    msgpack::sbuffer b;
    encode_request(b, 7, "method", std::string(100, 's'), std::vector<int>{1, 2, 3},
                   std::map<std::string, double>{{"k", 1.0}});
    for (std::size_t cut = 0; cut < b.size(); ++cut) {
        msgpack::zone z;
        try {
            (void)decode_message(std::string_view(b.data(), cut), limits{}, z);
            ADD_FAILURE() << "a message cut at " << cut << " of " << b.size() << " decoded";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::protocol_error) << cut;
        }
    }
    const std::string cases[] = {
        std::string("\x93\x02\xa1m\x91\xc1", 6),                   // reserved 0xc1
        std::string("\x93\x02\xa1m\x91\xdd\xff\xff\xff\xff", 10),  // array of 2^32-1, no items
        std::string("\x93\x02\xa1m\x91\xdb\x7f\xff\xff\xff", 10),  // str of 2 GiB, no bytes
        std::string("\x93\x02\xa1m\x91\xdf\x00\x10\x00\x00", 10),  // map of 1 Mi pairs, none
        std::string("\x93\x02\xa1m\x90\xc0", 6),                   // a byte after the message
    };
    for (std::size_t i = 0; i < std::size(cases); ++i) {
        msgpack::zone z;
        EXPECT_THROW((void)decode_message(cases[i], limits{}, z), std::system_error) << i;
        EXPECT_THROW((void)decode_message(cases[i]), std::system_error) << i;
    }
    limits small;
    small.max_depth = 3;
    std::string deep = "\x93\x02\xa1m\x91\x91\x91\x90";  // params nest to depth 5
    msgpack::zone z;
    EXPECT_THROW((void)decode_message(deep, small, z), std::system_error);
}

// What connections decode in one pass (detail::decode_prefix): the message at the start of the
// bytes, its size, and fields that own() makes a copy of.
TEST(Codec, OnePassDecodeTakesTheFirstMessageAndOwnCopiesIt) {
    buffer b;
    encode_request(b, 70000, "inc", 41, std::string("x"));
    const std::size_t first = b.size();
    encode_notification(b, "add", 5);
    const std::string bytes = bytes_of(b);
    detail::read_area z;
    message m;
    ASSERT_EQ(detail::decode_prefix(bytes, limits{}, z, m), first);
    EXPECT_EQ(m.kind, message_kind::request);
    EXPECT_EQ(m.msgid, 70000u);
    EXPECT_EQ(m.method, "inc");
    own(m);
    EXPECT_FALSE(m.borrowed);
    EXPECT_EQ(m.method, "inc");
    EXPECT_EQ(m.msgid, 70000u);
    EXPECT_EQ((m.params.as<std::tuple<int, std::string>>()), std::make_tuple(41, std::string("x")));
    EXPECT_EQ(m.handle.get(), decode_message(bytes.substr(0, first)).handle.get());
    // Cut short anywhere, or over a limit, it is left to the framer.
    detail::read_area z2;
    for (std::size_t n = 0; n < first; ++n) {
        message part;
        EXPECT_EQ(detail::decode_prefix(std::string_view(bytes).substr(0, n), limits{}, z2, part),
                  0u)
            << n;
    }
    limits small;
    small.max_string_bytes = 2;
    message over;
    EXPECT_EQ(detail::decode_prefix(bytes, small, z2, over), 0u);
}

// Whether the general decoder takes `bytes` under `l`.
bool general_accepts(const std::string& bytes, const limits& l) {
    try {
        (void)decode_message(bytes, l);
        return true;
    } catch (const std::system_error&) {
        return false;
    }
}

// decode_prefix declines `bytes` cut short anywhere. Each cut is a block of exactly its size:
// under AddressSanitizer, a read past the cut is reported.
void expect_each_cut_declined(const std::string& bytes, detail::read_area& z) {
    for (std::size_t n = 0; n < bytes.size(); ++n) {
        const auto cut = std::make_unique<char[]>(n);
        std::copy_n(bytes.data(), n, cut.get());
        message part;
        ASSERT_EQ(detail::decode_prefix(std::string_view(cut.get(), n), limits{}, z, part), 0u)
            << bytes.size() << " cut at " << n;
    }
}

// A successful response with a small int, str or bin result is read by the envelope decoder
// itself: the same message as the general decoder gives, declined when cut short anywhere or
// over max_string_bytes; other results take the general reader.
TEST(Codec, OnePassDecodeOfACommonResultMatchesTheGeneralDecoder) {
    std::vector<std::pair<std::uint32_t, std::string>> results;
    // Each result after a msgid of each width: fixint, uint 8, uint 16, uint 32.
    auto add = [&](auto v) {
        for (std::uint32_t id : {5u, 200u, 300u, 70000u}) {
            buffer b;
            encode_response(b, id, v);
            results.emplace_back(id, bytes_of(b));
        }
    };
    add(0);
    add(127);
    add(128);
    add(-1);
    for (std::size_t n : {0, 1, 16, 31, 32, 255, 256}) add(std::string(n, 's'));
    for (std::size_t n : {0, 16, 255, 256}) add(std::vector<char>(n, 'b'));
    add(std::vector<int>{1, 2});
    for (const auto& [id, bytes] : results) {
        const std::string two = bytes + bytes;
        detail::read_area z;
        message m;
        ASSERT_EQ(detail::decode_prefix(two, limits{}, z, m), bytes.size()) << bytes.size();
        const message general = decode_message(bytes);
        EXPECT_EQ(m.kind, message_kind::response);
        EXPECT_EQ(m.msgid, id);
        EXPECT_TRUE(m.error.is_nil());
        EXPECT_EQ(m.result, general.result) << bytes.size();
        own(m);
        EXPECT_EQ(m.handle.get(), general.handle.get());
        expect_each_cut_declined(bytes, z);
        limits small;
        small.max_string_bytes = 15;
        message over;
        const std::size_t taken = detail::decode_prefix(bytes, small, z, over);
        const bool long_bytes =
            (general.result.type == msgpack::type::STR && general.result.via.str.size > 15) ||
            (general.result.type == msgpack::type::BIN && general.result.via.bin.size > 15);
        EXPECT_EQ(taken, long_bytes ? 0u : bytes.size()) << bytes.size();
    }
}

// A request or notification whose params are a fixarray of flat values (fixints, fixstr or
// str 8, nil, bools) is read by the envelope decoder itself, its params put in the read area
// rather than a zone: the same message as the general decoder gives, declined when cut short
// anywhere, and under tighter limits taken only when the general decoder accepts it. Other
// params take the general reader, with the same result.
TEST(Codec, OnePassDecodeOfACommonCallMatchesTheGeneralDecoder) {
    struct sample {
        std::string bytes;
        bool flat;  // params the envelope decoder reads itself
    };
    std::vector<sample> samples;
    auto add = [&](bool flat, const auto&... args) {
        for (std::uint32_t id : {5u, 200u, 300u, 70000u}) {
            buffer b;
            encode_request(b, id, "inc", args...);
            samples.push_back({bytes_of(b), flat});
        }
        buffer b;
        encode_notification(b, std::string(40, 'n'), args...);  // a str 8 method
        samples.push_back({bytes_of(b), flat});
    };
    add(true);
    add(true, 0, 127, -1, -32);
    add(true, std::string(), std::string(16, 's'), std::string(31, 's'));
    add(true, std::string(32, 's'), std::string(255, 's'));
    add(true, msgpack::type::nil_t(), true, false);
    add(true, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);  // a full fixarray
    // uint 8, 16, 32, 64; int 8, 16, 32, 64; float 32, 64; bin 8.
    add(true, 128, 65535, 70000u, std::uint64_t(1) << 40, std::uint64_t(-1));
    add(true, -33, -129, -40000, std::int64_t(-1) << 40, std::numeric_limits<std::int64_t>::min());
    add(true, 1.5f, -2.25, 1e300);
    add(true, std::vector<char>(), std::vector<char>(4, 'b'), std::vector<char>(255, 'b'));
    add(false, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);  // array 16
    add(false, std::string(256, 's'));
    add(false, std::vector<char>(256, 'b'));
    add(false, std::vector<int>{1});
    add(false, 1, std::map<int, int>{{1, 2}});
    add(false, msgpack::type::ext(5, "e", 1));
    // Positive values sent as int 8, 16, 32, 64 (msgpack-c sends them as uints).
    using namespace std::string_literals;
    samples.push_back(
        {"\x93\x02\xa1m\x94\xd0\x05\xd1\x01\x00\xd2\x00\x01\x00\x00"
         "\xd3\x00\x00\x00\x01\x00\x00\x00\x00"s,
         true});
    for (const auto& [bytes, flat] : samples) {
        const std::string two = bytes + bytes;
        detail::read_area z;
        message m;
        ASSERT_EQ(detail::decode_prefix(two, limits{}, z, m), bytes.size()) << bytes.size();
        const message general = decode_message(bytes);
        EXPECT_EQ(m.kind, general.kind);
        EXPECT_EQ(m.msgid, general.msgid);
        EXPECT_EQ(m.method, general.method);
        EXPECT_EQ(m.params, general.params) << bytes.size();
        EXPECT_EQ(flat && m.params.via.array.size > 0, m.params.via.array.ptr == z.items)
            << bytes.size();
        own(m);
        EXPECT_EQ(m.handle.get(), general.handle.get());
        expect_each_cut_declined(bytes, z);
        // Each limit at the message's own need, and one short of it.
        const std::size_t objects =
            4 + (general.kind == message_kind::request ? 1 : 0) + general.params.via.array.size;
        std::vector<limits> tight(8);
        tight[0].max_string_bytes = 31;
        tight[1].max_string_bytes = 40;
        tight[2].max_objects = objects;
        tight[3].max_objects = objects - 1;
        tight[4].max_container_length = std::max<std::size_t>(4, general.params.via.array.size);
        tight[5].max_container_length = 3;
        tight[6].max_message_bytes = bytes.size();
        tight[7].max_message_bytes = bytes.size() - 1;
        for (std::size_t i = 0; i < tight.size(); ++i) {
            const bool accepted = general_accepts(bytes, tight[i]);
            // Taken only when the general decoder accepts it; and taken at the message's
            // own need (the even cases) unless that is below what any message needs (a
            // message of four objects under max_objects 4: left to the general way).
            message under;
            const std::size_t taken = detail::decode_prefix(bytes, tight[i], z, under);
            const bool must = accepted && i % 2 == 0 && !(i == 2 && objects < 5);
            EXPECT_TRUE(taken == 0 || (accepted && taken == bytes.size()))
                << bytes.size() << " under limits " << i;
            if (must) {
                EXPECT_EQ(taken, bytes.size()) << bytes.size() << " under limits " << i;
            }
        }
    }
}

// A request with its context (docs/protocol.md, "Call context") in the common shape, a fixmap
// of str keys to str, bin or (for an "ordo-" key) uint values, is read by the envelope decoder
// itself, its pairs put in the read area: the same message as the general decoder gives,
// declined when cut short anywhere, and under tighter limits taken only when the general decoder
// accepts it. Other maps take the general way, which reads them or says what is wrong.
TEST(Codec, OnePassDecodeOfACallWithItsContextMatchesTheGeneralDecoder) {
    using kv = std::pair<std::string, msgpack::object>;
    struct sample {
        std::string bytes;
        bool fast;  // the envelope decoder reads it itself
        bool valid;
    };
    std::vector<sample> samples;
    msgpack::zone keep;
    const auto str = [&](const std::string& v) { return msgpack::object(v, keep); };
    // Packs [0, id, "look", [1, "a"], {pairs...}].
    const auto add = [&](bool fast, bool valid, const std::vector<kv>& pairs) {
        for (std::uint32_t id : {5u, 70000u}) {
            buffer b;
            msgpack::packer<buffer> p(b);
            p.pack_array(5);
            p.pack(0);
            p.pack(id);
            p.pack(std::string_view("look"));
            p.pack_array(2);
            p.pack(1);
            p.pack(std::string_view("a"));
            p.pack_map(static_cast<std::uint32_t>(pairs.size()));
            for (const auto& [k, v] : pairs) {
                p.pack(k);
                p.pack(v);
            }
            samples.push_back({bytes_of(b), fast, valid});
        }
    };
    const std::string tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const std::vector<char> blob{'\0', '\x01', '\xff'};
    add(true, true, {});
    add(true, true, {{"traceparent", str(tp)}});
    add(true, true, {{"ordo-deadline-ms", msgpack::object(250)}, {"tenant", str("acme")}});
    for (std::uint64_t ms : {0ull, 127ull, 128ull, 65535ull, 70000ull, 1ull << 40})
        add(true, true, {{"ordo-deadline-ms", msgpack::object(ms)}, {"traceparent", str(tp)}});
    add(true, true, {{"blob-bin", msgpack::object(blob, keep)}, {"k", str(std::string(255, 'v'))}});
    std::vector<kv> fifteen;
    for (int i = 0; i < 15; ++i) fifteen.emplace_back("k" + std::to_string(i), str("v"));
    add(true, true, fifteen);
    std::vector<kv> sixteen = fifteen;
    sixteen.emplace_back("k15", str("v"));
    add(false, true, sixteen);                              // a map 16
    add(false, true, {{"k", str(std::string(256, 'v'))}});  // a str 16 value
    add(false, false, {{"k", msgpack::object(5)}});         // a number for a user key
    add(false, false, {{"", str("v")}});                    // an empty key
    add(false, false, {{"k", msgpack::object(-1)}});        // a negative number
    add(false, false, {{"ordo-deadline-ms", msgpack::object(-5)}});
    for (const auto& [bytes, fast, valid] : samples) {
        const std::string two = bytes + bytes;
        detail::read_area z;
        message m;
        bool general_ok = true;
        message general;
        try {
            general = decode_message(bytes);
        } catch (const std::system_error&) {
            general_ok = false;
        }
        ASSERT_EQ(general_ok, valid) << bytes.size();
        const std::size_t taken = detail::decode_prefix(two, limits{}, z, m);
        if (!valid) {
            EXPECT_EQ(taken, 0u) << bytes.size();  // the framer's general way says what is wrong
            continue;
        }
        ASSERT_EQ(taken, bytes.size()) << bytes.size();
        EXPECT_EQ(m.kind, message_kind::request);
        EXPECT_EQ(m.msgid, general.msgid);
        EXPECT_EQ(m.method, general.method);
        EXPECT_EQ(m.params, general.params);
        EXPECT_EQ(m.meta, general.meta) << bytes.size();
        EXPECT_EQ(fast && m.meta.via.map.size > 0, m.meta.via.map.ptr == z.pairs) << bytes.size();
        own(m);
        EXPECT_EQ(m.handle.get(), general.handle.get());
        expect_each_cut_declined(bytes, z);
        // Each limit at the message's own need, and one short of it.
        const std::size_t pairs = general.meta.via.map.size;
        std::size_t meta_bytes = 0;
        for (std::uint32_t i = 0; i < pairs; ++i) {
            const auto& e = general.meta.via.map.ptr[i];
            meta_bytes += e.key.via.str.size;
            if (e.val.type == msgpack::type::STR) meta_bytes += e.val.via.str.size;
            if (e.val.type == msgpack::type::BIN) meta_bytes += e.val.via.bin.size;
        }
        const std::size_t objects = 5 + 2 + 1 + 2 * pairs;
        std::vector<limits> tight(8);
        tight[0].max_metadata_entries = pairs;
        tight[1].max_metadata_entries = pairs - 1;
        tight[2].max_metadata_bytes = meta_bytes;
        tight[3].max_metadata_bytes = meta_bytes - 1;
        tight[4].max_objects = objects;
        tight[5].max_objects = objects - 1;
        tight[6].max_message_bytes = bytes.size();
        tight[7].max_message_bytes = bytes.size() - 1;
        for (std::size_t i = 0; i < tight.size(); ++i) {
            if ((i == 1 && pairs == 0) || (i == 3 && meta_bytes == 0)) continue;
            const bool accepted = general_accepts(bytes, tight[i]);
            message under;
            const std::size_t got = detail::decode_prefix(bytes, tight[i], z, under);
            EXPECT_TRUE(got == 0 || (accepted && got == bytes.size()))
                << bytes.size() << " under limits " << i;
            if (accepted && i % 2 == 0 && fast) {
                EXPECT_EQ(got, bytes.size()) << bytes.size() << " under limits " << i;
            }
        }
    }
}

}  // namespace
}  // namespace ordo
