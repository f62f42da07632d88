// launch.cuh's contract, checked on the GPU the test runs on: a kernel launched as a
// programmatic dependent sees, once WaitForPrecedingGrid returns, what the kernel before it
// wrote, even where every multiprocessor's L1 held the old contents (read there by the kernel
// before the writer, as a skinny GEMM reads the rows that the next RmsNorm overwrites), with
// plain loads (what the kernels use) and L2-only ones. The non-coherent path is outside the
// contract (in the engine it returned stale rows, gemv_kernels.cu): it runs the same chain, but
// its count of stale words is only reported (the test's "stale_words_nc" property), never
// checked. A control reads before the writer has written and must count old words, so that the
// counting is shown to work; that a stale line cached in L1 would be counted is not shown.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/pdl_probe.h"

namespace kvd::gpu_test {
namespace {

using PdlVisibilityTest = GpuVsCpuTest;

constexpr int kWords = 4096;  // 16 KB: fits any L1
constexpr int kRounds = 200;

std::string LoadName(ProbeLoad load) {
  switch (load) {
    case ProbeLoad::kNonCoherent:
      return "ld.global.nc";
    case ProbeLoad::kPlain:
      return "ld.global";
    case ProbeLoad::kL2Only:
      return "ld.global.cg";
  }
  return "?";
}

// kRounds rounds of: every SM reads the buffer (its L1 may keep the lines), one CTA writes
// round + 1 everywhere, every SM reads it again and counts words that are not round + 1. All
// launched back to back as programmatic dependents, once directly and once from a graph.
TEST_F(PdlVisibilityTest, DependentsSeeTheWritesBeforeThemThroughEveryLoad) {
  const int ctas = 2 * gpu().num_sms();
  for (const ProbeLoad load : {ProbeLoad::kNonCoherent, ProbeLoad::kPlain, ProbeLoad::kL2Only}) {
    for (const bool graph : {false, true}) {
      SCOPED_TRACE(LoadName(load) + (graph ? ", from a graph" : ", launched directly"));
      DeviceBuffer buf = Upload(gpu(), std::vector<uint32_t>(kWords, 0));
      DeviceBuffer counters = Upload(gpu(), std::vector<uint32_t>(2, 0));  // mismatches, sink
      uint32_t* mismatches = counters.as<uint32_t>();
      cudaStream_t stream = gpu().stream();
      ASSERT_TRUE(gpu().Synchronize().ok());
      cudaGraph_t captured = nullptr;
      if (graph) {
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      }
      cudaError_t err = cudaSuccess;
      for (int round = 0; round < kRounds && err == cudaSuccess; ++round) {
        const uint32_t value = round + 1;
        err = LaunchProbeRead(buf.as<uint32_t>(), kWords, load, ctas, mismatches + 1, stream);
        if (err == cudaSuccess) {
          err = LaunchProbeWrite(buf.as<uint32_t>(), kWords, value, /*delay_us=*/0, stream);
        }
        if (err == cudaSuccess) {
          err = LaunchProbeCheck(buf.as<uint32_t>(), kWords, load, value,
                                 /*read_before_wait=*/false, ctas, mismatches, stream);
        }
      }
      if (graph) {
        ASSERT_EQ(cudaStreamEndCapture(stream, &captured), cudaSuccess);
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
        ASSERT_EQ(cudaGraphInstantiate(&exec, captured, 0), cudaSuccess);
        for (int replay = 0; replay < 5; ++replay) {
          ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        }
        ASSERT_TRUE(gpu().Synchronize().ok());
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(captured);
      }
      ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
      ASSERT_TRUE(gpu().Synchronize().ok());
      std::vector<uint32_t> got(2);
      std::memcpy(got.data(), DownloadBytes(gpu(), counters.data(), 8).data(), 8);
      if (load == ProbeLoad::kNonCoherent) {
        RecordProperty(graph ? "stale_words_nc_graph" : "stale_words_nc", std::to_string(got[0]));
      } else {
        EXPECT_EQ(got[0], 0u) << "words read stale after the wait";
      }
    }
  }
}

// The control: the same checker reading before its wait, while the writer sleeps 20 us before
// writing, counts the old words; so the count tells old words from new ones.
TEST_F(PdlVisibilityTest, ReadingBeforeTheWaitSeesTheOldWords) {
  const int ctas = 2 * gpu().num_sms();
  DeviceBuffer buf = Upload(gpu(), std::vector<uint32_t>(kWords, 0));
  DeviceBuffer counters = Upload(gpu(), std::vector<uint32_t>(2, 0));
  uint32_t* mismatches = counters.as<uint32_t>();
  cudaStream_t stream = gpu().stream();
  ASSERT_TRUE(gpu().Synchronize().ok());
  for (int round = 0; round < 10; ++round) {
    const uint32_t value = round + 1;
    ASSERT_EQ(LaunchProbeRead(buf.as<uint32_t>(), kWords, ProbeLoad::kNonCoherent, ctas,
                              mismatches + 1, stream),
              cudaSuccess);
    ASSERT_EQ(LaunchProbeWrite(buf.as<uint32_t>(), kWords, value, /*delay_us=*/20, stream),
              cudaSuccess);
    ASSERT_EQ(LaunchProbeCheck(buf.as<uint32_t>(), kWords, ProbeLoad::kNonCoherent, value,
                               /*read_before_wait=*/true, ctas, mismatches, stream),
              cudaSuccess);
  }
  ASSERT_TRUE(gpu().Synchronize().ok());
  std::vector<uint32_t> got(2);
  std::memcpy(got.data(), DownloadBytes(gpu(), counters.data(), 8).data(), 8);
  EXPECT_GT(got[0], 0u) << "reads before the wait all saw the new words";
}

}  // namespace
}  // namespace kvd::gpu_test
