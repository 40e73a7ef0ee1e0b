// ordo as a client of neovim, a msgpack-rpc peer nobody on the team wrote: calls, its error
// objects, notifications, and requests it sends back. nvim runs as a child process (path in
// ORDO_NVIM), killed by PID.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

class nvim_process {
  public:
    explicit nvim_process(const std::string& listen)
        : path_(listen.starts_with("/") ? listen : "") {
        // nvim killed with SIGKILL leaves its socket file behind, and a later run whose pid
        // names the same path found it: nvim would not listen there, and connecting was refused.
        if (!path_.empty()) ::unlink(path_.c_str());
        const char* nvim = std::getenv("ORDO_NVIM");
        if (!nvim || ::access(nvim, X_OK) != 0)
            throw std::runtime_error(
                "neovim is required for the interop tests: apt-get install neovim (ORDO_NVIM)");
        pid_ = ::fork();
        if (pid_ == 0) {
            ::execl(nvim, nvim, "--headless", "--clean", "--listen", listen.c_str(), nullptr);
            std::_Exit(127);
        }
    }
    ~nvim_process() {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        if (!path_.empty()) ::unlink(path_.c_str());
    }

  private:
    std::string path_;  // a unix socket's file, removed before and after
    pid_t pid_;
};

// Connects, retrying while nvim starts (it creates its socket after a few ms).
net::awaitable<channel> connect_when_up(std::string url, const handlers* h) {
    net::steady_timer t(co_await net::this_coro::executor);
    for (int i = 0;; ++i) {
        try {
            const peer_options defaults;
            co_return co_await async_connect(url, defaults, h);
        } catch (const std::system_error&) {
            if (i >= 200) throw;
        }
        t.expires_after(50ms);
        co_await t.async_wait(use_tuple);
    }
}

// A port that was free a moment ago (nvim binds it right after).
std::uint16_t free_port() {
    net::io_context io;
    auto l = listen(io.get_executor(), "tcp://127.0.0.1:0");
    return parse_address(l->local_address()).port;
}

class Neovim : public ::testing::TestWithParam<std::string> {};

TEST_P(Neovim, CallsErrorsNotificationsAndRequestsBackAllWork) {
    std::string listen, url;
    if (GetParam() == "unix") {
        listen = "/tmp/ordo-nvim-" + std::to_string(::getpid()) + ".sock";
        url = "unix://" + listen;
    } else {
        listen = "127.0.0.1:" + std::to_string(free_port());
        url = "tcp://" + listen;
    }
    nvim_process nvim(listen);
    run_test([&]() -> net::awaitable<void> {
        handlers mine;
        int asked = 0;
        mine.on("client_double", [&](int x) {
            ++asked;
            return 2 * x;
        });
        auto ch = co_await connect_when_up(url, &mine);

        EXPECT_EQ(co_await ch.async_call<int>("nvim_eval", "1+1"), 2);

        value info = co_await ch.async_call("nvim_get_api_info");
        ORDO_CO_ASSERT_EQ(info.get().type, msgpack::type::ARRAY);
        ORDO_CO_ASSERT_EQ(info.get().via.array.size, 2u);
        const auto chan = info.get().via.array.ptr[0].as<std::int64_t>();
        EXPECT_GT(chan, 0);

        // neovim's errors are [type, message] arrays: surfaced as remote_error with the message.
        try {
            co_await ch.async_call<int>("nvim_eval", "no_such_variable");
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::remote_error);
            EXPECT_NE(e.detail().find("no_such_variable"), std::string::npos) << e.what();
        }

        // A notification, then a call: neovim handles them in that order.
        ch.notify("nvim_set_var", "ordo_answer", 42);
        EXPECT_EQ(co_await ch.async_call<int>("nvim_get_var", "ordo_answer"), 42);

        // neovim calls back into this client while our call is pending.
        const std::string c = std::to_string(chan);
        EXPECT_EQ(
            co_await ch.async_call<int>("nvim_eval", "rpcrequest(" + c + ", 'client_double', 21)"),
            42);
        EXPECT_EQ(asked, 1);
        try {
            co_await ch.async_call<int>("nvim_eval", "rpcrequest(" + c + ", 'client_unknown')");
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::remote_error);
            EXPECT_NE(e.detail().find("client_unknown"), std::string::npos) << e.what();
        }

        // Pipelined calls: neovim may answer out of order; ids match them.
        int ok = 0;
        for (int i = 0; i < 200; ++i)
            ch.async_call<int>("nvim_eval", std::to_string(i) + "*2",
                               [&, i](std::error_code ec, int v) { ok += !ec && v == 2 * i; });
        EXPECT_TRUE(co_await wait_until([&] { return ok == 200; }));
        EXPECT_TRUE(static_cast<peer&>(*ch.impl()).is_open());

        // A resumable session asked of a peer that knows nothing of it: neovim answers
        // ordo.hello with an error, and the channel goes on as a plain one.
        auto plain = co_await connect_when_up(url + "?resume_ms=5000", nullptr);
        plain.notify("nvim_set_var", "ordo_resumed", 7);
        EXPECT_EQ(co_await plain.async_call<int>("nvim_get_var", "ordo_resumed"), 7);
        EXPECT_FALSE(static_cast<peer&>(*plain.impl()).is_resumable());
    });
}

INSTANTIATE_TEST_SUITE_P(UnixAndTcp, Neovim, ::testing::Values("unix", "tcp"));

}  // namespace
}  // namespace ordo
