#include "server/serve_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cache/kv_cache_options.h"
#include "cache/kv_layout.h"
#include "cache/memory_estimator.h"
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

// Every config key `kvd serve` hands to the cache reaches its own option: each set to a value
// that is neither its default nor any other key's.
TEST(CacheOptionsFromTest, EveryKeyReachesItsOption) {
  KvCacheConfig kv;
  kv.block_size = 32;
  kv.memory_pool.initial_size_bytes = int64_t{3} << 20;
  kv.memory_pool.max_size_bytes = int64_t{5} << 30;
  kv.memory_pool.device_headroom_bytes = int64_t{7} << 20;
  kv.memory_pool.growth_retry_interval = absl::Seconds(42);
  kv.enable_prefix_caching = false;
  kv.session.idle_timeout = absl::Seconds(77);
  kv.session.max_pinned_fraction = 0.375;
  kv.defrag.enabled = false;
  kv.defrag.interval = absl::Milliseconds(1234);
  kv.defrag.max_pause = absl::Microseconds(4321);
  kv.defrag.max_moves_per_step = 99;
  kv.eviction_policy = EvictionPolicyKind::kChunkLru;
  const KvCacheOptions o = CacheOptionsFrom(kv, DType::kBF16, kLlama3_8b);
  EXPECT_EQ(o.block_size, 32);
  EXPECT_EQ(o.kv_dtype, DType::kBF16);
  EXPECT_EQ(o.initial_pool_bytes, int64_t{3} << 20);
  EXPECT_EQ(o.max_pool_bytes, int64_t{5} << 30);
  EXPECT_EQ(o.device_headroom_bytes, int64_t{7} << 20);
  EXPECT_EQ(o.growth_retry_interval, absl::Seconds(42));
  EXPECT_FALSE(o.enable_prefix_caching);
  EXPECT_EQ(o.eviction_policy, "chunk_lru");
  EXPECT_EQ(o.session_idle_timeout, absl::Seconds(77));
  EXPECT_EQ(o.max_pinned_fraction, 0.375);
  EXPECT_FALSE(o.enable_defrag);
  EXPECT_EQ(o.defrag_interval, absl::Milliseconds(1234));
  EXPECT_EQ(o.defrag_max_pause, absl::Microseconds(4321));
  EXPECT_EQ(o.defrag_max_moves_per_step, 99);
  // And the switches the other way, from their defaults.
  const KvCacheOptions defaults = CacheOptionsFrom(KvCacheConfig{}, DType::kBF16, kLlama3_8b);
  EXPECT_TRUE(defaults.enable_prefix_caching);
  EXPECT_TRUE(defaults.enable_defrag);
  EXPECT_EQ(defaults.eviction_policy, "lru");
}

// kv_cache_config.quantization picks the cache's dtype (none: the backend's own), and the
// pool counts a quantized block with its scales.
TEST(CacheOptionsFromTest, QuantizationPicksTheKvDtype) {
  EXPECT_EQ(KvDtypeFor(KvQuantization::kNone, DType::kF32), DType::kF32);
  EXPECT_EQ(KvDtypeFor(KvQuantization::kNone, DType::kBF16), DType::kBF16);
  EXPECT_EQ(KvDtypeFor(KvQuantization::kInt8, DType::kF32), DType::kInt8);
  EXPECT_EQ(KvDtypeFor(KvQuantization::kBF16, DType::kF32), DType::kBF16);
  EXPECT_EQ(KvDtypeFor(KvQuantization::kFP16, DType::kBF16), DType::kF16);
  EXPECT_EQ(KvDtypeFor(KvQuantization::kFP8, DType::kBF16), DType::kFp8E4M3);
  EXPECT_EQ(KvDtypeFor(KvQuantization::kInt4, DType::kBF16), DType::kInt4);
  KvCacheConfig kv;
  kv.quantization = KvQuantization::kInt8;
  kv.memory_pool.max_size_bytes = int64_t{64} << 20;
  const KvCacheOptions o = CacheOptionsFrom(kv, DType::kF32, kStories260K);
  EXPECT_EQ(o.kv_dtype, DType::kInt8);
  const KvLayout layout = *KvLayout::Create(kStories260K, DType::kInt8, 16);
  EXPECT_EQ(layout.block_bytes(), 7680);  // 5 layers x K, V x (4 heads x 16 x (8 + 4 bytes))
  EXPECT_EQ(KvPoolGeometry::Compute(o, layout)->chunk_bytes, 512 * 7680);  // <= 64MiB / 16
}

TEST(CheckServableTest, Int8RunsOnBothDevicesInt4OnNeither) {
  InferenceConfig config;
  config.kv_cache.quantization = KvQuantization::kInt8;
  EXPECT_TRUE(CheckServable(config, Device::kCpu).ok());
  EXPECT_TRUE(CheckServable(config, Device::kCuda).ok());
  config.kv_cache.quantization = KvQuantization::kInt4;
  const absl::Status cuda = CheckServable(config, Device::kCuda);
  EXPECT_EQ(cuda.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(cuda), HasSubstr("kv_cache_config.quantization: 'int4'"));
  EXPECT_THAT(Message(cuda), HasSubstr("on cpu: none, int8"));
  EXPECT_EQ(CheckServable(config, Device::kCpu).code(), absl::StatusCode::kUnimplemented);
}

// growth_retry_interval 0 means no tries: the cache's option is infinite (only a released chunk
// lifts a stop), where a zero interval would be an invalid option.
TEST(CacheOptionsFromTest, AGrowthRetryIntervalOfZeroMeansNoTries) {
  KvCacheConfig kv;
  kv.memory_pool.growth_retry_interval = absl::ZeroDuration();
  const KvCacheOptions o = CacheOptionsFrom(kv, DType::kBF16, kLlama3_8b);
  EXPECT_EQ(o.growth_retry_interval, absl::InfiniteDuration());
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_EQ(CacheOptionsFrom(KvCacheConfig{}, DType::kBF16, kLlama3_8b).growth_retry_interval,
            absl::Seconds(10));
}

TEST(EngineOptionsFromTest, EveryKeyReachesItsOption) {
  InferenceConfig config;
  config.kv_cache.max_batch_size = 21;
  config.scheduler.max_num_batched_tokens = 1111;
  config.scheduler.prefill_chunk_tokens = 333;
  config.scheduler.predictor_quantile = 0.625;
  config.server.max_waiting_requests = 44;
  config.kv_cache.max_seq_length = 777;
  const EngineOptions o = EngineOptionsFrom(config);
  EXPECT_EQ(o.max_batch_size, 21);
  EXPECT_EQ(o.max_num_batched_tokens, 1111);
  EXPECT_EQ(o.prefill_chunk_tokens, 333);
  EXPECT_EQ(o.predictor_quantile, 0.625);
  EXPECT_EQ(o.max_waiting_requests, 44);
  EXPECT_EQ(o.max_context_tokens, 777);  // the engine caps it at the model's context
  for (const auto& [policy, mode] :
       {std::pair{AdmissionPolicyKind::kPredicted, AdmissionMode::kPredicted},
        std::pair{AdmissionPolicyKind::kReserveMax, AdmissionMode::kReserveMax},
        std::pair{AdmissionPolicyKind::kOptimistic, AdmissionMode::kOptimistic}}) {
    config.scheduler.admission_policy = policy;
    EXPECT_EQ(EngineOptionsFrom(config).admission, mode) << static_cast<int>(policy);
  }
  // What a valid config makes, the engine takes (EngineLoop aborts on anything else).
  EXPECT_TRUE(EngineOptionsFrom(InferenceConfig{}).Validate().ok());
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
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

// Chunks aim at 16 MiB, but at most 1/16 of the pool: 8 GiB of stories260K's 20 KiB blocks
// gets the most blocks, a power of two, within 16 MiB (512 = 10 MiB); 1 MiB gets chunks of
// 2 blocks (the most within 64 KiB), 25 of them, not one chunk of 32 blocks (640 KiB).
TEST(CacheOptionsFromTest, ChunksAreAtMostSixteenMiBAndASixteenthOfThePool) {
  KvCacheConfig kv;
  EXPECT_EQ(Translate(kv, DType::kF32, kStories260K).options.chunk_bytes, 512 * 20480);
  kv.memory_pool.initial_size_bytes = 0;
  kv.memory_pool.max_size_bytes = int64_t{1} << 20;
  const Translated t = Translate(kv, DType::kF32, kStories260K);
  EXPECT_EQ(t.options.chunk_bytes, 2 * 20480);
  ASSERT_TRUE(t.geometry.ok()) << t.geometry.status();
  EXPECT_EQ(t.geometry->max_chunks, 25);
  EXPECT_EQ(t.geometry->initial_chunks, 1);
}

// The reviewer's pools of stories260K: 64 MiB served 3072 blocks (6 chunks of 10 MiB, 60 MiB)
// and just under 20 MiB one 10 MiB chunk; 2.5 MiB and 640 KiB chunks lose far less.
TEST(CacheOptionsFromTest, SmallPoolsKeepNearlyAllOfMaxSize) {
  KvCacheConfig kv;
  kv.memory_pool.initial_size_bytes = 0;
  kv.memory_pool.max_size_bytes = int64_t{64} << 20;
  Translated t = Translate(kv, DType::kF32, kStories260K);
  ASSERT_TRUE(t.geometry.ok()) << t.geometry.status();
  EXPECT_EQ(t.geometry->chunk_bytes, 128 * 20480);
  EXPECT_EQ(t.geometry->max_chunks, 25);  // 3200 blocks, 62.5 MiB
  kv.memory_pool.max_size_bytes = (int64_t{20} << 20) - 1;
  t = Translate(kv, DType::kF32, kStories260K);
  ASSERT_TRUE(t.geometry.ok()) << t.geometry.status();
  EXPECT_EQ(t.geometry->chunk_bytes, 32 * 20480);
  EXPECT_EQ(t.geometry->max_chunks, 31);  // 992 blocks, 19.375 MiB
}

struct PoolCase {
  const char* model;
  KvShape shape;
  DType dtype;
  int32_t block_size;
};

// Blocks of 1280 bytes to 32 MiB: stories260K, llama2-7b (MHA) and llama3-8b (GQA) shapes.
const PoolCase kPoolCases[] = {
    {"stories260K", kStories260K, DType::kF32, 1},    // 1280-byte blocks
    {"stories260K", kStories260K, DType::kF32, 16},   // 20 KiB
    {"stories260K", kStories260K, DType::kF32, 256},  // 320 KiB
    {"llama3-8b", kLlama3_8b, DType::kBF16, 16},      // 2 MiB
    {"llama3-8b", kLlama3_8b, DType::kF32, 64},       // 16 MiB
    {"llama2-7b", {32, 32, 128}, DType::kBF16, 32},   // 16 MiB
    {"llama3-8b", kLlama3_8b, DType::kBF16, 256},     // 32 MiB, more than a 16 MiB chunk
    {"llama2-7b", {32, 32, 128}, DType::kF32, 256},   // 256 MiB
    {"stories260K", kStories260K, DType::kInt8, 16},  // 7680 bytes: int8 with its scales
    {"llama3-8b", kLlama3_8b, DType::kInt8, 16},      // 1056 KiB
};

std::string Describe(const PoolCase& c, int64_t max_bytes) {
  return absl::StrCat(c.model, " ", std::string(DTypeName(c.dtype)), " block_size ", c.block_size,
                      ", max_size ", max_bytes);
}

// Just under 2 chunks of the old 16 MiB aim (and of 10 MiB ones), deploy/kvd.yaml's 512 MiB,
// the default 8 GiB, decimal sizes and more.
const int64_t kMaxSizes[] = {
    int64_t{1} << 20, (int64_t{20} << 20) - 1,    (int64_t{32} << 20) - 1, int64_t{64} << 20,
    100'000'000,      int64_t{512} << 20,         1'000'000'000,           int64_t{8} << 30,
    80'000'000'000,   (int64_t{1} << 40) + 12345,
};

// Serve rounds max_size down to whole chunks; that loses less than 1/16 of max_size, or less
// than one block when a block is larger, for any model, block size and pool.
// Calls fn(case, max_bytes, block_bytes, what, translated) for every pool case and every
// max size of at least one block (smaller ones are refused: CheckPoolSizeTest).
template <typename Fn>
void ForEachPool(Fn fn) {
  for (const PoolCase& c : kPoolCases) {
    KvCacheConfig kv;
    kv.block_size = c.block_size;
    kv.memory_pool.initial_size_bytes = 0;
    const int64_t block_bytes = KvLayout::Create(c.shape, c.dtype, c.block_size)->block_bytes();
    for (const int64_t max_bytes : kMaxSizes) {
      if (max_bytes < block_bytes) continue;
      kv.memory_pool.max_size_bytes = max_bytes;
      fn(c, max_bytes, block_bytes, Describe(c, max_bytes), Translate(kv, c.dtype, c.shape));
    }
  }
}

TEST(CacheOptionsFromTest, RoundingMaxSizeDownToWholeChunksLosesUnderASixteenthOrOneBlock) {
  ForEachPool([](const PoolCase&, int64_t max_bytes, int64_t block_bytes, const std::string& what,
                 const Translated& t) {
    ASSERT_TRUE(t.check.ok()) << what << ": " << t.check;
    ASSERT_TRUE(t.geometry.ok()) << what << ": " << t.geometry.status();
    // The options ask for the chunk the cache makes (kvd_kv_pool_max_bytes counts in it).
    EXPECT_EQ(t.geometry->chunk_bytes, t.options.chunk_bytes) << what;
    const int64_t usable = int64_t{t.geometry->max_chunks} * t.geometry->chunk_bytes;
    EXPECT_LE(usable, max_bytes) << what;
    EXPECT_LT(max_bytes - usable, std::max(max_bytes / 16, block_bytes))
        << what << ": usable " << usable << " in chunks of " << t.geometry->chunk_bytes;
  });
}

// `kvd estimate --budget B` counts the blocks `kvd serve` has with max_size B (its
// tokens_in_budget and sequences_in_budget are whole blocks of that pool).
TEST(CacheOptionsFromTest, EstimateBudgetHasTheBlocksServeHas) {
  ForEachPool([](const PoolCase& c, int64_t max_bytes, int64_t, const std::string& what,
                 const Translated& t) {
    ASSERT_TRUE(t.geometry.ok()) << what << ": " << t.geometry.status();
    const int64_t serve_blocks = t.geometry->max_blocks();
    MemoryEstimateRequest r;
    r.num_layers = c.shape.num_layers;
    r.d_model = c.shape.num_kv_heads * c.shape.head_dim;
    r.num_kv_heads = c.shape.num_kv_heads;
    r.head_dim = c.shape.head_dim;
    r.kv_dtype = c.dtype;
    r.block_size = c.block_size;
    r.seq_len = 512;
    r.budget_bytes = max_bytes;
    const absl::StatusOr<MemoryEstimate> e = MemoryEstimator::Estimate(r);
    ASSERT_TRUE(e.ok()) << what << ": " << e.status();
    EXPECT_EQ(e->tokens_in_budget, serve_blocks * c.block_size) << what;
    EXPECT_EQ(e->sequences_in_budget, serve_blocks / e->blocks_per_sequence) << what;
  });
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
