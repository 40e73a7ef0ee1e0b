// What a replica source has told a test: every set it gave and every problem it reported
// (each problem is also printed, so that a failing test's log shows them).
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "ordo/fleet/sources.hpp"

namespace ordo::test {

struct recorder {
    std::vector<std::vector<member>> updates;
    std::vector<std::string> problems;
    void start(replica_source& s) {
        s.start([this](std::vector<member> m) { updates.push_back(std::move(m)); },
                [this](const std::string& p) {
                    std::printf("problem: %s\n", p.c_str());
                    problems.push_back(p);
                });
    }
    // The URLs of the last set.
    std::vector<std::string> urls() const {
        std::vector<std::string> out;
        if (!updates.empty())
            for (const auto& m : updates.back()) out.push_back(m.url);
        return out;
    }
    bool has(const std::string& url) const {
        const auto u = urls();
        return std::find(u.begin(), u.end(), url) != u.end();
    }
    // Whether a problem mentioned `part`.
    bool said(const std::string& part) const {
        return std::any_of(problems.begin(), problems.end(),
                           [&](const std::string& p) { return p.find(part) != std::string::npos; });
    }
};

}  // namespace ordo::test
