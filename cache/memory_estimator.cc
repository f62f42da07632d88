#include "cache/memory_estimator.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/kv_layout.h"

namespace kvd {

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
  absl::StatusOr<KvLayout> layout =
      KvLayout::Create({r.num_layers, r.num_kv_heads, r.head_dim}, r.kv_dtype, r.block_size);
  if (!layout.ok()) return layout.status();
  MemoryEstimate e;
  e.bytes_per_token = layout->data_bytes_per_token();
  e.bytes_per_token_with_scales = layout->bytes_per_token();
  e.bytes_per_block = layout->block_bytes();
  e.blocks_per_sequence = layout->BlocksForTokens(r.seq_len);
  e.bytes_per_sequence = e.blocks_per_sequence * e.bytes_per_block;
  // Scales of partly used blocks count whole: they are allocated per block.
  const int64_t scale_bytes = r.batch * e.blocks_per_sequence * layout->block_scale_bytes();
  e.batch_bytes = r.batch * r.seq_len * e.bytes_per_token + scale_bytes;
  e.batch_bytes_paged = r.batch * e.bytes_per_sequence;
  e.seed_bytes_per_token = int64_t{2} * r.num_layers * r.d_model * DTypeBits(r.kv_dtype) / 8;
  e.seed_batch_bytes = r.batch * r.seq_len * e.seed_bytes_per_token;
  e.seed_over_exact = static_cast<double>(e.seed_batch_bytes) / static_cast<double>(e.batch_bytes);
  if (r.budget_bytes > 0) {
    e.sequences_in_budget = r.budget_bytes / e.bytes_per_sequence;
    e.tokens_in_budget = r.budget_bytes / e.bytes_per_block * r.block_size;
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
    absl::StrAppendFormat(&out, "  budget %d bytes     %d sequences of %d tokens, %d tokens\n",
                          r.budget_bytes, e.sequences_in_budget, r.seq_len, e.tokens_in_budget);
  }
  return out;
}

}  // namespace kvd
