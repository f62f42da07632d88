#ifndef KVD_MODEL_HF_LOADER_H_
#define KVD_MODEL_HF_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "model/model_spec.h"
#include "model/model_weights.h"
#include "model/tokenizer.h"

namespace kvd {

// Hugging Face model directories of Llama and Mistral models: config.json, the weights in
// model.safetensors or in the shards model.safetensors.index.json's weight_map names, and
// (optionally) a SentencePiece tokenizer.model.
//
// config.json (nested at most 64 levels): architectures ["LlamaForCausalLM"] or
// ["MistralForCausalLM"]; hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads (default: num_attention_heads; Mistral's 8),
// max_position_embeddings, vocab_size, rope_theta (or transformers 5's
// rope_parameters.rope_theta; default 10000),
// rms_norm_eps (default 1e-6), tie_word_embeddings (default false), bos_token_id and
// eos_token_id (defaults 1 and 2; of a list of EOS ids the first, the rest, and those of
// generation_config.json's eos_token_id, are other_end_token_ids), head_dim (must be
// hidden_size / num_attention_heads where given). RoPE rotates halves (i, i + head_dim/2),
// as transformers does on these weights. A Mistral sliding_window (default 4096) caps the
// context at the window, inside which it attends as full attention does. A completion ends at EOS.
// name = the directory's name.
//
// Tensors (row-major [out][in], F32, F16 or BF16, loaded as fp32): model.embed_tokens,
// model.norm, lm_head (absent when tied), and per layer N model.layers.N.input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj (each
// ".weight").
//
// Refused, naming what: other architectures, rope_scaling or rope_parameters other than
// rope_type "default" (or two rope_thetas that differ, or another rope_* key),
// attention or MLP biases, an activation other than silu, a missing tensor or one of another
// shape or dtype, a non-finite weight (DataLoss). Errors name the directory or file. All
// functions are stateless and thread safe.

// Reads config.json and the safetensors headers; every tensor's presence and shape is checked.
absl::StatusOr<ModelSpec> ReadHfSpec(const std::string& dir);

// Loads the weights as host fp32. ResourceExhausted naming the bytes when they need more
// than `host_bytes_available`, before anything is allocated.
absl::StatusOr<ModelWeights> LoadHfModel(
    const std::string& dir, std::optional<int64_t> host_bytes_available = std::nullopt);

// The directory's tokenizer.model (LoadSentencePieceTokenizer). Unimplemented when the
// directory has none (tokenizer.json alone, as Llama 3's, is not read).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& dir,
                                                           int32_t expected_vocab_size = -1);

}  // namespace kvd

#endif  // KVD_MODEL_HF_LOADER_H_
