// UsableCpus: "all cores" for the CPU backend's threads means the CPUs this process may run
// on (affinity) within its cgroup's CPU quota, not the host's core count.

#include "tools/cpu_count.h"

#include <sched.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "gtest/gtest.h"

namespace kvd {
namespace {

TEST(CpuCountTest, CgroupV2CpuMaxRoundsTheQuotaUp) {
  EXPECT_EQ(CpusFromCgroupV2Max("200000 100000\n"), 2);
  EXPECT_EQ(CpusFromCgroupV2Max("150000 100000"), 2);  // 1.5 CPUs: two threads, not one
  EXPECT_EQ(CpusFromCgroupV2Max("50000 100000"), 1);
  EXPECT_EQ(CpusFromCgroupV2Max("max 100000\n"), std::nullopt);  // no limit
  for (const char* bad : {"", "200000", "x 100000", "200000 0", "-1 100000", "1 2 3"}) {
    EXPECT_EQ(CpusFromCgroupV2Max(bad), std::nullopt) << bad;
  }
}

TEST(CpuCountTest, CgroupV1QuotaAndPeriod) {
  EXPECT_EQ(CpusFromCgroupV1("400000\n", "100000\n"), 4);
  EXPECT_EQ(CpusFromCgroupV1("250000", "100000"), 3);
  EXPECT_EQ(CpusFromCgroupV1("-1\n", "100000\n"), std::nullopt);  // no limit
  EXPECT_EQ(CpusFromCgroupV1("", "100000"), std::nullopt);
  EXPECT_EQ(CpusFromCgroupV1("100000", "0"), std::nullopt);
}

// A process pinned to one CPU (taskset -c 0) gets one thread, whatever the host has.
TEST(CpuCountTest, FollowsTheCpuAffinity) {
  const int all = UsableCpus();
  EXPECT_GE(all, 1);
  EXPECT_LE(all, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  // On a thread of its own, so the test's main thread keeps its mask.
  int pinned = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    cpu_set_t mine;
    ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &mine)) {
        CPU_SET(c, &one);
        break;
      }
    }
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    pinned = UsableCpus();
  }).join();
  EXPECT_EQ(pinned, 1);
}

}  // namespace
}  // namespace kvd
