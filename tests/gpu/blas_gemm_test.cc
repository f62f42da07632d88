// BlasGemm keeps the plans it used last, at most kMaxPlans: m takes every batch token count,
// so a long run must not grow the cache without bound, and a product whose plan was dropped
// is computed as before. Every algorithm the benchmark may pick by heuristic rank
// (UseHeuristicRank) computes the same product.

#include "kernels/cuda/blas_gemm.h"

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

}  // namespace
}  // namespace kvd::gpu_test
