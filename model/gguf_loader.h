#ifndef KVD_MODEL_GGUF_LOADER_H_
#define KVD_MODEL_GGUF_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "model/model_spec.h"
#include "model/model_weights.h"
#include "model/tokenizer.h"

namespace kvd {

// Llama models in GGUF files (gguf_file.h), as llama.cpp's converters write them
// (general.architecture "llama": Llama 1-3, Mistral, TinyLlama, llama2.c's models).
//
// The spec comes from the `llama.*` metadata: embedding_length, feed_forward_length,
// block_count, attention.head_count, attention.head_count_kv (default: head_count),
// context_length, rope.freq_base (default 10000), attention.layer_norm_rms_epsilon (default
// 1e-5); vocab_size, or else token_embd.weight's rows; BOS and EOS from
// tokenizer.ggml.bos_token_id and eos_token_id (default 1 and 2), and eot_token_id and
// eom_token_id as other_end_token_ids (unless 2^32 - 1, none). head_dim is
// embedding_length / head_count (rope.dimension_count, key_length and value_length must
// agree where given). RoPE rotates adjacent pairs, as llama.cpp's converters permute Q and K
// for. The classifier is output.weight, or the token embedding when the file has none. A
// completion ends at EOS (ends_at_bos is false). name = the file's stem.
//
// Tensors (ggml dims, innermost first): token_embd.weight [dim, vocab], output_norm.weight
// [dim], output.weight [dim, vocab] (optional), and per layer N blk.N.attn_norm.weight [dim],
// attn_q [dim, heads*head_dim], attn_k and attn_v [dim, kv_heads*head_dim], attn_output
// [heads*head_dim, dim], ffn_norm [dim], ffn_gate and ffn_up [dim, hidden], ffn_down
// [hidden, dim] (each ".weight"), stored as F32, F16, BF16 or Q8_0 and loaded as fp32.
//
// Refused, naming what: another architecture, mixture-of-experts (expert_count > 0), RoPE
// scaling (rope.scaling.type other than "none", or a rope_freqs.weight tensor: Llama 3.1's
// long-context frequencies), a missing tensor or one of another shape, other tensor types
// (k-quants and the rest: Unimplemented), a non-finite weight (DataLoss). Errors name the
// path. All functions are stateless and thread safe.

// Reads the header only; every tensor's presence and shape is checked.
absl::StatusOr<ModelSpec> ReadGgufSpec(const std::string& path);

// Loads the weights as host fp32. ResourceExhausted naming the bytes when they need more
// than `host_bytes_available`, before anything is allocated.
absl::StatusOr<ModelWeights> LoadGgufModel(
    const std::string& path, std::optional<int64_t> host_bytes_available = std::nullopt);

// The tokenizer in the file's metadata: tokenizer.ggml.model "llama" (SentencePiece), its
// tokens and scores, BOS 1 and EOS 2 and the byte pieces at 3..258 (Tokenizer's layout).
// Pieces are taken as llama2.c's export takes them: U+2581 becomes a space, BOS and EOS
// decode as "\n<s>\n" and "\n</s>\n". Unimplemented naming the tokenizer model for others
// (e.g. "gpt2", Llama 3's byte-level BPE); InvalidArgument when expected_vocab_size >= 0
// does not match.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path,
                                                             int32_t expected_vocab_size = -1);

}  // namespace kvd

#endif  // KVD_MODEL_GGUF_LOADER_H_
