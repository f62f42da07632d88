#ifndef KVD_MODEL_MODEL_WEIGHTS_H_
#define KVD_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// One tensor of a Llama's weights as a checkpoint loader fills it: which one, its layer (-1
// for the model-wide ones), its row-major shape ([out][in] for a matrix) and where it goes.
enum class WeightKind {
  kTokenEmbedding,
  kFinalNorm,
  kClassifier,
  kAttnNorm,
  kWq,
  kWk,
  kWv,
  kWo,
  kFfnNorm,
  kW1,  // gate
  kW2,  // down
  kW3,  // up
};
struct WeightSlot {
  WeightKind kind;
  int32_t layer;
  std::vector<int64_t> shape;
  std::vector<float>* dest;
};

// How a checkpoint format names a Llama's tensors: the model-wide ones whole, a layer's as
// "<layer_prefix><layer>.<name>.weight", its names in LayerWeights' order (attn_norm, wq, wk,
// wv, wo, ffn_norm, w1, w2, w3).
struct WeightNames {
  const char* token_embedding;
  const char* final_norm;
  const char* classifier;
  const char* layer_prefix;
  const char* layer[9];
};
std::string WeightName(const WeightSlot& slot, const WeightNames& names);

// Every tensor `w.spec` needs (the classifier only when not shared), pointing into `w`:
// model-wide ones first, then each layer's in LayerWeights' order. Resizes w.layers to the
// spec's layers; the slots stay valid while `w` does not move.
std::vector<WeightSlot> WeightSlots(ModelWeights& w);

// The weights of `spec` from a checkpoint file: refuses with ResourceExhausted naming the
// bytes when their fp32 total exceeds `host_bytes_available`, before anything is read; then
// `read` fills each slot's dest with exactly its elements, and a value that is not finite is
// refused with DataLoss naming `name(slot)` and the index. Errors start with `where`.
absl::StatusOr<ModelWeights> LoadWeightSlots(
    const ModelSpec& spec, absl::string_view where, std::optional<int64_t> host_bytes_available,
    absl::FunctionRef<std::string(const WeightSlot&)> name,
    absl::FunctionRef<absl::Status(const WeightSlot&)> read);

// DataLoss "<where>: <tensor>[i] is <value>, not a finite number" for the first value of
// `values` that is NaN or infinite; OK when there is none.
absl::Status CheckFinite(absl::string_view where, absl::string_view tensor,
                         const std::vector<float>& values);

}  // namespace kvd

#endif  // KVD_MODEL_MODEL_WEIGHTS_H_
