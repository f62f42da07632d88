#include "server/serve_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "cache/kv_cache_options.h"
#include "cache/kv_layout.h"
#include "config/inference_config.h"
#include "kernels/dtype.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// KV shapes (layers, KV heads, head_dim) of synthetic:llama3-8b and stories260K.
constexpr KvShape kLlama3_8b{32, 8, 128};
constexpr KvShape kStories260K{5, 4, 8};

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// What `kvd serve` does with the KV part of a config: the cache's options, its own check,
// then the geometry the cache computes from them.
struct Translated {
  KvCacheOptions options;
  absl::Status check;
  absl::StatusOr<KvPoolGeometry> geometry;
};

Translated Translate(const KvCacheConfig& kv, DType dtype, const KvShape& shape) {
  Translated t;
  t.options = CacheOptionsFrom(kv, dtype, shape);
  t.check = CheckPoolSize(kv, t.options, shape);
  absl::StatusOr<KvLayout> layout = KvLayout::Create(shape, dtype, kv.block_size);
  EXPECT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(t.options.Validate().ok()) << t.options.Validate();
  t.geometry = KvPoolGeometry::Compute(t.options, *layout);
  return t;
}

// Llama-3-8B in bf16 at block_size 256 has 32 MiB blocks, twice the usual 16 MiB chunk: the
// chunk grows to hold one, instead of an error naming the internal chunk_bytes.
TEST(CacheOptionsFromTest, ChunksHoldOneBlockLargerThanSixteenMiB) {
  KvCacheConfig kv;
  kv.block_size = 256;
  const Translated t = Translate(kv, DType::kBF16, kLlama3_8b);
  const int64_t block_bytes = int64_t{32} << 20;
  EXPECT_EQ(t.options.chunk_bytes, block_bytes);
  EXPECT_TRUE(t.check.ok()) << t.check;
  ASSERT_TRUE(t.geometry.ok()) << t.geometry.status();
  EXPECT_EQ(t.geometry->chunk_bytes, block_bytes);
  EXPECT_EQ(t.geometry->max_chunks, kv.memory_pool.max_size_bytes / block_bytes);
}

TEST(CacheOptionsFromTest, SmallBlocksKeepSixteenMiBChunksOrTheWholePool) {
  KvCacheConfig kv;
  EXPECT_EQ(Translate(kv, DType::kF32, kStories260K).options.chunk_bytes, int64_t{16} << 20);
  kv.memory_pool.initial_size_bytes = 0;
  kv.memory_pool.max_size_bytes = int64_t{1} << 20;
  const Translated t = Translate(kv, DType::kF32, kStories260K);
  EXPECT_EQ(t.options.chunk_bytes, int64_t{1} << 20);
  ASSERT_TRUE(t.geometry.ok()) << t.geometry.status();
  EXPECT_EQ(t.geometry->max_chunks, 1);
}

// 20TB of stories260K's 20 KiB blocks is ~1.9 million 16 MiB chunks, more than a pool may
// have: the chunks grow instead (still a tiny fraction of the pool), and it serves.
TEST(CacheOptionsFromTest, HugePoolsGetLargerChunksNotTooMany) {
  KvCacheConfig kv;
  kv.memory_pool.max_size_bytes = int64_t{20'000'000'000'000};
  const Translated t = Translate(kv, DType::kF32, kStories260K);
  EXPECT_TRUE(t.check.ok()) << t.check;
  ASSERT_TRUE(t.geometry.ok()) << t.geometry.status();
  EXPECT_LE(t.geometry->max_chunks, KvPoolGeometry::kMaxChunks);
  EXPECT_EQ(t.geometry->chunk_bytes, 20480 * 1024);  // 1024 blocks, up from 512
  EXPECT_EQ(t.geometry->max_chunks, kv.memory_pool.max_size_bytes / (20480 * 1024));
}

// The chunk the pool is counted in is the one the geometry makes (512 of stories260K's
// 20 KiB blocks = 10 MiB), not the 16 MiB asked for: 12 and 15 TiB are more than 2^20 of those
// but fewer than 2^20 of 16 MiB, and must grow too.
TEST(CacheOptionsFromTest, PoolsCountInTheChunkTheGeometryMakes) {
  KvCacheConfig kv;
  for (const int64_t tib : {12, 15}) {
    kv.memory_pool.max_size_bytes = tib << 40;
    const Translated t = Translate(kv, DType::kF32, kStories260K);
    EXPECT_TRUE(t.check.ok()) << tib << " TiB: " << t.check;
    ASSERT_TRUE(t.geometry.ok()) << tib << " TiB: " << t.geometry.status();
    EXPECT_LE(t.geometry->max_chunks, KvPoolGeometry::kMaxChunks);
    EXPECT_EQ(t.geometry->chunk_bytes, 20480 * 1024);
  }
}

TEST(CheckPoolSizeTest, PoolSmallerThanOneBlockNamesMaxSize) {
  KvCacheConfig kv;
  kv.block_size = 256;
  kv.memory_pool.initial_size_bytes = 0;
  kv.memory_pool.max_size_bytes = int64_t{16} << 20;
  const absl::Status s =
      CheckPoolSize(kv, CacheOptionsFrom(kv, DType::kBF16, kLlama3_8b), kLlama3_8b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), StartsWith("kv_cache_config.memory_pool.max_size: 16MiB is smaller "
                                     "than one KV block"));
  EXPECT_THAT(Message(s), HasSubstr("allowed: at least 32MiB"));
}

// Past 2^30 blocks no chunk size helps: the error names the key and the largest size.
TEST(CheckPoolSizeTest, MoreBlocksThanAPoolHoldsNamesMaxSizeAndTheLargestAllowed) {
  KvCacheConfig kv;
  kv.block_size = 1;  // 1280-byte blocks: 2^30 of them is 1280GiB
  for (const int64_t max_bytes : {int64_t{20'000'000'000'000}, (int64_t{1280} << 30) + 1280}) {
    kv.memory_pool.max_size_bytes = max_bytes;
    const absl::Status s =
        CheckPoolSize(kv, CacheOptionsFrom(kv, DType::kF32, kStories260K), kStories260K);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(s), StartsWith("kv_cache_config.memory_pool.max_size: "));
    EXPECT_THAT(Message(s), HasSubstr("allowed: at most 1280GiB"));
    EXPECT_THAT(Message(s), Not(HasSubstr("chunk")));
  }
  kv.memory_pool.max_size_bytes = int64_t{1280} << 30;  // the largest: it serves
  const Translated t = Translate(kv, DType::kF32, kStories260K);
  EXPECT_TRUE(t.check.ok()) << t.check;
  ASSERT_TRUE(t.geometry.ok()) << t.geometry.status();
  EXPECT_EQ(int64_t{t.geometry->max_chunks} * t.geometry->blocks_per_chunk(),
            KvPoolGeometry::kMaxBlocks);
}

}  // namespace
}  // namespace kvd
