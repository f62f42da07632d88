#include "kernels/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvd {
namespace {

using Chunks = std::set<std::pair<int64_t, int64_t>>;

// Runs one ParallelFor and returns the chunks it called fn with, checking every index of
// [0, n) was visited exactly once.
Chunks RunAndCheckCoverage(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> visits(std::max<int64_t>(n, 0));
  std::mutex mu;
  Chunks chunks;
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(chunks.emplace(begin, end).second) << "chunk [" << begin << ", " << end << ")";
  });
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(visits[i].load(), 1) << "index " << i << " n=" << n << " grain=" << grain;
  }
  return chunks;
}

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnceInGrainSizedChunks) {
  for (int threads : {0, 1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 6, 7, 8, 64, 1000, 1001}) {
      for (int64_t grain : {-1, 0, 1, 2, 3, 7, 64, 5000}) {
        SCOPED_TRACE(::testing::Message()
                     << "threads=" << threads << " n=" << n << " grain=" << grain);
        const Chunks chunks = RunAndCheckCoverage(pool, n, grain);
        const int64_t g = std::max<int64_t>(grain, 1);
        EXPECT_EQ(static_cast<int64_t>(chunks.size()), n == 0 ? 0 : (n + g - 1) / g);
        for (const auto& [begin, end] : chunks) {
          EXPECT_EQ(begin % g, 0);
          EXPECT_EQ(end, std::min(n, begin + g));
        }
      }
    }
  }
}

TEST(ThreadPoolTest, NegativeCountCallsNothing) {
  ThreadPool pool(3);
  int calls = 0;
  pool.ParallelFor(-5, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, ChunkBoundariesDoNotDependOnThreadCount) {
  ThreadPool one(1), two(2), seven(7);
  for (int64_t n : {1, 9, 100, 257}) {
    for (int64_t grain : {1, 4, 10}) {
      const Chunks expected = RunAndCheckCoverage(one, n, grain);
      EXPECT_EQ(RunAndCheckCoverage(two, n, grain), expected);
      EXPECT_EQ(RunAndCheckCoverage(seven, n, grain), expected);
    }
  }
}

TEST(ThreadPoolTest, ZeroOrOneThreadRunsInlineOnCaller) {
  for (int threads : {0, 1}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), 1);
    const std::thread::id caller = std::this_thread::get_id();
    pool.ParallelFor(50, 1,
                     [&](int64_t, int64_t) { EXPECT_EQ(std::this_thread::get_id(), caller); });
  }
}

TEST(ThreadPoolTest, UsesAtMostNumThreadsThreads) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.num_threads(), 4);
  std::mutex mu;
  std::set<std::thread::id> seen;
  pool.ParallelFor(200, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(std::this_thread::get_id());
  });
  EXPECT_LE(seen.size(), 4u);
}

TEST(ThreadPoolTest, ManyLoopsInARowAndFromConcurrentCallers) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 200; ++rep) {
      pool.ParallelFor(rep % 17, 2, [&](int64_t begin, int64_t end) { total += end - begin; });
    }
  };
  std::thread other(work);
  work();
  other.join();
  int64_t expected = 0;
  for (int rep = 0; rep < 200; ++rep) expected += rep % 17;
  EXPECT_EQ(total.load(), 2 * expected);
}

// The chunks not yet started when one throws are skipped. Every other chunk waits for the
// throw and then takes 5 ms, so the exception is recorded long before the other thread
// could get through the remaining 62 chunks; without the skip, all 64 run.
TEST(ThreadPoolTest, ChunksNotYetStartedWhenOneThrowsAreSkipped) {
  ThreadPool pool(2);
  std::atomic<bool> thrown{false};
  std::atomic<int> calls{0};
  EXPECT_THROW(pool.ParallelFor(64, 1,
                                [&](int64_t begin, int64_t) {
                                  ++calls;
                                  if (begin == 0) {  // handed out first
                                    thrown = true;
                                    throw std::runtime_error("chunk 0");
                                  }
                                  while (!thrown) std::this_thread::yield();
                                  std::this_thread::sleep_for(std::chrono::milliseconds(5));
                                }),
               std::runtime_error);
  EXPECT_LE(calls.load(), 8);
}

// An exception from a chunk (the CPU kernels' scratch vectors can throw std::bad_alloc)
// reaches the caller, wherever the chunk ran, instead of ending the process; later chunks are
// skipped and the pool runs the next loop whole.
TEST(ThreadPoolTest, AnExceptionFromAChunkReachesTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(3);
  for (int64_t thrower : {int64_t{0}, int64_t{37}, int64_t{63}}) {
    std::atomic<int> calls{0};
    EXPECT_THROW(pool.ParallelFor(64, 1,
                                  [&](int64_t begin, int64_t) {
                                    ++calls;
                                    // Slow enough that the workers take chunks too.
                                    std::this_thread::sleep_for(std::chrono::microseconds(200));
                                    if (begin == thrower) throw std::runtime_error("chunk");
                                  }),
                 std::runtime_error)
        << "thrower " << thrower;
    EXPECT_GE(calls.load(), thrower + 1);
    EXPECT_EQ(RunAndCheckCoverage(pool, 100, 7).size(), 15u) << "thrower " << thrower;
  }
  // Every chunk throwing, from every thread at once: one exception, nothing else.
  EXPECT_THROW(pool.ParallelFor(64, 1, [](int64_t, int64_t) { throw std::runtime_error("all"); }),
               std::runtime_error);
  EXPECT_EQ(RunAndCheckCoverage(pool, 64, 1).size(), 64u);
}

}  // namespace
}  // namespace kvd
