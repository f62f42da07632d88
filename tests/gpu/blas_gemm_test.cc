// BlasGemm keeps the plans it used last, at most kMaxPlans: m takes every batch token count,
// so a long run must not grow the cache without bound, and a product whose plan was dropped
// is computed as before. Every algorithm the benchmark may pick by heuristic rank
// (UseHeuristicRank) computes the same product, and so do plans chosen by timing (TuneUpTo).

#include "kernels/cuda/blas_gemm.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/random_fill.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using BlasGemmTest = GpuVsCpuTest;

TEST_F(BlasGemmTest, KeepsTheMostRecentlyUsedPlansAndRecomputesADroppedOne) {
  constexpr int kN = 64, kK = 64;
  const int max_m = static_cast<int>(BlasGemm::kMaxPlans) + 8;
  DeviceBuffer weight = OrDie(gpu().Allocate(size_t{kN} * kK * 2), "Allocate");
  OrDie(gpu().FillRandom(weight.data(), DType::kBF16, size_t{kN} * kK, RandomFill{21, 1, 0}),
        "FillRandom");
  DeviceBuffer in = OrDie(gpu().Allocate(size_t(max_m) * kK * 2), "Allocate");
  OrDie(gpu().FillRandom(in.data(), DType::kBF16, size_t(max_m) * kK, RandomFill{22, 1, 0}),
        "FillRandom");
  DeviceBuffer out = Poisoned(gpu(), size_t(max_m) * kN * 4);
  std::unique_ptr<BlasGemm> blas = OrDie(BlasGemm::Create(gpu().stream()), "BlasGemm");

  // m = 3 first: its plan is the least recently used once the others come.
  ASSERT_TRUE(blas->Run(out.as<float>(), in.data(), weight.data(), 3, kN, kK, false).ok());
  const std::vector<float> first = DownloadFloats(gpu(), out.data(), size_t{3} * kN);
  EXPECT_EQ(blas->num_plans(), 1u);
  for (int m = 4; m <= max_m; ++m) {
    const absl::Status s = blas->Run(out.as<float>(), in.data(), weight.data(), m, kN, kK, false);
    ASSERT_TRUE(s.ok()) << "m " << m << ": " << s;
    ASSERT_LE(blas->num_plans(), BlasGemm::kMaxPlans) << "m " << m;
  }
  EXPECT_EQ(blas->num_plans(), BlasGemm::kMaxPlans);
  // m = 3's plan was dropped: made again, the same product.
  OrDie(gpu().CopyToDevice(out.data(), std::vector<float>(size_t{3} * kN, -1.0f).data(),
                           size_t{3} * kN * 4),
        "CopyToDevice");
  ASSERT_TRUE(blas->Run(out.as<float>(), in.data(), weight.data(), 3, kN, kK, false).ok());
  EXPECT_EQ(DownloadFloats(gpu(), out.data(), size_t{3} * kN), first);
  EXPECT_EQ(blas->num_plans(), BlasGemm::kMaxPlans);
}

TEST_F(BlasGemmTest, EveryHeuristicRankComputesTheSameProduct) {
  constexpr int kM = 64, kN = 512, kK = 1024;
  DeviceBuffer weight = OrDie(gpu().Allocate(size_t{kN} * kK * 2), "Allocate");
  OrDie(gpu().FillRandom(weight.data(), DType::kBF16, size_t{kN} * kK, RandomFill{31, 1, 0}),
        "FillRandom");
  DeviceBuffer in = OrDie(gpu().Allocate(size_t{kM} * kK * 2), "Allocate");
  OrDie(gpu().FillRandom(in.data(), DType::kBF16, size_t{kM} * kK, RandomFill{32, 1, 0}),
        "FillRandom");
  DeviceBuffer out = Poisoned(gpu(), size_t{kM} * kN * 4);
  std::unique_ptr<BlasGemm> blas = OrDie(BlasGemm::Create(gpu().stream()), "BlasGemm");
  const std::vector<float> ones(size_t{kM} * kN, 1.0f);
  // The product at the current rank, without and with accumulation onto ones.
  auto run = [&](bool accumulate) {
    OrDie(gpu().CopyToDevice(out.data(), ones.data(), ones.size() * 4), "CopyToDevice");
    const absl::Status s =
        blas->Run(out.as<float>(), in.data(), weight.data(), kM, kN, kK, accumulate);
    EXPECT_TRUE(s.ok()) << s;
    return DownloadFloats(gpu(), out.data(), ones.size());
  };
  const std::vector<float> product = run(false);
  ASSERT_GE(blas->heuristic_results(), 1);
  // Up to one past the ranks offered: that plan runs cublasGemmEx.
  for (int rank = 1; rank <= BlasGemm::kMaxHeuristicRank; ++rank) {
    blas->UseHeuristicRank(rank);
    const std::vector<float> plain = run(false);
    const bool offered = blas->heuristic_results() > rank;
    const std::vector<float> accumulated = run(true);
    for (size_t i = 0; i < product.size(); ++i) {
      // Sums of 1024 products of unit-scale bf16 values, in another order: fp32 rounding.
      const float tolerance = 1e-4f * (1.0f + std::fabs(product[i])) * 32;
      ASSERT_NEAR(plain[i], product[i], tolerance) << "rank " << rank << ", element " << i;
      ASSERT_NEAR(accumulated[i], product[i] + 1.0f, tolerance)
          << "rank " << rank << " accumulating, element " << i;
    }
    if (!offered) break;
  }
}

// Plans for few rows (TuneUpTo) over a weight of twice the L2 or more time the heuristic's
// candidates on the call's operands and run the fastest: the same product, `out` written once
// (accumulating onto ones gives the product plus one, not the timing runs' sum). Plans for
// more rows, over smaller weights, and plans made while a graph is captured (where timing
// would synchronize and allocate) take the first choice.
TEST_F(BlasGemmTest, TunedPlansComputeTheSameProductAndNeverTimeInACapture) {
  int l2_bytes = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  constexpr int kM = 64, kK = 1024;
  const int n = (2 * l2_bytes / (2 * kK) + 255) / 256 * 256;  // bf16 weight >= 2 x L2
  const size_t weight_count = size_t(n) * kK;
  DeviceBuffer weight = OrDie(gpu().Allocate(weight_count * 2), "Allocate");
  OrDie(gpu().FillRandom(weight.data(), DType::kBF16, weight_count, RandomFill{41, 1, 0}),
        "FillRandom");
  DeviceBuffer in = OrDie(gpu().Allocate(size_t{kM + 1} * kK * 2), "Allocate");
  OrDie(gpu().FillRandom(in.data(), DType::kBF16, size_t{kM + 1} * kK, RandomFill{42, 1, 0}),
        "FillRandom");
  DeviceBuffer out = Poisoned(gpu(), size_t{kM + 1} * n * 4);
  std::unique_ptr<BlasGemm> reference = OrDie(BlasGemm::Create(gpu().stream()), "BlasGemm");
  std::unique_ptr<BlasGemm> tuned = OrDie(BlasGemm::Create(gpu().stream()), "BlasGemm");
  tuned->TuneUpTo(kM);
  const std::vector<float> ones(size_t{kM + 1} * n, 1.0f);
  auto run = [&](BlasGemm& blas, int m, int cols, bool accumulate) {
    OrDie(gpu().CopyToDevice(out.data(), ones.data(), ones.size() * 4), "CopyToDevice");
    const absl::Status s =
        blas.Run(out.as<float>(), in.data(), weight.data(), m, cols, kK, accumulate);
    EXPECT_TRUE(s.ok()) << s;
    return DownloadFloats(gpu(), out.data(), size_t(m) * cols);
  };
  auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want, float offset,
                        const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const float tolerance = 1e-4f * (1.0f + std::fabs(want[i])) * 32;
      ASSERT_NEAR(got[i], want[i] + offset, tolerance) << what << ", element " << i;
    }
  };
  const std::vector<float> product = run(*reference, kM, n, false);
  expect_near(run(*tuned, kM, n, true), product, 1.0f, "tuned, accumulating");
  ASSERT_GE(tuned->heuristic_results(), 2) << "nothing to choose between";
  EXPECT_GE(tuned->last_plan_rank(), 0);
  EXPECT_LT(tuned->last_plan_rank(), tuned->heuristic_results());
  expect_near(run(*tuned, kM, n, false), product, 0.0f, "tuned");
  // One row more than tuned, and a weight of 256 rows: the first choice, untimed.
  run(*tuned, kM + 1, n, false);
  EXPECT_EQ(tuned->last_plan_rank(), 0);
  run(*tuned, kM, 256, false);
  EXPECT_EQ(tuned->last_plan_rank(), 0);

  // A plan first made inside a capture: no timing (which would end the capture in an error).
  cudaStream_t stream = gpu().stream();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status in_capture =
      tuned->Run(out.as<float>(), in.data(), weight.data(), kM / 2, n, kK, false);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  ASSERT_TRUE(in_capture.ok()) << in_capture;
  ASSERT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
  EXPECT_EQ(tuned->last_plan_rank(), 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  OrDie(gpu().CopyToDevice(out.data(), ones.data(), ones.size() * 4), "CopyToDevice");
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  const std::vector<float> half = DownloadFloats(gpu(), out.data(), size_t{kM / 2} * n);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  expect_near(half, std::vector<float>(product.begin(), product.begin() + half.size()), 0.0f,
              "made in a capture");
}

}  // namespace
}  // namespace kvd::gpu_test
