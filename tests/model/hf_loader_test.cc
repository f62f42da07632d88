#include "model/hf_loader.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf_file.h"
#include "model/llama2c_loader.h"
#include "model/model_loader.h"
#include "model/safetensors_file.h"
#include "model/sentencepiece_model.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/model/hf_writer.h"
#include "tests/model/llama_tokenizer_cases.h"

namespace kvd {
namespace {

using test::SafetensorsBytes;
using test::SafetensorsEntry;
using test::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kModels = KVD_SHARED_DIR "/models";

std::string TempDir(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::string Floats(const std::vector<float>& values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A safetensors file's tensors as F32 entries, to write back changed.
std::vector<SafetensorsEntry> F32Entries(const std::string& path) {
  std::vector<SafetensorsEntry> entries;
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return entries;
  for (const SafetensorsTensor& t : f->tensors()) {
    std::vector<float> v;
    EXPECT_TRUE(f->ReadAsFloat(t, &v).ok()) << t.name;
    entries.push_back({t.name, "F32", t.shape, Floats(v)});
  }
  return entries;
}

// --- safetensors ------------------------------------------------------------------------

TEST(SafetensorsFileTest, ReadsF32F16AndBf16Tensors) {
  const std::string path = TempDir("types.safetensors");
  WriteFile(path, SafetensorsBytes({{"a", "F32", {2, 2}, Floats({1, -2, 3.5f, 0})},
                                    {"h", "F16", {3}, std::string("\x00\x3c\x00\xc0\x01\x00", 6)},
                                    {"b", "BF16", {2}, std::string("\x80\x3f\xa0\xc0", 4)},
                                    {"i", "I64", {1}, std::string(8, '\0')}},
                                   R"({"format": "pt"})"));
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensors().size(), 4u);
  const SafetensorsTensor* a = f->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_THAT(a->shape, ElementsAre(2, 2));
  EXPECT_EQ(a->num_bytes, 16);
  std::vector<float> out;
  ASSERT_TRUE(f->ReadAsFloat(*a, &out).ok());
  EXPECT_THAT(out, ElementsAre(1, -2, 3.5f, 0));
  ASSERT_TRUE(f->ReadAsFloat(*f->Find("h"), &out).ok());
  EXPECT_THAT(out, ElementsAre(1.0f, -2.0f, std::ldexp(1.0f, -24)));
  ASSERT_TRUE(f->ReadAsFloat(*f->Find("b"), &out).ok());
  EXPECT_THAT(out, ElementsAre(1.0f, -5.0f));
  const absl::Status s = f->ReadAsFloat(*f->Find("i"), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'i'"), HasSubstr("I64")));
  EXPECT_EQ(f->Find("nothing"), nullptr);
}

TEST(SafetensorsFileTest, RefusesCorruptFilesSayingWhat) {
  auto refused = [](const std::string& name, const std::string& bytes, const std::string& what) {
    const std::string path = TempDir(name);
    WriteFile(path, bytes);
    const absl::Status s = SafetensorsFile::Open(path).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << ": " << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr(name), HasSubstr(what))) << name;
  };
  refused("short.safetensors", "abc", "no header length");
  refused("long_header.safetensors", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10),
          "exceeds the file's");
  const std::string good = SafetensorsBytes({{"t", "F32", {2}, Floats({1, 2})}});
  refused("truncated.safetensors", good.substr(0, good.size() - 1), "outside the 7 bytes");
  auto with_header = [](const std::string& json, const std::string& data) {
    std::string out(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(out.data(), &n, 8);
    return out + json + data;
  };
  refused("not_json.safetensors", with_header("{\"t\": ", ""), "not a JSON object");
  refused("metadata.safetensors", with_header(R"({"__metadata__": {"a": []}})", ""),
          "__metadata__ is not an object of strings");
  const std::string unknown = TempDir("dtype.safetensors");
  WriteFile(unknown,
            with_header(R"({"t": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", "x"));
  const absl::Status s = SafetensorsFile::Open(unknown).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("dtype 'F4', which kvd does not know"));
  refused("size.safetensors",
          with_header(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "xxxx"),
          "4 bytes for 2 elements of F32");
  refused("shape.safetensors",
          with_header(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "xxxx"),
          "bad shape [-1]");
  refused("offsets.safetensors",
          with_header(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "xxxx"),
          "data_offsets [4,0]");
  refused("fields.safetensors", with_header(R"({"t": {"dtype": "F32"}})", ""),
          "needs dtype, shape and two data_offsets");
}

// --- Hugging Face directories -----------------------------------------------------------------

// stories260K written as transformers stores a Llama (Q and K rows in half-rotation order)
// loads as the llama2.c checkpoint with those rows, whole or sharded, and RoPE on halves.
TEST(HfLoaderTest, Stories260kDirectoryHoldsTheCheckpointsWeights) {
  auto c = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(c.ok()) << c.status();
  const ModelSpec& cs = c->spec;
  for (bool sharded : {false, true}) {
    const std::string dir = TempDir(sharded ? "hf_sharded" : "stories260K_hf");
    test::WriteHfStories260k(dir, sharded);
    absl::StatusOr<ModelWeights> h = LoadHfModel(dir);
    ASSERT_TRUE(h.ok()) << h.status();
    const ModelSpec& hs = h->spec;
    EXPECT_EQ(hs.name, sharded ? "hf_sharded" : "stories260K_hf");
    EXPECT_EQ(hs.num_layers, cs.num_layers);
    EXPECT_EQ(hs.dim, cs.dim);
    EXPECT_EQ(hs.hidden_dim, cs.hidden_dim);
    EXPECT_EQ(hs.num_heads, cs.num_heads);
    EXPECT_EQ(hs.num_kv_heads, cs.num_kv_heads);
    EXPECT_EQ(hs.head_dim, cs.head_dim);
    EXPECT_EQ(hs.vocab_size, cs.vocab_size);
    EXPECT_EQ(hs.max_context_tokens, cs.max_context_tokens);
    EXPECT_EQ(hs.rope_style, RopeStyle::kHalf);
    EXPECT_EQ(hs.rope_theta, 10000.0f);
    EXPECT_EQ(hs.norm_eps, 1e-5f);
    EXPECT_TRUE(hs.shared_classifier);
    EXPECT_FALSE(hs.ends_at_bos);
    EXPECT_EQ(h->token_embedding, c->token_embedding);
    EXPECT_TRUE(h->classifier.empty());
    EXPECT_EQ(h->final_norm, c->final_norm);
    for (int l = 0; l < cs.num_layers; ++l) {
      const LayerWeights& a = h->layers[l];
      const LayerWeights& b = c->layers[l];
      EXPECT_EQ(a.wq, test::ToHalfRotationRows(b.wq, cs.num_heads, cs.head_dim, cs.dim)) << l;
      EXPECT_EQ(a.wk, test::ToHalfRotationRows(b.wk, cs.num_kv_heads, cs.head_dim, cs.dim)) << l;
      EXPECT_NE(a.wq, b.wq) << l;
      EXPECT_EQ(a.wv, b.wv) << l;
      EXPECT_EQ(a.wo, b.wo) << l;
      EXPECT_EQ(a.attn_norm, b.attn_norm) << l;
      EXPECT_EQ(a.ffn_norm, b.ffn_norm) << l;
      EXPECT_EQ(a.w1, b.w1) << l;
      EXPECT_EQ(a.w2, b.w2) << l;
      EXPECT_EQ(a.w3, b.w3) << l;
    }
    absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir);  // model_loader picks the directory
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->rope_style, RopeStyle::kHalf);
  }
}

TEST(HfLoaderTest, TokenizerModelIsTok512) {
  const std::string dir = TempDir("hf_tokenizer");
  test::WriteHfStories260k(dir);
  absl::StatusOr<std::unique_ptr<Tokenizer>> h = LoadHfTokenizer(dir, 512);
  ASSERT_TRUE(h.ok()) << h.status();
  auto t = Tokenizer::LoadLlama2c(kModels + "/tok512.bin");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ((*h)->vocab_size(), (*t)->vocab_size());
  for (int32_t id = 0; id < (*t)->vocab_size(); ++id) {
    EXPECT_EQ((*h)->piece(id), (*t)->piece(id)) << id;
    EXPECT_EQ((*h)->score(id), (*t)->score(id)) << id;
  }
  ASSERT_TRUE(LoadModelTokenizer(dir, 512).ok());
  ASSERT_TRUE(LoadTokenizerFile(dir + "/tokenizer.model", 512).ok());

  const absl::Status wrong = LoadHfTokenizer(dir, 32000).status();
  EXPECT_THAT(wrong.message(), HasSubstr("has 512 pieces but the model expects 32000"));
  std::filesystem::remove(dir + "/tokenizer.model");
  const absl::Status none = LoadHfTokenizer(dir).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(none.message(), HasSubstr("no tokenizer.model"));
}

TEST(HfLoaderTest, SentencePieceModelsOtherThanLlamasAreRefused) {
  std::vector<test::SentencePieceEntry> pieces = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    pieces.push_back({name, 0, 6});
  }
  const std::string path = TempDir("spm.model");
  WriteFile(path, test::SentencePieceModelBytes(pieces));
  absl::StatusOr<std::unique_ptr<Tokenizer>> ok = LoadSentencePieceTokenizer(path);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->vocab_size(), 259);
  EXPECT_EQ((*ok)->piece(1), "\n<s>\n");

  WriteFile(path, test::SentencePieceModelBytes(pieces, /*model_type=*/1));
  absl::Status s = LoadSentencePieceTokenizer(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("a unigram model"));
  pieces[1].type = 1;
  WriteFile(path, test::SentencePieceModelBytes(pieces));
  s = LoadSentencePieceTokenizer(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("BOS and EOS are not the control pieces"));
  const std::string bytes = test::SentencePieceModelBytes(pieces);
  WriteFile(path, bytes.substr(0, bytes.size() - 3));
  s = LoadSentencePieceTokenizer(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("spm.model"), HasSubstr("at offset")));
  pieces[1].type = 3;

  // Normalization kvd's encoder does not do (NFKC, whitespace collapsed, no dummy prefix;
  // proto2's defaults when the file has no normalizer_spec), and user-defined pieces.
  for (const std::string& normalizer :
       {std::string("\x0a\x08nmt_nfkc"), std::string("\x18\x00\x20\x00", 4), std::string()}) {
    WriteFile(path, test::SentencePieceModelBytes(pieces, 2, normalizer));
    s = LoadSentencePieceTokenizer(path).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_THAT(s.message(), HasSubstr("normalization kvd's encoder does not do"));
  }
  pieces.push_back({"<|im_start|>", 0, 4});
  WriteFile(path, test::SentencePieceModelBytes(pieces));
  s = LoadSentencePieceTokenizer(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("piece 259 ('<|im_start|>') is user-defined"));
}

// The LLaMA vocabulary written as a tokenizer.model (from llama.cpp's vocabulary-only GGUF:
// its pieces, scores and types) encodes llama.cpp's tokenizer test cases as they expect.
TEST(HfLoaderTest, LlamaTokenizerModelMatchesLlamaCppsTestCases) {
  absl::StatusOr<GgufFile> gguf = GgufFile::Open(test::kLlamaSpmVocab);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const std::vector<std::string> tokens = *gguf->GetStrings("tokenizer.ggml.tokens");
  const std::vector<double> scores = *gguf->GetNumbers("tokenizer.ggml.scores");
  const std::vector<double> types = *gguf->GetNumbers("tokenizer.ggml.token_type");
  std::vector<test::SentencePieceEntry> pieces;
  for (size_t id = 0; id < tokens.size(); ++id) {
    pieces.push_back({tokens[id], static_cast<float>(scores[id]), static_cast<int>(types[id])});
  }
  const std::string path = TempDir("llama_spm.model");
  WriteFile(path, test::SentencePieceModelBytes(pieces));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadSentencePieceTokenizer(path, 32000);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  test::ExpectEncodesLlamaTokenizerCases(**tokenizer);
}

// A directory whose config.json is edited by `edit` (and whose files then by `files`).
std::string EditedStories(const std::string& name, void (*edit)(nlohmann::json&)) {
  const std::string dir = TempDir(name);
  test::WriteHfStories260k(dir);
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  edit(config);
  WriteFile(dir + "/config.json", config.dump());
  return dir;
}

TEST(HfLoaderTest, RefusesWhatItCannotServeNamingIt) {
  struct Case {
    std::string dir;
    absl::StatusCode code;
    std::string what;
  };
  const Case cases[] = {
      {EditedStories("qwen", [](nlohmann::json& c) { c["architectures"] = {"Qwen2ForCausalLM"}; }),
       absl::StatusCode::kUnimplemented, "architecture 'Qwen2ForCausalLM'"},
      {EditedStories("bias", [](nlohmann::json& c) { c["attention_bias"] = true; }),
       absl::StatusCode::kUnimplemented, "attention_bias is true"},
      {EditedStories("gelu", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; }),
       absl::StatusCode::kUnimplemented, "hidden_act \"gelu\""},
      {EditedStories("llama3_rope",
                     [](nlohmann::json& c) {
                       c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
                     }),
       absl::StatusCode::kUnimplemented, "rope_scaling"},
      {EditedStories("no_layers", [](nlohmann::json& c) { c.erase("num_hidden_layers"); }),
       absl::StatusCode::kInvalidArgument, "config.json has no num_hidden_layers"},
      {EditedStories("neg_vocab", [](nlohmann::json& c) { c["vocab_size"] = -5; }),
       absl::StatusCode::kInvalidArgument, "vocab_size = -5"},
      {EditedStories("big_vocab", [](nlohmann::json& c) { c["vocab_size"] = 1000; }),
       absl::StatusCode::kInvalidArgument,
       "tensor model.embed_tokens.weight is [512, 64], the model's shape needs [1000, 64]"},
      {EditedStories("untied", [](nlohmann::json& c) { c["tie_word_embeddings"] = false; }),
       absl::StatusCode::kInvalidArgument, "no tensor lm_head.weight"},
      {EditedStories("head_dim", [](nlohmann::json& c) { c["head_dim"] = 16; }),
       absl::StatusCode::kUnimplemented, "head_dim 16"},
      {EditedStories("eos", [](nlohmann::json& c) { c["eos_token_id"] = 600; }),
       absl::StatusCode::kInvalidArgument, "eos_token_id 600"},
      // transformers 5 keeps RoPE settings in rope_parameters.
      {EditedStories("v5_llama3_rope",
                     [](nlohmann::json& c) {
                       c.erase("rope_theta");
                       c.erase("rope_scaling");
                       c["rope_parameters"] = {
                           {"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0}};
                     }),
       absl::StatusCode::kUnimplemented, "rope_parameters"},
      {EditedStories("two_thetas",
                     [](nlohmann::json& c) {
                       c["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
                     }),
       absl::StatusCode::kInvalidArgument, "rope_parameters's rope_theta 500000.0 differ"},
      {EditedStories("rope_type_first",
                     [](nlohmann::json& c) {
                       c["rope_scaling"] = {{"rope_type", "yarn"}, {"type", "default"}};
                     }),
       absl::StatusCode::kUnimplemented, "rope_scaling"},
      {EditedStories("rope_other", [](nlohmann::json& c) { c["rope_interleaved"] = true; }),
       absl::StatusCode::kUnimplemented, "rope_interleaved true (RoPE settings)"},
      {EditedStories("huge_theta", [](nlohmann::json& c) { c["rope_theta"] = 1e39; }),
       absl::StatusCode::kInvalidArgument, "is not a positive float"},
  };
  for (const Case& c : cases) {
    for (const absl::Status& s : {ReadHfSpec(c.dir).status(), LoadHfModel(c.dir).status()}) {
      EXPECT_EQ(s.code(), c.code) << c.dir << ": " << s;
      EXPECT_THAT(s.message(), AllOf(HasSubstr(c.dir), HasSubstr(c.what))) << c.dir;
    }
  }

  // A shard the index names is missing; a tensor of a dtype kvd does not read.
  const std::string sharded = TempDir("hf_missing_shard");
  test::WriteHfStories260k(sharded, /*sharded=*/true);
  std::filesystem::remove(sharded + "/model-00002-of-00002.safetensors");
  absl::Status s = ReadHfSpec(sharded).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("model-00002-of-00002.safetensors"));
  const std::string ints = TempDir("hf_int_norm");
  test::WriteHfStories260k(ints);
  std::vector<SafetensorsEntry> entries = F32Entries(ints + "/model.safetensors");
  for (SafetensorsEntry& e : entries) {
    if (e.name == "model.norm.weight") e.dtype = "I32";
  }
  WriteFile(ints + "/model.safetensors", SafetensorsBytes(entries));
  s = LoadHfModel(ints).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("tensor model.norm.weight is I32"));

  // A bias the forward pass has no place for is refused; saved RoPE frequencies are not.
  for (SafetensorsEntry& e : entries) e.dtype = "F32";
  entries.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                     "F32",
                     {4},
                     Floats({1, 0.1f, 0.01f, 0.001f})});
  WriteFile(ints + "/model.safetensors", SafetensorsBytes(entries));
  ASSERT_TRUE(ReadHfSpec(ints).ok()) << ReadHfSpec(ints).status();
  entries.push_back(
      {"model.layers.0.self_attn.q_proj.bias", "F32", {64}, Floats(std::vector<float>(64))});
  WriteFile(ints + "/model.safetensors", SafetensorsBytes(entries));
  s = ReadHfSpec(ints).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor model.layers.0.self_attn.q_proj.bias is not one kvd's llama"));
}

// transformers 5's rope_parameters give the RoPE base when rope_theta is not at the top.
TEST(HfLoaderTest, ReadsRopeParameters) {
  const std::string dir = EditedStories("v5_rope", [](nlohmann::json& c) {
    c.erase("rope_theta");
    c.erase("rope_scaling");
    c["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
  });
  absl::StatusOr<ModelSpec> spec = ReadHfSpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rope_theta, 500000.0f);
}

// Files from anywhere: nesting deeper than any real one is refused before it is parsed.
TEST(HfLoaderTest, RefusesDeeplyNestedJson) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string dir = EditedStories("deep_config", [](nlohmann::json&) {});
  WriteFile(dir + "/config.json", R"({"architectures": )" + deep + "}");
  absl::Status s = ReadHfSpec(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nested deeper than 64 levels"));
  std::string header =
      R"({"a": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 0]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  WriteFile(TempDir("deep.safetensors"), bytes + header);
  s = SafetensorsFile::Open(TempDir("deep.safetensors")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nested deeper than 64 levels"));
}

// An untied classifier is lm_head.weight, loaded as it is.
TEST(HfLoaderTest, AnUntiedClassifierIsLmHead) {
  const std::string dir =
      EditedStories("untied_lm_head", [](nlohmann::json& c) { c["tie_word_embeddings"] = false; });
  std::vector<SafetensorsEntry> entries = F32Entries(dir + "/model.safetensors");
  std::vector<float> head(512 * 64);
  for (size_t i = 0; i < head.size(); ++i) head[i] = static_cast<float>(i % 97) / 97.0f;
  entries.push_back({"lm_head.weight", "F32", {512, 64}, Floats(head)});
  WriteFile(dir + "/model.safetensors", SafetensorsBytes(entries));
  absl::StatusOr<ModelWeights> w = LoadHfModel(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE(w->spec.shared_classifier);
  EXPECT_EQ(w->classifier, head);
}

// MistralConfig's defaults for absent keys: a 4096-token window.
TEST(HfLoaderTest, AMistralConfigWithoutAWindowKeyHasMistralsWindow) {
  const std::string dir = EditedStories("mistral_defaults", [](nlohmann::json& c) {
    c["architectures"] = {"MistralForCausalLM"};
    c["max_position_embeddings"] = 32768;
  });
  absl::StatusOr<ModelSpec> spec = ReadHfSpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_context_tokens, 4096);
}

TEST(HfLoaderTest, AMistralSlidingWindowCapsTheContext) {
  const std::string dir = EditedStories("mistral", [](nlohmann::json& c) {
    c["architectures"] = {"MistralForCausalLM"};
    c["sliding_window"] = 256;
    c["eos_token_id"] = {2, 1};
  });
  absl::StatusOr<ModelSpec> spec = ReadHfSpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_context_tokens, 256);
  EXPECT_EQ(spec->eos_token_id, 2);  // the first of the list; the rest end completions too
  EXPECT_EQ(spec->StopTokenIds(), (std::vector<int32_t>{2, 1}));
}

// generation_config.json's end tokens (a chat model's end of turn) end completions too.
TEST(HfLoaderTest, GenerationConfigEndTokensEndCompletions) {
  const std::string dir = TempDir("hf_generation_config");
  test::WriteHfStories260k(dir);
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": [2, 300], "do_sample": true})");
  absl::StatusOr<ModelSpec> spec = ReadHfSpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->StopTokenIds(), (std::vector<int32_t>{2, 300}));
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": 9000})");
  const absl::Status s = ReadHfSpec(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("generation_config.json's eos_token_id 9000"));
}

TEST(HfLoaderTest, RefusesNonFiniteWeightsAndWeightsPastTheHostsMemory) {
  const std::string dir = TempDir("hf_budget");
  test::WriteHfStories260k(dir);
  absl::Status s = LoadHfModel(dir, /*host_bytes_available=*/1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("more than the 1000 available"));

  std::vector<SafetensorsEntry> entries = F32Entries(dir + "/model.safetensors");
  for (SafetensorsEntry& e : entries) {
    if (e.name != "model.layers.2.mlp.up_proj.weight") continue;
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(e.data.data() + 5 * sizeof(float), &inf, sizeof(float));
  }
  WriteFile(dir + "/model.safetensors", SafetensorsBytes(entries));
  s = LoadHfModel(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.2.mlp.up_proj.weight[5] is inf"));
}

}  // namespace
}  // namespace kvd
