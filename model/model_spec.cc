#include "model/model_spec.h"

#include "absl/strings/str_cat.h"

namespace kvd {

namespace {

absl::Status Positive(const char* field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("model spec: ", field, " must be positive, got ", value));
}

}  // namespace

absl::Status ModelSpec::Validate() const {
  for (auto [field, value] : {std::pair<const char*, int64_t>{"num_layers", num_layers},
                              {"dim", dim},
                              {"hidden_dim", hidden_dim},
                              {"num_heads", num_heads},
                              {"num_kv_heads", num_kv_heads},
                              {"head_dim", head_dim},
                              {"vocab_size", vocab_size},
                              {"max_context_tokens", max_context_tokens}}) {
    if (auto s = Positive(field, value); !s.ok()) return s;
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model spec: num_heads (", num_heads,
                                                   ") is not a multiple of num_kv_heads (",
                                                   num_kv_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec: head_dim must be even for RoPE, got ", head_dim));
  }
  if (!(rope_theta > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec: rope_theta must be positive, got ", rope_theta));
  }
  if (!(norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec: norm_eps must be positive, got ", norm_eps));
  }
  if (bos_token_id < 0 || bos_token_id >= vocab_size || eos_token_id < 0 ||
      eos_token_id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec: bos/eos token ids (", bos_token_id, ", ", eos_token_id,
                     ") must be in [0, vocab_size ", vocab_size, ")"));
  }
  for (int32_t id : other_end_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model spec: end token id ", id, " must be in [0, vocab_size ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

int64_t ModelSpec::NumParameters() const {
  const int64_t q_dim = int64_t{num_heads} * head_dim;
  const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
  const int64_t per_layer = 2 * int64_t{dim} + q_dim * dim * 2 + kv_dim * dim * 2 +
                            3 * int64_t{hidden_dim} * dim;
  const int64_t embed = int64_t{vocab_size} * dim;
  return embed * (shared_classifier ? 1 : 2) + per_layer * num_layers + dim;
}

}  // namespace kvd
