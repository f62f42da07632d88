#include "model/gguf_loader.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf_file.h"
#include "model/half_float.h"
#include "model/llama2c_loader.h"
#include "model/model_loader.h"
#include "model/tokenizer.h"
#include "tests/model/gguf_writer.h"

namespace kvd {
namespace {

using test::GgufWriter;
using test::TinyLlamaGguf;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kModels = KVD_SHARED_DIR "/models";

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ4_K = 12, kBF16 = 30;

// --- The file format --------------------------------------------------------------------

TEST(GgufFileTest, ReadsTheStories260kHeader) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(kModels + "/stories260K.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->data_offset() % 32, 0);
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetInt("llama.block_count"), 5);
  EXPECT_FLOAT_EQ(*f->GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(f->GetStrings("tokenizer.ggml.tokens")->size(), 512u);
  EXPECT_EQ(f->GetStrings("tokenizer.ggml.tokens")->at(259), "\xE2\x96\x81t");
  EXPECT_EQ(f->GetNumbers("tokenizer.ggml.token_type")->at(3), 6);  // a byte piece
  EXPECT_EQ(f->GetNumbers("tokenizer.ggml.scores")->size(), 512u);
  const GgufTensorInfo* embd = f->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_THAT(embd->dims, ElementsAre(64, 512));
  EXPECT_EQ(embd->type, kF32);
  EXPECT_EQ(embd->num_bytes, 64 * 512 * 4);
  EXPECT_EQ(f->FindTensor("blk.5.attn_q.weight"), nullptr);

  // Typed lookups name the key, and what it holds.
  EXPECT_EQ(f->GetInt("llama.rope.freq_base").status().code(), absl::StatusCode::kNotFound);
  absl::Status s = f->GetInt("general.architecture").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("general.architecture"), HasSubstr("string")));
  s = f->GetString("tokenizer.ggml.scores").status();
  EXPECT_THAT(s.message(), HasSubstr("array of float32"));
}

// F16 (normal, subnormal, signed zero and the largest finite), BF16 and Q8_0 (a scale per 32
// values) come out as the fp32 values they encode, exactly.
TEST(GgufFileTest, ConvertsF16Bf16AndQ8_0ToFp32) {
  GgufWriter w;
  w.AddTensor("f16", {5}, kF16, GgufWriter::U16({0x3C00, 0xC000, 0x0001, 0x8000, 0x7BFF}));
  w.AddTensor("bf16", {3}, kBF16, GgufWriter::U16({0x3F80, 0xC0A0, 0x0000}));
  std::string q8;  // two blocks: scale 0.5 (fp16 0x3800) and -2 (0xC000)
  for (uint16_t scale : {uint16_t{0x3800}, uint16_t{0xC000}}) {
    q8 += GgufWriter::U16({scale});
    for (int i = 0; i < 32; ++i) q8 += static_cast<char>(static_cast<int8_t>(i - 16));
  }
  w.AddTensor("q8", {64}, kQ8_0, q8);
  w.AddTensor("f32", {2}, kF32, GgufWriter::F32({1.5f, -0.25f}));
  w.AddTensor("q4k", {256}, kQ4_K, std::string(144, '\0'));
  absl::StatusOr<GgufFile> f = GgufFile::Open(w.WriteTemp("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<float> out;
  ASSERT_TRUE(f->ReadAsFloat(*f->FindTensor("f16"), &out).ok());
  EXPECT_THAT(out, ElementsAre(1.0f, -2.0f, std::ldexp(1.0f, -24), -0.0f, 65504.0f));
  EXPECT_TRUE(std::signbit(out[3]));
  ASSERT_TRUE(f->ReadAsFloat(*f->FindTensor("bf16"), &out).ok());
  EXPECT_THAT(out, ElementsAre(1.0f, -5.0f, 0.0f));
  ASSERT_TRUE(f->ReadAsFloat(*f->FindTensor("q8"), &out).ok());
  ASSERT_EQ(out.size(), 64u);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[i], 0.5f * (i - 16)) << i;
    EXPECT_EQ(out[32 + i], -2.0f * (i - 16)) << i;
  }
  ASSERT_TRUE(f->ReadAsFloat(*f->FindTensor("f32"), &out).ok());
  EXPECT_THAT(out, ElementsAre(1.5f, -0.25f));
  absl::Status s = f->ReadAsFloat(*f->FindTensor("q4k"), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'q4k'"), HasSubstr("Q4_K"), HasSubstr("Q8_0")));
  EXPECT_EQ(GgmlTypeName(kQ4_K), "Q4_K");
  EXPECT_EQ(GgmlTypeName(99), "type 99");
}

absl::Status OpenBytes(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return GgufFile::Open(path).status();
}

// Every prefix of a valid file is refused (never read past its end, never a crash), naming
// the file.
TEST(GgufFileTest, RefusesEveryTruncation) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddFloats("scores", {1, 2, 3});
  w.AddStrings("tokens", {"a", "bc"});
  w.AddTensor("t", {4, 2}, kF32, GgufWriter::F32({1, 2, 3, 4, 5, 6, 7, 8}));
  const std::string bytes = w.Bytes();
  ASSERT_TRUE(OpenBytes("whole.gguf", bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const absl::Status s = OpenBytes("prefix.gguf", bytes.substr(0, n));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n << " bytes: " << s;
    EXPECT_THAT(s.message(), HasSubstr("prefix.gguf")) << n;
  }
}

TEST(GgufFileTest, RefusesCorruptHeadersSayingWhat) {
  auto refused = [](const std::string& name, const GgufWriter& w, const std::string& what,
                    uint32_t version = 3) {
    const absl::Status s = OpenBytes(name, w.Bytes(version));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr(what)) << name;
  };
  GgufWriter empty;
  refused("v1.gguf", empty, "GGUF version 1", 1);
  EXPECT_THAT(OpenBytes("magic.gguf", "GGML and more bytes").message(), HasSubstr("not a GGUF"));

  GgufWriter twice;
  twice.AddUint32("k", 1);
  twice.AddUint32("k", 2);
  refused("twice.gguf", twice, "'k' appears twice");

  GgufWriter long_string;  // a length far past the file's end: refused, not allocated
  long_string.AddRaw("k", 8, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8));
  refused("long_string.gguf", long_string, "metadata 'k'");
  GgufWriter long_array;
  long_array.AddRaw("k", 9, std::string("\x06\0\0\0\xff\xff\xff\xff\xff\xff\0\0", 12));
  refused("long_array.gguf", long_array, "metadata 'k'");
  GgufWriter bad_bool;
  bad_bool.AddRaw("k", 7, "\x02");
  refused("bad_bool.gguf", bad_bool, "bad value of type bool");
  GgufWriter bad_type;
  bad_type.AddRaw("k", 13, "\0");
  refused("bad_type.gguf", bad_type, "metadata 'k'");

  GgufWriter dims5;
  dims5.AddTensor("t", {1, 1, 1, 1, 1}, kF32, GgufWriter::F32({1}));
  refused("dims5.gguf", dims5, "'t' has 5 dimensions");
  GgufWriter dim0;
  dim0.AddTensor("t", {4, 0}, kF32, "");
  refused("dim0.gguf", dim0, "dimension 1 is 0");
  GgufWriter same;
  same.AddTensor("t", {1}, kF32, GgufWriter::F32({1}));
  same.AddTensor("t", {1}, kF32, GgufWriter::F32({1}));
  refused("same.gguf", same, "'t' appears twice");
  GgufWriter misaligned;
  misaligned.AddTensor("t", {1}, kF32, GgufWriter::F32({1}), 4);
  refused("misaligned.gguf", misaligned, "offset 4 is not a multiple of the alignment 32");
  GgufWriter past_end;
  past_end.AddTensor("t", {4}, kF32, GgufWriter::F32({1, 2, 3}));
  refused("past_end.gguf", past_end, "'t' (F32, 16 bytes at data offset 0) ends past the end");
  GgufWriter q8_rows;
  q8_rows.AddTensor("t", {16}, kQ8_0, std::string(17, '\0'));
  refused("q8_rows.gguf", q8_rows, "not a multiple of 32");
  GgufWriter alignment;
  alignment.AddUint32("general.alignment", 24);
  refused("alignment.gguf", alignment, "general.alignment must be a uint32 power of two");
  GgufWriter signed_alignment;
  signed_alignment.AddInt32("general.alignment", 32);
  refused("signed_alignment.gguf", signed_alignment, "must be a uint32 power of two");
  GgufWriter overflow;  // 2^62 floats: their bytes would wrap an int64
  overflow.AddTensor("t", {uint64_t{1} << 31, uint64_t{1} << 31}, kF32, "");
  refused("overflow.gguf", overflow, "more bytes than any file holds");
  GgufWriter long_name;
  long_name.AddTensor(std::string(65, 'n'), {1}, kF32, GgufWriter::F32({1}));
  refused("long_name.gguf", long_name, "a name of 65 bytes");
  GgufWriter no_name;
  no_name.AddTensor("", {1}, kF32, GgufWriter::F32({1}));
  refused("no_name.gguf", no_name, "a name of 0 bytes");
}

// Version 2 has version 3's layout (3 only adds big-endian files, which kvd refuses).
TEST(GgufFileTest, ReadsVersion2) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddTensor("t", {2}, kF32, GgufWriter::F32({5, 6}));
  absl::StatusOr<GgufFile> f = GgufFile::Open(w.WriteTemp("v2.gguf", /*version=*/2));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 2u);
  std::vector<float> out;
  ASSERT_TRUE(f->ReadAsFloat(f->tensors()[0], &out).ok());
  EXPECT_THAT(out, ElementsAre(5, 6));
}

// Every fp16 bit pattern converts to the value it encodes: (-1)^s 2^(e-15) (1 + m/1024), or
// 2^-14 m/1024 for e = 0, infinities and NaNs at e = 31.
TEST(GgufFileTest, EveryHalfConvertsExactly) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const int sign = bits >> 15, e = (bits >> 10) & 31, m = bits & 1023;
    const float got = HalfToFloat(static_cast<uint16_t>(bits));
    if (e == 31 && m != 0) {
      EXPECT_TRUE(std::isnan(got)) << bits;
      continue;
    }
    const double magnitude = e == 31  ? std::numeric_limits<double>::infinity()
                             : e == 0 ? std::ldexp(m, -24)
                                      : std::ldexp(1024 + m, e - 25);
    EXPECT_EQ(got, sign ? -magnitude : magnitude) << bits;
    EXPECT_EQ(std::signbit(got), sign == 1) << bits;
  }
}

TEST(GgufFileTest, HonoursGeneralAlignment) {
  GgufWriter w;
  w.AddUint32("general.alignment", 64);
  w.AddTensor("t", {2}, kF32, GgufWriter::F32({3, 4}));
  const std::string path = ::testing::TempDir() + "/aligned64.gguf";
  std::ofstream(path, std::ios::binary) << w.Bytes(3, 64);
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->data_offset() % 64, 0);
  std::vector<float> out;
  ASSERT_TRUE(f->ReadAsFloat(f->tensors()[0], &out).ok());
  EXPECT_THAT(out, ElementsAre(3, 4));
}

// --- Llama models ---------------------------------------------------------------------------

// The GGUF copy of stories260K holds the llama2.c checkpoint's weights bit for bit (its
// classifier, stored as output.weight, is the checkpoint's shared embedding).
TEST(GgufLoaderTest, Stories260kEqualsTheLlama2cCheckpoint) {
  absl::StatusOr<ModelWeights> g = LoadGgufModel(kModels + "/stories260K.gguf");
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ModelWeights> c = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(c.ok()) << c.status();
  const ModelSpec& gs = g->spec;
  const ModelSpec& cs = c->spec;
  EXPECT_EQ(gs.name, "stories260K");
  EXPECT_EQ(gs.num_layers, cs.num_layers);
  EXPECT_EQ(gs.dim, cs.dim);
  EXPECT_EQ(gs.hidden_dim, cs.hidden_dim);
  EXPECT_EQ(gs.num_heads, cs.num_heads);
  EXPECT_EQ(gs.num_kv_heads, cs.num_kv_heads);
  EXPECT_EQ(gs.head_dim, cs.head_dim);
  EXPECT_EQ(gs.vocab_size, cs.vocab_size);
  EXPECT_EQ(gs.max_context_tokens, 2048);  // the file's llama.context_length
  EXPECT_EQ(gs.rope_theta, cs.rope_theta);
  EXPECT_EQ(gs.rope_style, RopeStyle::kInterleaved);
  EXPECT_FLOAT_EQ(gs.norm_eps, cs.norm_eps);
  EXPECT_EQ(gs.bos_token_id, 1);
  EXPECT_EQ(gs.eos_token_id, 2);
  EXPECT_FALSE(gs.ends_at_bos);
  EXPECT_FALSE(gs.shared_classifier);
  EXPECT_EQ(g->token_embedding, c->token_embedding);
  EXPECT_EQ(g->classifier, c->token_embedding);
  EXPECT_EQ(g->final_norm, c->final_norm);
  ASSERT_EQ(g->layers.size(), c->layers.size());
  for (size_t l = 0; l < g->layers.size(); ++l) {
    const LayerWeights& a = g->layers[l];
    const LayerWeights& b = c->layers[l];
    EXPECT_EQ(a.attn_norm, b.attn_norm) << l;
    EXPECT_EQ(a.wq, b.wq) << l;
    EXPECT_EQ(a.wk, b.wk) << l;
    EXPECT_EQ(a.wv, b.wv) << l;
    EXPECT_EQ(a.wo, b.wo) << l;
    EXPECT_EQ(a.ffn_norm, b.ffn_norm) << l;
    EXPECT_EQ(a.w1, b.w1) << l;
    EXPECT_EQ(a.w2, b.w2) << l;
    EXPECT_EQ(a.w3, b.w3) << l;
  }
  absl::StatusOr<ModelSpec> spec = ReadGgufSpec(kModels + "/stories260K.gguf");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->NumParameters(), gs.NumParameters());
}

// Its tokenizer is tok512.bin's: the same pieces and scores, id for id.
TEST(GgufLoaderTest, Stories260kTokenizerEqualsTok512) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> g = LoadGgufTokenizer(kModels + "/stories260K.gguf");
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::LoadLlama2c(kModels + "/tok512.bin");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ((*g)->vocab_size(), (*t)->vocab_size());
  for (int32_t id = 0; id < (*t)->vocab_size(); ++id) {
    EXPECT_EQ((*g)->piece(id), (*t)->piece(id)) << id;
    EXPECT_EQ((*g)->score(id), (*t)->score(id)) << id;
  }
  const std::string text = "Once upon a time, Lily saw a big dog.";
  EXPECT_EQ((*g)->Encode(text, true), (*t)->Encode(text, true));
  absl::Status s = LoadGgufTokenizer(kModels + "/stories260K.gguf", 32000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("has 512 tokens but the model expects 32000"));
}

TEST(GgufLoaderTest, ReadsALlamasShapeAndWeights) {
  const std::string path = TinyLlamaGguf{}.Writer().WriteTemp("tiny.gguf");
  absl::StatusOr<ModelWeights> w = LoadGgufModel(path);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelSpec& s = w->spec;
  EXPECT_EQ(s.name, "tiny");
  EXPECT_EQ(s.num_layers, 2);
  EXPECT_EQ(s.dim, 8);
  EXPECT_EQ(s.hidden_dim, 12);
  EXPECT_EQ(s.num_heads, 2);
  EXPECT_EQ(s.num_kv_heads, 1);
  EXPECT_EQ(s.head_dim, 4);
  EXPECT_EQ(s.vocab_size, 16);  // token_embd.weight's rows: no llama.vocab_size
  EXPECT_EQ(s.max_context_tokens, 64);
  EXPECT_EQ(s.rope_theta, 500000.0f);
  EXPECT_EQ(s.norm_eps, 1e-6f);
  EXPECT_FALSE(s.shared_classifier);
  // Tensor k in the writer's order: 0 token_embd, 1 output_norm, 2 output, then 9 a layer.
  EXPECT_EQ(w->token_embedding[17], 0 + 17 / 1024.0f);
  EXPECT_EQ(w->final_norm[3], 1 + 3 / 1024.0f);
  EXPECT_EQ(w->classifier[0], 2);
  EXPECT_EQ(w->layers[1].w3[95], 3 + 9 + 8 + 95 / 1024.0f);
  EXPECT_EQ(w->layers[0].wk.size(), 32u);
  ASSERT_TRUE(ReadGgufSpec(path).ok());

  // BF16 tensors load as the fp32 values their bits are the top halves of; without
  // output.weight the classifier is the embedding.
  TinyLlamaGguf bf16;
  bf16.type = kBF16;
  bf16.with_output = false;
  absl::StatusOr<ModelWeights> b = LoadGgufModel(bf16.Writer().WriteTemp("tiny_bf16.gguf"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->spec.shared_classifier);
  EXPECT_TRUE(b->classifier.empty());
  auto top_half = [](float v) {
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) >> 16 << 16);
  };
  EXPECT_EQ(b->token_embedding[17], 0 + 17 / 1024.0f);  // exact in bf16
  EXPECT_EQ(b->layers[1].w3[95], top_half(2 + 9 + 8 + 95 / 1024.0f));
  EXPECT_NE(b->layers[1].w3[95], 2 + 9 + 8 + 95 / 1024.0f);

  // Without head_count_kv every head has its own K and V: attn_k and attn_v must be [8, 8].
  TinyLlamaGguf mha;
  mha.write_head_count_kv = false;
  const absl::Status s2 = LoadGgufModel(mha.Writer().WriteTemp("tiny_mha.gguf")).status();
  EXPECT_THAT(s2.message(), HasSubstr("tensor blk.0.attn_k.weight is [8, 4], the model's shape "
                                      "needs [8, 8]"));
}

TEST(GgufLoaderTest, RefusesWhatItCannotServeNamingIt) {
  auto refused = [](const std::string& name, const TinyLlamaGguf& t, absl::StatusCode code,
                    const std::string& what) {
    const std::string path = t.Writer().WriteTemp(name);
    for (const absl::Status& s : {ReadGgufSpec(path).status(), LoadGgufModel(path).status()}) {
      EXPECT_EQ(s.code(), code) << name << ": " << s;
      EXPECT_THAT(s.message(), AllOf(HasSubstr(name), HasSubstr(what))) << name;
    }
  };
  TinyLlamaGguf qwen;
  qwen.architecture = "qwen2";
  refused("qwen.gguf", qwen, absl::StatusCode::kUnimplemented, "architecture 'qwen2'");
  TinyLlamaGguf dropped;
  dropped.drop = "blk.1.ffn_down.weight";
  refused("dropped.gguf", dropped, absl::StatusCode::kInvalidArgument,
          "no tensor blk.1.ffn_down.weight");
  TinyLlamaGguf reshaped;
  reshaped.reshape = "output_norm.weight";
  refused("reshaped.gguf", reshaped, absl::StatusCode::kInvalidArgument,
          "tensor output_norm.weight is [3], the model's shape needs [8]");

  auto with = [](const std::string& name, auto&& add) {
    GgufWriter w = TinyLlamaGguf{}.Writer();
    add(w);
    return w.WriteTemp(name);
  };
  struct Case {
    std::string path;
    absl::StatusCode code;
    std::string what;
  };
  for (const Case& c : {
           Case{with("rope_freqs.gguf",
                     [](GgufWriter& w) {
                       w.AddTensor("rope_freqs.weight", {2}, kF32, GgufWriter::F32({1, 1}));
                     }),
                absl::StatusCode::kUnimplemented, "rope_freqs.weight"},
           Case{with("scale_linear.gguf",
                     [](GgufWriter& w) { w.AddFloat32("llama.rope.scale_linear", 4.0f); }),
                absl::StatusCode::kUnimplemented, "RoPE scaling by 4 (llama.rope.scale_linear)"},
           Case{with("scaling_factor.gguf",
                     [](GgufWriter& w) { w.AddFloat32("llama.rope.scaling.factor", 8.0f); }),
                absl::StatusCode::kUnimplemented, "RoPE scaling by 8"},
           Case{with("bias.gguf",
                     [](GgufWriter& w) {
                       w.AddTensor("blk.0.attn_q.bias", {8}, kF32,
                                   GgufWriter::F32(std::vector<float>(8)));
                     }),
                absl::StatusCode::kUnimplemented,
                "tensor blk.0.attn_q.bias is not one kvd's llama forward pass uses"},
           Case{[] {
                  TinyLlamaGguf t;
                  t.rope_theta = std::numeric_limits<float>::infinity();
                  return t.Writer().WriteTemp("inf_theta.gguf");
                }(),
                absl::StatusCode::kInvalidArgument, "is not a finite float"},
           Case{[] {
                  TinyLlamaGguf t;
                  t.int8_tensor = "blk.1.attn_v.weight";
                  return t.Writer().WriteTemp("int8.gguf");
                }(),
                absl::StatusCode::kUnimplemented,
                "tensor blk.1.attn_v.weight is I8; kvd reads F32, F16, BF16 and Q8_0"},
           Case{with("scaling.gguf",
                     [](GgufWriter& w) { w.AddString("llama.rope.scaling.type", "linear"); }),
                absl::StatusCode::kUnimplemented, "RoPE scaling 'linear'"},
           Case{with("moe.gguf", [](GgufWriter& w) { w.AddUint32("llama.expert_count", 8); }),
                absl::StatusCode::kUnimplemented, "llama.expert_count = 8"},
           Case{with("partial_rope.gguf",
                     [](GgufWriter& w) { w.AddUint32("llama.attention.key_length", 8); }),
                absl::StatusCode::kUnimplemented, "llama.attention.key_length = 8"},
           Case{with("big_bos.gguf",
                     [](GgufWriter& w) { w.AddUint32("tokenizer.ggml.bos_token_id", 16); }),
                absl::StatusCode::kInvalidArgument, "bos_token_id = 16 is outside"},
           Case{with("string_layers.gguf",
                     [](GgufWriter& w) { w.AddString("llama.vocab_size", "many"); }),
                absl::StatusCode::kInvalidArgument, "'llama.vocab_size' is string"},
       }) {
    for (const absl::Status& s : {ReadGgufSpec(c.path).status(), LoadGgufModel(c.path).status()}) {
      EXPECT_EQ(s.code(), c.code) << c.path << ": " << s;
      EXPECT_THAT(s.message(), AllOf(HasSubstr(c.path), HasSubstr(c.what))) << c.path;
    }
  }

  // A key every llama has, missing.
  GgufWriter no_layers;
  no_layers.AddString("general.architecture", "llama");
  const absl::Status s = ReadGgufSpec(no_layers.WriteTemp("no_layers.gguf")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("'llama.embedding_length' is missing"));
}

// End-of-turn and end-of-message tokens end completions as EOS does; 2^32 - 1 means none.
TEST(GgufLoaderTest, EndOfTurnTokensEndCompletions) {
  GgufWriter w = TinyLlamaGguf{}.Writer();
  w.AddUint32("tokenizer.ggml.eos_token_id", 2);
  w.AddUint32("tokenizer.ggml.eot_token_id", 7);
  w.AddUint32("tokenizer.ggml.eom_token_id", 0xFFFFFFFF);
  absl::StatusOr<ModelSpec> spec = ReadGgufSpec(w.WriteTemp("eot.gguf"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->StopTokenIds(), (std::vector<int32_t>{2, 7}));
  GgufWriter bad = TinyLlamaGguf{}.Writer();
  bad.AddUint32("tokenizer.ggml.eot_token_id", 16);
  const absl::Status s = ReadGgufSpec(bad.WriteTemp("bad_eot.gguf")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.eot_token_id = 16 is outside"));
}

TEST(GgufLoaderTest, RefusesNonFiniteWeightsAndWeightsPastTheHostsMemory) {
  const std::string path = TinyLlamaGguf{}.Writer().WriteTemp("budget.gguf");
  absl::Status s = LoadGgufModel(path, /*host_bytes_available=*/1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("more than the 1000 available"));

  TinyLlamaGguf without_norm;
  without_norm.drop = "blk.0.attn_norm.weight";
  GgufWriter nan = without_norm.Writer();
  nan.AddTensor("blk.0.attn_norm.weight", {8}, kF32,
                GgufWriter::F32({1, 1, 1, std::numeric_limits<float>::quiet_NaN(), 1, 1, 1, 1}));
  s = LoadGgufModel(nan.WriteTemp("nan.gguf")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("blk.0.attn_norm.weight[3] is nan"));
}

// A llama vocabulary kvd's tokenizer would encode otherwise than llama.cpp is refused as
// Unimplemented (the daemon then serves token ids): user-defined tokens, which llama.cpp
// matches whole, and byte pieces elsewhere than at 3..258.
TEST(GgufLoaderTest, VocabulariesKvdWouldEncodeOtherwiseAreUnimplemented) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    tokens.push_back(piece);
  }
  tokens.push_back("<|im_start|>");
  std::vector<float> scores(tokens.size(), 0.0f);
  auto write = [&](const std::string& name, int32_t last_type) {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "llama");
    w.AddStrings("tokenizer.ggml.tokens", tokens);
    w.AddFloats("tokenizer.ggml.scores", scores);
    std::vector<int32_t> types(tokens.size(), 1);
    types.back() = last_type;
    w.AddInt32s("tokenizer.ggml.token_type", types);
    return w.WriteTemp(name);
  };
  ASSERT_TRUE(LoadGgufTokenizer(write("normal_vocab.gguf", 1), 260).ok());
  absl::Status s = LoadGgufTokenizer(write("user_defined.gguf", 4)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("token 259 ('<|im_start|>') is user-defined"));
  std::swap(tokens[3], tokens[259]);
  s = LoadGgufTokenizer(write("bytes_elsewhere.gguf", 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("token 3 is '<|im_start|>', not the byte piece <0x00>"));
}

TEST(GgufLoaderTest, TokenizersOtherThanSentencePieceAreUnimplemented) {
  GgufWriter w;
  w.AddString("tokenizer.ggml.model", "gpt2");
  const std::string path = w.WriteTemp("gpt2.gguf");
  absl::Status s = LoadGgufTokenizer(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("gpt2.gguf"), HasSubstr("'gpt2'")));
  GgufWriter moved;
  moved.AddString("tokenizer.ggml.model", "llama");
  moved.AddUint32("tokenizer.ggml.bos_token_id", 128000);
  s = LoadGgufTokenizer(moved.WriteTemp("moved_bos.gguf")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("bos_token_id = 128000"));
}

// model_loader picks the GGUF loader by the extension, in any case, for weights, spec and
// tokenizer.
TEST(GgufLoaderTest, ModelLoaderReadsGgufFiles) {
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(kModels + "/stories260K.gguf");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_context_tokens, 2048);
  absl::StatusOr<std::unique_ptr<Tokenizer>> t =
      LoadModelTokenizer(kModels + "/stories260K.gguf", 512);
  ASSERT_TRUE(t.ok()) << t.status();
  t = LoadTokenizerFile(kModels + "/stories260K.gguf", 512);
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Status s = LoadModel("/nowhere/Model.GGUF").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("GGUF file '/nowhere/Model.GGUF'"));
}

}  // namespace
}  // namespace kvd
