// The main of the test programs that hold several test files (tests/meson.build). `--file=PATH`
// (PATH under tests/, as meson's test() names it) runs only the tests that PATH defines, each
// file in a process of its own as if it were its own program; without it every test runs.
// --gtest_filter still narrows what runs.
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace test_main {

// gtest's filter language: patterns with * and ?, ':' between them, '-' before the negative ones.
bool glob(std::string_view pattern, std::string_view name) {
    if (pattern.empty()) return name.empty();
    if (pattern[0] == '*')
        return glob(pattern.substr(1), name) || (!name.empty() && glob(pattern, name.substr(1)));
    return !name.empty() && (pattern[0] == '?' || pattern[0] == name[0]) &&
           glob(pattern.substr(1), name.substr(1));
}

bool any_matches(std::string_view patterns, std::string_view name) {
    while (true) {
        const auto colon = patterns.find(':');
        if (glob(patterns.substr(0, colon), name)) return true;
        if (colon == std::string_view::npos) return false;
        patterns.remove_prefix(colon + 1);
    }
}

bool filter_passes(std::string_view filter, std::string_view name) {
    const auto dash = filter.find('-');
    const auto positive = filter.substr(0, dash);
    if (!positive.empty() && !any_matches(positive, name)) return false;
    return dash == std::string_view::npos || !any_matches(filter.substr(dash + 1), name);
}

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace test_main

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    std::string file;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], "--file=", 7) == 0) {
            file = argv[i] + 7;
            continue;
        }
        std::fprintf(stderr, "test_main: unknown argument %s (--file=PATH, gtest's flags)\n",
                     argv[i]);
        return 2;
    }
    if (file.empty()) return RUN_ALL_TESTS();

    // The file's tests, as an explicit list: gtest's filter has no "and" of two filters.
    const std::string tail = "tests/" + file;
    const std::string given = ::testing::GTEST_FLAG(filter);
    std::string chosen;
    int in_file = 0;
    const auto& unit = *::testing::UnitTest::GetInstance();
    for (int s = 0; s < unit.total_test_suite_count(); ++s) {
        const auto& suite = *unit.GetTestSuite(s);
        for (int t = 0; t < suite.total_test_count(); ++t) {
            const auto& info = *suite.GetTestInfo(t);
            if (!test_main::ends_with(info.file(), tail)) continue;
            ++in_file;
            const std::string name = std::string(suite.name()) + "." + info.name();
            if (!test_main::filter_passes(given, name)) continue;
            chosen += (chosen.empty() ? "" : ":") + name;
        }
    }
    if (in_file == 0) {
        std::fprintf(stderr, "test_main: this program holds no test from %s\n", tail.c_str());
        return 2;
    }
    // Nothing chosen runs nothing (a filter that leaves this file's tests out), as gtest would.
    ::testing::GTEST_FLAG(filter) = chosen.empty() ? "-*" : chosen;
    return RUN_ALL_TESTS();
}
