// What `kvd bench` measures (decode_bench.h), on the CPU backend and the tiny synthetic model:
// its case list, its copy bandwidth, and one case's step times, KV bytes and roofline, which
// the table prints as they are.

#include "tools/decode_bench.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "kernels/cpu_backend.h"
#include "model/synthetic_model.h"
#include "tools/random_model.h"

namespace kvd {
namespace {

using ::testing::ElementsAre;
using ::testing::FieldsAre;
using ::testing::HasSubstr;

TEST(DecodeBenchCasesTest, ParsesCommaSeparatedShapesSkippingEmptyItems) {
  auto cases = ParseDecodeBenchCases("1x64,,8x4096,");
  ASSERT_TRUE(cases.ok()) << cases.status();
  EXPECT_THAT(*cases, ElementsAre(FieldsAre(1, 64), FieldsAre(8, 4096)));
}

TEST(DecodeBenchCasesTest, RefusesAnItemThatIsNotTwoPositiveNumbersNamingIt) {
  for (const char* bad : {"0x64", "4x0", "4x", "x4", "4x4x4", "four", "1x64,-2x8"}) {
    auto cases = ParseDecodeBenchCases(bad);
    EXPECT_EQ(cases.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(cases.status().message(), HasSubstr("is not BATCHxCONTEXT")) << bad;
  }
  auto named = ParseDecodeBenchCases("1x64,3y5");
  EXPECT_THAT(named.status().message(), HasSubstr("'3y5'"));
}

TEST(DecodeBenchCasesTest, RefusesAListOfNoCase) {
  for (const char* none : {"", ",", ",,"}) {
    auto cases = ParseDecodeBenchCases(none);
    EXPECT_EQ(cases.status().code(), absl::StatusCode::kInvalidArgument) << none;
    EXPECT_THAT(cases.status().message(), HasSubstr("names no case")) << none;
  }
}

TEST(DecodeBenchTest, CopyBandwidthIsAPositiveFiniteRate) {
  CpuBackend cpu(1);
  auto gbps = MeasureCopyBandwidth(&cpu);
  ASSERT_TRUE(gbps.ok()) << gbps.status();
  EXPECT_GT(*gbps, 0.0);
  EXPECT_LT(*gbps, 1e5);  // 100 TB/s: no host memory copies that fast
}

class DecodeBenchCaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = SyntheticSpec("tiny");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    auto model = CreateRandomModel(spec_, 5, &cpu_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  CpuBackend cpu_{1};
  ModelSpec spec_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(DecodeBenchCaseTest, TimesEveryStepAndPutsKvBytesAndWeightsOnTheRoofline) {
  const DecodeBenchOptions options{
      .block_size = 8, .warmup = 2, .steps = 5, .seed = 3, .weight_bytes = 1e6, .copy_gbps = 10.0};
  auto r = RunDecodeBenchCase({.batch = 3, .context = 40}, /*graphs=*/false, options, model_.get(),
                              &cpu_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shape.batch, 3);
  EXPECT_EQ(r->shape.context, 40);
  EXPECT_FALSE(r->graphs);
  EXPECT_TRUE(r->finite);
  EXPECT_GT(r->min_step_ms, 0.0);
  EXPECT_LE(r->min_step_ms, r->step_ms);
  // No graphs on the CPU: every timed step is an uncaptured one.
  EXPECT_EQ(r->recorded_steps, 0);
  EXPECT_EQ(r->replayed_steps, 0);
  EXPECT_EQ(r->graph_stats.captures, 0);
  EXPECT_TRUE(r->op_ms.empty());
  // KV read per step: fp32 K and V of every layer and KV head, over the mean context of the
  // timed steps (40 + 2 warm-up + the 1st..5th timed token: 45 on average), for 3 sequences.
  const double bytes_per_token = 2.0 * spec_.num_layers * spec_.num_kv_heads * spec_.head_dim * 4;
  const double kv_bytes = bytes_per_token * 45.0 * 3;
  EXPECT_DOUBLE_EQ(r->kv_gb, kv_bytes / 1e9);
  EXPECT_DOUBLE_EQ(r->roofline_ms, (1e6 + kv_bytes) / (10.0 * 1e6));
}

// Each step computes one position's KV (the token it samples is fed back by the next step):
// a case fits when context + warm-up + steps is the model's context, 256 for tiny.
TEST_F(DecodeBenchCaseTest, ACaseFitsTheModelsContextToTheLastPosition) {
  const DecodeBenchOptions options{.warmup = 4, .steps = 4, .weight_bytes = 1, .copy_gbps = 1};
  auto fits = RunDecodeBenchCase({.batch = 1, .context = 248}, /*graphs=*/false, options,
                                 model_.get(), &cpu_);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(fits->finite);
  auto r = RunDecodeBenchCase({.batch = 1, .context = 249}, /*graphs=*/false, options, model_.get(),
                              &cpu_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("256 tokens"));
}

}  // namespace
}  // namespace kvd
