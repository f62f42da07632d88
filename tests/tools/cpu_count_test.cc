// UsableCpus: "all cores" for the CPU backend's threads means the CPUs this process may run
// on (affinity) within its cgroup's CPU quota, not the host's core count.

#include "tools/cpu_count.h"

#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
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

// A cgroup tree under a temporary root: Write("a/b/cpu.max", "...") and so on.
class CgroupTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvd_cgroup_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& file, const std::string& text) {
    const std::filesystem::path path = std::filesystem::path(root_) / file;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::string root_;
};

TEST_F(CgroupTreeTest, V2TakesTheTightestCpuMaxFromTheProcessesCgroupUp) {
  Write("user.slice/app.service/cpu.max", "max 100000\n");  // the process's own: none
  Write("user.slice/cpu.max", "300000 100000\n");           // a slice above it: 3
  Write("cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit("0::/user.slice/app.service\n", root_), 3);
  Write("user.slice/app.service/cpu.max", "150000 100000\n");  // tighter below: 2
  EXPECT_EQ(CgroupCpuLimit("0::/user.slice/app.service\n", root_), 2);
  // A container's namespace shows its cgroup as the root.
  Write("cpu.max", "100000 100000\n");
  EXPECT_EQ(CgroupCpuLimit("0::/\n", root_), 1);
}

TEST_F(CgroupTreeTest, V1WalksTheCpuHierarchyUpFromTheProcessesCgroup) {
  const std::string self =
      "12:memory:/system.slice/kvd.service\n"
      "4:cpu,cpuacct:/system.slice/kvd.service\n"
      "0::/system.slice/kvd.service\n";  // hybrid: v2 with no cpu.max
  Write("cpu,cpuacct/system.slice/kvd.service/cpu.cfs_quota_us", "-1\n");
  Write("cpu,cpuacct/system.slice/kvd.service/cpu.cfs_period_us", "100000\n");
  Write("cpu,cpuacct/system.slice/cpu.cfs_quota_us", "200000\n");  // systemd CPUQuota=200%
  Write("cpu,cpuacct/system.slice/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(self, root_), 2);
}

TEST_F(CgroupTreeTest, V1InAContainerFindsItsLimitAtTheMountsRoot) {
  // Without a cgroup namespace the path is the host's, which the container does not have.
  Write("cpu/cpu.cfs_quota_us", "150000\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit("4:cpu,cpuacct:/docker/0123abcd\n", root_), 2);
}

TEST_F(CgroupTreeTest, NoLimitAnywhereIsNone) {
  Write("cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit("0::/\n", root_), std::nullopt);
  EXPECT_EQ(CgroupCpuLimit("", root_), std::nullopt);
  EXPECT_EQ(CgroupCpuLimit("not a cgroup line\n", root_), std::nullopt);
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
