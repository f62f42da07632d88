#ifndef KVD_MODEL_MODEL_LOADER_H_
#define KVD_MODEL_MODEL_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/model_spec.h"
#include "model/model_weights.h"
#include "model/tokenizer.h"

namespace kvd {

// Picks a loader from a model reference, the string a user passes as `--model`:
//   "synthetic:<preset>"  seeded random weights of a preset's shape (synthetic_model.h)
//   "<path>.gguf"         a GGUF file of a llama model (gguf_loader.h), any case of ".gguf"
//   "<directory>"         a Hugging Face model directory, with config.json (hf_loader.h);
//                         InvalidArgument for any other directory
//   any other path        a llama2.c checkpoint (llama2c_loader.h), usually "<path>.bin"
// Stateless and thread safe.

// Loads host fp32 weights. `seed` is used only by synthetic models. Synthetic weights are
// capped at MakeSyntheticWeights' default host size, so "synthetic:llama3-8b" is refused
// here with ResourceExhausted (use LoadModelSpec to plan for it); a checkpoint is refused so
// when its weights need more than AvailableHostBytes().
absl::StatusOr<ModelWeights> LoadModel(std::string_view model, uint64_t seed = 0);

// Reads only the spec (checkpoint header or preset); cheap for any model size, which is
// what `kvd estimate` needs for huge models.
absl::StatusOr<ModelSpec> LoadModelSpec(std::string_view model);

// The tokenizer of a model: for a GGUF file the one in its metadata (LoadGgufTokenizer), for
// a Hugging Face directory its tokenizer.model (LoadHfTokenizer), else the llama2.c
// tokenizer beside the checkpoint (Tokenizer::FindBesideModel), with `vocab_size` tokens.
// Unimplemented where the model's own tokenizer is one kvd cannot read. Not for synthetic
// models, which have none.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(std::string_view model,
                                                              int32_t vocab_size);

// A tokenizer file named by the user (model.tokenizer, --tokenizer): a GGUF file's vocabulary
// when the path ends in ".gguf", a SentencePiece model for ".model", else a llama2.c
// tokenizer.bin; `vocab_size` tokens.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFile(const std::string& path,
                                                             int32_t vocab_size);

// The host memory the kernel reports available for new allocations without swapping
// (/proc/meminfo's MemAvailable), or nothing where that is not known. A container's memory
// limit is not in it: an allocation past that limit fails as std::bad_alloc, or not at all.
std::optional<int64_t> AvailableHostBytes();

}  // namespace kvd

#endif  // KVD_MODEL_MODEL_LOADER_H_
