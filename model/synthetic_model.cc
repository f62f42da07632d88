#include "model/synthetic_model.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd {

namespace {

struct Preset {
  std::string_view name;
  ModelSpec spec;  // everything but the name
};

ModelSpec MakeSpec(int32_t num_layers, int32_t dim, int32_t hidden_dim, int32_t num_heads,
                   int32_t num_kv_heads, int32_t head_dim, int32_t vocab_size,
                   int32_t max_context_tokens, float rope_theta, RopeStyle rope_style,
                   bool shared_classifier, int32_t bos_token_id, int32_t eos_token_id) {
  ModelSpec spec;
  spec.num_layers = num_layers;
  spec.dim = dim;
  spec.hidden_dim = hidden_dim;
  spec.num_heads = num_heads;
  spec.num_kv_heads = num_kv_heads;
  spec.head_dim = head_dim;
  spec.vocab_size = vocab_size;
  spec.max_context_tokens = max_context_tokens;
  spec.rope_theta = rope_theta;
  spec.rope_style = rope_style;
  spec.norm_eps = 1e-5f;
  spec.shared_classifier = shared_classifier;
  spec.bos_token_id = bos_token_id;
  spec.eos_token_id = eos_token_id;
  return spec;
}

// Debian's Abseil has its own string_view type, so std::string_view goes through
// std::string on the way into absl::StrCat.

// Values from the models' published config.json files (meta-llama/Meta-Llama-3-8B and
// meta-llama/Llama-2-7b-hf).
std::vector<Preset> Presets() {
  return {
      {"llama3-8b", MakeSpec(32, 4096, 14336, 32, 8, 128, 128256, 8192, 500000.0f, RopeStyle::kHalf,
                             false, 128000, 128001)},
      {"llama2-7b", MakeSpec(32, 4096, 11008, 32, 32, 128, 32000, 4096, 10000.0f, RopeStyle::kHalf,
                             false, 1, 2)},
      {"tiny",
       MakeSpec(2, 64, 128, 4, 2, 16, 256, 256, 10000.0f, RopeStyle::kInterleaved, true, 1, 2)},
  };
}

// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and fully specified, so the weights
// are the same on every platform and standard library.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in (-1, 1), symmetric: the top 24 bits, centred on the bucket midpoints.
  float NextSigned() {
    const float u = (static_cast<float>(Next() >> 40) + 0.5f) * 0x1p-24f;  // (0, 1)
    return 2.0f * u - 1.0f;
  }

 private:
  uint64_t state_;
};

// Fills `out` with `n` values center + half_width * U(-1, 1) from the stream of
// (seed, tensor_id).
void Fill(std::vector<float>& out, int64_t n, uint64_t seed, uint64_t tensor_id, float center,
          float half_width) {
  SplitMix64 stream_seed(tensor_id);
  SplitMix64 rng(seed ^ stream_seed.Next());
  out.resize(n);
  for (float& v : out) v = center + half_width * rng.NextSigned();
}

// Half width of a uniform distribution with variance 1 / fan_in.
float UniformHalfWidth(int64_t fan_in) { return std::sqrt(3.0f / static_cast<float>(fan_in)); }

constexpr float kNormHalfWidth = 0.1f;

// Tensor ids: globals below kLayerIdBase, then kLayerIdStride per layer.
enum TensorId : uint64_t {
  kTokenEmbedding = 1,
  kFinalNorm = 2,
  kClassifier = 3,
  kLayerIdBase = 16,
  kLayerIdStride = 16,
};

}  // namespace

absl::StatusOr<ModelSpec> SyntheticSpec(std::string_view preset) {
  std::string valid;
  for (const Preset& p : Presets()) {
    if (p.name == preset) {
      ModelSpec spec = p.spec;
      spec.name = absl::StrCat("synthetic:", std::string(p.name));
      return spec;
    }
    absl::StrAppend(&valid, valid.empty() ? "" : ", ", std::string(p.name));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown synthetic model preset \"", std::string(preset), "\"; valid presets: ", valid));
}

absl::StatusOr<ModelWeights> MakeSyntheticWeights(const ModelSpec& spec, uint64_t seed,
                                                  int64_t max_bytes) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  const int64_t bytes = spec.NumParameters() * int64_t{sizeof(float)};
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "synthetic weights for %s need %d bytes (%.1f GiB) of fp32 host memory, over the "
        "limit of %d bytes; generate them on the device instead",
        spec.name, bytes, static_cast<double>(bytes) / (1 << 30), max_bytes));
  }
  const int64_t dim = spec.dim;
  const int64_t q_dim = int64_t{spec.num_heads} * spec.head_dim;
  const int64_t kv_dim = int64_t{spec.num_kv_heads} * spec.head_dim;
  const int64_t hidden = spec.hidden_dim;
  const int64_t embed = int64_t{spec.vocab_size} * dim;

  ModelWeights w;
  w.spec = spec;
  Fill(w.token_embedding, embed, seed, kTokenEmbedding, 0.0f, UniformHalfWidth(dim));
  Fill(w.final_norm, dim, seed, kFinalNorm, 1.0f, kNormHalfWidth);
  if (!spec.shared_classifier) {
    Fill(w.classifier, embed, seed, kClassifier, 0.0f, UniformHalfWidth(dim));
  }
  w.layers.resize(spec.num_layers);
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    LayerWeights& layer = w.layers[l];
    const uint64_t id = kLayerIdBase + l * kLayerIdStride;
    Fill(layer.attn_norm, dim, seed, id + 0, 1.0f, kNormHalfWidth);
    Fill(layer.wq, q_dim * dim, seed, id + 1, 0.0f, UniformHalfWidth(dim));
    Fill(layer.wk, kv_dim * dim, seed, id + 2, 0.0f, UniformHalfWidth(dim));
    Fill(layer.wv, kv_dim * dim, seed, id + 3, 0.0f, UniformHalfWidth(dim));
    Fill(layer.wo, dim * q_dim, seed, id + 4, 0.0f, UniformHalfWidth(q_dim));
    Fill(layer.ffn_norm, dim, seed, id + 5, 1.0f, kNormHalfWidth);
    Fill(layer.w1, hidden * dim, seed, id + 6, 0.0f, UniformHalfWidth(dim));
    Fill(layer.w2, dim * hidden, seed, id + 7, 0.0f, UniformHalfWidth(hidden));
    Fill(layer.w3, hidden * dim, seed, id + 8, 0.0f, UniformHalfWidth(dim));
  }
  return w;
}

}  // namespace kvd
