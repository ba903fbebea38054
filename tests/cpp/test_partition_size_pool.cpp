// on_workers (partition/size_pool.h), the pool that plans the micro-batch sizes: every index taken
// is worked and kept once, take() sees what was kept before it (partition()'s skipping relies on
// it), several workers run at once, and an error stops the pool and reaches the caller from the
// smallest index that threw.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "partition/size_pool.h"

namespace pt = graphpipe::partition;

namespace {

TEST(SizePool, EveryIndexIsWorkedAndKeptOnce) {
  for (std::size_t width : {1u, 2u, 4u, 16u}) {
    constexpr std::size_t kCount = 9;
    std::size_t next = 0;
    std::vector<int> kept(kCount, 0);
    std::vector<std::size_t> squares(kCount, 0);
    pt::on_workers(
        width, kCount,
        [&]() -> std::optional<std::size_t> {
          if (next == kCount) return std::nullopt;
          return next++;
        },
        [](std::size_t i) { return i * i; },
        [&](std::size_t i, std::size_t square) {
          ++kept[i];
          squares[i] = square;
        });
    for (std::size_t i = 0; i < kCount; ++i) {
      EXPECT_EQ(kept[i], 1) << "index " << i << " with " << width << " workers";
      EXPECT_EQ(squares[i], i * i);
    }
  }
}

TEST(SizePool, TakeSeesWhatWasKeptBefore) {
  // One worker: take() must see the result of the index before it, as partition()'s bound does.
  std::size_t next = 0;
  std::vector<std::size_t> kept_when_taken;
  std::size_t kept = 0;
  pt::on_workers(
      1, 5,
      [&]() -> std::optional<std::size_t> {
        if (next == 5) return std::nullopt;
        kept_when_taken.push_back(kept);
        return next++;
      },
      [](std::size_t i) { return i; }, [&](std::size_t, std::size_t) { ++kept; });
  EXPECT_EQ(kept_when_taken, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
}

TEST(SizePool, WorkersRunAtOnce) {
  // Two workers, two indices: each waits (with a timeout) until both have started, which only
  // happens when they run side by side.
  std::atomic<int> started{0};
  std::size_t next = 0;
  std::vector<bool> met(2, false);
  pt::on_workers(
      2, 2,
      [&]() -> std::optional<std::size_t> {
        if (next == 2) return std::nullopt;
        return next++;
      },
      [&](std::size_t) {
        ++started;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (started.load() < 2 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return started.load() == 2;
      },
      [&](std::size_t i, bool both) { met[i] = both; });
  EXPECT_TRUE(met[0]);
  EXPECT_TRUE(met[1]);
}

TEST(SizePool, AnErrorStopsThePoolAndNamesTheSmallestIndexThatThrew) {
  for (std::size_t width : {1u, 3u}) {
    std::size_t next = 0, taken = 0;
    try {
      pt::on_workers(
          width, 100,
          [&]() -> std::optional<std::size_t> {
            if (next == 100) return std::nullopt;
            ++taken;
            return next++;
          },
          [](std::size_t i) -> int {
            if (i >= 2) throw std::runtime_error("size " + std::to_string(i) + " failed");
            return 0;
          },
          [](std::size_t, int) {});
      FAIL() << "no error reached the caller";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "size 2 failed");
    }
    // Once an index has failed, the workers take no more than the ones already in hand.
    EXPECT_LE(taken, 2 + width) << width << " workers";
  }
}

}  // namespace
