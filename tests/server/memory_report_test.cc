// What `kvd serve` prints at startup of where the backend's memory is (DescribeMemory).

#include "server/memory_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvd {
namespace {

// The startup line beside the pool's: where the backend's memory is, and the device's
// memory where there is one.
TEST(MemoryReportTest, SaysWhatHoldsTheBackendsMemoryAndWhatTheDeviceHasFree) {
  const MemoryStats m{.weights_bytes = int64_t{16} << 30,
                      .kv_pool_bytes = int64_t{8} << 30,
                      .activation_bytes = 3 << 20,
                      .workspace_bytes = 33 << 20};
  EXPECT_EQ(DescribeMemory(m, std::nullopt),
            "kvd: memory: weights 16.00 GiB, KV pool 8.00 GiB, activations and other buffers 3.0 "
            "MiB (grown to the largest batch as it comes), backend workspace 33.0 MiB");
  EXPECT_THAT(DescribeMemory(m, Backend::DeviceMemory{int64_t{80} << 30, int64_t{55} << 30}),
              ::testing::EndsWith("backend workspace 33.0 MiB; the device has 55.00 GiB free of "
                                  "80.00 GiB"));
  // On a GPU the daemon holds the largest step's activations from the start.
  EXPECT_THAT(DescribeMemory(m, std::nullopt, /*activations_reserved=*/true),
              ::testing::HasSubstr("activations and other buffers 3.0 MiB (those of the largest "
                                   "step, held from the start), backend workspace"));
}

}  // namespace
}  // namespace kvd
