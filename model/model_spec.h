#ifndef KVD_MODEL_MODEL_SPEC_H_
#define KVD_MODEL_MODEL_SPEC_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

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
  // A llama2.c checkpoint, whatever its file is called: a story model ends a story with BOS
  // (run.c's generate stops there), a chat model its answer with EOS (run.c's chat).
  bool ends_at_bos = false;
  // Other tokens that end a completion as EOS does: a Hugging Face config's eos_token_id list
  // after its first, a GGUF file's end-of-turn and end-of-message tokens (Llama 3 Instruct
  // ends a turn with <|eot_id|>, not its EOS).
  std::vector<int32_t> other_end_token_ids;

  // The tokens a completion ends at unless the request says otherwise: EOS (BOS first where
  // ends_at_bos), then other_end_token_ids, each once.
  std::vector<int32_t> StopTokenIds() const {
    std::vector<int32_t> ids;
    if (ends_at_bos) ids.push_back(bos_token_id);
    ids.push_back(eos_token_id);
    for (int32_t id : other_end_token_ids) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    return ids;
  }

  // Returns InvalidArgument naming the first inconsistent field.
  absl::Status Validate() const;

  // Parameter count, embeddings and classifier included (classifier once if shared).
  int64_t NumParameters() const;
};

}  // namespace kvd

#endif  // KVD_MODEL_MODEL_SPEC_H_
