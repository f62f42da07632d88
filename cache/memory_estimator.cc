#include "cache/memory_estimator.h"

#include <cmath>
#include <initializer_list>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "cache/kv_cache_options.h"
#include "cache/kv_layout.h"

namespace kvd {
namespace {

// The product of `factors`, or nullopt when it leaves int64: sizes of absurd workloads
// must be an error, not signed overflow (undefined; it printed negative byte counts).
std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(product, f, &product)) return std::nullopt;
  }
  return product;
}

absl::Status WorkloadOverflow(const MemoryEstimateRequest& r, absl::string_view product) {
  return absl::InvalidArgumentError(absl::StrCat("batch=", r.batch, " seq_len=", r.seq_len,
                                                 " is too large: ", product,
                                                 " does not fit in 64 bits"));
}

// The pool `kvd serve` builds with memory_pool.max_size = budget_bytes (CacheOptionsFrom
// picks the chunk the same way), or the error for a max_size that it refuses (CheckPoolSize).
absl::StatusOr<KvPoolGeometry> PoolFor(int64_t budget_bytes, const KvLayout& layout) {
  const int64_t block_bytes = layout.block_bytes();
  if (budget_bytes < block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget_bytes=", budget_bytes, " is smaller than one KV block (", block_bytes,
                     " bytes); kvd serve refuses a memory_pool.max_size below it"));
  }
  if (budget_bytes / block_bytes > KvPoolGeometry::kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget_bytes=", budget_bytes, " holds more than ", KvPoolGeometry::kMaxBlocks,
        " KV blocks of ", block_bytes, " bytes; kvd serve refuses a memory_pool.max_size above ",
        KvPoolGeometry::kMaxBlocks * block_bytes, " bytes (or a larger block_size)"));
  }
  KvCacheOptions options;
  options.block_size = layout.block_size();
  options.kv_dtype = layout.dtype();
  options.max_pool_bytes = budget_bytes;
  options.initial_pool_bytes = 1;
  options.chunk_bytes = KvPoolGeometry::ChunkBytesFor(budget_bytes, block_bytes);
  return KvPoolGeometry::Compute(options, layout);
}

}  // namespace

absl::StatusOr<MemoryEstimate> MemoryEstimator::Estimate(const MemoryEstimateRequest& r) {
  if (r.d_model <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("d_model must be positive, got ", r.d_model));
  }
  if (r.batch <= 0 || r.seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("batch and seq_len must be positive, got %d and %d", r.batch, r.seq_len));
  }
  if (r.budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget_bytes must be >= 0, got ", r.budget_bytes));
  }
  // Before the layout, whose own size check would not name d_model.
  const std::optional<int64_t> seed_bytes_per_token =
      CheckedProduct({2, r.num_layers, r.d_model, DTypeBits(r.kv_dtype)});
  if (!seed_bytes_per_token.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_layers=", r.num_layers, " d_model=", r.d_model,
                     " is too large: 2 * num_layers * d_model * bits does not fit in 64 bits"));
  }
  absl::StatusOr<KvLayout> layout =
      KvLayout::Create({r.num_layers, r.num_kv_heads, r.head_dim}, r.kv_dtype, r.block_size);
  if (!layout.ok()) return layout.status();
  MemoryEstimate e;
  e.bytes_per_token = layout->data_bytes_per_token();
  e.bytes_per_token_with_scales = layout->bytes_per_token();
  e.bytes_per_block = layout->block_bytes();
  // Not layout->BlocksForTokens: its round-up addition overflows near the int64 maximum.
  e.blocks_per_sequence = r.seq_len / r.block_size + (r.seq_len % r.block_size != 0 ? 1 : 0);
  e.seed_bytes_per_token = *seed_bytes_per_token / 8;
  const std::optional<int64_t> data_bytes = CheckedProduct({r.batch, r.seq_len, e.bytes_per_token});
  if (!data_bytes.has_value()) {
    return WorkloadOverflow(
        r, absl::StrCat("batch * seq_len * bytes_per_token (", e.bytes_per_token, ")"));
  }
  const std::optional<int64_t> batch_bytes_paged =
      CheckedProduct({r.batch, e.blocks_per_sequence, e.bytes_per_block});
  if (!batch_bytes_paged.has_value()) {
    return WorkloadOverflow(r, absl::StrCat("batch * blocks_per_sequence (", e.blocks_per_sequence,
                                            ") * bytes_per_block (", e.bytes_per_block, ")"));
  }
  // The figures below are at most the paged bytes (batch >= 1, scales are part of a
  // block, tokens fill at most their blocks), so they fit.
  e.batch_bytes_paged = *batch_bytes_paged;
  e.bytes_per_sequence = e.blocks_per_sequence * e.bytes_per_block;
  // Scales of partly used blocks count whole: they are allocated per block.
  const int64_t scale_bytes = r.batch * e.blocks_per_sequence * layout->block_scale_bytes();
  e.batch_bytes = *data_bytes + scale_bytes;
  const std::optional<int64_t> seed_batch_bytes =
      CheckedProduct({r.batch, r.seq_len, e.seed_bytes_per_token});
  if (!seed_batch_bytes.has_value()) {
    return WorkloadOverflow(
        r, absl::StrCat("batch * seq_len * seed_bytes_per_token (", e.seed_bytes_per_token, ")"));
  }
  e.seed_batch_bytes = *seed_batch_bytes;
  e.seed_over_exact = static_cast<double>(e.seed_batch_bytes) / static_cast<double>(e.batch_bytes);
  if (r.budget_bytes > 0) {
    absl::StatusOr<KvPoolGeometry> pool = PoolFor(r.budget_bytes, *layout);
    if (!pool.ok()) return pool.status();
    e.pool_chunk_bytes = pool->chunk_bytes;
    e.pool_chunks = pool->max_chunks;
    e.pool_blocks = pool->max_blocks();
    e.pool_bytes = e.pool_chunks * e.pool_chunk_bytes;
    e.sequences_in_budget = e.pool_blocks / e.blocks_per_sequence;
    e.tokens_in_budget = e.pool_blocks * r.block_size;
  }
  return e;
}

std::string MemoryEstimator::Format(const MemoryEstimateRequest& r, const MemoryEstimate& e) {
  std::string out = absl::StrFormat(
      "KV cache: %d layers x %d KV heads x %d head_dim, %s, %d tokens/block\n"
      "  per token           %d bytes%s\n"
      "  per block           %d bytes\n"
      "  per sequence        %d bytes (%d tokens in %d blocks)\n"
      "  batch of %d         %d bytes exact, %d bytes paged\n"
      "  seeds' formula      %d bytes/token, %d bytes for the batch (2 x layers x d_model "
      "%d x bytes): %.2fx the exact figure\n",
      r.num_layers, r.num_kv_heads, r.head_dim, std::string(DTypeName(r.kv_dtype)), r.block_size,
      e.bytes_per_token,
      e.bytes_per_token_with_scales != static_cast<double>(e.bytes_per_token)
          ? absl::StrFormat(" (%.2f with scales)", e.bytes_per_token_with_scales)
          : std::string(),
      e.bytes_per_block, e.bytes_per_sequence, r.seq_len, e.blocks_per_sequence, r.batch,
      e.batch_bytes, e.batch_bytes_paged, e.seed_bytes_per_token, e.seed_batch_bytes, r.d_model,
      e.seed_over_exact);
  if (e.sequences_in_budget >= 0) {
    // The pool's bytes hold the scales (and their padding): each block carries its own.
    const std::optional<int64_t> scale_bytes =
        CheckedProduct({e.pool_blocks, e.bytes_per_block - e.bytes_per_token * r.block_size});
    absl::StrAppendFormat(
        &out,
        "  budget %d bytes as memory_pool.max_size: %d chunks of %d bytes, %d blocks, %d bytes%s\n"
        "                      %d sequences of %d tokens, %d tokens\n",
        r.budget_bytes, e.pool_chunks, e.pool_chunk_bytes, e.pool_blocks, e.pool_bytes,
        scale_bytes.value_or(0) > 0
            ? absl::StrFormat(" (%d of them scales and padding)", *scale_bytes)
            : std::string(),
        e.sequences_in_budget, r.seq_len, e.tokens_in_budget);
  }
  return out;
}

}  // namespace kvd
