#include "model/hf_loader.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/json_text.h"
#include "model/regular_file.h"
#include "model/safetensors_file.h"
#include "model/sentencepiece_model.h"
#include "nlohmann/json.hpp"

namespace kvd {

namespace {

// Sanity limits as the other loaders': far above any real Llama.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxHiddenDim = 1 << 18;
constexpr int64_t kMaxLayers = 1 << 10;
constexpr int64_t kMaxHeads = 1 << 10;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxContext = 1 << 24;
constexpr int64_t kMaxJsonBytes = int64_t{64} << 20;
std::string Where(const std::string& dir) {
  return absl::StrCat("Hugging Face model directory '", dir, "'");
}

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  const std::string what = absl::StrCat("'", path, "'");
  const absl::StatusOr<int64_t> size = RegularFileSize(path, what);
  if (!size.ok()) return size.status();
  if (*size > kMaxJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", *size, " bytes, over ", kMaxJsonBytes, " for a JSON file"));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return CannotOpen(what, errno);
  std::stringstream text;
  text << in.rdbuf();
  if (JsonDepth(text.str()) > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": nested deeper than ", kMaxJsonDepth, " levels"));
  }
  nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
  }
  return json;
}

// How a transformers Llama checkpoint names its tensors.
constexpr WeightNames kHfNames = {
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.layers.",
    {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
     "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.down_proj",
     "mlp.up_proj"}};

std::string HfName(const WeightSlot& slot) { return WeightName(slot, kHfNames); }

// The directory's spec and safetensors files, every tensor the model needs present, of its
// shape and of a dtype kvd reads.
struct Opened {
  ModelSpec spec;
  std::vector<SafetensorsFile> files;
  std::map<std::string, size_t> file_of;  // tensor name -> index into files
};

// config.json's integer `key` in [1, max]; `fallback` when absent, if given.
absl::StatusOr<int32_t> PositiveKey(const std::string& dir, const nlohmann::json& config,
                                    const char* key, int64_t max,
                                    std::optional<int64_t> fallback = std::nullopt) {
  if (!config.contains(key) || config[key].is_null()) {
    if (fallback.has_value()) return static_cast<int32_t>(*fallback);
    return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": config.json has no ", key));
  }
  const nlohmann::json& v = config[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > max) {
    return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": config.json's ", key, " = ",
                                                   ShownJson(v), " is not an integer in 1..", max));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

absl::StatusOr<double> NumberKey(const std::string& dir, const nlohmann::json& config,
                                 const char* key, double fallback) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_number() || !(config[key].get<double>() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": config.json's ", key, " = ",
                                                   ShownJson(config[key]),
                                                   " is not a positive number"));
  }
  return config[key].get<double>();
}

absl::StatusOr<Opened> OpenModel(const std::string& dir) {
  absl::StatusOr<nlohmann::json> loaded =
      ReadJson((std::filesystem::path(dir) / "config.json").string());
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat(Where(dir), ": config.json: ", loaded.status().message()));
  }
  const nlohmann::json& config = *loaded;
  std::string architecture;
  if (config.contains("architectures") && config["architectures"].is_array() &&
      !config["architectures"].empty() && config["architectures"][0].is_string()) {
    architecture = config["architectures"][0].get<std::string>();
  }
  const bool mistral = architecture == "MistralForCausalLM";
  if (architecture != "LlamaForCausalLM" && !mistral) {
    return absl::UnimplementedError(absl::StrCat(
        Where(dir), ": architecture '", architecture,
        "' (config.json's architectures); kvd serves LlamaForCausalLM and MistralForCausalLM"));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (config.contains(key) && config[key].is_boolean() && config[key].get<bool>()) {
      return absl::UnimplementedError(absl::StrCat(Where(dir), ": ", key, " is true (biases)"));
    }
  }
  if (config.contains("hidden_act") && config["hidden_act"] != "silu" &&
      config["hidden_act"] != "swish") {
    return absl::UnimplementedError(
        absl::StrCat(Where(dir), ": hidden_act ", ShownJson(config["hidden_act"]), " (kvd: silu)"));
  }
  // RoPE: transformers 4 writes rope_theta and rope_scaling; 5 folds both into
  // rope_parameters ({"rope_theta": ..., "rope_type": ...}). Plain RoPE has no scaling or
  // rope_type "default" (older files: "type"); any other rope_* key is something kvd does
  // not compute.
  for (const auto& [key, value] : config.items()) {
    if (key.rfind("rope_", 0) == 0 && key != "rope_theta" && key != "rope_scaling" &&
        key != "rope_parameters") {
      return absl::UnimplementedError(
          absl::StrCat(Where(dir), ": ", key, " ", ShownJson(value), " (RoPE settings)"));
    }
  }
  double theta_fallback = 10000.0;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const nlohmann::json& rope = config[key];
    const char* type_key = rope.is_object() && rope.contains("rope_type") ? "rope_type" : "type";
    const bool plain =
        rope.is_object() && (!rope.contains(type_key) || rope[type_key] == "default");
    const bool scaled = key == std::string("rope_scaling") && !rope.contains(type_key);
    if (!plain || scaled) {
      return absl::UnimplementedError(
          absl::StrCat(Where(dir), ": ", key, " ", ShownJson(rope), " (RoPE scaling)"));
    }
    if (rope.contains("rope_theta")) {
      if (!rope["rope_theta"].is_number()) {
        return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": ", key, "'s rope_theta ",
                                                       ShownJson(rope["rope_theta"]),
                                                       " is not a number"));
      }
      theta_fallback = rope["rope_theta"].get<double>();
      if (config.contains("rope_theta") && config["rope_theta"] != rope["rope_theta"]) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(dir), ": rope_theta ", ShownJson(config["rope_theta"]), " and ", key,
                         "'s rope_theta ", ShownJson(rope["rope_theta"]), " differ"));
      }
    }
  }

  ModelSpec spec;
  spec.name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (spec.name.empty()) spec.name = std::filesystem::path(dir).parent_path().filename().string();
  struct Field {
    int32_t* dest;
    const char* key;
    int64_t max;
  };
  for (const Field& field :
       {Field{&spec.dim, "hidden_size", kMaxDim},
        Field{&spec.hidden_dim, "intermediate_size", kMaxHiddenDim},
        Field{&spec.num_layers, "num_hidden_layers", kMaxLayers},
        Field{&spec.num_heads, "num_attention_heads", kMaxHeads},
        Field{&spec.max_context_tokens, "max_position_embeddings", kMaxContext},
        Field{&spec.vocab_size, "vocab_size", kMaxVocab}}) {
    absl::StatusOr<int32_t> v = PositiveKey(dir, config, field.key, field.max);
    if (!v.ok()) return v.status();
    *field.dest = *v;
  }
  // Absent keys take transformers' defaults: MistralConfig's are 8 KV heads and a 4096-token
  // window, LlamaConfig's one KV head per head and none.
  absl::StatusOr<int32_t> kv_heads =
      PositiveKey(dir, config, "num_key_value_heads", kMaxHeads, mistral ? 8 : spec.num_heads);
  if (!kv_heads.ok()) return kv_heads.status();
  spec.num_kv_heads = *kv_heads;
  if (spec.dim % spec.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": hidden_size (", spec.dim,
                                                   ") is not a multiple of num_attention_heads (",
                                                   spec.num_heads, ")"));
  }
  spec.head_dim = spec.dim / spec.num_heads;
  if (config.contains("head_dim") && !config["head_dim"].is_null() &&
      config["head_dim"] != spec.head_dim) {
    return absl::UnimplementedError(
        absl::StrCat(Where(dir), ": head_dim ", ShownJson(config["head_dim"]),
                     ", not hidden_size / ", "num_attention_heads = ", spec.head_dim));
  }
  if (config.contains("sliding_window") ? !config["sliding_window"].is_null() : mistral) {
    absl::StatusOr<int32_t> window =
        PositiveKey(dir, config, "sliding_window", kMaxContext, int64_t{4096});
    if (!window.ok()) return window.status();
    spec.max_context_tokens = std::min(spec.max_context_tokens, *window);
  }
  absl::StatusOr<double> theta = NumberKey(dir, config, "rope_theta", theta_fallback);
  if (!theta.ok()) return theta.status();
  absl::StatusOr<double> eps = NumberKey(dir, config, "rms_norm_eps", 1e-6);
  if (!eps.ok()) return eps.status();
  spec.rope_theta = static_cast<float>(*theta);
  spec.norm_eps = static_cast<float>(*eps);
  if (!std::isfinite(spec.rope_theta) || !(spec.rope_theta > 0) || !std::isfinite(spec.norm_eps) ||
      !(spec.norm_eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": rope_theta ", *theta,
                                                   " or rms_norm_eps ", *eps,
                                                   " is not a positive float"));
  }
  spec.rope_style = RopeStyle::kHalf;
  if (config.contains("tie_word_embeddings") && !config["tie_word_embeddings"].is_null() &&
      !config["tie_word_embeddings"].is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(dir),
                                                   ": config.json's tie_word_embeddings is not a "
                                                   "boolean"));
  }
  spec.shared_classifier = config.contains("tie_word_embeddings") &&
                           config["tie_word_embeddings"].is_boolean() &&
                           config["tie_word_embeddings"].get<bool>();
  // bos_token_id and eos_token_id: an id or a list of ids (of EOS ids the first is the EOS,
  // the rest end a completion too), in config.json and, for the end tokens a chat model
  // stops at, generation_config.json.
  auto token_ids = [&](const nlohmann::json& json, const char* file,
                       const char* key) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    if (!json.contains(key) || json[key].is_null()) return ids;
    const nlohmann::json list =
        json[key].is_array() ? json[key] : nlohmann::json::array({json[key]});
    for (const nlohmann::json& v : list) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= spec.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": ", file, "'s ", key, " ",
                                                       ShownJson(json[key]),
                                                       " is not a token id of the vocabulary"));
      }
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
  };
  absl::StatusOr<std::vector<int32_t>> bos = token_ids(config, "config.json", "bos_token_id");
  if (!bos.ok()) return bos.status();
  absl::StatusOr<std::vector<int32_t>> eos = token_ids(config, "config.json", "eos_token_id");
  if (!eos.ok()) return eos.status();
  spec.bos_token_id = bos->empty() ? 1 : bos->front();
  spec.eos_token_id = eos->empty() ? 2 : eos->front();
  if (eos->size() > 1) spec.other_end_token_ids.assign(eos->begin() + 1, eos->end());
  const std::filesystem::path generation = std::filesystem::path(dir) / "generation_config.json";
  std::error_code exists_error;
  if (std::filesystem::exists(generation, exists_error)) {
    absl::StatusOr<nlohmann::json> json = ReadJson(generation.string());
    if (!json.ok()) return json.status();
    absl::StatusOr<std::vector<int32_t>> ends =
        token_ids(*json, "generation_config.json", "eos_token_id");
    if (!ends.ok()) return ends.status();
    for (int32_t id : *ends) {
      if (id != spec.eos_token_id) spec.other_end_token_ids.push_back(id);
    }
  }
  spec.ends_at_bos = false;
  if (absl::Status s = spec.Validate(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(Where(dir), ": ", s.message()));
  }

  // The shards: model.safetensors.index.json's weight_map, or model.safetensors alone.
  Opened out;
  out.spec = spec;
  const std::filesystem::path root(dir);
  std::map<std::string, std::string> shard_of;  // tensor -> file name
  std::error_code ec;
  if (std::filesystem::exists(root / "model.safetensors.index.json", ec)) {
    absl::StatusOr<nlohmann::json> index =
        ReadJson((root / "model.safetensors.index.json").string());
    if (!index.ok()) return index.status();
    if (!index->contains("weight_map") || !(*index)["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(dir), ": model.safetensors.index.json has no weight_map object"));
    }
    for (const auto& [tensor, file] : (*index)["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(Where(dir), ": weight_map names ",
                                                       ShownJson(file), " for ", tensor,
                                                       " (a file name in the directory expected)"));
      }
      shard_of[tensor] = file.get<std::string>();
    }
  }
  std::map<std::string, size_t> opened_files;
  auto open_file = [&](const std::string& name) -> absl::StatusOr<size_t> {
    if (auto it = opened_files.find(name); it != opened_files.end()) return it->second;
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open((root / name).string());
    if (!f.ok()) return f.status();
    out.files.push_back(*std::move(f));
    opened_files[name] = out.files.size() - 1;
    return out.files.size() - 1;
  };
  ModelWeights unused;
  unused.spec = spec;
  for (const WeightSlot& slot : WeightSlots(unused)) {
    const std::string name = HfName(slot);
    auto shard = shard_of.find(name);
    if (!shard_of.empty() && shard == shard_of.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(dir), ": no tensor ", name, " in model.safetensors.index.json"));
    }
    absl::StatusOr<size_t> f = open_file(shard_of.empty() ? "model.safetensors" : shard->second);
    if (!f.ok()) return f.status();
    const SafetensorsTensor* t = out.files[*f].Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(dir), ": no tensor ", name, " in ", out.files[*f].path()));
    }
    if (t->shape != slot.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(dir), ": tensor ", name, " is [", absl::StrJoin(t->shape, ", "),
                       "], the model's shape needs [", absl::StrJoin(slot.shape, ", "), "]"));
    }
    if (!SafetensorsDtypeIsConverted(t->dtype)) {
      return absl::UnimplementedError(absl::StrCat(Where(dir), ": tensor ", name, " is ", t->dtype,
                                                   "; kvd reads F32, F16 and BF16"));
    }
    out.file_of[name] = *f;
  }
  // A tensor the forward pass would not use (a bias, say) would change what the model
  // computes: refused rather than dropped. Older transformers saved RoPE's inverse
  // frequencies, which kvd computes.
  std::vector<std::string> names;
  for (const auto& [name, file] : shard_of) names.push_back(name);
  for (const SafetensorsFile& f : out.files) {
    for (const SafetensorsTensor& t : f.tensors()) names.push_back(t.name);
  }
  for (const std::string& name : names) {
    if (out.file_of.count(name) == 0 && !absl::EndsWith(name, ".rotary_emb.inv_freq")) {
      return absl::UnimplementedError(
          absl::StrCat(Where(dir), ": tensor ", name, " is not one kvd's llama forward pass uses"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelSpec> ReadHfSpec(const std::string& dir) {
  absl::StatusOr<Opened> opened = OpenModel(dir);
  if (!opened.ok()) return opened.status();
  return std::move(opened->spec);
}

absl::StatusOr<ModelWeights> LoadHfModel(const std::string& dir,
                                         std::optional<int64_t> host_bytes_available) {
  absl::StatusOr<Opened> opened = OpenModel(dir);
  if (!opened.ok()) return opened.status();
  const Opened& o = *opened;
  return LoadWeightSlots(o.spec, Where(dir), host_bytes_available, HfName,
                         [&o](const WeightSlot& slot) {
                           const std::string name = HfName(slot);
                           const SafetensorsFile& file = o.files[o.file_of.at(name)];
                           return file.ReadAsFloat(*file.Find(name), slot.dest);
                         });
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& dir,
                                                           int32_t expected_vocab_size) {
  const std::filesystem::path path = std::filesystem::path(dir) / "tokenizer.model";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) {
    return absl::UnimplementedError(
        absl::StrCat(Where(dir),
                     ": no tokenizer.model (kvd reads SentencePiece tokenizers; tokenizer.json "
                     "alone, as Llama 3's, is not read)"));
  }
  return LoadSentencePieceTokenizer(path.string(), expected_vocab_size);
}

}  // namespace kvd
