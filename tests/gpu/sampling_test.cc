// CUDA Sample against CpuBackend::Sample (the reference procedure of kernels/cpu_sampling.h).
//
// Greedy rows must match exactly. A sampled row must match too, except that the device sums
// weight mass differently (exact fixed point instead of double in sorted order), so when
// u * total (or top_p * total) lies within rounding of a cumulative boundary it may take the
// neighbouring token. The test recomputes the CPU-order cumulative masses in double and
// accepts a difference only when every boundary between the two choices is within 1e-5
// relative of the target; such rows must stay a small minority.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/random_sampling_row.h"

namespace kvd::gpu_test {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kBoundaryTolerance = 1e-5;

// A batch of rows in one [num_rows][row_stride] matrix; padding holds huge logits so that
// reading past vocab_size shows up as a wrong token.
struct Batch {
  int32_t vocab_size = 0;
  int64_t row_stride = 0;
  std::vector<float> logits;
  std::vector<SamplingRow> rows;

  std::vector<float> Row(int32_t r) const {
    const auto begin = logits.begin() + r * row_stride;
    return std::vector<float>(begin, begin + vocab_size);
  }
};

enum class Shape { kNormal, kTies, kNanAndNegInf, kHuge };

std::vector<float> MakeLogits(int32_t n, Shape shape, std::mt19937& rng) {
  const float sd = std::uniform_real_distribution<float>(1.0f, 10.0f)(rng);
  std::normal_distribution<float> normal(0.0f, sd);
  std::uniform_int_distribution<int32_t> position(0, n - 1);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  switch (shape) {
    case Shape::kNormal:
      break;
    case Shape::kTies:  // a handful of distinct values: long runs of exact ties
      for (float& x : v) x = std::round(x / sd * 2.0f) * 0.5f;
      break;
    case Shape::kNanAndNegInf:
      for (int i = 0; i < std::max(1, n / 20); ++i) v[position(rng)] = kNan;
      for (int i = 0; i < std::max(1, n / 20); ++i) v[position(rng)] = -kInf;
      break;
    case Shape::kHuge:
      v[position(rng)] = 3e38f;
      v[position(rng)] = -3e38f;
      if (n > 2) v[position(rng)] = 1e30f;
      break;
  }
  return v;
}

Batch RandomBatch(int32_t vocab, int32_t num_rows, std::mt19937& rng, bool allow_greedy = true) {
  Batch b;
  b.vocab_size = vocab;
  b.row_stride = vocab + (rng() % 2 == 0 ? 0 : 3);
  b.logits.assign(static_cast<size_t>(num_rows) * b.row_stride, 1e38f);
  for (int32_t r = 0; r < num_rows; ++r) {
    const Shape shape = static_cast<Shape>(rng() % 4);
    const std::vector<float> row = MakeLogits(vocab, shape, rng);
    std::copy(row.begin(), row.end(), b.logits.begin() + r * b.row_stride);
    b.rows.push_back(RandomSamplingRow(rng, allow_greedy));
  }
  return b;
}

// Runs Sample on `backend` with out_tokens poisoned (-1) beforehand.
std::vector<int32_t> RunSample(Backend& backend, const Batch& b) {
  const int32_t num_rows = static_cast<int32_t>(b.rows.size());
  DeviceBuffer logits = Upload(backend, b.logits);
  DeviceBuffer rows = Upload(backend, b.rows.data(), b.rows.size() * sizeof(SamplingRow));
  DeviceBuffer tokens = Poisoned(backend, sizeof(int32_t) * std::max(num_rows, 1));
  SampleParams p;
  p.logits = logits.as<float>();
  p.row_stride = b.row_stride;
  p.num_rows = num_rows;
  p.vocab_size = b.vocab_size;
  p.rows = rows.as<SamplingRow>();
  p.out_tokens = tokens.as<int32_t>();
  const absl::Status s = backend.Sample(p);
  EXPECT_TRUE(s.ok()) << backend.name() << ": " << s;
  std::vector<int32_t> out(num_rows);
  const std::vector<uint8_t> bytes = DownloadBytes(backend, tokens.data(), out.size() * 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

int32_t Argmax(const std::vector<float>& logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best < 0 ? 0 : best;
}

// Candidates in reference order with their fp32 weights, as the CPU computes them.
struct Kept {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  std::vector<double> cumulative;  // cumulative[j] = weights[0..j] summed in order
  double total() const { return cumulative.empty() ? 0.0 : cumulative.back(); }
  void Push(int32_t id, double w) {
    ids.push_back(id);
    weights.push_back(w);
    cumulative.push_back(total() + w);
  }
};

// Indices m whose cut "first cumulative reaching target" could be the device's: the
// reference's own cut plus neighbours whose boundaries are all within tolerance.
std::vector<size_t> PlausibleCuts(const Kept& k, double target, bool inclusive) {
  auto reached = [&](double c) { return inclusive ? c >= target : c > target; };
  size_t exact = k.ids.size() - 1;
  for (size_t j = 0; j < k.ids.size(); ++j) {
    if (reached(k.cumulative[j])) {
      exact = j;
      break;
    }
  }
  const double tol = kBoundaryTolerance * std::max(target, 1.0);
  std::vector<size_t> cuts = {exact};
  for (size_t j = exact; j > 0 && std::abs(k.cumulative[j - 1] - target) <= tol; --j) {
    cuts.push_back(j - 1);
  }
  for (size_t j = exact; j + 1 < k.ids.size() && std::abs(k.cumulative[j] - target) <= tol; ++j) {
    cuts.push_back(j + 1);
  }
  return cuts;
}

// Whether `device_token` is the reference's choice for `row` up to the allowed rounding.
// Sets *rounding when it is only within rounding.
bool AcceptableToken(const std::vector<float>& logits, const SamplingRow& row, int32_t device_token,
                     int32_t cpu_token, bool* rounding) {
  *rounding = false;
  if (device_token == cpu_token) return true;
  if (row.temperature == 0.0f) return false;
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isnan(logits[i])) order.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (order.empty()) return false;
  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < order.size()) order.resize(row.top_k);
  const float max_logit = logits[order[0]];
  Kept weighted;
  for (int32_t id : order) {
    const float w = logits[id] == max_logit
                        ? 1.0f
                        : std::exp((logits[id] - max_logit) * (1.0f / row.temperature));
    if (w > 0.0f) weighted.Push(id, w);
  }
  std::vector<size_t> top_p_cuts = {weighted.ids.size() - 1};
  if (row.top_p < 1.0f) {
    top_p_cuts = PlausibleCuts(weighted, static_cast<double>(row.top_p) * weighted.total(),
                               /*inclusive=*/true);
  }
  for (size_t cut : top_p_cuts) {
    Kept kept;
    for (size_t j = 0; j <= cut; ++j) {
      if (weighted.weights[j] >= row.min_p) kept.Push(weighted.ids[j], weighted.weights[j]);
    }
    const std::vector<size_t> draws =
        PlausibleCuts(kept, static_cast<double>(row.u) * kept.total(), /*inclusive=*/false);
    for (size_t j : draws) {
      if (kept.ids[j] == device_token) {
        *rounding = true;
        return true;
      }
    }
  }
  return false;
}

using SamplingTest = GpuVsCpuTest;

TEST_F(SamplingTest, RandomRowsMatchTheCpuUpToBoundaryRounding) {
  std::mt19937 rng(2024);
  int num_sampled = 0, num_rounding = 0;
  for (const auto& [vocab, num_rows] : std::vector<std::pair<int32_t, int32_t>>{
           {1, 64}, {7, 64}, {512, 64}, {32000, 64}, {128256, 48}}) {
    for (int32_t done = 0; done < num_rows; done += 16) {
      const Batch b = RandomBatch(vocab, 16, rng);
      const std::vector<int32_t> expected = RunSample(cpu(), b);
      const std::vector<int32_t> actual = RunSample(gpu(), b);
      for (int32_t r = 0; r < 16; ++r) {
        const SamplingRow& row = b.rows[r];
        SCOPED_TRACE(testing::Message() << "vocab " << vocab << " row " << done + r << ": T "
                                        << row.temperature << " top_k " << row.top_k << " top_p "
                                        << row.top_p << " min_p " << row.min_p << " u " << row.u);
        ASSERT_GE(actual[r], 0);
        ASSERT_LT(actual[r], vocab);
        bool rounding = false;
        EXPECT_TRUE(AcceptableToken(b.Row(r), row, actual[r], expected[r], &rounding))
            << "device " << actual[r] << " cpu " << expected[r];
        if (row.temperature != 0.0f) ++num_sampled;
        num_rounding += rounding;
      }
    }
  }
  std::printf("sampling: %d of %d sampled rows took a neighbour within rounding\n", num_rounding,
              num_sampled);
  RecordProperty("rounding_rows", num_rounding);
  EXPECT_LT(num_rounding, 0.02 * num_sampled);
}

// The launch gives each row a cluster of 8, 4, 2 or 1 CTAs by batch size (sampling_kernels.cu:
// up to 8 rows, 32, 64, then one CTA a row): batches of 40 and 100 rows (clusters of 2 and 1;
// the other tests' 2 to 24 rows take 8 and 4) and 256 rows, as a full decode batch.
TEST_F(SamplingTest, LargeBatchesOnSmallerClustersMatchTheCpu) {
  std::mt19937 rng(4242);
  int num_sampled = 0, num_rounding = 0;
  for (const auto& [vocab, num_rows] :
       std::vector<std::pair<int32_t, int32_t>>{{128256, 40}, {32000, 100}, {128256, 256}}) {
    const Batch b = RandomBatch(vocab, num_rows, rng);
    const std::vector<int32_t> expected = RunSample(cpu(), b);
    const std::vector<int32_t> actual = RunSample(gpu(), b);
    for (int32_t r = 0; r < num_rows; ++r) {
      SCOPED_TRACE(testing::Message()
                   << "vocab " << vocab << ", " << num_rows << " rows, row " << r);
      ASSERT_GE(actual[r], 0);
      ASSERT_LT(actual[r], vocab);
      bool rounding = false;
      EXPECT_TRUE(AcceptableToken(b.Row(r), b.rows[r], actual[r], expected[r], &rounding))
          << "device " << actual[r] << " cpu " << expected[r];
      if (b.rows[r].temperature != 0.0f) ++num_sampled;
      num_rounding += rounding;
    }
  }
  EXPECT_LT(num_rounding, 0.02 * num_sampled);
}

TEST_F(SamplingTest, GreedyRowsAreTheExactArgmax) {
  std::mt19937 rng(7);
  for (int32_t vocab : {1, 7, 512, 32000, 128256}) {
    Batch b = RandomBatch(vocab, 16, rng);
    for (SamplingRow& row : b.rows) row.temperature = 0.0f;
    // Special rows: all NaN, all -inf, ties at the maximum, +inf twice, -0 beside +0.
    auto set_row = [&](int32_t r, auto fill) {
      for (int32_t i = 0; i < vocab; ++i) b.logits[r * b.row_stride + i] = fill(i);
    };
    set_row(0, [](int32_t) { return kNan; });
    set_row(1, [](int32_t) { return -kInf; });
    set_row(2, [&](int32_t i) { return i % 3 == 2 ? 4.0f : 1.0f; });
    set_row(3, [&](int32_t i) { return i == vocab / 2 || i == vocab - 1 ? kInf : 0.0f; });
    set_row(4, [&](int32_t i) { return i % 2 ? 0.0f : (i == 0 ? -0.0f : -1.0f); });
    const std::vector<int32_t> actual = RunSample(gpu(), b);
    for (int32_t r = 0; r < 16; ++r) {
      EXPECT_EQ(actual[r], Argmax(b.Row(r))) << "vocab " << vocab << " row " << r;
    }
  }
}

TEST_F(SamplingTest, BatchMixingGreedyAndSampledRows) {
  std::mt19937 rng(99);
  Batch b = RandomBatch(32000, 24, rng, /*allow_greedy=*/false);
  for (size_t r = 0; r < b.rows.size(); r += 2) b.rows[r].temperature = 0.0f;
  const std::vector<int32_t> expected = RunSample(cpu(), b);
  const std::vector<int32_t> actual = RunSample(gpu(), b);
  for (int32_t r = 0; r < 24; ++r) {
    bool rounding = false;
    if (r % 2 == 0) {
      EXPECT_EQ(actual[r], Argmax(b.Row(r))) << "greedy row " << r;
    } else {
      EXPECT_TRUE(AcceptableToken(b.Row(r), b.rows[r], actual[r], expected[r], &rounding))
          << "sampled row " << r << ": device " << actual[r] << " cpu " << expected[r];
    }
  }
}

TEST_F(SamplingTest, EdgeCasesMatchTheCpuExactly) {
  // Rows whose answer does not involve a mass boundary near u * total.
  const int32_t vocab = 1000;
  Batch b;
  b.vocab_size = vocab;
  b.row_stride = vocab;
  auto add = [&](std::vector<float> logits, SamplingRow row) {
    b.logits.insert(b.logits.end(), logits.begin(), logits.end());
    b.rows.push_back(row);
  };
  std::vector<float> equal(vocab, 0.5f);
  add(equal, {.temperature = 0.7f, .u = 0.1234f});                 // uniform: id floor(u * n)
  add(equal, {.temperature = 1.0f, .top_k = 10, .u = 0.95f});      // ties keep lowest ids
  add(equal, {.temperature = 1.0f, .top_k = 5000, .u = 0.5005f});  // top_k > vocab
  std::vector<float> nan(vocab, kNan);
  add(nan, {.temperature = 1.0f, .u = 0.5f});
  std::vector<float> inf(vocab, 0.0f);
  inf[17] = kInf;
  inf[900] = kInf;
  inf[5] = -kInf;
  add(inf, {.temperature = 1.0f, .u = 0.3f});
  add(inf, {.temperature = 1.0f, .u = 0.7f});
  std::vector<float> peaked(vocab, -5.0f);
  peaked[321] = 3.0f;
  peaked[322] = 3.0f;
  peaked[10] = 2.5f;
  add(peaked, {.temperature = 1.0f, .top_p = 1e-6f, .u = 0.9f});  // tiny top_p: argmax
  add(peaked, {.temperature = 1.0f, .min_p = 1.0f, .u = 0.75f});  // min_p 1: tied maxima
  add(peaked, {.temperature = 1.5f, .top_k = 1, .u = 0.99f});
  const std::vector<int32_t> expected = RunSample(cpu(), b);
  EXPECT_EQ(RunSample(gpu(), b), expected);
  EXPECT_EQ(expected, (std::vector<int32_t>{123, 9, 500, 0, 17, 900, 321, 322, 321}));
}

// min_p keeps a token whose weight equals it (w >= min_p) and drops one a float below: the
// device recomputes weights this close to min_p exactly, so it must agree with the CPU on
// either side. Token 500's weight w is set as the CPU computes it; the draw (u = 0.9 of the
// kept mass) takes it when kept, else the maximum, token 7.
TEST_F(SamplingTest, MinPAtAWeightKeepsItAndAFloatAboveDropsIt) {
  const int32_t vocab = 1000;
  Batch b;
  b.vocab_size = vocab;
  b.row_stride = vocab;
  std::vector<int32_t> expected;
  for (const float temperature : {1.0f, 0.7f, 1.3f}) {
    std::vector<float> logits(vocab, -40.0f);  // weights far below any min_p here
    logits[7] = 2.0f;
    logits[500] = 0.8f;
    const float w = std::exp((logits[500] - logits[7]) * (1.0f / temperature));
    for (const auto& [min_p, token] : std::vector<std::pair<float, int32_t>>{
             {w, 500}, {std::nextafter(w, 0.0f), 500}, {std::nextafter(w, 1.0f), 7}}) {
      b.logits.insert(b.logits.end(), logits.begin(), logits.end());
      b.rows.push_back({.temperature = temperature, .min_p = min_p, .u = 0.9f});
      expected.push_back(token);
    }
  }
  EXPECT_EQ(RunSample(cpu(), b), expected);
  EXPECT_EQ(RunSample(gpu(), b), expected);
}

TEST_F(SamplingTest, VocabularyOfOneAndZeroRows) {
  Batch b;
  b.vocab_size = 1;
  b.row_stride = 2;
  b.logits = {-3.0f, 9.0f, kNan, 9.0f};
  b.rows = {{.temperature = 1.0f, .u = 0.9f}, {.temperature = 0.0f}};
  EXPECT_EQ(RunSample(gpu(), b), (std::vector<int32_t>{0, 0}));
  SampleParams empty;
  empty.vocab_size = 1;
  empty.row_stride = 1;
  EXPECT_TRUE(gpu().Sample(empty).ok());
  empty.num_rows = 1;
  empty.row_stride = 0;
  EXPECT_EQ(gpu().Sample(empty).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SamplingTest, CutsInsideTiedBucketsTooLargeToGatherMatchTheCpu) {
  // The device resolves a cut by gathering the one value bucket that holds it into shared
  // memory (at most 2048 candidates); thousands of equal logits make that bucket too large
  // and send the selection down the radix fallback, for every filter and for the draw, also
  // when a small top_k's candidates do not fit.
  const int32_t vocab = 128256;
  std::mt19937 rng(31);
  Batch b;
  b.vocab_size = vocab;
  b.row_stride = vocab + 1;
  auto add = [&](int32_t num_tied, float tied_logit, SamplingRow row) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> logits(b.row_stride, 1e38f);
    for (int32_t i = 0; i < vocab; ++i) logits[i] = normal(rng);
    for (int32_t t = 0; t < num_tied; ++t) logits[rng() % vocab] = tied_logit;
    b.logits.insert(b.logits.end(), logits.begin(), logits.end());
    row.u = std::uniform_real_distribution<float>(0.0f, 0.99f)(rng);
    b.rows.push_back(row);
  };
  add(6000, 4.5f, {.temperature = 1.0f});                              // the draw
  add(6000, 4.5f, {.temperature = 1.0f, .top_k = 3000});               // large top_k
  add(6000, 4.5f, {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f});  // small top_k
  add(6000, 4.5f, {.temperature = 1.0f, .top_p = 0.3f});               // top_p
  add(6000, 4.5f, {.temperature = 1.0f, .min_p = 0.5f});               // min_p
  add(20000, 0.0f, {.temperature = 1.0f, .top_p = 0.95f});             // tie mid-row
  add(20000, 0.0f, {.temperature = 1.0f, .top_k = 40000, .top_p = 0.5f});
  add(vocab * 4, 1.25f, {.temperature = 0.5f});  // (nearly) all equal
  const int32_t num_rows = static_cast<int32_t>(b.rows.size());
  const std::vector<int32_t> expected = RunSample(cpu(), b);
  const std::vector<int32_t> actual = RunSample(gpu(), b);
  for (int32_t r = 0; r < num_rows; ++r) {
    bool rounding = false;
    EXPECT_TRUE(AcceptableToken(b.Row(r), b.rows[r], actual[r], expected[r], &rounding))
        << "row " << r << ": device " << actual[r] << " cpu " << expected[r];
  }
}

TEST_F(SamplingTest, CapturedInAGraphItReadsTheRowsOfEachReplay) {
  std::mt19937 rng(5);
  const Batch b = RandomBatch(32000, 8, rng, /*allow_greedy=*/false);
  DeviceBuffer logits = Upload(gpu(), b.logits);
  DeviceBuffer rows = Upload(gpu(), b.rows.data(), b.rows.size() * sizeof(SamplingRow));
  DeviceBuffer tokens = Poisoned(gpu(), 8 * sizeof(int32_t));
  SampleParams p;
  p.logits = logits.as<float>();
  p.row_stride = b.row_stride;
  p.num_rows = 8;
  p.vocab_size = b.vocab_size;
  p.rows = rows.as<SamplingRow>();
  p.out_tokens = tokens.as<int32_t>();
  ASSERT_TRUE(gpu().BeginCapture().ok());
  const absl::Status recorded = gpu().Sample(p);
  absl::StatusOr<CudaBackend::Graph> graph = gpu().EndCapture();
  ASSERT_TRUE(recorded.ok()) << recorded;
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int step = 0; step < 3; ++step) {
    Batch next = b;
    for (SamplingRow& row : next.rows) row.u = std::uniform_real_distribution<float>(0, 0.99f)(rng);
    OrDie(gpu().CopyToDevice(rows.data(), next.rows.data(), next.rows.size() * sizeof(SamplingRow)),
          "rows");
    ASSERT_TRUE(gpu().LaunchGraph(*graph).ok());
    std::vector<int32_t> replayed(8);
    const std::vector<uint8_t> bytes = DownloadBytes(gpu(), tokens.data(), 32);
    std::memcpy(replayed.data(), bytes.data(), 32);
    EXPECT_EQ(replayed, RunSample(gpu(), next)) << "step " << step;
  }
}

}  // namespace
}  // namespace kvd::gpu_test
