#include "model/gguf_loader.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "model/gguf_file.h"

namespace kvd {

namespace {

// Sanity limits as the llama2.c loader's: far above any real Llama.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxHiddenDim = 1 << 18;
constexpr int64_t kMaxLayers = 1 << 10;
constexpr int64_t kMaxHeads = 1 << 10;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxContext = 1 << 24;

constexpr double kUserDefinedToken = 4;  // tokenizer.ggml.token_type, as SentencePiece's

std::string Where(const std::string& path) { return absl::StrCat("GGUF file '", path, "'"); }

absl::Status Prefixed(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(Where(path), ": ", s.message()));
}

// An integer key that must be in [1, max]; `fallback` when absent, if given.
absl::StatusOr<int32_t> PositiveKey(const GgufFile& f, const std::string& key, int64_t max,
                                    std::optional<int64_t> fallback = std::nullopt) {
  absl::StatusOr<int64_t> v = f.GetInt(key);
  if (!v.ok() && absl::IsNotFound(v.status()) && fallback.has_value()) v = *fallback;
  if (!v.ok()) return Prefixed(f.path(), v.status());
  if (*v <= 0 || *v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(f.path()), ": ", key, " = ", *v, " is outside 1..", max));
  }
  return static_cast<int32_t>(*v);
}

absl::StatusOr<double> FloatKey(const GgufFile& f, const std::string& key, double fallback) {
  if (!f.Has(key)) return fallback;
  absl::StatusOr<double> v = f.GetFloat(key);
  if (!v.ok()) return Prefixed(f.path(), v.status());
  return *v;
}

// How a llama GGUF file names its tensors.
constexpr WeightNames kGgufNames = {"token_embd.weight",
                                    "output_norm.weight",
                                    "output.weight",
                                    "blk.",
                                    {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                     "ffn_norm", "ffn_gate", "ffn_down", "ffn_up"}};

std::string GgufName(const WeightSlot& slot) { return WeightName(slot, kGgufNames); }

// ggml lists dimensions innermost first: a row-major [out][in] matrix is [in, out].
std::vector<int64_t> GgufDims(const WeightSlot& slot) {
  return std::vector<int64_t>(slot.shape.rbegin(), slot.shape.rend());
}

std::string DimsText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

struct Opened {
  GgufFile file;
  ModelSpec spec;  // every tensor it needs is in the file, of the right shape
};

absl::StatusOr<Opened> OpenModel(const std::string& path) {
  absl::StatusOr<GgufFile> opened = GgufFile::Open(path);
  if (!opened.ok()) return opened.status();
  const GgufFile& f = *opened;
  absl::StatusOr<std::string> arch = f.GetString("general.architecture");
  if (!arch.ok()) return Prefixed(path, arch.status());
  if (*arch != "llama") {
    return absl::UnimplementedError(absl::StrCat(Where(path), ": architecture '", *arch,
                                                 "' (general.architecture); kvd serves 'llama'"));
  }
  if (f.Has("llama.expert_count")) {
    absl::StatusOr<int64_t> experts = f.GetInt("llama.expert_count");
    if (!experts.ok()) return Prefixed(path, experts.status());
    if (*experts > 0) {
      return absl::UnimplementedError(absl::StrCat(
          Where(path), ": a mixture of experts (llama.expert_count = ", *experts, ")"));
    }
  }
  if (f.Has("llama.rope.scaling.type")) {
    absl::StatusOr<std::string> scaling = f.GetString("llama.rope.scaling.type");
    if (!scaling.ok()) return Prefixed(path, scaling.status());
    if (*scaling != "none") {
      return absl::UnimplementedError(
          absl::StrCat(Where(path), ": RoPE scaling '", *scaling, "' (llama.rope.scaling.type)"));
    }
  }
  // Linear scaling without a type (older converters wrote only the factor) is scaling too.
  for (const char* key : {"llama.rope.scaling.factor", "llama.rope.scale_linear"}) {
    if (!f.Has(key)) continue;
    absl::StatusOr<double> factor = f.GetFloat(key);
    if (!factor.ok()) return Prefixed(path, factor.status());
    if (*factor != 1.0 && *factor != 0.0) {  // 0: llama.cpp's "not set"
      return absl::UnimplementedError(
          absl::StrCat(Where(path), ": RoPE scaling by ", *factor, " (", key, ")"));
    }
  }
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(Where(path),
                     ": RoPE frequency factors (tensor rope_freqs.weight, Llama "
                     "3.1-style long-context scaling)"));
  }

  ModelSpec spec;
  spec.name = std::filesystem::path(path).stem().string();
  struct Field {
    int32_t* dest;
    const char* key;
    int64_t max;
  };
  for (const Field& field :
       {Field{&spec.dim, "llama.embedding_length", kMaxDim},
        Field{&spec.hidden_dim, "llama.feed_forward_length", kMaxHiddenDim},
        Field{&spec.num_layers, "llama.block_count", kMaxLayers},
        Field{&spec.num_heads, "llama.attention.head_count", kMaxHeads},
        Field{&spec.max_context_tokens, "llama.context_length", kMaxContext}}) {
    absl::StatusOr<int32_t> v = PositiveKey(f, field.key, field.max);
    if (!v.ok()) return v.status();
    *field.dest = *v;
  }
  absl::StatusOr<int32_t> kv_heads =
      PositiveKey(f, "llama.attention.head_count_kv", kMaxHeads, spec.num_heads);
  if (!kv_heads.ok()) return kv_heads.status();
  spec.num_kv_heads = *kv_heads;
  if (spec.dim % spec.num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path), ": llama.embedding_length (", spec.dim,
                     ") is not a multiple of llama.attention.head_count (", spec.num_heads, ")"));
  }
  spec.head_dim = spec.dim / spec.num_heads;
  for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                          "llama.attention.value_length"}) {
    if (!f.Has(key)) continue;
    absl::StatusOr<int64_t> v = f.GetInt(key);
    if (!v.ok()) return Prefixed(path, v.status());
    if (*v != spec.head_dim) {
      return absl::UnimplementedError(absl::StrCat(Where(path), ": ", key, " = ", *v,
                                                   ", not the head size ", spec.head_dim,
                                                   " (embedding_length / head_count)"));
    }
  }
  const GgufTensorInfo* embedding = f.FindTensor("token_embd.weight");
  if (embedding == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": no tensor token_embd.weight"));
  }
  absl::StatusOr<int32_t> vocab = PositiveKey(
      f, "llama.vocab_size", kMaxVocab,
      embedding->dims.size() == 2 ? std::optional<int64_t>(embedding->dims[1]) : std::nullopt);
  if (!vocab.ok()) return vocab.status();
  spec.vocab_size = *vocab;
  absl::StatusOr<double> theta = FloatKey(f, "llama.rope.freq_base", 10000.0);
  if (!theta.ok()) return theta.status();
  absl::StatusOr<double> eps = FloatKey(f, "llama.attention.layer_norm_rms_epsilon", 1e-5);
  if (!eps.ok()) return eps.status();
  spec.rope_theta = static_cast<float>(*theta);
  spec.norm_eps = static_cast<float>(*eps);
  if (!std::isfinite(spec.rope_theta) || !std::isfinite(spec.norm_eps)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": rope.freq_base ", *theta,
                                                   " or layer_norm_rms_epsilon ", *eps,
                                                   " is not a finite float"));
  }
  spec.rope_style = RopeStyle::kInterleaved;
  spec.shared_classifier = f.FindTensor("output.weight") == nullptr;
  for (auto [dest, key, fallback] : {std::tuple<int32_t*, const char*, int64_t>{
                                         &spec.bos_token_id, "tokenizer.ggml.bos_token_id", 1},
                                     {&spec.eos_token_id, "tokenizer.ggml.eos_token_id", 2}}) {
    absl::StatusOr<int64_t> v = f.Has(key) ? f.GetInt(key) : absl::StatusOr<int64_t>(fallback);
    if (!v.ok()) return Prefixed(path, v.status());
    if (*v < 0 || *v >= spec.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path), ": ", key, " = ", *v, " is outside the vocabulary of ", spec.vocab_size));
    }
    *dest = static_cast<int32_t>(*v);
  }
  // End-of-turn and end-of-message tokens end a completion as EOS does (Llama 3 Instruct ends
  // its turns with <|eot_id|>); 2^32 - 1 is llama.cpp's "none".
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (!f.Has(key)) continue;
    absl::StatusOr<int64_t> v = f.GetInt(key);
    if (!v.ok()) return Prefixed(path, v.status());
    if (*v == 0xFFFFFFFF || *v == -1) continue;
    if (*v < 0 || *v >= spec.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path), ": ", key, " = ", *v, " is outside the vocabulary of ", spec.vocab_size));
    }
    if (*v != spec.eos_token_id) spec.other_end_token_ids.push_back(static_cast<int32_t>(*v));
  }
  spec.ends_at_bos = false;
  if (absl::Status s = spec.Validate(); !s.ok()) return Prefixed(path, s);

  ModelWeights unused;
  unused.spec = spec;
  std::vector<std::string> names;
  for (const WeightSlot& slot : WeightSlots(unused)) {
    const std::string& name = names.emplace_back(GgufName(slot));
    const GgufTensorInfo* t = f.FindTensor(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path), ": no tensor ", name));
    }
    if (t->dims != GgufDims(slot)) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path), ": tensor ", name, " is ",
                                                     DimsText(t->dims), ", the model's shape ",
                                                     "needs ", DimsText(GgufDims(slot))));
    }
    if (!GgmlTypeIsConverted(t->type)) {
      return absl::UnimplementedError(absl::StrCat(Where(path), ": tensor ", name, " is ",
                                                   GgmlTypeName(t->type),
                                                   "; kvd reads F32, F16, BF16 and Q8_0"));
    }
  }
  // A tensor the forward pass would not use (a bias, say) would change what the model
  // computes: refused rather than dropped.
  if (f.tensors().size() != names.size()) {
    for (const GgufTensorInfo& t : f.tensors()) {
      if (std::find(names.begin(), names.end(), t.name) == names.end()) {
        return absl::UnimplementedError(absl::StrCat(Where(path), ": tensor ", t.name,
                                                     " is not one kvd's llama forward pass uses"));
      }
    }
  }
  return Opened{*std::move(opened), std::move(spec)};
}

}  // namespace

absl::StatusOr<ModelSpec> ReadGgufSpec(const std::string& path) {
  absl::StatusOr<Opened> opened = OpenModel(path);
  if (!opened.ok()) return opened.status();
  return std::move(opened->spec);
}

absl::StatusOr<ModelWeights> LoadGgufModel(const std::string& path,
                                           std::optional<int64_t> host_bytes_available) {
  absl::StatusOr<Opened> opened = OpenModel(path);
  if (!opened.ok()) return opened.status();
  const GgufFile& file = opened->file;
  return LoadWeightSlots(opened->spec, Where(path), host_bytes_available, GgufName,
                         [&file](const WeightSlot& slot) {
                           return file.ReadAsFloat(*file.FindTensor(GgufName(slot)), slot.dest);
                         });
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path,
                                                             int32_t expected_vocab_size) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  absl::StatusOr<std::string> model = f->GetString("tokenizer.ggml.model");
  if (!model.ok()) return Prefixed(path, model.status());
  if (*model != "llama") {
    return absl::UnimplementedError(
        absl::StrCat(Where(path), ": tokenizer.ggml.model '", *model,
                     "'; kvd's tokenizer reads 'llama' (SentencePiece) vocabularies"));
  }
  for (auto [key, want] : {std::pair<const char*, int64_t>{"tokenizer.ggml.bos_token_id", 1},
                           {"tokenizer.ggml.eos_token_id", 2}}) {
    if (!f->Has(key)) continue;
    absl::StatusOr<int64_t> id = f->GetInt(key);
    if (!id.ok()) return Prefixed(path, id.status());
    if (*id != want) {
      return absl::UnimplementedError(
          absl::StrCat(Where(path), ": ", key, " = ", *id, "; kvd's tokenizer has it at ", want));
    }
  }
  absl::StatusOr<std::vector<std::string>> tokens = f->GetStrings("tokenizer.ggml.tokens");
  if (!tokens.ok()) return Prefixed(path, tokens.status());
  absl::StatusOr<std::vector<double>> scores = f->GetNumbers("tokenizer.ggml.scores");
  if (!scores.ok()) return Prefixed(path, scores.status());
  if (expected_vocab_size >= 0 && tokens->size() != static_cast<size_t>(expected_vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": tokenizer.ggml.tokens has ",
                                                   tokens->size(), " tokens but the model ",
                                                   "expects ", expected_vocab_size));
  }
  if (f->Has("tokenizer.ggml.token_type")) {
    absl::StatusOr<std::vector<double>> types = f->GetNumbers("tokenizer.ggml.token_type");
    if (!types.ok()) return Prefixed(path, types.status());
    // llama.cpp matches user-defined tokens (added chat markers, say) in the text before
    // encoding the rest; kvd's encoder would split them into ordinary pieces.
    const auto user_defined = std::find(types->begin(), types->end(), kUserDefinedToken);
    if (user_defined != types->end()) {
      return absl::UnimplementedError(
          absl::StrCat(Where(path), ": token ", user_defined - types->begin(), " ('",
                       (*tokens)[user_defined - types->begin()],
                       "') is user-defined, which kvd's tokenizer does not match as a whole"));
    }
  }
  std::vector<std::string> pieces;
  pieces.reserve(tokens->size());
  for (size_t id = 0; id < tokens->size(); ++id) {
    pieces.push_back(id == 1   ? "\n<s>\n"
                     : id == 2 ? "\n</s>\n"
                               : absl::StrReplaceAll((*tokens)[id], {{"\xE2\x96\x81", " "}}));
  }
  std::vector<float> piece_scores(scores->begin(), scores->end());
  return Tokenizer::FromVocabulary(std::move(pieces), std::move(piece_scores),
                                   absl::StrCat(Where(path), ": tokenizer.ggml"));
}

}  // namespace kvd
