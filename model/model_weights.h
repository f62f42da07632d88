#ifndef KVD_MODEL_MODEL_WEIGHTS_H_
#define KVD_MODEL_MODEL_WEIGHTS_H_

#include <vector>

#include "model/model_spec.h"

namespace kvd {

// Host-side fp32 weights as loaded from a checkpoint, before upload to a backend.
// Matrices are row-major [out_features][in_features] (MatmulParams' weight layout).
struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> wq;         // [num_heads*head_dim][dim]
  std::vector<float> wk;         // [num_kv_heads*head_dim][dim]
  std::vector<float> wv;         // [num_kv_heads*head_dim][dim]
  std::vector<float> wo;         // [dim][num_heads*head_dim]
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> w1;         // gate: [hidden_dim][dim]
  std::vector<float> w2;         // down: [dim][hidden_dim]
  std::vector<float> w3;         // up:   [hidden_dim][dim]
};

struct ModelWeights {
  ModelSpec spec;
  std::vector<float> token_embedding;  // [vocab_size][dim]
  std::vector<LayerWeights> layers;    // [num_layers]
  std::vector<float> final_norm;       // [dim]
  std::vector<float> classifier;       // [vocab_size][dim]; empty when shared_classifier
};

}  // namespace kvd

#endif  // KVD_MODEL_MODEL_WEIGHTS_H_
