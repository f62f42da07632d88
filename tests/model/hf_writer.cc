#include "tests/model/hf_writer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "model/llama2c_loader.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace kvd::test {

namespace {

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  return out + static_cast<char>(v);
}

std::string Field(uint32_t field, const std::string& bytes) {  // length-delimited
  return Varint(field << 3 | 2) + Varint(bytes.size()) + bytes;
}

std::string Floats(const std::vector<float>& values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

}  // namespace

std::string SafetensorsBytes(const std::vector<SafetensorsEntry>& entries,
                             const std::string& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = nlohmann::ordered_json::parse(metadata);
  std::string data;
  for (const SafetensorsEntry& e : entries) {
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {data.size(), data.size() + e.data.size()}}};
    data += e.data;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}

std::string LlamaNormalizerSpec() {
  return Field(1, "identity") + Varint(3 << 3 | 0) + Varint(1) + Varint(4 << 3 | 0) + Varint(0);
}

std::string SentencePieceModelBytes(const std::vector<SentencePieceEntry>& pieces, int model_type,
                                    const std::string& normalizer_spec) {
  std::string out;
  for (const SentencePieceEntry& p : pieces) {
    std::string score(4, '\0');
    std::memcpy(score.data(), &p.score, 4);
    std::string piece = Field(1, p.piece) + Varint(2 << 3 | 5) + score;
    if (p.type != 1) piece += Varint(3 << 3 | 0) + Varint(p.type);
    out += Field(1, piece);
  }
  if (model_type != 0) out += Field(2, Varint(3 << 3 | 0) + Varint(model_type));
  out += Field(3, normalizer_spec);
  return out;
}

std::vector<float> ToHalfRotationRows(const std::vector<float>& w, int heads, int head_dim,
                                      int in) {
  std::vector<float> out(w.size());
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < head_dim / 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        const size_t from = (size_t{1} * h * head_dim + 2 * i + j) * in;
        const size_t to = (size_t{1} * h * head_dim + j * head_dim / 2 + i) * in;
        std::copy(w.begin() + from, w.begin() + from + in, out.begin() + to);
      }
    }
  }
  return out;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void WriteHfStories260k(const std::string& dir, bool sharded) {
  const std::string models = KVD_SHARED_DIR "/models";
  auto w = LoadLlama2cCheckpoint(models + "/stories260K.bin");
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelSpec& s = w->spec;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", s.dim},
                           {"intermediate_size", s.hidden_dim},
                           {"num_hidden_layers", s.num_layers},
                           {"num_attention_heads", s.num_heads},
                           {"num_key_value_heads", s.num_kv_heads},
                           {"max_position_embeddings", s.max_context_tokens},
                           {"vocab_size", s.vocab_size},
                           {"rms_norm_eps", 1e-5},
                           {"rope_theta", 10000.0},
                           {"hidden_act", "silu"},
                           {"tie_word_embeddings", true},
                           {"bos_token_id", 1},
                           {"eos_token_id", 2},
                           {"rope_scaling", nullptr},
                           {"torch_dtype", "float32"}};
  WriteFile(dir + "/config.json", config.dump(2));

  std::vector<SafetensorsEntry> entries = {
      {"model.embed_tokens.weight", "F32", {s.vocab_size, s.dim}, Floats(w->token_embedding)},
      {"model.norm.weight", "F32", {s.dim}, Floats(w->final_norm)}};
  const int64_t q_dim = int64_t{s.num_heads} * s.head_dim;
  const int64_t kv_dim = int64_t{s.num_kv_heads} * s.head_dim;
  for (int l = 0; l < s.num_layers; ++l) {
    const LayerWeights& lw = w->layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    entries.push_back({p + "input_layernorm.weight", "F32", {s.dim}, Floats(lw.attn_norm)});
    entries.push_back({p + "self_attn.q_proj.weight",
                       "F32",
                       {q_dim, s.dim},
                       Floats(ToHalfRotationRows(lw.wq, s.num_heads, s.head_dim, s.dim))});
    entries.push_back({p + "self_attn.k_proj.weight",
                       "F32",
                       {kv_dim, s.dim},
                       Floats(ToHalfRotationRows(lw.wk, s.num_kv_heads, s.head_dim, s.dim))});
    entries.push_back({p + "self_attn.v_proj.weight", "F32", {kv_dim, s.dim}, Floats(lw.wv)});
    entries.push_back({p + "self_attn.o_proj.weight", "F32", {s.dim, q_dim}, Floats(lw.wo)});
    entries.push_back({p + "post_attention_layernorm.weight", "F32", {s.dim}, Floats(lw.ffn_norm)});
    entries.push_back({p + "mlp.gate_proj.weight", "F32", {s.hidden_dim, s.dim}, Floats(lw.w1)});
    entries.push_back({p + "mlp.down_proj.weight", "F32", {s.dim, s.hidden_dim}, Floats(lw.w2)});
    entries.push_back({p + "mlp.up_proj.weight", "F32", {s.hidden_dim, s.dim}, Floats(lw.w3)});
  }
  if (!sharded) {
    WriteFile(dir + "/model.safetensors", SafetensorsBytes(entries, R"({"format": "pt"})"));
  } else {
    const size_t half = entries.size() / 2;
    const std::vector<SafetensorsEntry> first(entries.begin(), entries.begin() + half);
    const std::vector<SafetensorsEntry> second(entries.begin() + half, entries.end());
    const std::string names[] = {"model-00001-of-00002.safetensors",
                                 "model-00002-of-00002.safetensors"};
    WriteFile(dir + "/" + names[0], SafetensorsBytes(first));
    WriteFile(dir + "/" + names[1], SafetensorsBytes(second));
    nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                            {"weight_map", nlohmann::json::object()}};
    for (size_t i = 0; i < entries.size(); ++i) {
      index["weight_map"][entries[i].name] = names[i < half ? 0 : 1];
    }
    WriteFile(dir + "/model.safetensors.index.json", index.dump(2));
  }

  auto tok = Tokenizer::LoadLlama2c(models + "/tok512.bin");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<SentencePieceEntry> pieces;
  for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) {
    SentencePieceEntry e;
    e.score = (*tok)->score(id);
    if (id == 0) {
      e = {"<unk>", e.score, 2};
    } else if (id == 1 || id == 2) {
      e = {id == 1 ? "<s>" : "</s>", e.score, 3};
    } else {
      e.piece = absl::StrReplaceAll(std::string((*tok)->piece(id)), {{" ", "\xE2\x96\x81"}});
      e.type = id < 259 ? 6 : 1;
    }
    pieces.push_back(e);
  }
  WriteFile(dir + "/tokenizer.model", SentencePieceModelBytes(pieces));
}

}  // namespace kvd::test
