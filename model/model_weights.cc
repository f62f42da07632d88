#include "model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvd {

std::vector<WeightSlot> WeightSlots(ModelWeights& w) {
  const ModelSpec& s = w.spec;
  const int64_t dim = s.dim;
  const int64_t q_dim = int64_t{s.num_heads} * s.head_dim;
  const int64_t kv_dim = int64_t{s.num_kv_heads} * s.head_dim;
  const int64_t hidden = s.hidden_dim;
  w.layers.resize(s.num_layers);
  std::vector<WeightSlot> slots = {
      {WeightKind::kTokenEmbedding, -1, {s.vocab_size, dim}, &w.token_embedding},
      {WeightKind::kFinalNorm, -1, {dim}, &w.final_norm}};
  if (!s.shared_classifier) {
    slots.push_back({WeightKind::kClassifier, -1, {s.vocab_size, dim}, &w.classifier});
  }
  for (int32_t l = 0; l < s.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    slots.push_back({WeightKind::kAttnNorm, l, {dim}, &lw.attn_norm});
    slots.push_back({WeightKind::kWq, l, {q_dim, dim}, &lw.wq});
    slots.push_back({WeightKind::kWk, l, {kv_dim, dim}, &lw.wk});
    slots.push_back({WeightKind::kWv, l, {kv_dim, dim}, &lw.wv});
    slots.push_back({WeightKind::kWo, l, {dim, q_dim}, &lw.wo});
    slots.push_back({WeightKind::kFfnNorm, l, {dim}, &lw.ffn_norm});
    slots.push_back({WeightKind::kW1, l, {hidden, dim}, &lw.w1});
    slots.push_back({WeightKind::kW2, l, {dim, hidden}, &lw.w2});
    slots.push_back({WeightKind::kW3, l, {hidden, dim}, &lw.w3});
  }
  return slots;
}

std::string WeightName(const WeightSlot& slot, const WeightNames& names) {
  switch (slot.kind) {
    case WeightKind::kTokenEmbedding:
      return names.token_embedding;
    case WeightKind::kFinalNorm:
      return names.final_norm;
    case WeightKind::kClassifier:
      return names.classifier;
    default:  // the layer's, in enum order from kAttnNorm
      return absl::StrCat(
          names.layer_prefix, slot.layer, ".",
          names.layer[static_cast<int>(slot.kind) - static_cast<int>(WeightKind::kAttnNorm)],
          ".weight");
  }
}

absl::Status CheckFinite(absl::string_view where, absl::string_view tensor,
                         const std::vector<float>& values) {
  const auto bad =
      std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
  if (bad == values.end()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(where, ": ", tensor, "[", bad - values.begin(), "] is ",
                                          *bad, ", not a finite number"));
}

absl::StatusOr<ModelWeights> LoadWeightSlots(
    const ModelSpec& spec, absl::string_view where, std::optional<int64_t> host_bytes_available,
    absl::FunctionRef<std::string(const WeightSlot&)> name,
    absl::FunctionRef<absl::Status(const WeightSlot&)> read) {
  ModelWeights weights;
  weights.spec = spec;
  const std::vector<WeightSlot> slots = WeightSlots(weights);  // points into weights
  int64_t needed = 0;
  for (const WeightSlot& slot : slots) {
    int64_t elements = 1;
    for (int64_t d : slot.shape) elements *= d;
    needed += elements * int64_t{sizeof(float)};
  }
  if (host_bytes_available.has_value() && needed > *host_bytes_available) {
    return absl::ResourceExhaustedError(absl::StrCat(where, ": its weights need ", needed,
                                                     " bytes of host memory as fp32, more than "
                                                     "the ",
                                                     *host_bytes_available, " available"));
  }
  for (const WeightSlot& slot : slots) {
    if (absl::Status s = read(slot); !s.ok()) return s;
    if (absl::Status s = CheckFinite(where, name(slot), *slot.dest); !s.ok()) return s;
  }
  return weights;
}

}  // namespace kvd
