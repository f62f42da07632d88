#ifndef KVD_TESTS_MODEL_HF_WRITER_H_
#define KVD_TESTS_MODEL_HF_WRITER_H_

// Test support: Hugging Face model files built in memory (safetensors, SentencePiece
// tokenizer.model) and a Hugging Face directory of stories260K, for the loaders' tests.

#include <cstdint>
#include <string>
#include <vector>

namespace kvd::test {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian bytes
};

// A safetensors file of `entries`, in order; `metadata` (a JSON object, if not empty) is
// written as "__metadata__".
std::string SafetensorsBytes(const std::vector<SafetensorsEntry>& entries,
                             const std::string& metadata = "");

struct SentencePieceEntry {
  std::string piece;
  float score = 0;
  int type = 1;  // 1 normal, 2 unknown, 3 control, 6 byte
};

std::string LlamaNormalizerSpec();

// A serialized sentencepiece.ModelProto of these pieces, trainer_spec.model_type (1 unigram,
// 2 BPE; 0 writes no trainer_spec) and `normalizer_spec` (the message's bytes; by default
// Llama's: name "identity", add_dummy_prefix 1, remove_extra_whitespaces 0).
std::string SentencePieceModelBytes(const std::vector<SentencePieceEntry>& pieces,
                                    int model_type = 2,
                                    const std::string& normalizer_spec = LlamaNormalizerSpec());

// Writes stories260K (../shared/models) as a Hugging Face directory at `dir` (created):
// config.json (LlamaForCausalLM, tied embeddings), F32 weights with Q and K rows permuted
// to transformers' half-rotation layout, in model.safetensors or, when `sharded`, in two
// shards named by model.safetensors.index.json; and tok512.bin as tokenizer.model.
void WriteHfStories260k(const std::string& dir, bool sharded = false);

// The Q or K rows of `heads` heads of `head_dim` (each row `in` floats) moved from
// interleaved-pair order (llama2.c, GGUF) to transformers' half order: row 2i + j of a head
// becomes row j * head_dim / 2 + i.
std::vector<float> ToHalfRotationRows(const std::vector<float>& w, int heads, int head_dim, int in);

void WriteFile(const std::string& path, const std::string& bytes);

}  // namespace kvd::test

#endif  // KVD_TESTS_MODEL_HF_WRITER_H_
