// A call site on <ordo/client.hpp> alone: this translation unit never sees <msgpack.hpp>. What it
// packs and converts must be what the whole of msgpack-c would make of the same values (a more
// specialised adaptor left out would change the bytes silently: std::vector<unsigned char> as an
// array of ints instead of bin), and the typed call path compiles here.
#include "ordo/client.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

// <msgpack.hpp> brings its unpacker and every adaptor, the map's among them.
#if defined(MSGPACK_UNPACK_HPP) || defined(MSGPACK_TYPE_MAP_HPP)
#error "this test must not see <msgpack.hpp>"
#endif

namespace ordo {
namespace {

template <class... Args>
std::string packed(const Args&... args) {
    auto b = detail::pack_params(args...);
    return std::string(b.data(), b.size());
}

std::string bytes(std::initializer_list<unsigned> v) {
    std::string s;
    for (unsigned c : v) s.push_back(static_cast<char>(c));
    return s;
}

// The expected bytes are msgpack's, as <msgpack.hpp> packs them (the msgpack specification).
TEST(ClientHeader, ValuesPackAsTheWholeOfMsgpackPacksThem) {
    EXPECT_EQ(packed(std::vector<unsigned char>{1, 2}), bytes({0x91, 0xc4, 2, 1, 2}));  // bin
    EXPECT_EQ(packed(std::vector<char>{'a', 'b'}), bytes({0x91, 0xc4, 2, 'a', 'b'}));   // bin
    EXPECT_EQ(packed(std::vector<bool>{true, false}), bytes({0x91, 0x92, 0xc3, 0xc2}));
    EXPECT_EQ(packed(std::vector<int>{1, -1}), bytes({0x91, 0x92, 0x01, 0xff}));
    EXPECT_EQ(packed("hi"), bytes({0x91, 0xa2, 'h', 'i'}));  // a string literal is a str
    EXPECT_EQ(packed(std::string_view("hi"), std::string("hi")),
              bytes({0x92, 0xa2, 'h', 'i', 0xa2, 'h', 'i'}));
    EXPECT_EQ(
        packed(std::uint64_t{1} << 40, 1.5, msgpack::type::nil_t()),
        bytes({0x93, 0xcf, 0, 0, 1, 0, 0, 0, 0, 0, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xc0}));
}

TEST(ClientHeader, ABinResultConvertsToAByteVector) {
    msgpack::object o;
    o.type = msgpack::type::BIN;
    o.via.bin.size = 2;
    o.via.bin.ptr = "\x01\x02";
    EXPECT_EQ(o.as<std::vector<unsigned char>>(), (std::vector<unsigned char>{1, 2}));
    EXPECT_EQ(o.as<std::vector<char>>(), (std::vector<char>{1, 2}));
}

struct counter : interface {
    method<int(int)> inc{"inc"};
    method<std::vector<unsigned char>(std::vector<unsigned char>)> echo{"echo"};
};

// The typed call path instantiates here; a method outside a stub says so.
TEST(ClientHeader, AMethodOutsideAStubSaysItIsNotBound) {
    counter c;
    try {
        auto a = c.inc(1);
        ADD_FAILURE() << "called";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::bad_address);
        EXPECT_NE(std::string(e.what()).find("not bound"), std::string::npos) << e.what();
    }
    EXPECT_THROW(c.echo.notify({1, 2}), rpc_error);
}

}  // namespace
}  // namespace ordo
