#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/rng.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

// The documented procedure, written the slow obvious way (full sort), as the oracle.
int32_t ReferenceSample(const std::vector<float>& logits, const SamplingParams& params, float u) {
  if (params.temperature == 0.0f) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
      if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
    }
    return best;
  }
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isnan(logits[i])) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < order.size()) {
    order.resize(params.top_k);
  }
  const float max_logit = logits[order[0]];
  std::vector<std::pair<int32_t, double>> kept;
  for (int32_t id : order) {
    const float w = logits[id] == max_logit
                        ? 1.0f
                        : std::exp((logits[id] - max_logit) * (1.0f / params.temperature));
    if (w > 0.0f) kept.push_back({id, w});
  }
  if (params.top_p < 1.0f) {
    double total = 0.0;
    for (const auto& k : kept) total += k.second;
    double cumulative = 0.0;
    size_t n = 0;
    while (n < kept.size()) {
      cumulative += kept[n++].second;
      if (cumulative >= params.top_p * total) break;
    }
    kept.resize(n);
  }
  if (params.min_p > 0.0f) {
    std::erase_if(kept, [&](const auto& k) { return k.second < params.min_p; });
  }
  double total = 0.0;
  for (const auto& k : kept) total += k.second;
  double cumulative = 0.0;
  for (const auto& k : kept) {
    cumulative += k.second;
    if (cumulative > u * total) return k.first;
  }
  return kept.back().first;
}

std::vector<float> RandomLogits(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& x : logits) x = normal(rng);
  return logits;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp((logits[i] - max_logit) / temperature);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= total;
  return p;
}

std::vector<int64_t> Histogram(Sampler& sampler, const std::vector<float>& logits, int draws) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[sampler.Sample(logits)];
  return counts;
}

// Each count is Binomial(draws, p); its frequency is within 5 standard deviations,
// sqrt(p (1 - p) / draws), of p. For a fixed seed the test is deterministic; for a fresh
// seed a correct sampler fails one token's check with probability < 6e-7.
void ExpectFrequencies(const std::vector<int64_t>& counts, const std::vector<double>& p,
                       int draws) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double frequency = static_cast<double>(counts[i]) / draws;
    const double sigma = std::sqrt(p[i] * (1.0 - p[i]) / draws);
    EXPECT_NEAR(frequency, p[i], 5.0 * sigma) << "token " << i;
  }
}

// --- Rng ------------------------------------------------------------------------------

TEST(RngTest, StreamIsPinned) {
  // splitmix64-seeded xoshiro256**; these values pin the stream across platforms and let
  // another implementation (a CUDA kernel) check itself.
  Rng rng(0);
  EXPECT_EQ(rng.NextU64(), 0x99EC5F36CB75F2B4ull);
  EXPECT_EQ(rng.NextU64(), 0xBF6E1F784956452Aull);
  Rng seeded(42);
  EXPECT_EQ(seeded.NextU64(), 0x15780B2E0C2EC716ull);
}

TEST(RngTest, FloatsAreInUnitIntervalAndUniform) {
  Rng rng(123);
  double sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float u = rng.NextFloat();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  // Mean of n uniforms: sd = sqrt(1/12 / n) ~ 0.00091; allow 5 sd.
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12.0 / n));
}

// --- SamplingParams::Validate ------------------------------------------------------------

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams{}.Validate().ok()); }

TEST(SamplingParamsTest, ErrorsNameTheFieldValueAndRange) {
  struct Case {
    SamplingParams params;
    const char* field;
    const char* value;
  };
  const float nan = std::nanf("");
  const std::vector<Case> cases = {
      {{.temperature = -0.5f}, "temperature", "-0.5"},
      {{.temperature = INFINITY}, "temperature", "inf"},
      {{.temperature = nan}, "temperature", "nan"},
      {{.top_k = -1}, "top_k", "-1"},
      {{.top_p = 0.0f}, "top_p", "0"},
      {{.top_p = 1.5f}, "top_p", "1.5"},
      {{.top_p = nan}, "top_p", "nan"},
      {{.min_p = -0.1f}, "min_p", "-0.1"},
      {{.min_p = 2.0f}, "min_p", "2"},
  };
  for (const Case& c : cases) {
    const absl::Status status = c.params.Validate();
    ASSERT_FALSE(status.ok()) << c.field << " = " << c.value;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(std::string(c.field) + " = " + c.value));
    EXPECT_THAT(status.message(), HasSubstr("allowed"));
  }
  EXPECT_TRUE((SamplingParams{.temperature = 0.0f, .top_k = 5, .top_p = 1e-6f, .min_p = 1.0f})
                  .Validate()
                  .ok());
}

// --- Sampler ------------------------------------------------------------------------------

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const std::vector<float> logits = RandomLogits(300, 1, 2.0f);
  auto draw = [&](uint64_t seed) {
    Sampler sampler({.temperature = 1.0f, .top_k = 50, .top_p = 0.95f, .seed = seed});
    std::vector<int32_t> tokens;
    for (int i = 0; i < 200; ++i) tokens.push_back(sampler.Sample(logits));
    return tokens;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, TemperatureZeroIsArgmaxWithLowestIdOnTies) {
  Sampler sampler({.temperature = 0.0f, .seed = 3});
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = RandomLogits(1000, seed, 3.0f);
    const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sampler.Sample(logits), argmax);
  }
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 5.0f, 2.0f, 5.0f}), 1);
}

TEST(SamplerTest, TopKOneIsGreedyAtAnyTemperature) {
  for (float temperature : {0.1f, 1.0f, 10.0f, 1000.0f}) {
    Sampler sampler({.temperature = temperature, .top_k = 1, .seed = 11});
    for (uint32_t seed = 0; seed < 20; ++seed) {
      const std::vector<float> logits = RandomLogits(500, seed, 1.0f);
      const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
      EXPECT_EQ(sampler.Sample(logits), argmax) << "temperature " << temperature;
    }
    EXPECT_EQ(sampler.Sample(std::vector<float>{0.0f, 4.0f, 4.0f}), 1);
  }
}

TEST(SamplerTest, TinyTopPIsGreedy) {
  Sampler sampler({.temperature = 2.0f, .top_p = 1e-6f, .seed = 5});
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> logits = RandomLogits(2000, seed, 1.0f);
    const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sampler.Sample(logits), argmax);
  }
}

TEST(SamplerTest, TemperatureOneMatchesSoftmax) {
  const std::vector<float> logits = {0.5f, 1.5f, -0.3f, 2.0f, 1.0f, -1.0f};
  const int draws = 200000;
  Sampler sampler({.temperature = 1.0f, .seed = 2024});
  ExpectFrequencies(Histogram(sampler, logits, draws), Softmax(logits, 1.0), draws);
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  const std::vector<float> logits = {0.5f, 1.5f, -0.3f, 2.0f};
  const int draws = 100000;
  for (float temperature : {0.5f, 3.0f}) {
    Sampler sampler({.temperature = temperature, .seed = 99});
    ExpectFrequencies(Histogram(sampler, logits, draws), Softmax(logits, temperature), draws);
  }
}

TEST(SamplerTest, TopKKeepsOnlyTheKMostProbableRenormalised) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.2f, 1.9f, 0.3f, -0.5f};
  const int draws = 100000;
  Sampler sampler({.temperature = 0.8f, .top_k = 3, .seed = 17});
  const std::vector<int64_t> counts = Histogram(sampler, logits, draws);
  // The top 3 are ids 1, 4, 3; renormalise softmax(logits / 0.8) over them.
  std::vector<double> p = Softmax(logits, 0.8);
  const double kept_mass = p[1] + p[4] + p[3];
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = (i == 1 || i == 3 || i == 4) ? p[i] / kept_mass : 0.0;
  }
  for (size_t i : {0, 2, 5, 6}) EXPECT_EQ(counts[i], 0) << "token " << i;
  ExpectFrequencies(counts, p, draws);
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingTheMass) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: with top_p = 0.75 the nucleus is {0.5, 0.3}.
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  const int draws = 100000;
  Sampler sampler({.temperature = 1.0f, .top_p = 0.75f, .seed = 4});
  const std::vector<int64_t> counts = Histogram(sampler, logits, draws);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  ExpectFrequencies(counts, {0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8}, draws);
}

TEST(SamplerTest, MinPDropsTokensBelowTheFractionOfTheMax) {
  // Relative to the max: token 1 has 0.7 (kept with min_p 0.5), tokens 2, 3 have 0.25 and
  // 0.05 (dropped).
  const std::vector<float> logits = {0.0f, std::log(0.7f), std::log(0.25f), std::log(0.05f)};
  const int draws = 100000;
  Sampler sampler({.temperature = 1.0f, .min_p = 0.5f, .seed = 8});
  const std::vector<int64_t> counts = Histogram(sampler, logits, draws);
  EXPECT_EQ(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
  ExpectFrequencies(counts, {1.0 / 1.7, 0.7 / 1.7, 0.0, 0.0}, draws);
}

TEST(SamplerTest, NanLogitsAreNeverChosen) {
  const float nan = std::nanf("");
  Sampler sampler({.temperature = 1.0f, .seed = 1});
  for (int i = 0; i < 1000; ++i) {
    const int32_t token = sampler.Sample(std::vector<float>{nan, 0.0f, nan, 0.5f, nan});
    ASSERT_TRUE(token == 1 || token == 3) << token;
  }
  Sampler greedy({.temperature = 0.0f});
  EXPECT_EQ(greedy.Sample(std::vector<float>{nan, -1.0f, nan, 3.0f}), 3);
}

TEST(SamplerTest, InfiniteLogitsDoNotBreakSampling) {
  Sampler sampler({.temperature = 1.0f, .top_p = 0.9f, .seed = 1});
  const float inf = INFINITY;
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.0f, inf, 1.0f}), 1);
  for (int i = 0; i < 100; ++i) {
    const int32_t token = sampler.Sample(std::vector<float>{-inf, 2.0f, -inf, 2.0f});
    ASSERT_TRUE(token == 1 || token == 3) << token;
  }
}

// The fast path (selection instead of sorting) must draw exactly what the documented
// procedure draws, over large vocabularies and every filter combination.
TEST(SamplerTest, MatchesTheDocumentedProcedureOnLargeVocabularies) {
  const std::vector<SamplingParams> combos = {
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 40},
      {.temperature = 1.0f, .top_p = 0.9f},
      {.temperature = 1.3f, .top_k = 1000, .top_p = 0.5f, .min_p = 0.05f},
      {.temperature = 0.8f, .min_p = 0.1f},
      {.temperature = 0.0f},
  };
  const std::vector<float> logits = RandomLogits(32000, 12, 2.5f);
  for (size_t c = 0; c < combos.size(); ++c) {
    SamplingParams params = combos[c];
    params.seed = 1000 + c;
    Sampler sampler(params);
    Rng rng(params.seed);
    for (int i = 0; i < 8; ++i) {
      const float u = rng.NextFloat();
      ASSERT_EQ(sampler.Sample(logits), ReferenceSample(logits, params, u))
          << "combo " << c << " draw " << i;
    }
  }
}

TEST(SamplerTest, RandomSmallCasesMatchTheDocumentedProcedure) {
  std::mt19937 rng(5);
  for (int round = 0; round < 300; ++round) {
    const size_t n = std::uniform_int_distribution<size_t>(1, 80)(rng);
    std::vector<float> logits = RandomLogits(n, round, 1.5f);
    // Quantise some logits so that ties are common.
    if (round % 2 == 0) {
      for (float& x : logits) x = std::round(x);
    }
    SamplingParams params{
        .temperature = std::uniform_real_distribution<float>(0.1f, 2.0f)(rng),
        .top_k = std::uniform_int_distribution<int32_t>(0, 10)(rng),
        .top_p = round % 3 == 0 ? 1.0f : std::uniform_real_distribution<float>(0.05f, 1.0f)(rng),
        .min_p = round % 4 == 0 ? std::uniform_real_distribution<float>(0.0f, 0.5f)(rng) : 0.0f,
        .seed = static_cast<uint64_t>(round)};
    Sampler sampler(params);
    Rng reference_rng(params.seed);
    for (int i = 0; i < 10; ++i) {
      ASSERT_EQ(sampler.Sample(logits), ReferenceSample(logits, params, reference_rng.NextFloat()))
          << "round " << round << " draw " << i;
    }
  }
}

// Past 64 candidates the sampler selects through logit buckets rather than a sort
// (kernels/cpu_sampling.cc): vocabularies of 65 to 5000 tokens with long runs of ties, NaN,
// -inf and +inf, under random filters, against the sorting reference.
TEST(SamplerTest, RandomBucketedCasesWithTiesAndInfinitiesMatchTheDocumentedProcedure) {
  std::mt19937 rng(77);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int round = 0; round < 80; ++round) {
    const size_t n = std::uniform_int_distribution<size_t>(65, 5000)(rng);
    std::vector<float> logits = RandomLogits(n, 500 + round, 3.0f);
    std::uniform_int_distribution<size_t> position(0, n - 1);
    switch (round % 4) {
      case 0:  // a handful of distinct values: every cut falls inside a run of ties
        for (float& x : logits) x = std::round(x / 2.0f);
        break;
      case 1:  // NaN (never chosen) and -inf (weight 0)
        for (size_t i = 0; i < n / 10; ++i) logits[position(rng)] = std::nanf("");
        for (size_t i = 0; i < n / 10; ++i) logits[position(rng)] = -kInf;
        break;
      case 2:  // two +inf: they alone have weight
        logits[position(rng)] = kInf;
        logits[position(rng)] = kInf;
        break;
      default:
        break;
    }
    SamplingParams params{
        .temperature = std::uniform_real_distribution<float>(0.2f, 2.0f)(rng),
        .top_k = round % 3 == 0 ? 0 : std::uniform_int_distribution<int32_t>(1, 300)(rng),
        .top_p = round % 5 == 0 ? 1.0f : std::uniform_real_distribution<float>(0.05f, 1.0f)(rng),
        .min_p = round % 2 == 0 ? std::uniform_real_distribution<float>(0.0f, 0.3f)(rng) : 0.0f,
        .seed = static_cast<uint64_t>(round)};
    Sampler sampler(params);
    Rng reference_rng(params.seed);
    for (int i = 0; i < 5; ++i) {
      ASSERT_EQ(sampler.Sample(logits), ReferenceSample(logits, params, reference_rng.NextFloat()))
          << "round " << round << " (" << n << " tokens) draw " << i;
    }
  }
}

}  // namespace
}  // namespace kvd
