// decode_prefix on a message that a read cut: declined (0) as a return value, with no exception
// thrown on the way (an exception per cut message cost time and made instruction counts jump
// between runs). The process's exceptions are counted by wrapping __cxa_throw, so this test is
// built without sanitizers, whose runtimes wrap it too.
#include <dlfcn.h>

#include <atomic>
#include <cxxabi.h>
#include <string>
#include <typeinfo>

#include <gtest/gtest.h>

#include "ordo/rpc/codec.hpp"

namespace {
std::atomic<long> thrown{0};
}

// Defined where <cxxabi.h> declares it (a C function of namespace __cxxabiv1).
namespace __cxxabiv1 {
extern "C" void __cxa_throw(void* e, std::type_info* t, void (*destroy)(void*)) {
    thrown.fetch_add(1, std::memory_order_relaxed);
    using real_fn = void (*)(void*, std::type_info*, void (*)(void*));
    static const auto real = reinterpret_cast<real_fn>(dlsym(RTLD_NEXT, "__cxa_throw"));
    real(e, t, destroy);
    __builtin_unreachable();
}
}  // namespace __cxxabiv1

namespace ordo {
namespace {

// Messages of the shapes the one-pass readers leave to the general one: a long str, nested
// containers, a response with a map, a request with a context of long values.
std::vector<std::string> general_messages() {
    std::vector<std::string> out;
    auto done = [&](const msgpack::sbuffer& b) { out.emplace_back(b.data(), b.size()); };
    {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(4);
        p.pack(0);
        p.pack(7);
        p.pack(std::string("echo"));
        p.pack_array(1);
        p.pack(std::string(100'000, 'x'));
        done(b);
    }
    {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(3);
        p.pack(2);
        p.pack(std::string("note"));
        p.pack_array(2);
        p.pack_map(2);
        p.pack(std::string("a"));
        p.pack_array(3);
        p.pack(1);
        p.pack(2.5);
        p.pack(std::string(300, 'y'));
        p.pack(std::string("b"));
        p.pack_map(0);
        p.pack_bin(70'000);
        p.pack_bin_body(std::string(70'000, 'z').data(), 70'000);
        done(b);
    }
    {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(4);
        p.pack(1);
        p.pack(9);
        p.pack_nil();
        p.pack_map(1);
        p.pack(std::string("k"));
        p.pack(std::string(5000, 'v'));
        done(b);
    }
    {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(5);
        p.pack(0);
        p.pack(3);
        p.pack(std::string("ctx"));
        p.pack_array(1);
        p.pack(std::string(400, 'p'));
        p.pack_map(1);
        p.pack(std::string("key"));
        p.pack(std::string(1000, 'q'));
        done(b);
    }
    return out;
}

TEST(DecodePrefix, AMessageCutByAReadIsDeclinedWithoutAnException) {
    const auto messages = general_messages();
    detail::read_area a;
    for (std::size_t k = 0; k < messages.size(); ++k) {
        const std::string& whole = messages[k];
        {
            message m;
            EXPECT_EQ(detail::decode_prefix(whole, limits{}, a, m), whole.size()) << k;
        }
        const long before = thrown.load();
        // Every cut for the small ones; for the large ones, cuts every 997 bytes and near the
        // ends.
        for (std::size_t n = 1; n < whole.size(); n += (whole.size() < 20'000 || n < 64 ||
                                                        n > whole.size() - 64)
                                                           ? 1
                                                           : 997) {
            message m;
            ASSERT_EQ(detail::decode_prefix(std::string_view(whole).substr(0, n), limits{}, a, m),
                      0u)
                << "message " << k << " cut at " << n;
        }
        EXPECT_EQ(thrown.load(), before) << "message " << k << ": exceptions thrown for cuts";
    }
    // The hook counts what is thrown: a broken limit still throws (and is declined).
    const long before = thrown.load();
    limits small;
    small.max_string_bytes = 10;
    message m;
    EXPECT_EQ(detail::decode_prefix(messages[0], small, a, m), 0u);
    EXPECT_GT(thrown.load(), before);
}

}  // namespace
}  // namespace ordo
