// ordo::make_file_source: the set a file lists, seen again when the file is edited in place,
// renamed into place or written where inotify cannot see it; garbage lines left out by line
// number; a missing, all-bad or oversized file keeps the last good set.
#include "ordo/fleet/sources.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "support/run_test.hpp"
#include "support/source_recorder.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

// A fresh directory under /tmp, removed with what it holds.
struct temp_dir {
    temp_dir() {
        char tmpl[] = "/tmp/ordo-file-source-XXXXXX";
        if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        path = tmpl;
    }
    ~temp_dir() { std::filesystem::remove_all(path); }
    std::string path;
};

// Writes `text` to `path` in place (truncate, write, close).
void write_in_place(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
}

// Writes `text` beside `path` and renames it over `path`, as editors and `mv` do.
void write_and_rename(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".new";
    write_in_place(tmp, text);
    std::filesystem::rename(tmp, path);
}

using test::recorder;

std::unique_ptr<replica_source> file_source(net::any_io_executor ex, const std::string& path,
                                            std::chrono::milliseconds poll = 60s,
                                            std::string suffix = "") {
    return make_file_source(ex, {.path = path, .url_suffix = std::move(suffix), .poll = poll});
}

TEST(FileSource, ListsTheFilesReplicasWithWeightsGroupsAndTheSuffix) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path,
                       "# the fleet\n"
                       "\n"
                       "tcp://127.0.0.3:7000 weight=2.5 group=canary   # trailing comment\n"
                       "  tcp://127.0.0.2:7000\r\n"
                       "\ttcp://[::1]:7001 group=b weight=3\n"
                       "tcp://127.0.0.4:7000?resume_ms=50\n");
        auto src = file_source(co_await net::this_coro::executor, path, 60s, "?resume_ms=9");
        EXPECT_EQ(src->describe(), "file:" + path);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !r.updates.empty(); }));
        // Sorted by URL; the suffix only where the line has no '?' of its own.
        const std::vector<member> want{
            {"tcp://127.0.0.2:7000?resume_ms=9", 1, ""},
            {"tcp://127.0.0.3:7000?resume_ms=9", 2.5, "canary"},
            {"tcp://127.0.0.4:7000?resume_ms=50", 1, ""},
            {"tcp://[::1]:7001?resume_ms=9", 3, "b"},
        };
        EXPECT_EQ(r.updates.back(), want);
        EXPECT_TRUE(r.problems.empty()) << r.problems.front();
        const auto c = src->counters();
        EXPECT_EQ(c.refreshes, 1u);
        EXPECT_EQ(c.failures, 0u);
        EXPECT_EQ(c.rejected, 0u);
        EXPECT_EQ(c.members, 4u);
    });
}

TEST(FileSource, SeesAnEditInPlaceThroughInotify) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        // A poll of a minute: only inotify can see the edit within the test's wait.
        auto src = file_source(co_await net::this_coro::executor, path, 60s);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        write_in_place(path, "tcp://127.0.0.2:7000\ntcp://127.0.0.3:7000\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }, 20s));
        EXPECT_EQ(r.urls(),
                  (std::vector<std::string>{"tcp://127.0.0.2:7000", "tcp://127.0.0.3:7000"}));
    });
}

TEST(FileSource, SeesARenameIntoPlaceThroughInotify) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        auto src = file_source(co_await net::this_coro::executor, path, 60s);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        write_and_rename(path, "tcp://127.0.0.5:7000 weight=4\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }, 20s));
        EXPECT_EQ(r.updates.back(), (std::vector<member>{{"tcp://127.0.0.5:7000", 4, ""}}));
        // The temporary file's own events are not the file's: one update, no problem.
        EXPECT_TRUE(r.problems.empty()) << r.problems.front();
    });
}

TEST(FileSource, SeesASymlinkSwapLikeAKubernetesConfigMapUpdate) {
    run_test([]() -> net::awaitable<void> {
        namespace fs = std::filesystem;
        temp_dir dir;
        // replicas.txt -> ..data/replicas.txt, ..data -> ..v1: an update writes ..v2 and
        // renames a new ..data link over the old one. The name "replicas.txt" sees no event.
        fs::create_directory(dir.path + "/..v1");
        write_in_place(dir.path + "/..v1/replicas.txt", "tcp://127.0.0.2:7000\n");
        fs::create_directory_symlink("..v1", dir.path + "/..data");
        fs::create_symlink("..data/replicas.txt", dir.path + "/replicas.txt");
        auto src = file_source(co_await net::this_coro::executor, dir.path + "/replicas.txt", 60s);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        fs::create_directory(dir.path + "/..v2");
        write_in_place(dir.path + "/..v2/replicas.txt", "tcp://127.0.0.7:7000\n");
        fs::create_directory_symlink("..v2", dir.path + "/..data_tmp");
        fs::rename(dir.path + "/..data_tmp", dir.path + "/..data");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }, 20s));
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tcp://127.0.0.7:7000"});
    });
}

TEST(FileSource, ThePollSeesAWriteThatInotifyOnTheDirectoryCannot) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        std::filesystem::create_directory(dir.path + "/watched");
        std::filesystem::create_directory(dir.path + "/elsewhere");
        const std::string path = dir.path + "/watched/replicas.txt";
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        // Written through a hard link in another directory: the watched directory gets no
        // event, so only the poll (inode, size, modification time) can see it.
        std::filesystem::create_hard_link(path, dir.path + "/elsewhere/link.txt");
        auto src = file_source(co_await net::this_coro::executor, path, 100ms);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        write_in_place(dir.path + "/elsewhere/link.txt", "tcp://127.0.0.6:7000\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }, 20s));
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tcp://127.0.0.6:7000"});
    });
}

TEST(FileSource, GarbageLinesAreReportedByLineNumberAndTheGoodLinesStay) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path,
                       "tcp://127.0.0.2:7000\n"               // 1
                       "not-a-url\n"                          // 2
                       "tcp://127.0.0.3:7000 weight=abc\n"    // 3
                       "tcp://127.0.0.3:7000 weight=0\n"      // 4
                       "tcp://127.0.0.3:7000 colour=red\n"    // 5
                       "gopher://127.0.0.3:70\n"              // 6
                       "tcp://127.0.0.3:0\n"                  // 7
                       "# fine\n"                             // 8
                       "tcp://127.0.0.2:7000 weight=2\n"      // 9
                       "tcp://127.0.0.4:7000 weight=1e308\n"  // 10
                       "tcp://127.0.0.5:7000 group=a group=b\n"  // 11
                       "tcp://127.0.0.3:7000 weight=0.5\n");  // 12
        auto src = file_source(co_await net::this_coro::executor, path);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !r.updates.empty(); }));
        EXPECT_EQ(r.updates.back(), (std::vector<member>{{"tcp://127.0.0.2:7000", 1, ""},
                                                         {"tcp://127.0.0.3:7000", 0.5, ""}}));
        for (const auto& p : r.problems) std::printf("problem: %s\n", p.c_str());
        const std::string at = "file:" + path + ":";
        EXPECT_TRUE(r.said(at + "2: invalid address \"not-a-url\""));
        EXPECT_TRUE(r.said(at + "3: bad weight \"abc\""));
        EXPECT_TRUE(r.said(at + "4: bad weight \"0\""));
        EXPECT_TRUE(r.said(at + "5: unknown attribute \"colour=red\""));
        EXPECT_TRUE(r.said(at + "6: invalid address \"gopher://127.0.0.3:70\": unknown scheme"));
        EXPECT_TRUE(r.said(at + "7: \"tcp://127.0.0.3:0\" has port 0"));
        EXPECT_TRUE(r.said(at + "9: \"tcp://127.0.0.2:7000\" is already listed on line 1"));
        EXPECT_TRUE(r.said(at + "10: bad weight \"1e308\""));
        EXPECT_TRUE(r.said(at + "11: group given twice"));
        EXPECT_FALSE(r.said(at + "8:"));
        EXPECT_FALSE(r.said(at + "12:"));
        const auto c = src->counters();
        EXPECT_EQ(c.rejected, 9u);
        EXPECT_EQ(r.problems.size(), 9u);
        EXPECT_EQ(c.refreshes, 1u);
        EXPECT_EQ(c.failures, 0u);
        EXPECT_EQ(c.members, 2u);
    });
}

// A file cannot weaken its route: entries name tcp:// or tls:// hosts only, tls:// under a TLS
// route, and never a TLS parameter of their own (verify=none above all); the route's apply.
TEST(FileSource, EntriesThatWouldWeakenTheRouteAreLeftOutAndReported) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path,
                       "tls://127.0.0.2:7443\n"                        // 1
                       "unix:///run/app.sock\n"                        // 2
                       "inproc://inside\n"                             // 3
                       "tls://127.0.0.3:7443?verify=none\n"            // 4
                       "tls://127.0.0.4:7443?ca=/tmp/mine.pem\n"       // 5
                       "tcp://127.0.0.5:7000\n"                        // 6
                       "tls://127.0.0.6:7443?handshake_timeout_ms=50\n");  // 7
        auto src = file_source(co_await net::this_coro::executor, path, 60s,
                               "?ca=/etc/ca.pem&server_name=api");
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !r.updates.empty(); }));
        EXPECT_EQ(r.updates.back(),
                  (std::vector<member>{
                      {"tls://127.0.0.2:7443?ca=/etc/ca.pem&server_name=api", 1, ""},
                      {"tls://127.0.0.6:7443?ca=/etc/ca.pem&server_name=api&handshake_timeout_ms=50",
                       1, ""}}));
        for (const auto& p : r.problems) std::printf("problem: %s\n", p.c_str());
        const std::string at = "file:" + path + ":";
        EXPECT_TRUE(r.said(at + "2: \"unix:///run/app.sock\": a fleet entry must be tcp:// or "
                                "tls://, not unix://"));
        EXPECT_TRUE(r.said(at + "3: \"inproc://inside\": a fleet entry must be"));
        EXPECT_TRUE(r.said(at + "4: \"tls://127.0.0.3:7443?verify=none\": a fleet entry cannot "
                                "set verify="));
        EXPECT_TRUE(r.said(at + "5: \"tls://127.0.0.4:7443?ca=/tmp/mine.pem\": a fleet entry "
                                "cannot set ca="));
        EXPECT_TRUE(r.said(at + "6: \"tcp://127.0.0.5:7000\": the route is TLS"));
        EXPECT_EQ(src->counters().rejected, 5u);
    });
}

TEST(FileSource, AMissingFileKeepsTheLastGoodSetUntilItIsBack) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        auto src = file_source(co_await net::this_coro::executor, path, 200ms);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        std::filesystem::remove(path);
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return src->counters().failures == 1; }, 20s));
        EXPECT_TRUE(r.said("file:" + path + ": cannot open: No such file or directory"))
            << r.problems.back();
        EXPECT_EQ(r.updates.size(), 1u);  // no update: the router keeps the last set
        EXPECT_EQ(src->counters().members, 1u);
        write_and_rename(path, "tcp://127.0.0.2:7000\ntcp://127.0.0.3:7000\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 2; }, 20s));
        EXPECT_EQ(r.updates.back().size(), 2u);
        EXPECT_EQ(src->counters().failures, 1u);  // one failure per change seen, not per poll
    });
}

TEST(FileSource, AMissingFileAtStartIsAFailureWithNoUpdate) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/absent.txt";
        auto src = file_source(co_await net::this_coro::executor, path, 100ms);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return src->counters().failures == 1; }));
        EXPECT_TRUE(r.said("file:" + path + ": cannot open"));
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }, 20s));
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tcp://127.0.0.2:7000"});
    });
}

TEST(FileSource, AnAllBadOrEmptyFileIsAFailureThatKeepsTheLastSet) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        auto src = file_source(co_await net::this_coro::executor, path, 60s);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        write_and_rename(path, "garbage\nmore garbage\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return src->counters().failures == 1; }, 20s));
        EXPECT_TRUE(r.said("file:" + path + ": no usable replica (2 line(s) left out)"));
        EXPECT_EQ(src->counters().rejected, 2u);
        write_and_rename(path, "# nothing here\n\n");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return src->counters().failures == 2; }, 20s));
        EXPECT_TRUE(r.said("file:" + path + ": lists no replica"));
        EXPECT_EQ(r.updates.size(), 1u);
        EXPECT_EQ(src->counters().members, 1u);
    });
}

TEST(FileSource, AnOversizedFileIsRefusedWhole) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        auto src = file_source(co_await net::this_coro::executor, path, 60s);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        // Over 1 MiB, every line good.
        std::string big;
        for (int i = 0; big.size() <= (1 << 20); ++i)
            big += "tcp://127.0.0.3:" + std::to_string(1000 + i % 60000) + "  " +
                   std::string(200, ' ') + "# padding\n";
        write_and_rename(path, big);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return src->counters().failures == 1; }, 20s));
        EXPECT_TRUE(r.said("bytes, over the limit of 1 MiB")) << r.problems.back();
        // Over 10,000 lines, under 1 MiB.
        std::string many = "tcp://127.0.0.3:7000\n";
        for (int i = 0; i < 10'000; ++i) many += "#\n";
        write_and_rename(path, many);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return src->counters().failures == 2; }, 20s));
        EXPECT_TRUE(r.said("file:" + path + ": has more than 10000 lines")) << r.problems.back();
        EXPECT_EQ(r.updates.size(), 1u);
        EXPECT_EQ(r.urls(), std::vector<std::string>{"tcp://127.0.0.2:7000"});
    });
}

TEST(FileSource, NoCallbackRunsAfterStop) {
    run_test([]() -> net::awaitable<void> {
        temp_dir dir;
        const std::string path = dir.path + "/replicas.txt";
        write_in_place(path, "tcp://127.0.0.2:7000\n");
        auto src = file_source(co_await net::this_coro::executor, path, 50ms);
        recorder r;
        r.start(*src);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.updates.size() == 1; }));
        src->stop();
        write_and_rename(path, "tcp://127.0.0.3:7000\n");
        std::filesystem::remove(path);
        co_await test::sleep_for(1s);  // 20 polls, and the inotify events, had they been watched
        EXPECT_EQ(r.updates.size(), 1u);
        EXPECT_TRUE(r.problems.empty());
        src.reset();  // handlers still queued find the state stopped
        co_await test::sleep_for(100ms);
    });
}

TEST(FileSource, BadOptionsAreRefusedAtCreation) {
    net::io_context io;
    file_source_options o;
    EXPECT_THROW(make_file_source(io.get_executor(), o), std::system_error);  // no path
    o.path = "/tmp/x";
    o.poll = 0ms;
    EXPECT_THROW(make_file_source(io.get_executor(), o), std::system_error);
}

}  // namespace
}  // namespace ordo
