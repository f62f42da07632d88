// BlasGemm keeps the plans it used last, at most kMaxPlans: m takes every batch token count,
// so a long run must not grow the cache without bound, and a product whose plan was dropped
// is computed as before.

#include "kernels/cuda/blas_gemm.h"

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

}  // namespace
}  // namespace kvd::gpu_test
