#include "model/forward_batch.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvd {

namespace {

// Keys of sequence s of `b` (its new tokens included), from its block table.
int32_t SeqKvLen(const ForwardBatch& b, int32_t s, int32_t block_size) {
  return (b.kv_indptr[s + 1] - b.kv_indptr[s] - 1) * block_size + b.kv_last_block_len[s];
}

}  // namespace

void ForwardBatch::AddSequence(absl::Span<const int32_t> tokens, int32_t start_pos,
                               absl::Span<const int32_t> blocks, int32_t block_size,
                               bool want_logits) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = start_pos + i;
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    slot_mapping.push_back(int64_t{blocks[pos / block_size]} * block_size + pos % block_size);
  }
  q_indptr.push_back(q_indptr.back() + n);
  const int32_t kv_len = start_pos + n;
  const int32_t num_blocks = (kv_len + block_size - 1) / block_size;
  kv_indices.insert(kv_indices.end(), blocks.begin(), blocks.begin() + num_blocks);
  kv_indptr.push_back(kv_indptr.back() + num_blocks);
  kv_last_block_len.push_back(kv_len - (num_blocks - 1) * block_size);
  if (want_logits && n > 0) logit_rows.push_back(q_indptr.back() - 1);
}

absl::Status ForwardBatch::Validate(int32_t vocab_size, int32_t block_size) const {
  const size_t t = token_ids.size();
  if (positions.size() != t || slot_mapping.size() != t) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward batch: token_ids, positions and slot_mapping must have the same length; "
        "they have ",
        t, ", ", positions.size(), " and ", slot_mapping.size()));
  }
  if (q_indptr.empty() || q_indptr.front() != 0 || q_indptr.back() != static_cast<int32_t>(t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward batch: q_indptr must run from 0 to the ", t, " tokens; it has ", q_indptr.size(),
        " entries",
        q_indptr.empty() ? std::string()
                         : absl::StrCat(", from ", q_indptr.front(), " to ", q_indptr.back())));
  }
  if (kv_indptr.size() != q_indptr.size() || kv_last_block_len.size() + 1 != q_indptr.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward batch: q_indptr has ", q_indptr.size(), " entries but kv_indptr has ",
        kv_indptr.size(), " entries and kv_last_block_len ", kv_last_block_len.size()));
  }
  if (kv_indptr.front() != 0 || kv_indptr.back() != static_cast<int32_t>(kv_indices.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward batch: kv_indptr must run from 0 to the ", kv_indices.size(),
                     " kv_indices; it runs from ", kv_indptr.front(), " to ", kv_indptr.back()));
  }
  for (int32_t id : token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward batch: token id ", id, " outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  for (int32_t s = 0; s < num_seqs(); ++s) {
    const int32_t q_len = q_indptr[s + 1] - q_indptr[s];
    const int32_t blocks = kv_indptr[s + 1] - kv_indptr[s];
    const int32_t last = kv_last_block_len[s];
    const int32_t kv_len = SeqKvLen(*this, s, block_size);
    if (q_len < 0 || blocks <= 0 || last < 1 || last > block_size || kv_len < q_len) {
      return absl::InvalidArgumentError(absl::StrCat("forward batch: sequence ", s, " has ", q_len,
                                                     " new tokens but ", blocks, " blocks with ",
                                                     last, " tokens in the last"));
    }
    // Attention puts the chunk's row j at kv_len - q_len + j, RoPE reads positions[] and the
    // K/V append slot_mapping[]: a batch where they disagree would run, with wrong logits.
    for (int32_t j = 0; j < q_len; ++j) {
      const int32_t row = q_indptr[s] + j;
      const int32_t pos = kv_len - q_len + j;
      const int64_t slot =
          int64_t{kv_indices[kv_indptr[s] + pos / block_size]} * block_size + pos % block_size;
      if (positions[row] != pos || slot_mapping[row] != slot) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward batch: token row ", row, " (sequence ", s, ") has position ",
                         positions[row], " and slot ", slot_mapping[row],
                         "; its block table puts it at position ", pos, ", slot ", slot));
      }
    }
  }
  for (int32_t row : logit_rows) {
    if (row < 0 || row >= static_cast<int32_t>(t)) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: logit row ", row, " outside [0, ", t, ")"));
    }
  }
  return absl::OkStatus();
}

int32_t ForwardBatch::MaxKvLen(int32_t block_size) const {
  int32_t longest = 0;
  for (int32_t s = 0; s < num_seqs(); ++s) {
    if (q_indptr[s + 1] != q_indptr[s]) longest = std::max(longest, SeqKvLen(*this, s, block_size));
  }
  return longest;
}

}  // namespace kvd
