#include "model/llama2c_loader.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model_loader.h"
#include "model/synthetic_model.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kStoriesPath = KVD_SHARED_DIR "/models/stories260K.bin";

// --- Writing checkpoints the way llama2.c's export.py does -------------------------------

struct Params {
  int32_t dim = 8;
  int32_t hidden_dim = 12;
  int32_t n_layers = 2;
  int32_t n_heads = 4;
  int32_t n_kv_heads = 2;
  int32_t vocab_size = 16;
  int32_t seq_len = 6;
};

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/kvd_llama2c_", getpid(), "_", name);
}

// A fresh path each call: rewriting a file in place makes ext4 flush it on close
// (auto_da_alloc), which turns hundreds of small writes into seconds of waiting.
std::string UniqueTempPath(const std::string& name) {
  static int counter = 0;
  return TempPath(absl::StrCat(counter++, "_", name));
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
void Append(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

void Append(std::string& bytes, const std::vector<float>& values) {
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

void AppendParams(std::string& bytes, const Params& p, int32_t stored_vocab) {
  for (int32_t v :
       {p.dim, p.hidden_dim, p.n_layers, p.n_heads, p.n_kv_heads, stored_vocab, p.seq_len}) {
    Append(bytes, v);
  }
}

// Every float in the model is distinct (a running counter), so any misplaced tensor or
// offset shows up as a mismatch.
ModelWeights NumberedWeights(const Params& p, bool shared) {
  const int64_t head_dim = p.dim / p.n_heads;
  const int64_t q_dim = p.n_heads * head_dim;
  const int64_t kv_dim = p.n_kv_heads * head_dim;
  float counter = 1.0f;
  auto numbered = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = counter++;
    return v;
  };
  ModelWeights w;
  w.token_embedding = numbered(int64_t{p.vocab_size} * p.dim);
  for (int l = 0; l < p.n_layers; ++l) {
    LayerWeights layer;
    layer.attn_norm = numbered(p.dim);
    layer.wq = numbered(q_dim * p.dim);
    layer.wk = numbered(kv_dim * p.dim);
    layer.wv = numbered(kv_dim * p.dim);
    layer.wo = numbered(p.dim * q_dim);
    layer.ffn_norm = numbered(p.dim);
    layer.w1 = numbered(int64_t{p.hidden_dim} * p.dim);
    layer.w2 = numbered(int64_t{p.dim} * p.hidden_dim);
    layer.w3 = numbered(int64_t{p.hidden_dim} * p.dim);
    w.layers.push_back(std::move(layer));
  }
  w.final_norm = numbered(p.dim);
  if (!shared) w.classifier = numbered(int64_t{p.vocab_size} * p.dim);
  return w;
}

// Version 0: 7 int32 (vocab negated when unshared), tensors, freq_cis, then wcls.
std::string V0Bytes(const Params& p, const ModelWeights& w) {
  const bool shared = w.classifier.empty();
  std::string bytes;
  AppendParams(bytes, p, shared ? p.vocab_size : -p.vocab_size);
  Append(bytes, w.token_embedding);
  for (const auto& l : w.layers) Append(bytes, l.attn_norm);
  for (const auto& l : w.layers) Append(bytes, l.wq);
  for (const auto& l : w.layers) Append(bytes, l.wk);
  for (const auto& l : w.layers) Append(bytes, l.wv);
  for (const auto& l : w.layers) Append(bytes, l.wo);
  for (const auto& l : w.layers) Append(bytes, l.ffn_norm);
  for (const auto& l : w.layers) Append(bytes, l.w1);
  for (const auto& l : w.layers) Append(bytes, l.w2);
  for (const auto& l : w.layers) Append(bytes, l.w3);
  Append(bytes, w.final_norm);
  const int64_t freq_floats = int64_t{p.seq_len} * (p.dim / p.n_heads / 2);
  Append(bytes, std::vector<float>(freq_floats, -7.0f));  // freq_cis_real
  Append(bytes, std::vector<float>(freq_floats, -9.0f));  // freq_cis_imag
  if (!shared) Append(bytes, w.classifier);
  return bytes;
}

std::string V1Header(const Params& p, int32_t version, uint8_t shared) {
  std::string bytes;
  Append(bytes, uint32_t{0x616b3432});
  Append(bytes, version);
  AppendParams(bytes, p, p.vocab_size);
  Append(bytes, shared);
  bytes.resize(256, '\0');
  return bytes;
}

// Version 1: 256-byte header, norms first, then embedding, then the matrices.
std::string V1Bytes(const Params& p, const ModelWeights& w) {
  const bool shared = w.classifier.empty();
  std::string bytes = V1Header(p, 1, shared ? 1 : 0);
  for (const auto& l : w.layers) Append(bytes, l.attn_norm);
  for (const auto& l : w.layers) Append(bytes, l.ffn_norm);
  Append(bytes, w.final_norm);
  Append(bytes, w.token_embedding);
  for (const auto& l : w.layers) Append(bytes, l.wq);
  for (const auto& l : w.layers) Append(bytes, l.wk);
  for (const auto& l : w.layers) Append(bytes, l.wv);
  for (const auto& l : w.layers) Append(bytes, l.wo);
  for (const auto& l : w.layers) Append(bytes, l.w1);
  for (const auto& l : w.layers) Append(bytes, l.w2);
  for (const auto& l : w.layers) Append(bytes, l.w3);
  if (!shared) Append(bytes, w.classifier);
  return bytes;
}

void ExpectSameTensors(const ModelWeights& actual, const ModelWeights& expected) {
  EXPECT_EQ(actual.token_embedding, expected.token_embedding);
  EXPECT_EQ(actual.final_norm, expected.final_norm);
  EXPECT_EQ(actual.classifier, expected.classifier);
  ASSERT_EQ(actual.layers.size(), expected.layers.size());
  for (size_t l = 0; l < actual.layers.size(); ++l) {
    SCOPED_TRACE(absl::StrCat("layer ", l));
    const LayerWeights& a = actual.layers[l];
    const LayerWeights& e = expected.layers[l];
    EXPECT_EQ(a.attn_norm, e.attn_norm);
    EXPECT_EQ(a.wq, e.wq);
    EXPECT_EQ(a.wk, e.wk);
    EXPECT_EQ(a.wv, e.wv);
    EXPECT_EQ(a.wo, e.wo);
    EXPECT_EQ(a.ffn_norm, e.ffn_norm);
    EXPECT_EQ(a.w1, e.w1);
    EXPECT_EQ(a.w2, e.w2);
    EXPECT_EQ(a.w3, e.w3);
  }
}

int64_t NumFloats(const ModelWeights& w) {
  int64_t n = w.token_embedding.size() + w.final_norm.size() + w.classifier.size();
  for (const LayerWeights& l : w.layers) {
    for (const auto* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w1, &l.w2, &l.w3}) {
      n += t->size();
    }
  }
  return n;
}

// Loads `bytes` written to a temp file; the status must be an error naming the path.
absl::Status LoadBytes(const std::string& name, const std::string& bytes) {
  const std::string path = UniqueTempPath(name);
  WriteFile(path, bytes);
  absl::Status status = LoadLlama2cCheckpoint(path).status();
  if (!status.ok()) {
    EXPECT_THAT(status.message(), HasSubstr(path)) << name;
  }
  std::remove(path.c_str());
  return status;
}

// --- stories260K -----------------------------------------------------------------------

float FloatAt(const std::string& file, int64_t float_index) {
  float value;
  std::memcpy(&value, file.data() + 28 + float_index * 4, sizeof(value));
  return value;
}

TEST(Llama2cLoaderTest, Stories260KLoadsWithItsPublishedSpec) {
  absl::StatusOr<ModelWeights> w = LoadLlama2cCheckpoint(kStoriesPath);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelSpec& s = w->spec;
  EXPECT_EQ(s.name, "stories260K");
  EXPECT_EQ(s.dim, 64);
  EXPECT_EQ(s.hidden_dim, 172);
  EXPECT_EQ(s.num_layers, 5);
  EXPECT_EQ(s.num_heads, 8);
  EXPECT_EQ(s.num_kv_heads, 4);
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_EQ(s.vocab_size, 512);
  EXPECT_EQ(s.max_context_tokens, 512);
  EXPECT_TRUE(s.shared_classifier);
  EXPECT_EQ(s.rope_theta, 10000.0f);
  EXPECT_EQ(s.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(s.norm_eps, 1e-5f);
  EXPECT_EQ(s.bos_token_id, 1);
  EXPECT_EQ(s.eos_token_id, 2);
  // A story ends with BOS, as run.c's generate stops; a chat model's answer with EOS.
  EXPECT_EQ(s.StopTokenIds(), (std::vector<int32_t>{1, 2}));

  EXPECT_EQ(w->token_embedding.size(), 512u * 64);
  EXPECT_EQ(w->final_norm.size(), 64u);
  EXPECT_TRUE(w->classifier.empty());
  ASSERT_EQ(w->layers.size(), 5u);
  for (const LayerWeights& l : w->layers) {
    EXPECT_EQ(l.attn_norm.size(), 64u);
    EXPECT_EQ(l.wq.size(), 64u * 64);
    EXPECT_EQ(l.wk.size(), 32u * 64);
    EXPECT_EQ(l.wv.size(), 32u * 64);
    EXPECT_EQ(l.wo.size(), 64u * 64);
    EXPECT_EQ(l.ffn_norm.size(), 64u);
    EXPECT_EQ(l.w1.size(), 172u * 64);
    EXPECT_EQ(l.w2.size(), 64u * 172);
    EXPECT_EQ(l.w3.size(), 172u * 64);
  }

  // Float offsets of each v0 section (after the 28-byte header), computed independently.
  const std::string file = ReadFile(kStoriesPath);
  const int64_t emb = 0, rms_att = emb + 512 * 64, wq = rms_att + 5 * 64, wk = wq + 5 * 4096,
                wv = wk + 5 * 2048, wo = wv + 5 * 2048, rms_ffn = wo + 5 * 4096,
                w1 = rms_ffn + 5 * 64, w2 = w1 + 5 * 11008, w3 = w2 + 5 * 11008,
                rms_final = w3 + 5 * 11008;
  EXPECT_EQ(w->token_embedding[7 * 64 + 5], FloatAt(file, emb + 7 * 64 + 5));
  EXPECT_EQ(w->layers[0].attn_norm[3], FloatAt(file, rms_att + 3));
  EXPECT_EQ(w->layers[1].wq[100], FloatAt(file, wq + 1 * 4096 + 100));
  EXPECT_EQ(w->layers[4].wk[2047], FloatAt(file, wk + 4 * 2048 + 2047));
  EXPECT_EQ(w->layers[2].wv[0], FloatAt(file, wv + 2 * 2048));
  EXPECT_EQ(w->layers[3].wo[4095], FloatAt(file, wo + 3 * 4096 + 4095));
  EXPECT_EQ(w->layers[4].ffn_norm[63], FloatAt(file, rms_ffn + 4 * 64 + 63));
  EXPECT_EQ(w->layers[0].w1[11007], FloatAt(file, w1 + 11007));
  EXPECT_EQ(w->layers[2].w2[500], FloatAt(file, w2 + 2 * 11008 + 500));
  EXPECT_EQ(w->layers[4].w3[11007], FloatAt(file, w3 + 4 * 11008 + 11007));
  EXPECT_EQ(w->final_norm[63], FloatAt(file, rms_final + 63));
  // The norms of a trained model are not the zero fill of a mis-offset read.
  EXPECT_NE(w->final_norm[0], 0.0f);
}

// The format, not the file's name, sets where a completion stops: a checkpoint called
// .ckpt is the same llama2.c model (serve once chose BOS by a ".bin" suffix).
TEST(Llama2cLoaderTest, AnyFileNameStopsAtBosAndEos) {
  const std::string path = UniqueTempPath("stories260K.ckpt");
  WriteFile(path, ReadFile(kStoriesPath));
  absl::StatusOr<ModelWeights> w = LoadModel(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->spec.ends_at_bos);
  EXPECT_EQ(w->spec.StopTokenIds(), (std::vector<int32_t>{1, 2}));
}

TEST(Llama2cLoaderTest, ReadSpecMatchesTheFullLoad) {
  absl::StatusOr<ModelSpec> spec = ReadLlama2cSpec(kStoriesPath);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->NumParameters(), 64 * 512 + 5 * 45440 + 64);
  EXPECT_EQ(spec->num_kv_heads, 4);
  EXPECT_EQ(spec->name, "stories260K");
}

// --- Layouts -----------------------------------------------------------------------------

TEST(Llama2cLoaderTest, V0SharedClassifierLoadsEveryTensorInPlace) {
  const Params p;
  const ModelWeights expected = NumberedWeights(p, /*shared=*/true);
  const std::string path = TempPath("v0_shared.bin");
  WriteFile(path, V0Bytes(p, expected));
  absl::StatusOr<ModelWeights> w = LoadLlama2cCheckpoint(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->spec.name, absl::StrCat("kvd_llama2c_", getpid(), "_v0_shared"));
  EXPECT_TRUE(w->spec.shared_classifier);
  EXPECT_EQ(w->spec.vocab_size, 16);
  EXPECT_EQ(w->spec.head_dim, 2);
  EXPECT_EQ(w->spec.max_context_tokens, 6);
  ExpectSameTensors(*w, expected);
}

TEST(Llama2cLoaderTest, V0NegativeVocabMeansTrailingUnsharedClassifier) {
  const Params p;
  const ModelWeights expected = NumberedWeights(p, /*shared=*/false);
  const std::string path = TempPath("v0_unshared.bin");
  WriteFile(path, V0Bytes(p, expected));
  absl::StatusOr<ModelWeights> w = LoadLlama2cCheckpoint(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE(w->spec.shared_classifier);
  EXPECT_EQ(w->spec.vocab_size, 16);
  EXPECT_EQ(w->classifier.size(), 16u * 8);
  ExpectSameTensors(*w, expected);
}

TEST(Llama2cLoaderTest, V1LoadsTheSameWeightsAsV0) {
  const Params p;
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared" : "unshared");
    const ModelWeights expected = NumberedWeights(p, shared);
    const std::string v0 = TempPath("same_v0.bin"), v1 = TempPath("same_v1.bin");
    WriteFile(v0, V0Bytes(p, expected));
    WriteFile(v1, V1Bytes(p, expected));
    absl::StatusOr<ModelWeights> from_v0 = LoadLlama2cCheckpoint(v0);
    absl::StatusOr<ModelWeights> from_v1 = LoadLlama2cCheckpoint(v1);
    ASSERT_TRUE(from_v0.ok()) << from_v0.status();
    ASSERT_TRUE(from_v1.ok()) << from_v1.status();
    EXPECT_EQ(from_v1->spec.shared_classifier, shared);
    EXPECT_EQ(from_v1->spec.NumParameters(), from_v0->spec.NumParameters());
    ExpectSameTensors(*from_v1, expected);
    ExpectSameTensors(*from_v0, *from_v1);
  }
}

// --- Malformed files ---------------------------------------------------------------------

TEST(Llama2cLoaderTest, MissingFileIsNotFound) {
  const std::string path = TempPath("does_not_exist.bin");
  absl::Status s = LoadLlama2cCheckpoint(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST(Llama2cLoaderTest, EmptyFileIsDataLoss) {
  absl::Status s = LoadBytes("empty.bin", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("empty"));
}

TEST(Llama2cLoaderTest, TruncatedHeaderIsDataLoss) {
  std::string bytes = V0Bytes(Params{}, NumberedWeights(Params{}, true)).substr(0, 10);
  absl::Status s = LoadBytes("short_v0_header.bin", bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("truncated header"), HasSubstr("28"), HasSubstr("file has 10")));

  s = LoadBytes("short_v1_header.bin", V1Header(Params{}, 1, 1).substr(0, 100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("256"), HasSubstr("file has 100")));
}

TEST(Llama2cLoaderTest, SizeMismatchNamesExpectedAndActualBytes) {
  const Params p;
  for (bool shared : {true, false}) {
    const ModelWeights w = NumberedWeights(p, shared);
    for (const std::string& good : {V0Bytes(p, w), V1Bytes(p, w)}) {
      const std::string expected = absl::StrCat("expected ", good.size(), " bytes");
      absl::Status s = LoadBytes("minus_one.bin", good.substr(0, good.size() - 1));
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(s.message(),
                  AllOf(HasSubstr(expected), HasSubstr(absl::StrCat("file has ", good.size() - 1)),
                        HasSubstr("truncated")));
      s = LoadBytes("plus_four.bin", good + "abcd");
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(s.message(),
                  AllOf(HasSubstr(expected), HasSubstr(absl::StrCat("file has ", good.size() + 4)),
                        HasSubstr("extra trailing bytes")));
    }
  }
}

TEST(Llama2cLoaderTest, SharedFileWithNegativeVocabIsMissingItsClassifier) {
  const Params p;
  std::string bytes = V0Bytes(p, NumberedWeights(p, /*shared=*/true));
  const int32_t negative_vocab = -p.vocab_size;
  std::memcpy(bytes.data() + 5 * 4, &negative_vocab, 4);
  absl::Status s = LoadBytes("sign_flipped.bin", bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("unshared"), HasSubstr("truncated")));
}

// Header field i (0 = dim ... 6 = seq_len) replaced by `value`.
std::string V0WithField(int field, int32_t value) {
  const Params p;
  std::string bytes = V0Bytes(p, NumberedWeights(p, true));
  std::memcpy(bytes.data() + field * 4, &value, 4);
  return bytes;
}

TEST(Llama2cLoaderTest, NonPositiveHeaderFieldsAreNamed) {
  const char* names[] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                         "n_kv_heads", "vocab_size", "seq_len"};
  for (int field = 0; field < 7; ++field) {
    for (int32_t bad : {0, -3}) {
      if (field == 5 && bad < 0) continue;  // negative vocab is the unshared marker
      SCOPED_TRACE(absl::StrCat(names[field], " = ", bad));
      absl::Status s = LoadBytes("nonpositive.bin", V0WithField(field, bad));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(s.message(), AllOf(HasSubstr(names[field]), HasSubstr("must be positive")));
    }
  }
}

TEST(Llama2cLoaderTest, InconsistentHeadCountsAreNamed) {
  absl::Status s = LoadBytes("heads_dim.bin", V0WithField(3, 3));  // dim 8, 3 heads
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dim (8) is not a multiple of n_heads (3)"));

  s = LoadBytes("heads_kv.bin", V0WithField(4, 3));  // 4 heads, 3 kv heads
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("n_heads (4) is not a multiple of n_kv_heads (3)"));

  s = LoadBytes("heads_odd.bin", V0WithField(3, 8));  // head_dim 1
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("head_dim"));
}

TEST(Llama2cLoaderTest, AbsurdSizesAreRefusedWithoutAllocating) {
  absl::Status s = LoadBytes("absurd_dim.bin", V0WithField(0, 1 << 30));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("dim"), HasSubstr("1073741824"), HasSubstr("limit")));

  s = LoadBytes("absurd_vocab.bin", V0WithField(5, std::numeric_limits<int32_t>::min()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("vocab_size"));

  // Every field at its sanity limit: terabytes implied, a few KB present.
  const Params p;
  std::string bytes = V0Bytes(p, NumberedWeights(p, true));
  for (auto [field, value] : {std::pair{0, 1 << 16},
                              {1, 1 << 18},
                              {2, 1 << 10},
                              {3, 1 << 10},
                              {4, 1 << 10},
                              {5, 1 << 22},
                              {6, 1 << 22}}) {
    std::memcpy(bytes.data() + field * 4, &value, 4);
  }
  s = LoadBytes("huge_header.bin", bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("expected"), HasSubstr("truncated")));
}

// The loader refuses, before allocating, weights larger than the host memory it is told is
// available (LoadModel tells it MemAvailable), rather than being killed part way through.
TEST(Llama2cLoaderTest, WeightsLargerThanTheAvailableHostMemoryAreResourceExhausted) {
  const Params p;
  const ModelWeights w = NumberedWeights(p, true);
  const std::string path = UniqueTempPath("host_memory.bin");
  WriteFile(path, V0Bytes(p, w));
  const int64_t needed = NumFloats(w) * int64_t{sizeof(float)};
  const absl::Status s = LoadLlama2cCheckpoint(path, needed - 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr(absl::StrCat(needed, " bytes")),
                                 HasSubstr(absl::StrCat(needed - 1, " available"))));
  EXPECT_TRUE(LoadLlama2cCheckpoint(path, needed).ok());
  std::filesystem::remove(path);
}

TEST(ModelLoaderTest, AvailableHostBytesIsMemAvailableWhereTheKernelSaysIt) {
  std::ifstream meminfo("/proc/meminfo");
  if (!meminfo) GTEST_SKIP() << "no /proc/meminfo";
  const std::optional<int64_t> available = AvailableHostBytes();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0);
}

TEST(Llama2cLoaderTest, APathThatCannotBeExaminedNamesTheReason) {
  const std::string path = UniqueTempPath("loop.bin");
  std::filesystem::create_symlink(std::filesystem::path(path).filename(), path);
  const absl::Status s = LoadLlama2cCheckpoint(path).status();
  std::filesystem::remove(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("symbolic links")));
}

TEST(Llama2cLoaderTest, NonFiniteWeightsAreDataLossNamingTheTensor) {
  const Params p;
  const std::string good = V0Bytes(p, NumberedWeights(p, true));
  std::string bytes = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 28 + 5 * sizeof(float), &nan, sizeof(float));  // after the header
  absl::Status s = LoadBytes("nan_weight.bin", bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("token_embedding[5] is nan"));
  // The RoPE tables at the end of a v0 file are skipped: they may hold anything.
  bytes = good;
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(bytes.data() + bytes.size() - sizeof(float), &inf, sizeof(float));
  EXPECT_TRUE(LoadBytes("inf_rope.bin", bytes).ok());
}

TEST(Llama2cLoaderTest, UnsupportedVersionsAreNamed) {
  const Params p;
  std::string payload = V1Bytes(p, NumberedWeights(p, true)).substr(256);

  absl::Status s = LoadBytes("v2.bin", V1Header(p, 2, 1) + payload);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("version 2"), HasSubstr("int8")));

  s = LoadBytes("v7.bin", V1Header(p, 7, 1) + payload);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("version 7"));

  s = LoadBytes("v1_bad_flag.bin", V1Header(p, 1, 5) + payload);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("shared_classifier"));
}

TEST(Llama2cLoaderTest, GgufFileIsRecognizedAndRefused) {
  const std::string path = KVD_SHARED_DIR "/models/stories260K.gguf";
  absl::Status s = LoadLlama2cCheckpoint(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("GGUF")));
}

TEST(Llama2cLoaderTest, EveryTruncationAndHeaderCorruptionFailsCleanly) {
  const Params p;
  const std::string good = V0Bytes(p, NumberedWeights(p, false));
  const std::string good_v1 = V1Bytes(p, NumberedWeights(p, false));
  // Every prefix through the headers (v0: 28 bytes, v1: 256), then strided.
  for (const std::string* bytes : {&good, &good_v1}) {
    for (size_t n = 0; n < bytes->size(); n += (n < 40 || (n >= 250 && n < 262) ? 1 : 53)) {
      EXPECT_FALSE(LoadBytes("prefix.bin", bytes->substr(0, n)).ok()) << n;
    }
  }
  // Random header bytes: OK only if the header still describes exactly this file.
  uint64_t state = 12345;
  for (int trial = 0; trial < 100; ++trial) {
    std::string bytes = good;
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    bytes[(state >> 33) % 28] = static_cast<char>(state >> 20);
    const std::string path = UniqueTempPath("corrupt.bin");
    WriteFile(path, bytes);
    absl::StatusOr<ModelWeights> w = LoadLlama2cCheckpoint(path);
    std::remove(path.c_str());
    if (w.ok()) {
      EXPECT_LE(NumFloats(*w) * 4, static_cast<int64_t>(bytes.size()));
      EXPECT_EQ(NumFloats(*w), w->spec.NumParameters());
    }
  }
}

// --- Dispatch (model_loader.h) -----------------------------------------------------------

TEST(ModelLoaderTest, PathsLoadAsLlama2cCheckpoints) {
  absl::StatusOr<ModelWeights> w = LoadModel(kStoriesPath);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<ModelWeights> direct = LoadLlama2cCheckpoint(kStoriesPath);
  ASSERT_TRUE(direct.ok()) << direct.status();
  ExpectSameTensors(*w, *direct);

  absl::StatusOr<ModelSpec> spec = LoadModelSpec(kStoriesPath);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->NumParameters(), w->spec.NumParameters());
}

TEST(ModelLoaderTest, SyntheticPrefixSelectsAPresetAndUsesTheSeed) {
  absl::StatusOr<ModelWeights> w = LoadModel("synthetic:tiny", 42);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->spec.name, "synthetic:tiny");
  absl::StatusOr<ModelWeights> direct = MakeSyntheticWeights(*SyntheticSpec("tiny"), 42);
  ASSERT_TRUE(direct.ok());
  ExpectSameTensors(*w, *direct);

  absl::StatusOr<ModelSpec> big = LoadModelSpec("synthetic:llama3-8b");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->num_kv_heads, 8);
  EXPECT_EQ(LoadModel("synthetic:llama3-8b").status().code(), absl::StatusCode::kResourceExhausted);

  absl::Status s = LoadModel("synthetic:gpt5").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("gpt5"));
}

TEST(ModelLoaderTest, AnEmptyReferenceIsInvalid) {
  EXPECT_EQ(LoadModel("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadModelSpec("").status().code(), absl::StatusCode::kInvalidArgument);
}

// A directory is a Hugging Face checkpoint when it has config.json (hf_loader.h, whose
// errors then name the directory); any other, e.g. the models folder instead of a file in
// it, is a wrong path, said as such.
TEST(ModelLoaderTest, DirectoriesAreRefusedSayingWhy) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "kvd_model_loader_dir_test";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(std::filesystem::create_directories(dir));
  absl::Status s = LoadModelSpec(dir.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is a directory without config.json, not a model"));
  std::ofstream(dir / "config.json") << "{}";
  s = LoadModel(dir.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("Hugging Face model directory"), HasSubstr("architecture ''")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvd
