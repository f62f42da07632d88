#include "tools/engine_setup.h"

#include "absl/strings/str_cat.h"
#include "tools/device.h"

namespace kvd {
namespace {

// Largest chunk CreateCache makes (unless one block is larger).
constexpr int64_t kMaxChunkBytes = int64_t{1} << 30;

}  // namespace

absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateCache(const ModelSpec& spec, Backend* backend,
                                                            Clock* clock,
                                                            const CacheSizing& sizing) {
  if (sizing.block_size < 1 || sizing.num_sequences < 1 || sizing.tokens_per_sequence < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache sizing: block size (", sizing.block_size, ") and sequences (", sizing.num_sequences,
        ") must be at least 1, tokens per sequence (", sizing.tokens_per_sequence, ") at least 0"));
  }
  const KvShape shape{spec.num_layers, spec.num_kv_heads, spec.head_dim};
  auto layout = KvLayout::Create(shape, sizing.kv_dtype, sizing.block_size);
  if (!layout.ok()) return layout.status();
  const int32_t tokens =
      sizing.tokens_per_sequence > 0 ? sizing.tokens_per_sequence : spec.max_context_tokens;
  const int64_t block_bytes = layout->block_bytes();
  const int64_t blocks_needed =
      (layout->BlocksForTokens(tokens) + 1) * int64_t{sizing.num_sequences};
  // Power-of-two blocks per chunk: enough for the whole load when that is under the cap.
  int64_t blocks_per_chunk = 1;
  while (blocks_per_chunk < blocks_needed && 2 * blocks_per_chunk * block_bytes <= kMaxChunkBytes) {
    blocks_per_chunk *= 2;
  }
  const int64_t num_chunks = (blocks_needed + blocks_per_chunk - 1) / blocks_per_chunk;
  KvCacheOptions options;
  options.block_size = sizing.block_size;
  options.kv_dtype = sizing.kv_dtype;
  options.chunk_bytes = blocks_per_chunk * block_bytes;
  options.initial_pool_bytes = num_chunks * options.chunk_bytes;
  options.max_pool_bytes = options.initial_pool_bytes;
  options.enable_prefix_caching = sizing.enable_prefix_caching;
  options.enable_defrag = false;
  return KvCacheManager::Create(options, shape, backend, clock);
}

absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateCacheForSequences(
    const ModelSpec& spec, Backend* backend, Clock* clock, int32_t block_size,
    int32_t num_sequences, bool enable_prefix_caching) {
  return CreateCache(spec, backend, clock,
                     {.block_size = block_size,
                      .num_sequences = num_sequences,
                      .kv_dtype = backend != nullptr ? DefaultKvDtype(*backend) : DType::kF32,
                      .enable_prefix_caching = enable_prefix_caching});
}

}  // namespace kvd
