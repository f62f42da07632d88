#ifndef KVD_MODEL_MODEL_SPEC_H_
#define KVD_MODEL_MODEL_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "kernels/params.h"

namespace kvd {

// The shape of a Llama-family decoder. Plain aggregate; Validate() checks consistency.
struct ModelSpec {
  std::string name;               // e.g. "stories260K", "synthetic:llama3-8b"
  int32_t num_layers = 0;
  int32_t dim = 0;                // d_model
  int32_t hidden_dim = 0;         // FFN inner size
  int32_t num_heads = 0;          // query heads
  int32_t num_kv_heads = 0;       // KV heads (GQA when < num_heads)
  int32_t head_dim = 0;           // usually dim / num_heads
  int32_t vocab_size = 0;
  int32_t max_context_tokens = 0; // the model's context limit
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  float norm_eps = 1e-5f;
  bool shared_classifier = true;  // output projection is the token embedding table
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 2;
  // Where a completion ends unless the request says otherwise, when not EOS: a llama2.c
  // checkpoint ends a story with BOS (run.c stops there), whatever its file is called.
  std::optional<int32_t> stop_token_id;

  // The token a completion ends at by default: stop_token_id, else EOS.
  int32_t StopTokenId() const { return stop_token_id.value_or(eos_token_id); }

  // Returns InvalidArgument naming the first inconsistent field.
  absl::Status Validate() const;

  // Parameter count, embeddings and classifier included (classifier once if shared).
  int64_t NumParameters() const;
};

}  // namespace kvd

#endif  // KVD_MODEL_MODEL_SPEC_H_
