// The weights of a synthetic model (CreateRandomModel, what `kvd serve` and `kvd generate`
// run) are a fixed function of the seed, the tensor and the element: the same on every
// backend, build and machine, so a seed names one model. Pinned values catch a change to the
// stream or its rounding (the host once risked an FMA-contracted fill on FMA targets, one
// ulp off the device's).

#include "tools/random_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_backend.h"
#include "model/synthetic_model.h"

namespace kvd {
namespace {

TEST(RandomModelTest, WeightValuesArePinned) {
  // A matrix of fan-in 64 (uniform on [-sqrt(3/64), sqrt(3/64))) and a norm weight (uniform
  // on [0.9, 1.1)), seed 7; the same matrix under seed 8.
  const RandomFill matrix = RandomWeightFill(7, {.index = 0, .count = 1000, .fan_in = 64});
  const RandomFill norm = RandomWeightFill(7, {.index = 1, .count = 64, .fan_in = 0});
  const RandomFill other_seed = RandomWeightFill(8, {.index = 0, .count = 1000, .fan_in = 64});
  EXPECT_EQ(RandomFillValue(matrix, 0), 0x1.8f3524p-3f);
  EXPECT_EQ(RandomFillValue(matrix, 1), 0x1.50b5cep-3f);
  EXPECT_EQ(RandomFillValue(matrix, 999), -0x1.938e78p-3f);
  EXPECT_EQ(RandomFillValue(norm, 0), 0x1.f2361cp-1f);
  EXPECT_EQ(RandomFillValue(norm, 63), 0x1.d4b04p-1f);
  EXPECT_EQ(RandomFillValue(other_seed, 0), 0x1.b7c306p-3f);
}

TEST(RandomModelTest, ValuesStayInTheirRanges) {
  const RandomFill matrix = RandomWeightFill(3, {.index = 4, .count = 100000, .fan_in = 4096});
  const RandomFill norm = RandomWeightFill(3, {.index = 3, .count = 100000, .fan_in = 0});
  const float a = std::sqrt(3.0f / 4096.0f);
  double sum = 0.0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const float m = RandomFillValue(matrix, i);
    ASSERT_GE(m, -a) << i;
    ASSERT_LT(m, a) << i;
    const float n = RandomFillValue(norm, i);
    ASSERT_GE(n, 0.9f) << i;
    ASSERT_LE(n, 1.1f) << i;
    sum += m;
  }
  EXPECT_NEAR(sum / 100000, 0.0, 0.01 * a);  // centred
}

// On a backend whose weights are host memory (the CPU), a model past the memory the caller
// says is free is refused before anything is allocated: `kvd serve --device cpu --model
// synthetic:llama3-8b` once filled 32 GB until the OOM killer came.
TEST(RandomModelTest, WeightsPastTheFreeHostMemoryAreRefusedFirst) {
  CpuBackend cpu(1);
  const absl::StatusOr<ModelSpec> spec = SyntheticSpec("llama3-8b");
  ASSERT_TRUE(spec.ok());
  const auto model = CreateRandomModel(*spec, 1, &cpu, /*host_bytes_available=*/int64_t{1} << 30);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(model.status().message()),
              ::testing::AllOf(::testing::HasSubstr(absl::StrCat(
                                   "f32 weights need ", spec->NumParameters() * 4, " bytes")),
                               ::testing::HasSubstr("1073741824 bytes (1.0 GiB) are available")));
  const absl::StatusOr<ModelSpec> tiny = SyntheticSpec("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_TRUE(CreateRandomModel(*tiny, 1, &cpu, int64_t{1} << 30).ok());
}

}  // namespace
}  // namespace kvd
