// gpu_bench's stream hold (stream_hold.h), on the GPU the test runs on: work enqueued behind a
// hold waits for its release, events around that work time the device alone however long the
// host takes to enqueue it, and a hold nobody releases ends by its timeout and says so.

#include "tests/gpu/stream_hold.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using StreamHoldTest = GpuVsCpuTest;

// Two events, destroyed with the test.
struct EventPair {
  EventPair() {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  float Ms() const {
    float ms = -1;
    EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    return ms;
  }
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
};

TEST_F(StreamHoldTest, WorkBehindAHoldWaitsForTheReleaseAndIsTimedWithoutTheHostsDelay) {
  StreamHold hold;
  ASSERT_EQ(hold.Init(), cudaSuccess);
  DeviceBuffer buffer = Upload(gpu(), std::vector<uint8_t>(1 << 20, 0));
  cudaStream_t stream = gpu().stream();
  ASSERT_TRUE(gpu().Synchronize().ok());
  EventPair events;
  ASSERT_EQ(hold.Hold(stream, /*timeout_ms=*/10000), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(events.start, stream), cudaSuccess);
  // A host that takes 50 ms to enqueue the work: unheld, the events would span that wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(cudaMemsetAsync(buffer.data(), 7, 1 << 20, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(events.stop, stream), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaEventQuery(events.stop), cudaErrorNotReady) << "the hold let the work run";
  hold.Release();
  ASSERT_TRUE(gpu().Synchronize().ok());
  EXPECT_FALSE(hold.TimedOut());
  EXPECT_LT(events.Ms(), 5.0f);
  const std::vector<uint8_t> bytes = DownloadBytes(gpu(), buffer.data(), 1 << 20);
  EXPECT_EQ(bytes.front(), 7);
  EXPECT_EQ(bytes.back(), 7);
}

TEST_F(StreamHoldTest, AHoldNobodyReleasesEndsByItsTimeoutAndTheNextStartsAfresh) {
  StreamHold hold;
  ASSERT_EQ(hold.Init(), cudaSuccess);
  cudaStream_t stream = gpu().stream();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(hold.Hold(stream, /*timeout_ms=*/30), cudaSuccess);
  ASSERT_TRUE(gpu().Synchronize().ok());
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(30));
  EXPECT_LT(waited, std::chrono::seconds(2));
  EXPECT_TRUE(hold.TimedOut());

  ASSERT_EQ(hold.Hold(stream, /*timeout_ms=*/10000), cudaSuccess);
  hold.Release();
  ASSERT_TRUE(gpu().Synchronize().ok());
  EXPECT_FALSE(hold.TimedOut());
}

// As Bench::TimeHeldMs uses it: a hold released and passed, then another that must hold again.
TEST_F(StreamHoldTest, EachHoldHoldsAfterAReleasedOne) {
  StreamHold hold;
  ASSERT_EQ(hold.Init(), cudaSuccess);
  cudaStream_t stream = gpu().stream();
  EventPair events;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    ASSERT_EQ(hold.Hold(stream, /*timeout_ms=*/10000), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(events.stop, stream), cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cudaEventQuery(events.stop), cudaErrorNotReady) << "the hold let the stream on";
    hold.Release();
    ASSERT_TRUE(gpu().Synchronize().ok());
    EXPECT_FALSE(hold.TimedOut());
  }
}

TEST_F(StreamHoldTest, RefusesAHoldBeforeInitOrWithoutATimeout) {
  StreamHold hold;
  EXPECT_EQ(hold.Hold(gpu().stream(), 10), cudaErrorInvalidValue);
  EXPECT_FALSE(hold.TimedOut());
  ASSERT_EQ(hold.Init(), cudaSuccess);
  EXPECT_EQ(hold.Hold(gpu().stream(), 0), cudaErrorInvalidValue);
  EXPECT_EQ(hold.Hold(gpu().stream(), -1), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvd::gpu_test
