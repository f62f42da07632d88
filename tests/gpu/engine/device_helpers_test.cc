// The device-side helpers of the engine tools on CUDA (tools/device.h, tools/random_model.h):
// seeded random fills equal their host definition bit for bit, and a random model made on the
// device computes the same logits as the same model made on the CPU, to bf16 accuracy (at
// head_dim 64, and at 128, where a Hopper GPU's prefill reads the bf16 Q rows RoPE writes).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cache/clock.h"
#include "kernels/cuda/prefill_attention_mma.h"
#include "model/synthetic_model.h"
#include "tests/gpu/gpu_test_util.h"
#include "tools/device.h"
#include "tools/engine_setup.h"
#include "tools/random_model.h"

namespace kvd::gpu_test {
namespace {

using DeviceHelpersTest = GpuVsCpuTest;

TEST_F(DeviceHelpersTest, RandomFillOnTheDeviceEqualsTheHostDefinition) {
  const size_t count = (size_t{1} << 20) + 7;  // several grid-stride rounds and a tail
  const RandomFill fill{.key = RandomFillKey(42, 3), .scale = 0.02f, .offset = 0.5f};
  DeviceBuffer f32 = Poisoned(gpu(), count * 4);
  DeviceBuffer bf16 = Poisoned(gpu(), count * 2);
  ASSERT_TRUE(FillRandom(&gpu(), f32.data(), DType::kF32, count, fill).ok());
  ASSERT_TRUE(FillRandom(&gpu(), bf16.data(), DType::kBF16, count, fill).ok());
  const std::vector<float> got = DownloadFloats(gpu(), f32.data(), count);
  const std::vector<uint8_t> got16 = DownloadBytes(gpu(), bf16.data(), count * 2);
  size_t f32_mismatch = 0, bf16_mismatch = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = RandomFillValue(fill, i);
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want, 4);
    f32_mismatch += a != b;
    uint16_t h;
    std::memcpy(&h, &got16[2 * i], 2);
    bf16_mismatch += h != Bf16Bits(want);
  }
  EXPECT_EQ(f32_mismatch, 0u);
  EXPECT_EQ(bf16_mismatch, 0u);
}

class RandomModelTest : public DeviceHelpersTest, public ::testing::WithParamInterface<int32_t> {};

TEST_P(RandomModelTest, OnTheDeviceMatchesTheSameModelOnTheCpu) {
  // head_dim 64 or 128 so the fast attention kernels run (at 128 on Hopper the prefill reads
  // the bf16 Q rows RoPE writes for it), small enough for the CPU.
  ModelSpec spec = *SyntheticSpec("tiny");
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = GetParam();
  spec.dim = spec.num_heads * spec.head_dim;
  spec.hidden_dim = 2 * spec.dim;
  spec.max_context_tokens = 512;
  auto on_gpu = CreateRandomModel(spec, 11, &gpu());
  auto on_cpu = CreateRandomModel(spec, 11, &cpu());
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  // On Hopper at head_dim 128 the device's prefill reads Q in bf16 (RoPE writes it).
  EXPECT_EQ(gpu().ReadsBf16Q(spec.head_dim),
            spec.head_dim == 128 && cuda::HopperPrefillSupported());
  // 300 tokens: several 128-key tiles and query tiles.
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 300; ++i) tokens.push_back((i * 37 + 5) % spec.vocab_size);
  std::vector<std::vector<float>> logits;
  for (auto [model, backend] : {std::pair{on_gpu->get(), static_cast<Backend*>(&gpu())},
                                std::pair{on_cpu->get(), static_cast<Backend*>(&cpu())}}) {
    FakeClock clock;
    auto cache = CreateCacheForSequences(spec, backend, &clock, 16, 1, false);
    ASSERT_TRUE(cache.ok()) << cache.status();
    ASSERT_TRUE((*cache)->AddSequence(0, tokens).ok());
    ASSERT_TRUE((*cache)->Reserve(0, static_cast<int32_t>(tokens.size())));
    ForwardBatch batch;
    batch.AddSequence(tokens, 0, (*cache)->BlockIds(0), 16, true);
    std::vector<KvCacheView> views;
    for (int32_t l = 0; l < spec.num_layers; ++l) views.push_back((*cache)->LayerView(l));
    std::vector<float> out;
    ASSERT_TRUE(model->Forward(batch, views, &out).ok());
    logits.push_back(out);
  }
  // bf16 weights (the CPU ones are the same values before rounding) and bf16 KV.
  EXPECT_TRUE(AllClose(logits[0], logits[1], 0.05, 0.05));
}

INSTANTIATE_TEST_SUITE_P(HeadDims, RandomModelTest, ::testing::Values(64, 128),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return "head_dim_" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace kvd::gpu_test
