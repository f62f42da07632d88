#ifndef KVD_MODEL_LLAMA2C_LOADER_H_
#define KVD_MODEL_LLAMA2C_LOADER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "model/model_spec.h"
#include "model/model_weights.h"

namespace kvd {

// Readers for fp32 checkpoints written by llama2.c's export.py. Two layouts exist:
//
// Version 0 ("legacy"):
//   header  7 x int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//           (vocab_size < 0 means the classifier is not shared; |vocab_size| is the vocab)
//   fp32    token_embedding [vocab][dim]
//           rms_att [layers][dim], wq [layers][n_heads*head_dim][dim],
//           wk [layers][kv_dim][dim], wv [layers][kv_dim][dim],
//           wo [layers][dim][n_heads*head_dim], rms_ffn [layers][dim],
//           w1 [layers][hidden][dim], w2 [layers][dim][hidden], w3 [layers][hidden][dim],
//           rms_final [dim], freq_cis_real [seq_len][head_dim/2],
//           freq_cis_imag [seq_len][head_dim/2]   (skipped: RoPE is computed)
//           wcls [vocab][dim]                      (only when not shared)
//
// Version 1:
//   header  uint32 magic 0x616b3432 ("ak42"), int32 version = 1, the same 7 int32
//           (vocab_size positive), uint8 shared_classifier, zero padding to 256 bytes
//   fp32    rms_att (all layers), rms_ffn (all layers), rms_final, token_embedding,
//           wq, wk, wv, wo, w1, w2, w3 (each all layers), then wcls when not shared
//
// head_dim = dim / n_heads, kv_dim = n_kv_heads * head_dim. Other versions (2 is int8
// quantized) are refused with a status naming the version.
//
// The file size must equal exactly what the header implies; a file that is empty,
// truncated, longer, or whose header is inconsistent or absurd yields a non-OK status
// naming the path (and for size mismatches the expected and actual byte counts). Nothing
// is allocated before the size check, so a corrupt header cannot cause a huge allocation.
//
// The returned spec: name = file stem, rope_theta 10000, interleaved RoPE, norm_eps 1e-5,
// max_context_tokens = seq_len, bos 1, eos 2.
//
// Both functions are stateless and thread safe.

// Loads the whole checkpoint into host fp32 weights. ResourceExhausted naming the bytes
// when the weights need more than `host_bytes_available` (given: LoadModel passes
// AvailableHostBytes()), before anything is allocated, or an allocation fails.
absl::StatusOr<ModelWeights> LoadLlama2cCheckpoint(
    const std::string& path, std::optional<int64_t> host_bytes_available = std::nullopt);

// Reads only the header (and checks the file size against it); cheap for any model size.
absl::StatusOr<ModelSpec> ReadLlama2cSpec(const std::string& path);

}  // namespace kvd

#endif  // KVD_MODEL_LLAMA2C_LOADER_H_
