// CpuBackend::Sample (kernels/cpu_sampling.h) against the documented procedure written the
// slow obvious way (a full sort), over random rows and the edge cases a device port must
// also get right.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/cpu_sampling.h"
#include "kernels/params.h"
#include "tests/kernels/random_sampling_row.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The procedure of kernels/cpu_sampling.h, sorting everything.
int32_t ReferenceSample(const std::vector<float>& logits, const SamplingRow& row) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isnan(logits[i])) order.push_back(static_cast<int32_t>(i));
  }
  if (order.empty()) return 0;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (row.temperature == 0.0f) return order[0];
  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < order.size()) order.resize(row.top_k);
  const float max_logit = logits[order[0]];
  std::vector<std::pair<int32_t, double>> kept;
  for (int32_t id : order) {
    const float w = logits[id] == max_logit
                        ? 1.0f
                        : std::exp((logits[id] - max_logit) * (1.0f / row.temperature));
    if (w > 0.0f) kept.push_back({id, w});
  }
  auto total_of = [&] {
    double total = 0.0;
    for (const auto& k : kept) total += k.second;
    return total;
  };
  if (row.top_p < 1.0f) {
    const double target = static_cast<double>(row.top_p) * total_of();
    double cumulative = 0.0;
    size_t n = 0;
    while (n < kept.size()) {
      cumulative += kept[n++].second;
      if (cumulative >= target) break;
    }
    kept.resize(n);
  }
  if (row.min_p > 0.0f) {
    std::erase_if(kept, [&](const auto& k) { return k.second < row.min_p; });
  }
  const double target = static_cast<double>(row.u) * total_of();
  double cumulative = 0.0;
  for (const auto& k : kept) {
    cumulative += k.second;
    if (cumulative > target) return k.first;
  }
  return kept.back().first;
}

// Runs CpuBackend::Sample over rows sharing one logits matrix [rows][stride].
class SampleRunner {
 public:
  explicit SampleRunner(int num_threads) : backend_(num_threads) {}

  absl::Status Run(const std::vector<float>& logits, int64_t stride, int32_t vocab,
                   const std::vector<SamplingRow>& rows, std::vector<int32_t>* tokens) {
    tokens->assign(rows.size(), -1);
    SampleParams p;
    p.logits = logits.data();
    p.row_stride = stride;
    p.num_rows = static_cast<int32_t>(rows.size());
    p.vocab_size = vocab;
    p.rows = rows.data();
    p.out_tokens = tokens->data();
    return backend_.Sample(p);
  }

  // One row, stride == vocab.
  int32_t One(const std::vector<float>& logits, const SamplingRow& row) {
    std::vector<int32_t> tokens;
    const absl::Status s = Run(logits, static_cast<int64_t>(logits.size()),
                               static_cast<int32_t>(logits.size()), {row}, &tokens);
    EXPECT_TRUE(s.ok()) << s;
    return tokens[0];
  }

 private:
  CpuBackend backend_;
};

std::vector<float> NormalLogits(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(CpuSampleTest, RandomBatchesMatchTheDocumentedProcedure) {
  std::mt19937 rng(7);
  SampleRunner runner(/*num_threads=*/2);
  for (int batch = 0; batch < 12; ++batch) {
    const int32_t vocab = std::vector<int32_t>{1, 7, 64, 65, 513, 5000}[batch % 6];
    const int64_t stride = vocab + (batch % 3);
    const int32_t num_rows = 1 + batch % 8;
    std::vector<float> logits(static_cast<size_t>(num_rows) * stride, kNan);  // NaN padding
    std::vector<SamplingRow> rows;
    for (int32_t r = 0; r < num_rows; ++r) {
      std::vector<float> row_logits =
          NormalLogits(vocab, rng, std::uniform_real_distribution<float>(1.0f, 10.0f)(rng));
      if (r % 2 == 1) {  // many exact ties
        for (float& x : row_logits) x = std::round(x);
      }
      if (r % 3 == 2) {  // some NaN and -inf
        for (size_t i = 0; i < row_logits.size(); i += 5) row_logits[i] = i % 10 ? kNan : -kInf;
      }
      std::copy(row_logits.begin(), row_logits.end(), logits.begin() + r * stride);
      rows.push_back(RandomSamplingRow(rng));
    }
    std::vector<int32_t> tokens;
    ASSERT_TRUE(runner.Run(logits, stride, vocab, rows, &tokens).ok());
    for (int32_t r = 0; r < num_rows; ++r) {
      const std::vector<float> row_logits(logits.begin() + r * stride,
                                          logits.begin() + r * stride + vocab);
      EXPECT_EQ(tokens[r], ReferenceSample(row_logits, rows[r]))
          << "batch " << batch << " row " << r << " vocab " << vocab;
    }
  }
}

TEST(CpuSampleTest, ManyDrawsOnALargeVocabularyMatchTheDocumentedProcedure) {
  std::mt19937 rng(11);
  SampleRunner runner(/*num_threads=*/1);
  const std::vector<float> logits = NormalLogits(32000, rng, 2.5f);
  for (int i = 0; i < 40; ++i) {
    const SamplingRow row = RandomSamplingRow(rng);
    EXPECT_EQ(runner.One(logits, row), ReferenceSample(logits, row)) << "draw " << i;
  }
}

TEST(CpuSampleTest, ResultsDoNotDependOnTheBatchOrThreadCount) {
  std::mt19937 rng(3);
  const int32_t vocab = 3000, num_rows = 9;
  std::vector<float> logits = NormalLogits(size_t{vocab} * num_rows, rng, 3.0f);
  std::vector<SamplingRow> rows;
  for (int32_t r = 0; r < num_rows; ++r) rows.push_back(RandomSamplingRow(rng));
  SampleRunner serial(1), parallel(4);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(serial.Run(logits, vocab, vocab, rows, &a).ok());
  ASSERT_TRUE(parallel.Run(logits, vocab, vocab, rows, &b).ok());
  EXPECT_EQ(a, b);
  for (int32_t r = 0; r < num_rows; ++r) {
    const std::vector<float> alone(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    EXPECT_EQ(serial.One(alone, rows[r]), a[r]) << "row " << r;
  }
}

TEST(CpuSampleTest, GreedyIsTheArgmaxWithLowestIdOnTiesIgnoringNan) {
  SampleRunner runner(1);
  const SamplingRow greedy{.temperature = 0.0f, .u = 0.999f};
  EXPECT_EQ(runner.One({1.0f, 5.0f, 2.0f, 5.0f}, greedy), 1);
  EXPECT_EQ(runner.One({kNan, -1.0f, kNan, 3.0f, 3.0f}, greedy), 3);
  EXPECT_EQ(runner.One({-kInf, -kInf, -kInf}, greedy), 0);
  EXPECT_EQ(runner.One({0.0f, kInf, 7.0f, kInf}, greedy), 1);
  EXPECT_EQ(runner.One({-0.0f, 0.0f, -1.0f}, greedy), 0);
  EXPECT_EQ(runner.One({kNan, kNan}, greedy), 0);
}

TEST(CpuSampleTest, AllNanRowsGiveTokenZeroAndNanIsNeverChosen) {
  SampleRunner runner(1);
  for (float u : {0.0f, 0.5f, 0.9999f}) {
    const SamplingRow row{.temperature = 1.0f, .u = u};
    EXPECT_EQ(runner.One({kNan, kNan, kNan}, row), 0);
    const int32_t token = runner.One({kNan, 0.0f, kNan, 0.5f, kNan}, row);
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
}

TEST(CpuSampleTest, AllEqualLogitsAreUniformInIdOrder) {
  // Equal weights: token floor(u * n) for u away from the boundaries, in id order.
  SampleRunner runner(1);
  const std::vector<float> logits(1000, 0.25f);
  for (float u : {0.0f, 0.1234f, 0.5005f, 0.9999f}) {
    EXPECT_EQ(runner.One(logits, {.temperature = 0.7f, .u = u}), static_cast<int32_t>(u * 1000));
  }
  // top_k among ties keeps the lowest ids.
  EXPECT_EQ(runner.One(logits, {.temperature = 1.0f, .top_k = 10, .u = 0.9999f}), 9);
}

TEST(CpuSampleTest, InfiniteLogitsDominate) {
  SampleRunner runner(1);
  const SamplingRow row{.temperature = 1.0f, .top_p = 0.9f, .u = 0.9f};
  EXPECT_EQ(runner.One({0.0f, kInf, 1.0f}, row), 1);
  // Two +inf share the mass; everything finite has weight 0.
  EXPECT_EQ(runner.One({5.0f, kInf, -kInf, kInf}, {.temperature = 1.0f, .u = 0.4f}), 1);
  EXPECT_EQ(runner.One({5.0f, kInf, -kInf, kInf}, {.temperature = 1.0f, .u = 0.6f}), 3);
  // Only -inf and NaN: every -inf is a maximum with weight 1.
  EXPECT_EQ(runner.One({kNan, -kInf, -kInf}, {.temperature = 1.0f, .u = 0.75f}), 2);
}

TEST(CpuSampleTest, HugeFiniteLogitsWhoseDistanceOverflowsAFloat) {
  // max - min = 6e38 is not a float: selection must still bucket every logit.
  std::mt19937 rng(13);
  SampleRunner runner(1);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> logits = NormalLogits(300, rng, 2.0f);
    logits[rng() % 300] = -3e38f;
    if (i % 2 == 0) logits[rng() % 300] = 3e38f;
    const SamplingRow row = {.temperature = 1.0f,
                             .top_k = i % 3 == 0 ? 100 : 0,
                             .top_p = i % 4 == 0 ? 0.9f : 1.0f,
                             .u = 0.01f + 0.049f * i};
    EXPECT_EQ(runner.One(logits, row), ReferenceSample(logits, row)) << "row " << i;
  }
}

// Logits in groups millions of times apart (a -FLT_MAX mask, a few far below, the rest
// close together): selection narrows bucket by bucket and must still agree with the full
// sort, top_k cutting inside the close group.
TEST(CpuSampleTest, LogitGroupsFarApartSelectAsTheFullSortDoes) {
  std::mt19937 rng(21);
  SampleRunner runner(1);
  for (int i = 0; i < 12; ++i) {
    std::vector<float> logits = NormalLogits(4096, rng, 1e-3f);
    logits[rng() % 4096] = -std::numeric_limits<float>::max();
    for (int j = 0; j < 5; ++j) logits[rng() % 4096] = -1e30f * (j + 1);
    for (int j = 0; j < 100; ++j) logits[rng() % 4096] = -1e6f + j;
    const SamplingRow row = {.temperature = 1e-4f,
                             .top_k = i % 2 == 0 ? 50 : 0,
                             .top_p = i % 3 == 0 ? 0.9f : 1.0f,
                             .u = 0.03f + 0.08f * i};
    EXPECT_EQ(runner.One(logits, row), ReferenceSample(logits, row)) << "row " << i;
  }
}

// The boundaries the procedure fixes, which a port must reproduce: top_p keeps the shortest
// prefix whose mass reaches (>=) top_p of the total, and the draw takes the first token whose
// cumulative mass exceeds (>) u of the total. Equal weights put both exactly on a boundary,
// on a short row (sorted whole) and on a long one (selected by buckets).
TEST(CpuSampleTest, TopPCutIsInclusiveAndTheDrawMustExceedItsShare) {
  SampleRunner runner(1);
  for (int n : {4, 128}) {
    SCOPED_TRACE(n);
    const std::vector<float> logits(n, 0.5f);
    // u = 1/4: the first n/4 tokens hold exactly that mass; the draw goes past them.
    EXPECT_EQ(runner.One(logits, {.temperature = 1.0f, .u = 0.25f}), n / 4);
    // top_p 1/2 keeps exactly the first n/2 tokens: u = 0.99 draws the last of them.
    EXPECT_EQ(runner.One(logits, {.temperature = 1.0f, .top_p = 0.5f, .u = 0.99f}), n / 2 - 1);
  }
}

TEST(CpuSampleTest, TopKLargerThanTheVocabularyKeepsEverything) {
  SampleRunner runner(1);
  std::mt19937 rng(5);
  const std::vector<float> logits = NormalLogits(50, rng, 1.0f);
  for (float u : {0.05f, 0.5f, 0.95f}) {
    EXPECT_EQ(runner.One(logits, {.temperature = 1.0f, .top_k = 1000, .u = u}),
              runner.One(logits, {.temperature = 1.0f, .top_k = 0, .u = u}));
  }
}

TEST(CpuSampleTest, TinyTopPAndTopKOneAreGreedy) {
  SampleRunner runner(1);
  std::mt19937 rng(9);
  for (int i = 0; i < 20; ++i) {
    const std::vector<float> logits = NormalLogits(700, rng, 1.0f);
    const int32_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    const float u = 0.999f;
    EXPECT_EQ(runner.One(logits, {.temperature = 1.5f, .top_p = 1e-6f, .u = u}), argmax);
    EXPECT_EQ(runner.One(logits, {.temperature = 1.5f, .top_k = 1, .u = u}), argmax);
  }
}

TEST(CpuSampleTest, MinPOneKeepsOnlyTheTiedMaxima) {
  SampleRunner runner(1);
  const std::vector<float> logits = {1.0f, 3.0f, 2.9999f, 3.0f, -2.0f};
  EXPECT_EQ(runner.One(logits, {.temperature = 1.0f, .min_p = 1.0f, .u = 0.0f}), 1);
  EXPECT_EQ(runner.One(logits, {.temperature = 1.0f, .min_p = 1.0f, .u = 0.49f}), 1);
  EXPECT_EQ(runner.One(logits, {.temperature = 1.0f, .min_p = 1.0f, .u = 0.51f}), 3);
}

TEST(CpuSampleTest, VocabularyOfOne) {
  SampleRunner runner(1);
  EXPECT_EQ(runner.One({-3.0f}, {.temperature = 1.0f, .u = 0.7f}), 0);
  EXPECT_EQ(runner.One({kNan}, {.temperature = 1.0f, .u = 0.7f}), 0);
  EXPECT_EQ(runner.One({2.0f}, {.temperature = 0.0f}), 0);
}

TEST(CpuSampleTest, RowStrideSkipsPadding) {
  // Padding holds the largest logits; a sampler that read it would pick it.
  SampleRunner runner(1);
  const int32_t vocab = 4;
  const int64_t stride = 6;
  const std::vector<float> logits = {0.0f, 1.0f, 9.0f, 2.0f, 100.0f, 100.0f,
                                     5.0f, 1.0f, 0.0f, 2.0f, 100.0f, 100.0f};
  std::vector<int32_t> tokens;
  ASSERT_TRUE(runner
                  .Run(logits, stride, vocab,
                       {{.temperature = 0.0f}, {.temperature = 1.0f, .top_k = 1, .u = 0.5f}},
                       &tokens)
                  .ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{2, 0}));
}

TEST(CpuSampleTest, ZeroRowsIsANoOp) {
  CpuBackend backend(1);
  SampleParams p;  // every pointer null
  p.vocab_size = 10;
  p.row_stride = 10;
  EXPECT_TRUE(backend.Sample(p).ok());
}

TEST(CpuSampleTest, InvalidParamsAreRejectedBeforeAnythingIsWritten) {
  CpuBackend backend(1);
  const std::vector<float> logits(8, 0.0f);
  std::vector<int32_t> tokens(2, -1);
  const std::vector<SamplingRow> good = {{.temperature = 1.0f, .u = 0.5f},
                                         {.temperature = 1.0f, .u = 0.5f}};
  auto params = [&](const std::vector<SamplingRow>& rows) {
    SampleParams p;
    p.logits = logits.data();
    p.row_stride = 4;
    p.num_rows = 2;
    p.vocab_size = 4;
    p.rows = rows.data();
    p.out_tokens = tokens.data();
    return p;
  };
  struct Case {
    std::string name;
    SampleParams p;
    std::string message;
  };
  std::vector<SamplingRow> bad_row = good;
  bad_row[1].u = 1.0f;
  std::vector<SamplingRow> bad_top_p = good;
  bad_top_p[0].top_p = 0.0f;
  std::vector<Case> cases;
  cases.push_back({"u", params(bad_row), "rows[1].u = 1"});
  cases.push_back({"top_p", params(bad_top_p), "rows[0].top_p = 0"});
  SampleParams p = params(good);
  p.num_rows = -1;
  cases.push_back({"num_rows", p, "num_rows"});
  p = params(good);
  p.vocab_size = 0;
  cases.push_back({"vocab_size", p, "vocab_size"});
  p = params(good);
  p.row_stride = 3;
  cases.push_back({"row_stride", p, "row_stride"});
  p = params(good);
  p.logits = nullptr;
  cases.push_back({"logits", p, "logits is null"});
  p = params(good);
  p.out_tokens = nullptr;
  cases.push_back({"out_tokens", p, "out_tokens is null"});
  for (const Case& c : cases) {
    const absl::Status s = backend.Sample(c.p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr("Sample"));
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_EQ(tokens, (std::vector<int32_t>{-1, -1})) << c.name;
  }
}

TEST(ValidateSamplingRowTest, NamesTheFieldValueAndRange) {
  EXPECT_TRUE(ValidateSamplingRow({}, "x.").ok());
  EXPECT_TRUE(
      ValidateSamplingRow(
          {.temperature = 0.0f, .top_k = 3, .top_p = 1e-6f, .min_p = 1.0f, .u = 0.99999994f}, "x.")
          .ok());
  const std::vector<std::pair<SamplingRow, std::string>> cases = {
      {{.temperature = -1.0f}, "x.temperature = -1"},
      {{.temperature = kInf}, "x.temperature = inf"},
      {{.top_k = -2}, "x.top_k = -2"},
      {{.top_p = 1.5f}, "x.top_p = 1.5"},
      {{.min_p = kNan}, "x.min_p = nan"},
      {{.u = -0.5f}, "x.u = -0.5"},
      {{.u = kNan}, "x.u = nan"},
  };
  for (const auto& [row, message] : cases) {
    const absl::Status s = ValidateSamplingRow(row, "x.");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(s.message(), HasSubstr(message));
    EXPECT_THAT(s.message(), HasSubstr("allowed"));
  }
}

}  // namespace
}  // namespace kvd
