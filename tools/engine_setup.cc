#include "tools/engine_setup.h"

#include "absl/strings/str_cat.h"

namespace kvd {

absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateCacheForSequences(
    const ModelSpec& spec, Backend* backend, Clock* clock, int32_t block_size,
    int32_t num_sequences, bool enable_prefix_caching) {
  if (block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block size must be at least 1, got ", block_size));
  }
  const KvShape shape{spec.num_layers, spec.num_kv_heads, spec.head_dim};
  auto layout = KvLayout::Create(shape, DType::kF32, block_size);
  if (!layout.ok()) return layout.status();
  const int64_t blocks_per_seq = layout->BlocksForTokens(spec.max_context_tokens) + 1;
  const int64_t bytes = layout->block_bytes() * blocks_per_seq * num_sequences;
  KvCacheOptions options;
  options.block_size = block_size;
  options.kv_dtype = DType::kF32;
  // One chunk holds the whole load, rounded up to a power-of-two number of blocks.
  int64_t blocks = 1;
  while (blocks * layout->block_bytes() < bytes) blocks *= 2;
  options.chunk_bytes = blocks * layout->block_bytes();
  options.initial_pool_bytes = options.chunk_bytes;
  options.max_pool_bytes = options.chunk_bytes;
  options.enable_prefix_caching = enable_prefix_caching;
  options.enable_defrag = false;
  return KvCacheManager::Create(options, shape, backend, clock);
}

}  // namespace kvd
