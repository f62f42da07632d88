#ifndef KVD_MODEL_SYNTHETIC_MODEL_H_
#define KVD_MODEL_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/model_spec.h"
#include "model/model_weights.h"

namespace kvd {

// Synthetic models: a real model's shape with seeded random weights, for capacity
// planning (`kvd estimate`), benchmarks and tests that need no checkpoint. All functions
// are stateless and thread safe.

// The spec of a named preset; spec.name is "synthetic:<preset>". Presets:
//   llama3-8b  Meta-Llama-3-8B: 32 layers, dim 4096, hidden 14336, 32 heads, 8 KV heads,
//              head_dim 128, vocab 128256, context 8192, rope_theta 500000, half RoPE,
//              eps 1e-5, unshared classifier, bos 128000, eos 128001
//   llama2-7b  Llama-2-7b: 32 layers, dim 4096, hidden 11008, 32 heads, 32 KV heads,
//              head_dim 128, vocab 32000, context 4096, rope_theta 10000, half RoPE,
//              eps 1e-5, unshared classifier, bos 1, eos 2
//   tiny       2 layers, dim 64, hidden 128, 4 heads, 2 KV heads, head_dim 16, vocab 256,
//              context 256, rope_theta 10000, interleaved RoPE, shared classifier, bos 1,
//              eos 2 (small enough for unit tests)
// An unknown preset returns InvalidArgument listing the valid ones.
absl::StatusOr<ModelSpec> SyntheticSpec(std::string_view preset);

// Host fp32 weights for `spec`, filled deterministically from `seed` (same spec and seed
// give bit-identical weights on every platform). Matrices are uniform with variance
// 1/fan_in, so activations stay O(1) through the layers; embeddings and the classifier
// have variance 1/dim (logits O(1)); norm weights lie in [0.9, 1.1]. Each tensor has its
// own stream, so a tensor does not depend on the shapes of the tensors before it.
// Returns InvalidArgument for an invalid spec, and ResourceExhausted (stating the bytes
// needed) when the weights would take more than `max_bytes` of host memory: llama3-8b is
// ~32 GB in fp32 and is meant for GPU benchmarks that generate weights on the device.
absl::StatusOr<ModelWeights> MakeSyntheticWeights(const ModelSpec& spec, uint64_t seed,
                                                  int64_t max_bytes = int64_t{4} << 30);

}  // namespace kvd

#endif  // KVD_MODEL_SYNTHETIC_MODEL_H_
