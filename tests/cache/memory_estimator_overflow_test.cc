#include <cstdint>
#include <limits>
#include <string>

#include "cache/memory_estimator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// llama3-8b: 131072 bytes of KV per token in bf16 (2^17), 2 MiB per 16-token block; the
// d_model formula says 2^19 bytes per token.
MemoryEstimateRequest Llama3_8b(int64_t batch, int64_t seq_len) {
  MemoryEstimateRequest r;
  r.num_layers = 32;
  r.d_model = 4096;
  r.num_kv_heads = 8;
  r.head_dim = 128;
  r.kv_dtype = DType::kBF16;
  r.batch = batch;
  r.seq_len = seq_len;
  return r;
}

std::string Message(const absl::StatusOr<MemoryEstimate>& e) {
  return std::string(e.status().message());
}

TEST(MemoryEstimatorOverflowTest, BatchBytesPastInt64AreAnErrorNamingBatchAndSeqLen) {
  // 10^6 x 10^8 tokens x 2^17 bytes ~ 1.3e19 > 2^63: printed as a negative size before.
  const absl::StatusOr<MemoryEstimate> e =
      MemoryEstimator::Estimate(Llama3_8b(1'000'000, 100'000'000));
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
  EXPECT_THAT(Message(e), AllOf(HasSubstr("batch=1000000"), HasSubstr("seq_len=100000000"),
                                HasSubstr("batch * seq_len * bytes_per_token")));
}

TEST(MemoryEstimatorOverflowTest, TheLargestSequenceLengthIsAnErrorNotNegativeBlocks) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  const absl::StatusOr<MemoryEstimate> e = MemoryEstimator::Estimate(Llama3_8b(1, max));
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
  EXPECT_THAT(Message(e), HasSubstr("seq_len=9223372036854775807"));
}

TEST(MemoryEstimatorOverflowTest, WorkloadsUpToInt64AreSizedExactly) {
  // 2^3 sequences of 2^40 tokens: 2^60 bytes exact and paged, 2^62 by the d_model formula.
  const absl::StatusOr<MemoryEstimate> e =
      MemoryEstimator::Estimate(Llama3_8b(int64_t{1} << 3, int64_t{1} << 40));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->blocks_per_sequence, int64_t{1} << 36);
  EXPECT_EQ(e->batch_bytes, int64_t{1} << 60);
  EXPECT_EQ(e->batch_bytes_paged, int64_t{1} << 60);
  EXPECT_EQ(e->seed_batch_bytes, int64_t{1} << 62);
  // Twice the batch puts the d_model formula at 2^63, one past the largest int64.
  const absl::StatusOr<MemoryEstimate> over =
      MemoryEstimator::Estimate(Llama3_8b(int64_t{1} << 4, int64_t{1} << 40));
  ASSERT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument) << over.status();
  EXPECT_THAT(Message(over), AllOf(HasSubstr("batch=16"), HasSubstr("seq_len=1099511627776"),
                                   HasSubstr("batch * seq_len * seed_bytes_per_token")));
}

TEST(MemoryEstimatorOverflowTest, AModelShapePastInt64IsAnErrorNamingItsSizes) {
  MemoryEstimateRequest r = Llama3_8b(1, 16);
  r.num_layers = std::numeric_limits<int32_t>::max();
  r.d_model = std::numeric_limits<int32_t>::max();
  const absl::StatusOr<MemoryEstimate> e = MemoryEstimator::Estimate(r);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
  EXPECT_THAT(Message(e),
              AllOf(HasSubstr("num_layers=2147483647"), HasSubstr("d_model=2147483647")));
}

}  // namespace
}  // namespace kvd
