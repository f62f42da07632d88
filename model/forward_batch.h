#ifndef KVD_MODEL_FORWARD_BATCH_H_
#define KVD_MODEL_FORWARD_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvd {

// One forward step over a batch that mixes prefill chunks and decodes, described on the
// host. Sequence s contributes tokens [q_indptr[s], q_indptr[s+1]) of token_ids; its block
// table (kv_*) must already have slots for those tokens, and slot_mapping says where each
// token's K/V goes. Plain aggregate; Validate() checks the shapes, and that each token's
// position and slot are those its sequence's block table gives it.
struct ForwardBatch {
  std::vector<int32_t> token_ids;          // [num_tokens]
  std::vector<int32_t> positions;          // [num_tokens] absolute positions
  std::vector<int64_t> slot_mapping;       // [num_tokens] block_id * block_size + offset
  std::vector<int32_t> q_indptr{0};        // [num_seqs + 1]
  std::vector<int32_t> kv_indptr{0};       // [num_seqs + 1]
  std::vector<int32_t> kv_indices;         // [kv_indptr.back()] block ids
  std::vector<int32_t> kv_last_block_len;  // [num_seqs]
  std::vector<int32_t> logit_rows;         // token rows whose logits are returned, in order

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(q_indptr.size()) - 1; }

  // Appends one sequence's chunk: `tokens` at positions start_pos.., with its whole block
  // table `blocks` covering start_pos + tokens.size() positions. When want_logits, the
  // chunk's last token is added to logit_rows (an empty chunk has none: no row is added).
  void AddSequence(absl::Span<const int32_t> tokens, int32_t start_pos,
                   absl::Span<const int32_t> blocks, int32_t block_size, bool want_logits);

  absl::Status Validate(int32_t vocab_size, int32_t block_size) const;

  // The most keys (its new tokens included) of a sequence with new tokens, for blocks of
  // block_size tokens: PagedAttentionParams::max_kv_len. 0 when no sequence has new tokens.
  // REQUIRES: Validate(..., block_size) passed.
  int32_t MaxKvLen(int32_t block_size) const;
};

}  // namespace kvd

#endif  // KVD_MODEL_FORWARD_BATCH_H_
