// The standard process collector's figures, from /proc: the parser on a fixed stat line (a
// command name with spaces and parentheses in it), and this very process read live.

#include "server/process_stats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kvd {
namespace {

// proc(5)'s fields 1-24 (and more): pid, comm, state, ..., utime 1234 (14), stime 766 (15),
// num_threads 7 (20), starttime 50000 (22), vsize 123456789 (23), rss 2500 (24).
constexpr char kStat[] =
    "4242 (kvd (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 766 0 0 20 0 7 0 50000 "
    "123456789 2500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";

TEST(ProcessStatsTest, ParsesTheFieldsAfterTheCommandName) {
  const std::optional<ProcessStats> p =
      ParseProcSelfStat(kStat, /*page_bytes=*/4096, /*ticks_per_second=*/100,
                        /*boot_time_seconds=*/1'700'000'000);
  ASSERT_TRUE(p.has_value());
  EXPECT_DOUBLE_EQ(p->cpu_seconds, 20.0);  // (1234 + 766) / 100
  EXPECT_EQ(p->resident_bytes, 2500 * 4096);
  EXPECT_EQ(p->virtual_bytes, 123456789);
  EXPECT_DOUBLE_EQ(p->start_time_seconds, 1'700'000'500.0);  // boot + 50000 / 100
  EXPECT_EQ(p->threads, 7);
  EXPECT_EQ(p->open_fds, -1);  // not in the stat line: unknown
  EXPECT_EQ(p->max_fds, 0);
}

TEST(ProcessStatsTest, RefusesWhatIsNotAStatLine) {
  EXPECT_FALSE(ParseProcSelfStat("", 4096, 100, 0).has_value());
  EXPECT_FALSE(ParseProcSelfStat("4242 kvd S 1 2 3", 4096, 100, 0).has_value());  // no ')'
  const std::string s = kStat;
  EXPECT_FALSE(ParseProcSelfStat(s.substr(0, s.find(" 2500")), 4096, 100, 0).has_value());
  std::string bad = s;
  bad.replace(bad.find("1234"), 4, "12x4");
  EXPECT_FALSE(ParseProcSelfStat(bad, 4096, 100, 0).has_value());
  EXPECT_FALSE(ParseProcSelfStat(kStat, 4096, 0, 0).has_value());  // no clock rate
}

TEST(ProcessStatsTest, ReadsThisProcess) {
  // A second thread, so the count is seen to be this process's.
  bool stop = false;
  std::thread other([&stop] {
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) usleep(1000);
  });
  const std::optional<ProcessStats> p = ReadProcessStats();
  __atomic_store_n(&stop, true, __ATOMIC_RELEASE);
  other.join();
  ASSERT_TRUE(p.has_value());
  EXPECT_GT(p->resident_bytes, 0);
  EXPECT_GE(p->virtual_bytes, p->resident_bytes);
  EXPECT_GE(p->threads, 2);
  EXPECT_GE(p->cpu_seconds, 0);
  // Started before now, and not before this test binary could have been built.
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(p->start_time_seconds, now + 1);
  EXPECT_GT(p->start_time_seconds, now - 24 * 3600);
  EXPECT_GE(p->open_fds, 3);  // stdin, stdout, stderr at least
  if (p->max_fds > 0) EXPECT_GE(p->max_fds, p->open_fds);
}

}  // namespace
}  // namespace kvd
