#include "comm/framing.hpp"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

template <class T>
std::string packed(const T& v) {
    msgpack::sbuffer b;
    msgpack::pack(b, v);
    return {b.data(), b.size()};
}

// A stream exercising every token shape: fix and sized ints, floats, strings of each width,
// bin, ext and fixext, nested arrays and maps, empty containers.
std::vector<std::string> sample_objects() {
    std::vector<std::string> out;
    auto add = [&](const auto& v) {
        msgpack::sbuffer b;
        msgpack::pack(b, v);
        out.emplace_back(b.data(), b.size());
    };
    add(1);
    add(-1);
    add(-200);
    add(70000);
    add(-70000);
    add(std::uint64_t(1) << 40);
    add(std::int64_t(-1) << 40);
    add(1.5f);
    add(2.5);
    add(std::string(5, 'a'));
    add(std::string(40, 'b'));
    add(std::string(300, 'c'));
    add(std::string(70000, 'd'));
    add(std::vector<int>{});
    add(std::vector<int>(20, 7));
    add(std::vector<int>(70000, 1));
    add(std::map<std::string, std::vector<int>>{{"x", {1, 2}}, {"y", {}}});
    add(std::vector<std::vector<std::string>>{{"a", "b"}, {}, {"c"}});
    add(msgpack::type::nil_t());
    add(true);
    add(std::vector<char>(10, 'z'));                                 // bin 8
    for (std::size_t n : {1u, 2u, 4u, 8u, 16u, 3u, 300u, 70000u}) {  // fixext and ext 8/16/32
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_ext(n, 5);
        std::string body(n, 'e');
        p.pack_ext_body(body.data(), body.size());
        out.emplace_back(b.data(), b.size());
    }
    return out;
}

std::string concat(const std::vector<std::string>& parts) {
    std::string s;
    for (const auto& p : parts) s += p;
    return s;
}

std::vector<std::string> drain(framer& f) {
    std::vector<std::string> got;
    while (auto m = f.next()) got.emplace_back(*m);
    return got;
}

TEST(Framer, EverySplitPointOfASampleStreamYieldsTheSameObjects) {
    // Small objects only, so that trying every split point stays quick.
    std::vector<std::string> objects;
    for (auto& o : sample_objects())
        if (o.size() < 400) objects.push_back(o);
    const std::string stream = concat(objects);
    for (std::size_t split = 0; split <= stream.size(); ++split) {
        framer f;
        f.feed(std::string_view(stream).substr(0, split));
        auto got = drain(f);
        f.feed(std::string_view(stream).substr(split));
        auto rest = drain(f);
        got.insert(got.end(), rest.begin(), rest.end());
        ASSERT_EQ(got, objects) << "split at " << split;
        f.finish();
    }
}

TEST(Framer, OneByteAtATimeYieldsTheSameObjects) {
    const auto objects = sample_objects();
    const std::string stream = concat(objects);
    framer f;
    std::vector<std::string> got;
    for (char ch : stream) {
        f.feed(std::string_view(&ch, 1));
        auto more = drain(f);
        got.insert(got.end(), more.begin(), more.end());
    }
    EXPECT_EQ(got, objects);
    EXPECT_EQ(f.buffered(), 0u);
}

TEST(Framer, WholeStreamInOneChunkYieldsTheSameObjects) {
    const auto objects = sample_objects();
    framer f;
    f.feed(concat(objects));
    EXPECT_EQ(drain(f), objects);
}

void expect_protocol_error(framer& f, std::string_view bytes, const std::string& words) {
    try {
        f.feed(bytes);
        drain(f);
        f.finish();
        ADD_FAILURE() << "no error; expected one mentioning \"" << words << "\"";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::protocol_error);
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
}

TEST(Framer, A4GiBStringHeaderFailsAtOnceWithoutAllocating) {
    framer f;
    expect_protocol_error(f, std::string("\xdb\xff\xff\xff\xff", 5), "max_string_bytes");
    EXPECT_LE(f.buffered(), 5u);
}

TEST(Framer, StringHeaderWithinStringLimitButOverMessageLimitFailsAtOnce) {
    limits l;
    l.max_message_bytes = 1000;
    framer f(l);
    expect_protocol_error(f, std::string("\x91\xda\x10\x00", 4), "max_message_bytes");
}

TEST(Framer, A4GiBArrayHeaderFailsAtOnce) {
    framer f;
    expect_protocol_error(f, std::string("\xdd\xff\xff\xff\xff", 5), "max_container_length");
    framer g;
    expect_protocol_error(g, std::string("\xdf\xff\xff\xff\xff", 5), "max_container_length");
}

TEST(Framer, ContainerAnnouncingMoreEntriesThanTheMessageCanHoldFailsAtOnce) {
    limits l;
    l.max_message_bytes = 100;
    framer f(l);
    expect_protocol_error(f, std::string("\xdc\x01\x00", 3), "more entries");
}

TEST(Framer, HundredThousandDeepNestingFailsFastAtMaxDepth) {
    framer f;
    const std::string deep(100000, '\x91');  // [[[[...
    expect_protocol_error(f, deep, "max_depth");
    EXPECT_LE(f.buffered(), deep.size());
}

TEST(Framer, DeepEmptyContainerBeyondMaxDepthFails) {
    limits l;
    l.max_depth = 2;
    framer f(l);
    expect_protocol_error(f, std::string("\x91\x91\x90", 3), "max_depth");
    framer ok(l);
    ok.feed(std::string("\x91\x90", 2));
    EXPECT_TRUE(ok.next().has_value());
}

TEST(Framer, TooManyObjectsInOneMessageFails) {
    limits l;
    l.max_objects = 10;
    framer f(l);
    expect_protocol_error(f, packed(std::vector<int>(20, 1)), "max_objects");
}

TEST(Framer, InvalidTypeByteFails) {
    framer f;
    expect_protocol_error(f, std::string("\x92\x01\xc1", 3), "0xc1");
}

TEST(Framer, TruncatedMessageAtEndOfStreamFails) {
    framer f;
    expect_protocol_error(f, std::string("\x93\x01\x02", 3), "truncated");
}

TEST(Framer, MessageOverMaxMessageBytesFailsEvenWhenMadeOfSmallPieces) {
    limits l;
    l.max_message_bytes = 64;
    framer f(l);
    std::string big("\xdc\x00\x64", 3);  // array of 100 entries
    big += std::string(100, '\x01');
    expect_protocol_error(f, big, "max_message_bytes");
}

TEST(Framer, LargeMessageInManyChunksIsScannedOnceAndYieldedWhole) {
    const std::string big = packed(std::string(8 << 20, 'q'));
    framer f;
    std::size_t at = 0, yielded = 0;
    while (at < big.size()) {
        auto n = std::min<std::size_t>(65536, big.size() - at);
        auto area = f.prepare(n);
        std::copy_n(big.data() + at, n, area.data());
        f.commit(n);
        at += n;
        while (auto m = f.next()) {
            EXPECT_EQ(m->size(), big.size());
            ++yielded;
        }
    }
    EXPECT_EQ(yielded, 1u);
    EXPECT_EQ(f.buffered(), 0u);
}

// A large bin read the way the connection reads (read_area, then as many bytes as a read may
// bring): the buffer grows toward the message's size, at most 4x what it holds at a step, so a
// 24 MiB message costs a few growths (doubling from 64 KiB would take nine) that copy little of
// it, and the reads take up to all the message still needs rather than 64 KiB at a time.
TEST(Framer, ReadAreaGrowsTowardALargeMessageInFewStepsAndNeverOnAHeaderAlone) {
    while (take_spare(0, SIZE_MAX).capacity() > 0) {
    }  // no spare buffer of another test's size: each growth is the rule's own
    std::string msg;
    {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(2);
        p.pack(7);
        const std::string payload(24 << 20, 'z');
        p.pack_bin(static_cast<std::uint32_t>(payload.size()));
        p.pack_bin_body(payload.data(), payload.size());
        msg.assign(b.data(), b.size());
    }
    framer f;
    std::size_t at = 0, growths = 0, largest_read = 0, copied = 0;
    std::size_t cap = f.capacity();
    int yielded = 0;
    while (at < msg.size()) {
        const std::size_t held = f.buffered();
        auto area = f.read_area(65536);
        if (f.capacity() != cap) {
            ++growths;
            copied += held;  // a growth copies what the buffer holds
            // Never more than 4x what was held (or one read's worth on the first bytes).
            EXPECT_LE(f.capacity(), std::max<std::size_t>(4 * held, 2 * cap + 65536));
            cap = f.capacity();
        }
        // A socket brings at most a few MiB at a time.
        const std::size_t n = std::min({area.size(), msg.size() - at, std::size_t{3} << 20});
        largest_read = std::max(largest_read, n);
        std::copy_n(msg.data() + at, n, area.data());
        f.commit(n);
        at += n;
        while (auto m = f.next()) {
            EXPECT_EQ(*m, msg);
            ++yielded;
        }
    }
    EXPECT_EQ(yielded, 1);
    EXPECT_LE(growths, 6u);
    // The steps are the message's size over powers of 4: the last growth is from a quarter of
    // it, and all the growths together copy less than 40% of it (8.4 MB here; 4x steps from
    // what arrived copied 12.9 MB).
    EXPECT_LT(copied * 5, msg.size() * 2);
    EXPECT_GT(largest_read, std::size_t{1} << 20);
    EXPECT_LE(f.capacity(), msg.size() + 65536);  // sized from the header, not doubled past it

    // A header alone (a bin of 100 MiB announced, nothing of it sent) allocates nothing large.
    limits l;
    l.max_message_bytes = l.max_string_bytes = 128 << 20;
    framer g(l);
    std::string head = "\x92\x07\xc6";
    const std::uint32_t n = 100u << 20;
    head += char(n >> 24);
    head += char(n >> 16);
    head += char(n >> 8);
    head += char(n);
    g.feed(head);
    EXPECT_FALSE(g.next());
    auto area = g.read_area(65536);
    EXPECT_LE(g.capacity(), std::size_t{1} << 20);
    EXPECT_GE(area.size(), 65536u);
}

// A read buffer lent to a keeper (keep_delivered) is the keeper's once the delivery settles,
// and comes back when the keeper lets it go: the next message of that size is read into it at
// once, with no growth that copies.
TEST(Framer, ALentBufferGoesToItsKeeperAndComesBackForTheNextLargeMessage) {
    std::size_t c = 0;
    while (take_given_back_block(0, SIZE_MAX, c)) {
    }  // what the tests before gave back
    std::string msg = "\x92\x07\xc6";
    const std::uint32_t size = 8u << 20;
    for (int shift : {24, 16, 8, 0}) msg += char(size >> shift);
    msg.append(size, 'k');
    framer f;
    // Reads as the connection does, until the message is whole; the growths it took.
    auto read_whole = [&](std::size_t& growths) -> std::string_view {
        std::size_t at = 0, cap = f.capacity();
        for (;;) {
            auto area = f.read_area(65536);
            if (f.capacity() != cap) ++growths, cap = f.capacity();
            const std::size_t n = std::min({area.size(), msg.size() - at, std::size_t{1} << 20});
            std::copy_n(msg.data() + at, n, area.data());
            f.commit(n);
            at += n;
            if (auto m = f.next()) return *m;
        }
    };
    std::size_t first = 0;
    const std::string_view m = read_whole(first);
    EXPECT_EQ(f.lend(m.substr(0, 1000)), nullptr) << "a small part takes no buffer";
    auto kept = f.lend(m);
    ASSERT_TRUE(kept);
    EXPECT_EQ(f.lend(m), kept);
    f.settle();
    EXPECT_EQ(f.capacity(), 0u) << "the buffer went to its keeper";
    EXPECT_EQ(m, msg) << "the kept bytes are where they were";
    const char* where = m.data();
    kept.reset();  // given back
    std::size_t second = 0;
    const std::string_view again = read_whole(second);
    EXPECT_EQ(again, msg);
    EXPECT_EQ(again.data(), where) << "read into the buffer given back";
    EXPECT_LE(second, 2u) << "after " << first << " growths the first time";
    EXPECT_LT(second, first);

    // What follows the part lent (a small message, and part of a third) goes on in the new
    // buffer, where its scan left off.
    framer g;
    const std::string small = "\x92\x01\x02", third = "\x93\x01\xa3" "abc\x04";
    g.feed(msg + small + third.substr(0, 4));
    const auto big = g.next();
    ASSERT_TRUE(big);
    auto k = g.lend(*big);
    ASSERT_TRUE(k);
    EXPECT_EQ(g.next(), std::optional<std::string_view>(small));
    EXPECT_FALSE(g.next());
    g.settle();
    EXPECT_EQ(*big, msg);
    EXPECT_EQ(g.buffered(), 4u);
    g.feed(third.substr(4));
    EXPECT_EQ(g.next(), std::optional<std::string_view>(third));
}

// The thread's spare buffers: a large buffer given back is taken again (no new mapping to
// fault in), the smallest that fits first; small ones and too many are not kept.
TEST(SpareBuffers, ALargeBufferGivenBackIsTakenAgainWithinTheBounds) {
    while (take_spare(0, SIZE_MAX).capacity() > 0) {
    }  // what the tests before left on this thread
    byte_buffer a;
    a.reserve(spare_min_bytes);
    const char* pa = a.data();
    byte_buffer b;
    b.reserve(2 * spare_min_bytes);
    const char* pb = b.data();
    keep_spare(std::move(b));
    keep_spare(std::move(a));
    byte_buffer t = take_spare(spare_min_bytes, 4 * spare_min_bytes);
    EXPECT_EQ(t.data(), pa);  // the smallest that fits
    EXPECT_EQ(t.size(), 0u);
    byte_buffer u = take_spare(spare_min_bytes + 1, spare_min_bytes + 2);
    EXPECT_EQ(u.capacity(), 0u);  // none within [want, most]
    byte_buffer v = take_spare(spare_min_bytes + 1, 4 * spare_min_bytes);
    EXPECT_EQ(v.data(), pb);
    byte_buffer small;
    small.reserve(spare_min_bytes - 1);
    keep_spare(std::move(small));
    EXPECT_EQ(take_spare(1, spare_min_bytes).capacity(), 0u);  // too small to keep
    // At most 8: a ninth drops the oldest.
    std::vector<const char*> kept;
    for (int i = 0; i < 9; ++i) {
        byte_buffer x;
        x.reserve(std::size_t{8} << 20);
        kept.push_back(x.data());
        keep_spare(std::move(x));
    }
    int found = 0;
    for (int i = 0; i < 9; ++i) {
        byte_buffer x = take_spare(std::size_t{8} << 20, std::size_t{8} << 20);
        if (x.capacity() == 0) break;
        EXPECT_NE(x.data(), kept[0]);
        ++found;
    }
    EXPECT_EQ(found, 8);
    // At most 65 MiB a buffer, 130 MiB together (the bytes are never touched: no memory used).
    byte_buffer huge;
    huge.reserve(std::size_t{66} << 20);
    keep_spare(std::move(huge));
    EXPECT_EQ(take_spare(0, SIZE_MAX).capacity(), 0u);
    for (int i = 0; i < 3; ++i) {
        byte_buffer x;
        x.reserve(std::size_t{60} << 20);
        keep_spare(std::move(x));
    }
    EXPECT_GT(take_spare(0, SIZE_MAX).capacity(), 0u);
    EXPECT_GT(take_spare(0, SIZE_MAX).capacity(), 0u);
    EXPECT_EQ(take_spare(0, SIZE_MAX).capacity(), 0u);
}

// A random msgpack object: nested arrays and maps of ints, strings and nils.
void random_object(std::mt19937& rng, msgpack::packer<msgpack::sbuffer>& p, int depth) {
    switch (depth > 6 ? rng() % 3 : rng() % 5) {
        case 0: p.pack(int(rng() % 300) - 100); break;
        case 1: p.pack(std::string(rng() % 40, 's')); break;
        case 2: p.pack_nil(); break;
        case 3: {
            const unsigned n = rng() % 5;
            p.pack_array(n);
            for (unsigned i = 0; i < n; ++i) random_object(rng, p, depth + 1);
            break;
        }
        default: {
            const unsigned n = rng() % 3;
            p.pack_map(n);
            for (unsigned i = 0; i < 2 * n; ++i) random_object(rng, p, depth + 1);
        }
    }
}

// What a framer yields for `stream` fed in pieces of `chunk` bytes (0: all at once): the
// objects, then the error if one was raised.
std::vector<std::string> outcome(const std::string& stream, const limits& l, std::size_t chunk) {
    framer f(l);
    std::vector<std::string> got;
    try {
        for (std::size_t at = 0; at < stream.size();) {
            const std::size_t n = chunk == 0 ? stream.size() : std::min(chunk, stream.size() - at);
            f.feed(std::string_view(stream).substr(at, n));
            at += n;
            while (auto m = f.next()) got.emplace_back(*m);
        }
        f.finish();
    } catch (const std::system_error& e) {
        // Without the figures in parentheses: "message longer than max_message_bytes" reports
        // the bytes buffered so far, which depend on how the stream was cut.
        const std::string what = e.what();
        got.push_back("error: " + what.substr(0, what.find(" (")));
    }
    return got;
}

// Whole messages take the one-pass path; pieces take the incremental scan. With small random
// limits (so that every limit is hit at every position), both must cut the same messages and
// raise the same errors at the same points.
TEST(Framer, TheWholeMessagePathAndTheIncrementalScanAgreeUnderRandomLimits) {
    std::mt19937 rng(11);
    int errors = 0;
    for (int round = 0; round < 3000; ++round) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        for (int m = 0; m < 4; ++m) random_object(rng, p, 1);
        std::string stream(b.data(), b.size());
        if (round % 10 == 0) stream.push_back('\xc1');  // an invalid byte after them
        if (round % 10 == 1) stream.pop_back();          // truncated
        limits l;
        l.max_depth = 1 + rng() % 8;
        l.max_objects = 1 + rng() % 60;
        l.max_container_length = rng() % 6;
        l.max_string_bytes = rng() % 45;
        l.max_message_bytes = 8 + rng() % 300;
        const auto whole = outcome(stream, l, 0);
        EXPECT_EQ(whole, outcome(stream, l, 1)) << "round " << round;
        EXPECT_EQ(whole, outcome(stream, l, 1 + rng() % 20)) << "round " << round;
        if (!whole.empty() && whole.back().rfind("error: ", 0) == 0) ++errors;
    }
    // The limits must bite in many rounds and let messages through in others.
    EXPECT_GT(errors, 300);
    EXPECT_LT(errors, 2900);
}

}  // namespace
}  // namespace ordo::detail
