// What `kvd serve` prints about its KV pool at startup (DescribePool): sizes an operator can
// check against the config, and a warning for each pool that cannot do what it looks like
// it can.

#include "server/pool_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvd {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// stories260K in f32 at block size 16: 20 KiB blocks, 512 to a 10 MiB chunk; 1 GiB initial,
// 8 GiB max (serve.yaml's pool).
KvPoolGeometry Stories8GiB() {
  KvPoolGeometry g;
  g.chunk_shift = 9;
  g.chunk_bytes = 512 * 20480;
  g.initial_chunks = 103;
  g.max_chunks = 819;
  return g;
}

TEST(HumanBytesTest, PicksTheUnitThatKeepsTheNumberShort) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(20480), "20.0 KiB");
  EXPECT_EQ(HumanBytes(10 << 20), "10.0 MiB");
  EXPECT_EQ(HumanBytes(int64_t{819} * 512 * 20480), "8.00 GiB");
}

TEST(PoolReportTest, SaysTheSizesNowAndAtMostAndWhatTheyHold) {
  const PoolReport r = DescribePool(Stories8GiB(), 20480, 16, 512, int64_t{64} << 30);
  EXPECT_EQ(r.line,
            "kvd: KV pool: 1.01 GiB reserved now (memory_pool.initial_size, at least one "
            "chunk), up to 8.00 GiB (max_size), in chunks of 10.0 MiB (512 blocks of 20.0 "
            "KiB): at most 419328 blocks, 6709248 tokens");
  EXPECT_THAT(r.warnings, IsEmpty());
}

TEST(PoolReportTest, WarnsWhenThePoolCannotHoldOneContext) {
  KvPoolGeometry g;
  g.chunk_shift = 0;
  g.chunk_bytes = 20480;
  g.initial_chunks = 1;
  g.max_chunks = 20;  // 320 tokens
  const PoolReport r = DescribePool(g, 20480, 16, 512, std::nullopt);
  EXPECT_THAT(r.line, HasSubstr("(1 block of 20.0 KiB): at most 20 blocks, 320 tokens"));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_THAT(r.warnings[0], HasSubstr("holds 320 tokens at max_size, fewer than one "
                                       "512-token context"));
  EXPECT_THAT(r.warnings[0], HasSubstr("kv_cache_config.memory_pool.max_size"));
  // A context capped to what the pool holds is no warning.
  EXPECT_THAT(DescribePool(g, 20480, 16, 320, std::nullopt).warnings, IsEmpty());
}

TEST(PoolReportTest, WarnsWhenAHostPoolCouldOutgrowTheAvailableMemory) {
  const PoolReport r = DescribePool(Stories8GiB(), 20480, 16, 512, int64_t{4} << 30);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_THAT(r.warnings[0],
              HasSubstr("grow to 8.00 GiB, more than the host's available memory (4.00 GiB)"));
  // Device memory (no host figure) and enough host memory are no warning.
  EXPECT_THAT(DescribePool(Stories8GiB(), 20480, 16, 512, std::nullopt).warnings, IsEmpty());
  EXPECT_THAT(DescribePool(Stories8GiB(), 20480, 16, 512, int64_t{819} * 512 * 20480).warnings,
              IsEmpty());
}

TEST(PoolReportTest, WarnsWhenADevicePoolCouldOutgrowTheDevice) {
  const int64_t gib = int64_t{1} << 30;
  // 8 GiB reserved, 20 GiB free, 1 GiB kept: room for 27 GiB.
  const std::optional<std::string> w = DeviceRoomWarning(64 * gib, 8 * gib, 20 * gib, gib);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(*w,
            "kvd: warning: kv_cache_config.memory_pool.max_size lets the KV pool grow to 64.00 "
            "GiB, more than the device has room for: 27.00 GiB (the 8.00 GiB reserved, and the "
            "20.00 GiB free now less memory_pool.device_headroom's 1.00 GiB); it stops growing "
            "about there (kvd_kv_pool_growth_failures_total)");
  EXPECT_EQ(DeviceRoomWarning(27 * gib, 8 * gib, 20 * gib, gib), std::nullopt);
  // Less free than the headroom: room for the reserve alone.
  EXPECT_THAT(DeviceRoomWarning(9 * gib, 8 * gib, gib / 2, gib).value_or(""),
              HasSubstr("room for: 8.00 GiB"));
  EXPECT_EQ(DeviceRoomWarning(8 * gib, 8 * gib, 0, gib), std::nullopt);
}

}  // namespace
}  // namespace kvd
