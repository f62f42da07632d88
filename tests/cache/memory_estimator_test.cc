#include "cache/memory_estimator.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

MemoryEstimateRequest Llama7b() {
  MemoryEstimateRequest r;
  r.num_layers = 32;
  r.d_model = 4096;
  r.num_kv_heads = 32;
  r.head_dim = 128;
  r.kv_dtype = DType::kF16;
  r.batch = 4;
  r.seq_len = 2048;
  return r;
}

TEST(MemoryEstimatorTest, ReproducesTheSeedsWorkedExampleForLlama7b) {
  const MemoryEstimate e = *MemoryEstimator::Estimate(Llama7b());
  EXPECT_EQ(e.seed_batch_bytes, 4'294'967'296);
  // Multi-head attention: the exact formula agrees, and 2048 tokens fill whole blocks.
  EXPECT_EQ(e.batch_bytes, 4'294'967'296);
  EXPECT_EQ(e.batch_bytes_paged, 4'294'967'296);
  EXPECT_EQ(e.bytes_per_token, 524'288);
  EXPECT_DOUBLE_EQ(e.seed_over_exact, 1.0);
}

TEST(MemoryEstimatorTest, GqaModelNeedsFourTimesLessThanTheSeedsFormulaSays) {
  MemoryEstimateRequest r;  // llama3-8b
  r.num_layers = 32;
  r.d_model = 4096;
  r.num_kv_heads = 8;
  r.head_dim = 128;
  r.kv_dtype = DType::kBF16;
  r.batch = 1;
  r.seq_len = 8192;
  const MemoryEstimate e = *MemoryEstimator::Estimate(r);
  EXPECT_EQ(e.bytes_per_token, 131'072);
  EXPECT_EQ(e.seed_bytes_per_token, 524'288);
  EXPECT_DOUBLE_EQ(e.seed_over_exact, 4.0);
  EXPECT_EQ(e.bytes_per_block, 16 * 131'072);
}

TEST(MemoryEstimatorTest, PagedBytesRoundUpToWholeBlocksAndBudgetCountsSequences) {
  MemoryEstimateRequest r = Llama7b();
  r.seq_len = 2049;                    // one token into a 129th block
  r.budget_bytes = int64_t{10} << 30;  // 10 GiB
  const MemoryEstimate e = *MemoryEstimator::Estimate(r);
  EXPECT_EQ(e.blocks_per_sequence, 129);
  EXPECT_EQ(e.batch_bytes, 4 * 2049 * int64_t{524'288});
  EXPECT_EQ(e.batch_bytes_paged, 4 * 129 * 16 * int64_t{524'288});
  EXPECT_EQ(e.sequences_in_budget, (int64_t{10} << 30) / (129 * 16 * int64_t{524'288}));
  EXPECT_EQ(e.tokens_in_budget, (int64_t{10} << 30) / (16 * int64_t{524'288}) * 16);
  EXPECT_THAT(MemoryEstimator::Format(r, e), ::testing::HasSubstr("seeds' formula"));
}

// stories260K's KV shape in f32: 20 KiB blocks, 32 of them for 512 tokens.
MemoryEstimateRequest Stories260K() {
  MemoryEstimateRequest r;
  r.num_layers = 5;
  r.d_model = 64;
  r.num_kv_heads = 4;
  r.head_dim = 8;
  r.kv_dtype = DType::kF32;
  r.seq_len = 512;
  return r;
}

// The budget is read as memory_pool.max_size: the pool `kvd serve` builds of it is whole
// chunks of a power-of-two number of blocks (KvPoolGeometry), not budget / block bytes.
TEST(MemoryEstimatorTest, BudgetIsThePoolServeBuildsFromMaxSize) {
  MemoryEstimateRequest r = Stories260K();
  r.budget_bytes = int64_t{512} << 20;  // deploy/kvd.yaml: 51 chunks of 512 blocks (10 MiB)
  MemoryEstimate e = *MemoryEstimator::Estimate(r);
  EXPECT_EQ(e.tokens_in_budget, 26112 * 16);  // not 26214 blocks' worth
  EXPECT_EQ(e.sequences_in_budget, 816);      // not 819
  r.budget_bytes = int64_t{64} << 20;         // 25 chunks of 128 blocks (2.5 MiB)
  e = *MemoryEstimator::Estimate(r);
  EXPECT_EQ(e.tokens_in_budget, 3200 * 16);
  EXPECT_EQ(e.sequences_in_budget, 100);
  EXPECT_THAT(MemoryEstimator::Format(r, e),
              ::testing::HasSubstr("as memory_pool.max_size: 25 chunks of 2621440 bytes, 3200 "
                                   "blocks, 65536000 bytes"));
}

// A budget that `kvd serve` refuses as max_size is an error, not a count.
TEST(MemoryEstimatorTest, BudgetServeRefusesIsAnError) {
  MemoryEstimateRequest r = Stories260K();
  r.budget_bytes = 20479;  // less than one block
  absl::StatusOr<MemoryEstimate> e = MemoryEstimator::Estimate(r);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()),
              ::testing::HasSubstr("budget_bytes=20479 is smaller than one KV block (20480"));
  r.budget_bytes = (int64_t{20480} << 30) + 20480;  // 2^30 + 1 blocks
  e = MemoryEstimator::Estimate(r);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()),
              ::testing::HasSubstr("holds more than 1073741824 KV blocks"));
  r.budget_bytes = int64_t{20480} << 30;  // the largest pool serve takes
  e = MemoryEstimator::Estimate(r);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens_in_budget, (int64_t{1} << 30) * 16);
}

TEST(MemoryEstimatorTest, QuantizedDtypesCountTheirScales) {
  MemoryEstimateRequest r = Llama7b();
  r.kv_dtype = DType::kInt8;
  r.seq_len = 16;
  r.batch = 1;
  const MemoryEstimate e = *MemoryEstimator::Estimate(r);
  EXPECT_EQ(e.bytes_per_token, 2 * 32 * 32 * 128);
  // One fp32 scale per token and KV head in each of 64 regions.
  EXPECT_DOUBLE_EQ(e.bytes_per_token_with_scales, 2 * 32 * 32 * 128 + 64 * 32 * 4);
  EXPECT_EQ(e.batch_bytes, 16 * (2 * 32 * 32 * 128 + 64 * 32 * 4));
  // A budget holds whole blocks with their scales, as the arena stores them.
  r.budget_bytes = int64_t{1} << 30;
  const MemoryEstimate budget = *MemoryEstimator::Estimate(r);
  EXPECT_EQ(budget.bytes_per_block, 16 * (2 * 32 * 32 * 128 + 64 * 32 * 4));
  EXPECT_EQ(budget.pool_bytes, budget.pool_blocks * budget.bytes_per_block);
  EXPECT_LE(budget.pool_bytes, r.budget_bytes);
  EXPECT_THAT(MemoryEstimator::Format(r, budget),
              ::testing::HasSubstr(absl::StrCat(" (", budget.pool_blocks * 64 * 32 * 16 * 4,
                                                " of them scales and padding)")));
}

TEST(MemoryEstimatorTest, RejectsEmptyWorkloads) {
  MemoryEstimateRequest r = Llama7b();
  r.seq_len = 0;
  EXPECT_EQ(MemoryEstimator::Estimate(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Llama7b();
  r.num_kv_heads = 0;
  EXPECT_EQ(MemoryEstimator::Estimate(r).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd
