// Specification of CpuBackend::PagedAttention: over K/V scattered through non-contiguous
// blocks of several chunks (random permutation of block ids, one released chunk in the
// middle, untouched slots NaN), the result equals float64 attention over the same K/V
// laid out contiguously, within kMaxRelError under MaxRowRelError per query row.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace kvd {
namespace {

using kernel_test::kMaxRelError;
using kernel_test::MaxRowRelError;
using kernel_test::RandomFloats;
using kernel_test::TestArena;
using ::testing::HasSubstr;

constexpr int kNumKvHeads = 2;
constexpr int kLayer = 1;  // of 2, so the K/V regions sit at non-zero offsets
constexpr float kOutSentinel = 7777.0f;

struct SeqSpec {
  int q_len;
  int kv_len;  // including this step's q_len tokens
};

struct Config {
  int block_size;
  int group;  // query heads per KV head
  int head_dim;
  bool causal = true;
  float score_scale = 1.0f;  // sm_scale = score_scale / sqrt(head_dim)
  float value_lo = -1.0f;    // V is uniform in [value_lo, value_hi)
  float value_hi = 1.0f;
};

// A prefill chunk on a cached prefix, a fresh prefill, decodes of several lengths.
std::vector<SeqSpec> MixedBatch(int block_size) {
  return {{7, 20}, {1, 1}, {1, 33}, {9, 9}, {1, 2 * block_size}, {1, 70}, {3, 3 * block_size + 1}};
}

// One batch: the arena with the sequences' K/V written at random block ids, the
// contiguous copy of the same K/V, queries, and the params pointing at all of it.
class AttentionProblem {
 public:
  AttentionProblem(const Config& c, const std::vector<SeqSpec>& seqs, uint32_t seed)
      : config_(c), seqs_(seqs), arena_(MakeArena(c, seqs)) {
    const int num_q_heads = kNumKvHeads * c.group;
    q_stride_ = num_q_heads * c.head_dim + 5;
    out_stride_ = num_q_heads * c.head_dim + 3;
    std::mt19937 rng(seed);
    // Block ids of every present chunk, shuffled: consecutive blocks of a sequence land
    // anywhere, in any chunk.
    std::vector<int32_t> ids;
    for (int chunk = 0; chunk < arena_.num_chunks(); ++chunk) {
      if (!arena_.present(chunk)) continue;
      for (int slot = 0; slot < arena_.blocks_per_chunk(); ++slot) {
        ids.push_back(chunk * arena_.blocks_per_chunk() + slot);
      }
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    q_indptr_ = {0};
    block_indptr_ = {0};
    size_t next_id = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int kv_len = seqs[s].kv_len;
      const int num_blocks = (kv_len + c.block_size - 1) / c.block_size;
      for (int b = 0; b < num_blocks; ++b) block_ids_.push_back(ids[next_id++]);
      block_indptr_.push_back(static_cast<int32_t>(block_ids_.size()));
      last_block_len_.push_back(kv_len - (num_blocks - 1) * c.block_size);
      q_indptr_.push_back(q_indptr_.back() + seqs[s].q_len);
      // Contiguous K and V: [kv_len][kNumKvHeads][head_dim].
      keys_.push_back(RandomFloats(kv_len * kNumKvHeads * c.head_dim, seed * 31 + s));
      values_.push_back(
          RandomFloats(kv_len * kNumKvHeads * c.head_dim, seed * 37 + s, c.value_lo, c.value_hi));
      for (int t = 0; t < kv_len; ++t) {
        const int32_t block = block_ids_[block_indptr_[s] + t / c.block_size];
        for (int h = 0; h < kNumKvHeads; ++h) {
          for (int d = 0; d < c.head_dim; ++d) {
            const int64_t i = (int64_t{t} * kNumKvHeads + h) * c.head_dim + d;
            arena_.At(kLayer, false, block, h, t % c.block_size, d) = keys_[s][i];
            arena_.At(kLayer, true, block, h, t % c.block_size, d) = values_[s][i];
          }
        }
      }
    }
    q_ = RandomFloats(int64_t{q_indptr_.back()} * q_stride_, seed + 1);
    out_.assign(int64_t{q_indptr_.back()} * out_stride_, kOutSentinel);

    params_.out = out_.data();
    params_.q = q_.data();
    params_.q_indptr = q_indptr_.data();
    params_.cache = arena_.View(kLayer);
    params_.blocks = {block_indptr_.data(), block_ids_.data(), last_block_len_.data(),
                      static_cast<int32_t>(seqs.size())};
    params_.num_q_heads = num_q_heads;
    params_.q_stride = q_stride_;
    params_.out_stride = out_stride_;
    params_.sm_scale = c.score_scale / std::sqrt(static_cast<float>(c.head_dim));
    params_.causal = c.causal;
  }

  PagedAttentionParams& params() { return params_; }
  // The arrays params() points into, for tests that corrupt them in place.
  std::vector<int32_t>& q_indptr() { return q_indptr_; }
  std::vector<int32_t>& block_indptr() { return block_indptr_; }
  std::vector<int32_t>& block_ids() { return block_ids_; }
  std::vector<int32_t>& last_block_len() { return last_block_len_; }
  const std::vector<float>& out() const { return out_; }
  TestArena& arena() { return arena_; }

  // float64 attention over the contiguous K/V: [total_q][num_q_heads * head_dim].
  std::vector<double> Reference() const {
    const int hd = config_.head_dim, num_q_heads = params_.num_q_heads;
    std::vector<double> ref(int64_t{q_indptr_.back()} * num_q_heads * hd, 0.0);
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const int q_len = seqs_[s].q_len, kv_len = seqs_[s].kv_len;
      for (int j = 0; j < q_len; ++j) {
        const int row = q_indptr_[s] + j;
        const int visible = config_.causal ? kv_len - q_len + j + 1 : kv_len;
        for (int h = 0; h < num_q_heads; ++h) {
          const int kvh = h / config_.group;
          std::vector<double> p(visible);
          for (int t = 0; t < visible; ++t) {
            double dot = 0;
            for (int d = 0; d < hd; ++d) {
              dot += double{q_[int64_t{row} * q_stride_ + h * hd + d]} *
                     keys_[s][(int64_t{t} * kNumKvHeads + kvh) * hd + d];
            }
            p[t] = dot * params_.sm_scale;
          }
          const double max_score = *std::max_element(p.begin(), p.end());
          double sum = 0;
          for (double& x : p) sum += (x = std::exp(x - max_score));
          for (int t = 0; t < visible; ++t) {
            for (int d = 0; d < hd; ++d) {
              ref[(int64_t{row} * num_q_heads + h) * hd + d] +=
                  p[t] / sum * values_[s][(int64_t{t} * kNumKvHeads + kvh) * hd + d];
            }
          }
        }
      }
    }
    return ref;
  }

  // Error of out() against Reference(); also fails the test if a padding column of out
  // was written.
  double Error() const {
    const int width = params_.num_q_heads * config_.head_dim;
    for (int r = 0; r < q_indptr_.back(); ++r) {
      for (int c = width; c < out_stride_; ++c) {
        EXPECT_EQ(out_[int64_t{r} * out_stride_ + c], kOutSentinel) << "padding written";
      }
    }
    const std::vector<double> ref = Reference();
    return MaxRowRelError(out_.data(), ref.data(), q_indptr_.back(), width, out_stride_);
  }

 private:
  // Chunks of 4 blocks, chunk 1 released, room for all sequences plus spare blocks.
  static TestArena MakeArena(const Config& c, const std::vector<SeqSpec>& seqs) {
    int blocks = 0;
    for (const SeqSpec& s : seqs) blocks += (s.kv_len + c.block_size - 1) / c.block_size;
    const int chunk_shift = 2;
    const int num_chunks = (blocks * 3 / 2) / 4 + 3;
    return TestArena(/*num_layers=*/2, kNumKvHeads, c.block_size, c.head_dim, chunk_shift,
                     num_chunks, /*released=*/{1});
  }

  Config config_;
  std::vector<SeqSpec> seqs_;
  TestArena arena_;
  int q_stride_ = 0, out_stride_ = 0;
  std::vector<int32_t> q_indptr_, block_indptr_, block_ids_, last_block_len_;
  std::vector<std::vector<float>> keys_, values_;
  std::vector<float> q_, out_;
  PagedAttentionParams params_;
};

TEST(PagedAttentionTest, ScatteredBlocksEqualContiguousAttentionForMixedBatch) {
  CpuBackend backend(3);
  const int head_dims[] = {8, 12, 16, 64};
  int combo = 0;
  for (int block_size : {1, 5, 16, 64}) {
    for (int group : {1, 2, 4, 8}) {
      const Config c{block_size, group, head_dims[combo++ % 4]};
      SCOPED_TRACE(::testing::Message() << "block_size=" << block_size << " group=" << group
                                        << " head_dim=" << c.head_dim);
      AttentionProblem problem(c, MixedBatch(block_size), 100 + combo);
      ASSERT_TRUE(backend.PagedAttention(problem.params()).ok());
      EXPECT_LT(problem.Error(), kMaxRelError);
    }
  }
}

TEST(PagedAttentionTest, NonCausalRowsSeeEveryKey) {
  CpuBackend backend(2);
  Config c{5, 2, 16};
  c.causal = false;
  // Non-causal allows more queries than keys.
  AttentionProblem problem(c, {{4, 11}, {6, 3}, {1, 5}}, 7);
  ASSERT_TRUE(backend.PagedAttention(problem.params()).ok());
  EXPECT_LT(problem.Error(), kMaxRelError);
}

TEST(PagedAttentionTest, SoftmaxIsStableForScoresThatOverflowExp) {
  CpuBackend backend(2);
  Config c{16, 4, 64};
  c.score_scale = 400.0f;  // scores reach hundreds: exp() of them overflows float
  AttentionProblem problem(c, MixedBatch(16), 8);
  ASSERT_TRUE(backend.PagedAttention(problem.params()).ok());
  EXPECT_LT(problem.Error(), kMaxRelError);
}

// Long contexts keep the reference's accuracy. Values with a common offset (as real V rows
// have) make the output as large as the values, so the error of the softmax sum and of the
// weighted value sum shows in full; over 32k keys and more, one running fp32 sum of each
// drifts past kMaxRelError.
TEST(PagedAttentionTest, LongContextsStayWithinTheTolerance) {
  CpuBackend backend(2);
  for (const int block_size : {16, 1}) {
    SCOPED_TRACE(::testing::Message() << "block_size=" << block_size);
    Config c{block_size, 1, 32};
    c.value_lo = 1.0f;
    c.value_hi = 2.0f;
    AttentionProblem problem(c, {{1, 131072}, {2, 32768}}, 21);
    ASSERT_TRUE(backend.PagedAttention(problem.params()).ok());
    EXPECT_LT(problem.Error(), kMaxRelError);
  }
}

TEST(PagedAttentionTest, BitwiseIdenticalFor1And2And7Threads) {
  const Config c{5, 4, 12};
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 7}) {
    CpuBackend backend(threads);
    AttentionProblem problem(c, MixedBatch(5), 9);
    ASSERT_TRUE(backend.PagedAttention(problem.params()).ok());
    outs.push_back(problem.out());
  }
  EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[2].data(), outs[0].size() * sizeof(float)));
}

TEST(PagedAttentionTest, EmptyBatchIsANoOp) {
  CpuBackend backend(1);
  EXPECT_TRUE(backend.PagedAttention({}).ok());
}

TEST(PagedAttentionTest, BadParamsAreInvalidArgumentAndWriteNothing) {
  CpuBackend backend(2);
  // Two sequences: 3 queries over 9 keys (3 blocks of 4), a decode over 6 keys (2 blocks).
  const Config c{4, 2, 8};
  {
    AttentionProblem good(c, {{3, 9}, {1, 6}}, 11);
    ASSERT_TRUE(backend.PagedAttention(good.params()).ok());
    good.params().max_kv_len = 9;  // kept promises
    good.params().max_q_len = 3;
    ASSERT_TRUE(backend.PagedAttention(good.params()).ok());
  }
  auto expect_invalid = [&](const char* field, auto mutate) {
    AttentionProblem bad(c, {{3, 9}, {1, 6}}, 11);
    mutate(bad);
    const absl::Status s = backend.PagedAttention(bad.params());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("PagedAttention"));
    EXPECT_THAT(s.message(), HasSubstr(field));
    for (float x : bad.out()) ASSERT_EQ(x, kOutSentinel) << field << ": out written";
  };
  using P = AttentionProblem;
  expect_invalid("out", [](P& p) { p.params().out = nullptr; });
  expect_invalid("q is", [](P& p) { p.params().q = nullptr; });
  expect_invalid("q_indptr", [](P& p) { p.params().q_indptr = nullptr; });
  expect_invalid("blocks.indices", [](P& p) { p.params().blocks.indices = nullptr; });
  expect_invalid("blocks.last_block_len", [](P& p) { p.params().blocks.last_block_len = nullptr; });
  expect_invalid("cache.chunks", [](P& p) { p.params().cache.chunks = nullptr; });
  expect_invalid("blocks.num_seqs", [](P& p) { p.params().blocks.num_seqs = -1; });
  expect_invalid("num_q_heads", [](P& p) { p.params().num_q_heads = 3; });  // 2 KV heads
  expect_invalid("num_q_heads", [](P& p) { p.params().num_q_heads = 0; });
  expect_invalid("cache.head_dim", [](P& p) { p.params().cache.head_dim = 0; });
  expect_invalid("cache.block_size", [](P& p) { p.params().cache.block_size = -4; });
  expect_invalid("cache.num_chunks", [](P& p) { p.params().cache.num_chunks = 0; });
  expect_invalid("cache.chunk_shift", [](P& p) { p.params().cache.chunk_shift = -1; });
  expect_invalid("q_stride", [](P& p) { p.params().q_stride = 8; });
  expect_invalid("out_stride", [](P& p) { p.params().out_stride = 15; });
  expect_invalid("cache.block_bytes", [](P& p) { p.params().cache.block_bytes = 16; });
  // f32 elements are read in place: a byte offset that splits one is refused.
  expect_invalid("multiples of 4", [](P& p) { p.params().cache.block_bytes += 2; });
  expect_invalid("multiples of 4", [](P& p) { p.params().cache.v_offset_bytes += 1; });
  // The minimum block size passes int64 (2^30 * 2^30 * 8 * 4): refused, not wrapped.
  expect_invalid("cache.block_bytes", [](P& p) {
    p.params().cache.block_size = 1 << 30;
    p.params().cache.num_kv_heads = 1 << 30;
  });
  expect_invalid("outside the arena", [](P& p) {
    p.block_ids()[2] = p.params().cache.num_chunks << p.params().cache.chunk_shift;
  });
  expect_invalid("outside the arena", [](P& p) { p.block_ids()[4] = -1; });
  expect_invalid("released (null) chunk", [](P& p) {
    p.block_ids()[3] = 1 * 4 + 2;  // chunk 1 (4 blocks per chunk) is released
  });
  expect_invalid("last_block_len", [](P& p) { p.last_block_len()[1] = 0; });
  expect_invalid("last_block_len", [](P& p) { p.last_block_len()[0] = 5; });  // block_size 4
  expect_invalid("q_len 3 > kv_len 1", [](P& p) {
    p.block_indptr()[1] = 1;    // sequence 0 keeps 1 block ...
    p.last_block_len()[0] = 1;  // ... holding 1 token, for 3 causal queries
  });
  expect_invalid("q_indptr decreases", [](P& p) { p.q_indptr()[1] = 5; });
  // A decrease to a large negative entry must not pass as a long sequence (1 - INT32_MIN
  // wraps to a positive length in int32): it is caught at the sequence where it happens.
  expect_invalid("q_indptr decreases at sequence 0", [](P& p) {
    p.q_indptr()[0] = 1;
    p.q_indptr()[1] = std::numeric_limits<int32_t>::min();
  });
  expect_invalid("blocks.indptr decreases at sequence 0", [](P& p) {
    p.block_indptr()[0] = 1;
    p.block_indptr()[1] = std::numeric_limits<int32_t>::min();
  });
  // Sequence 0 has 3 query rows: a promise of at most 1 (or a negative one) is broken.
  expect_invalid("max_q_len 1", [](P& p) { p.params().max_q_len = 1; });
  expect_invalid("max_q_len is -1", [](P& p) { p.params().max_q_len = -1; });
  // Sequence 0 has the longest context, 9 keys: a promise of 8 is broken (9 is kept, above).
  expect_invalid("sequence 0 has kv_len 9 > max_kv_len 8", [](P& p) { p.params().max_kv_len = 8; });
  expect_invalid("max_kv_len is -1", [](P& p) { p.params().max_kv_len = -1; });
  expect_invalid("no blocks", [](P& p) { p.block_indptr()[2] = p.block_indptr()[1]; });
}

// max_kv_len promises the longest context of a sequence with query rows: one without any
// may be longer.
TEST(PagedAttentionTest, TheKvLengthPromiseCoversSequencesWithQueryRows) {
  CpuBackend backend(1);
  AttentionProblem problem(Config{4, 2, 8}, {{3, 9}, {0, 12}, {1, 6}}, 5);
  problem.params().max_kv_len = 9;
  const absl::Status kept = backend.PagedAttention(problem.params());
  EXPECT_TRUE(kept.ok()) << kept;
  problem.params().max_kv_len = 8;
  const absl::Status broken = backend.PagedAttention(problem.params());
  EXPECT_EQ(broken.code(), absl::StatusCode::kInvalidArgument) << broken;
  EXPECT_THAT(broken.message(), HasSubstr("sequence 0 has kv_len 9 > max_kv_len 8"));
}

TEST(PagedAttentionTest, NonF32CacheIsUnimplemented) {
  CpuBackend backend(1);
  AttentionProblem problem(Config{4, 1, 8}, {{1, 3}}, 12);
  problem.params().cache.dtype = DType::kFp8E4M3;
  const absl::Status s = backend.PagedAttention(problem.params());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("PagedAttention"));
  EXPECT_THAT(s.message(), HasSubstr("fp8"));
}

}  // namespace
}  // namespace kvd
