// Sampler as a source of Backend::Sample rows: NextRow() advances the stream exactly as
// Sample() does, and sampling its rows on the CPU backend gives Sampler's own tokens.

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/cpu_sampling.h"
#include "kernels/params.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace kvd {
namespace {

std::vector<float> RandomLogits(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

const std::vector<SamplingParams>& Combos() {
  static const std::vector<SamplingParams> combos = {
      {.temperature = 0.0f, .seed = 1},
      {.temperature = 1.0f, .seed = 2},
      {.temperature = 0.7f, .top_k = 40, .seed = 3},
      {.temperature = 1.0f, .top_p = 0.9f, .seed = 4},
      {.temperature = 1.3f, .top_k = 1000, .top_p = 0.5f, .min_p = 0.05f, .seed = 5},
      {.temperature = 0.8f, .min_p = 0.1f, .seed = 6},
  };
  return combos;
}

TEST(SamplerRowTest, NextRowCarriesTheOptionsAndTheStreamsNextUniform) {
  const SamplingParams params{
      .temperature = 0.6f, .top_k = 7, .top_p = 0.8f, .min_p = 0.02f, .seed = 99};
  Sampler sampler(params);
  Rng rng(params.seed);
  for (int i = 0; i < 5; ++i) {
    const SamplingRow row = sampler.NextRow();
    EXPECT_EQ(row.temperature, params.temperature);
    EXPECT_EQ(row.top_k, params.top_k);
    EXPECT_EQ(row.top_p, params.top_p);
    EXPECT_EQ(row.min_p, params.min_p);
    EXPECT_EQ(row.u, rng.NextFloat()) << "step " << i;
  }
}

TEST(SamplerRowTest, SampleEqualsSampleRowOfNextRow) {
  std::mt19937 rng(21);
  for (const SamplingParams& params : Combos()) {
    Sampler sampling(params);
    Sampler rowing(params);
    SampleScratch scratch;
    for (int step = 0; step < 20; ++step) {
      const std::vector<float> logits = RandomLogits(step % 2 ? 5000 : 37, rng, 2.0f);
      // Mix the two ways on one sampler too: they must share one stream.
      const int32_t expected = sampling.Sample(logits);
      EXPECT_EQ(SampleRow(rowing.NextRow(), logits, &scratch), expected)
          << "seed " << params.seed << " step " << step;
    }
  }
}

TEST(SamplerRowTest, CpuBackendSampleOfABatchEqualsEachSampler) {
  std::mt19937 rng(22);
  const int32_t vocab = 4096;
  const int64_t stride = vocab + 3;
  std::vector<Sampler> reference, engine;
  for (const SamplingParams& params : Combos()) {
    reference.emplace_back(params);
    engine.emplace_back(params);
  }
  const int32_t num_rows = static_cast<int32_t>(reference.size());
  CpuBackend backend(2);
  for (int step = 0; step < 10; ++step) {
    std::vector<float> logits(static_cast<size_t>(num_rows) * stride, 1e30f);
    std::vector<SamplingRow> rows;
    std::vector<int32_t> expected;
    for (int32_t r = 0; r < num_rows; ++r) {
      const std::vector<float> row_logits = RandomLogits(vocab, rng, 3.0f);
      std::copy(row_logits.begin(), row_logits.end(), logits.begin() + r * stride);
      expected.push_back(reference[r].Sample(row_logits));
      rows.push_back(engine[r].NextRow());
    }
    std::vector<int32_t> tokens(num_rows, -1);
    SampleParams p;
    p.logits = logits.data();
    p.row_stride = stride;
    p.num_rows = num_rows;
    p.vocab_size = vocab;
    p.rows = rows.data();
    p.out_tokens = tokens.data();
    ASSERT_TRUE(backend.Sample(p).ok());
    EXPECT_EQ(tokens, expected) << "step " << step;
  }
}

}  // namespace
}  // namespace kvd
