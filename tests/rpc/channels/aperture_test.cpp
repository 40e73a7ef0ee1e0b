// least_loaded's adaptive aperture (rpc/channels/aperture.hpp) on a simulated clock: calls are
// sent and answered at made-up times, so what the aperture decides depends on the model of the
// replicas and a seed, never on how busy the machine is. router_test.cpp checks that a router
// feeds it and routes by it.
#include "rpc/channels/aperture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace ordo::detail {
namespace {

using namespace std::chrono_literals;
using clock_type = aperture::clock_type;
using duration = clock_type::duration;

struct fake_router final : aperture::host {
    std::size_t replicas = 3;
    std::vector<std::string> events;
    std::size_t usable() const override { return replicas; }
    void event(const std::string& line) override { events.push_back(line); }
};

// What a call costs when `size` replicas take calls, as the `n`th call made (from 0).
using cost_model = std::function<duration(std::size_t size, long n)>;

// Keeps `width` calls in flight for `calls` calls in all: each answer sends the next call at
// once. Each call's time is the model's, times a factor drawn uniformly from 1 +- `noise`.
struct simulation {
    fake_router router;
    clock_type::time_point t0 = clock_type::time_point{} + 1h;
    aperture ap{router, t0};
    std::mt19937 random;
    double noise;

    simulation(unsigned seed, double noise) : random(seed), noise(noise) {}

    std::size_t size_now() const {
        return std::min(ap.size(), router.replicas);
    }

    void run(int width, long calls, const cost_model& cost, long first = 0) {
        struct in_flight {
            clock_type::time_point arrives, sent;
            std::uint8_t tag;
            bool operator>(const in_flight& o) const { return arrives > o.arrives; }
        };
        std::priority_queue<in_flight, std::vector<in_flight>, std::greater<>> q;
        std::uniform_real_distribution<double> factor(1 - noise, 1 + noise);
        long made = 0;
        auto send = [&](clock_type::time_point at) {
            const auto took = std::chrono::duration_cast<duration>(
                cost(size_now(), first + made) * factor(random));
            q.push({at + took, at, ap.tag()});
            ++made;
        };
        for (int i = 0; i < width && made < calls; ++i) send(now);
        while (!q.empty()) {
            const in_flight c = q.top();
            q.pop();
            now = c.arrives;
            ap.answered(c.tag, c.sent, c.arrives);
            if (made < calls) send(now);
        }
    }

    clock_type::time_point now = t0;
};

// A call's time falls by 1% with every call, from 3 ms to 0.5 ms, whichever replica runs it.
duration getting_faster(std::size_t, long n) {
    return std::chrono::duration_cast<duration>(
        std::chrono::duration<double, std::micro>(std::max(500.0, 3000 * std::pow(0.99, n))));
}

// The aperture's trials see calls getting faster as every spell goes by, and no size faster
// than another: the slots of a trial take turns (old, new, new, old), so that the drift weighs
// on both sizes alike and no trial keeps its size. Over many seeds of +-5% noise per call.
TEST(Aperture, TrialsDoNotTakeCallsGettingFasterForAFasterSize) {
    for (unsigned seed = 1; seed <= 100; ++seed) {
        simulation s(seed, 0.05);
        s.run(1, 2500, getting_faster);
        EXPECT_GE(s.ap.trials(), 2u) << "seed " << seed;
        EXPECT_EQ(s.ap.changes(), 0u) << "seed " << seed << ": " << s.router.events.front();
        EXPECT_EQ(s.ap.size(), aperture::all) << "seed " << seed;
    }
}

// Spreading slows calls (replicas that share a CPU): 1 ms a call on one replica, 30% more for
// each replica more.
duration sharing_a_cpu(std::size_t size, long) {
    return std::chrono::duration_cast<duration>(1ms * (1 + 0.3 * double(size - 1)));
}

// The aperture narrows to one, a replica at a time, and says so.
TEST(Aperture, NarrowsWhileSpreadingSlowsCalls) {
    for (unsigned seed = 1; seed <= 20; ++seed) {
        simulation s(seed, 0.05);
        s.run(12, 20'000, sharing_a_cpu);
        EXPECT_EQ(s.ap.chosen(), 1u) << "seed " << seed;
        EXPECT_EQ(s.ap.changes(), 2u) << "seed " << seed;
        ASSERT_EQ(s.router.events.size(), 2u) << "seed " << seed;
        EXPECT_EQ(s.router.events[0].rfind("aperture 3 -> 2 replicas: calls took ", 0), 0u)
            << s.router.events[0];
        EXPECT_EQ(s.router.events[1].rfind("aperture 2 -> 1 replicas: calls took ", 0), 0u)
            << s.router.events[1];
    }
}

// Then spreading speeds calls up (replicas apart): the aperture opens again to every replica,
// and replicas added later join it (its size is "all", not 3).
TEST(Aperture, WidensAgainWhenSpreadingSpeedsCallsUp) {
    for (unsigned seed = 1; seed <= 20; ++seed) {
        simulation s(seed, 0.05);
        s.run(12, 20'000, sharing_a_cpu);
        ASSERT_EQ(s.ap.chosen(), 1u) << "seed " << seed;
        s.run(12, 20'000, [](std::size_t size, long) {
            return std::chrono::duration_cast<duration>(2ms / double(size));
        });
        EXPECT_EQ(s.ap.chosen(), aperture::all) << "seed " << seed;
        EXPECT_EQ(s.ap.changes(), 4u) << "seed " << seed;
        s.router.replicas = 4;
        EXPECT_EQ(s.size_now(), 4u);
    }
}

// A size that pays only 5% is not worth a change (a trial keeps a size only 10% faster), and
// each trial that does not pay waits twice as long as the last before the next: few trials.
TEST(Aperture, ASmallGainMovesNothingAndTrialsBackOff) {
    simulation s(7, 0.0);
    s.run(12, 50'000, [](std::size_t size, long) {
        return std::chrono::duration_cast<duration>(1ms * (1 + 0.05 * double(size - 1)));
    });
    EXPECT_EQ(s.ap.changes(), 0u);
    EXPECT_EQ(s.ap.chosen(), aperture::all);
    // 50,000 calls of ~1 ms over 12 in flight last ~4.4 s of simulated time: 220 spells of
    // 20 ms. Backing off 1, 2, 4, ..., 64 spells, trials number about ten, not a hundred.
    EXPECT_GE(s.ap.trials(), 3u);
    EXPECT_LE(s.ap.trials(), 12u);
}

// With one replica there is nothing to try.
TEST(Aperture, OneReplicaHasNothingToTry) {
    simulation s(1, 0.05);
    s.router.replicas = 1;
    s.run(4, 5000, [](std::size_t, long) { return duration(1ms); });
    EXPECT_EQ(s.ap.trials(), 0u);
    EXPECT_EQ(s.ap.chosen(), aperture::all);
}

// Calls sent before the aperture began counting (its spell or trial) do not count: a thousand
// of them end no spell, where a thousand sent after do.
TEST(Aperture, CallsSentBeforeItsSpellDoNotCount) {
    simulation s(1, 0);
    for (int i = 0; i < 1000; ++i)
        s.ap.answered(s.ap.tag(), s.t0 - 1s, s.t0 + std::chrono::milliseconds(i));
    EXPECT_EQ(s.ap.trials(), 0u);
    for (int i = 0; i < 1000; ++i) {
        const auto sent = s.t0 + std::chrono::milliseconds(i);
        s.ap.answered(s.ap.tag(), sent, sent + 1ms);
    }
    EXPECT_GE(s.ap.trials(), 1u);
}

}  // namespace
}  // namespace ordo::detail
