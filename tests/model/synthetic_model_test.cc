#include "model/synthetic_model.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ModelSpec Spec(std::string_view preset) {
  absl::StatusOr<ModelSpec> spec = SyntheticSpec(preset);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec{};
}

TEST(SyntheticSpecTest, Llama3_8bMatchesMetaLlama3Config) {
  const ModelSpec s = Spec("llama3-8b");
  EXPECT_EQ(s.name, "synthetic:llama3-8b");
  EXPECT_EQ(s.num_layers, 32);
  EXPECT_EQ(s.dim, 4096);
  EXPECT_EQ(s.hidden_dim, 14336);
  EXPECT_EQ(s.num_heads, 32);
  EXPECT_EQ(s.num_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.vocab_size, 128256);
  EXPECT_EQ(s.max_context_tokens, 8192);
  EXPECT_EQ(s.rope_theta, 500000.0f);
  EXPECT_EQ(s.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(s.norm_eps, 1e-5f);
  EXPECT_FALSE(s.shared_classifier);
  EXPECT_EQ(s.bos_token_id, 128000);
  EXPECT_EQ(s.eos_token_id, 128001);
  // <|end_of_text|> alone: not a llama2.c model.
  EXPECT_EQ(s.StopTokenIds(), std::vector<int32_t>{128001});
  EXPECT_TRUE(s.Validate().ok());
  // The parameter count Meta publishes for Llama 3 8B.
  EXPECT_EQ(s.NumParameters(), 8'030'261'248);
}

TEST(SyntheticSpecTest, Llama2_7bMatchesLlama2Config) {
  const ModelSpec s = Spec("llama2-7b");
  EXPECT_EQ(s.name, "synthetic:llama2-7b");
  EXPECT_EQ(s.num_layers, 32);
  EXPECT_EQ(s.dim, 4096);
  EXPECT_EQ(s.hidden_dim, 11008);
  EXPECT_EQ(s.num_heads, 32);
  EXPECT_EQ(s.num_kv_heads, 32);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.vocab_size, 32000);
  EXPECT_EQ(s.max_context_tokens, 4096);
  EXPECT_EQ(s.rope_theta, 10000.0f);
  EXPECT_EQ(s.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(s.norm_eps, 1e-5f);
  EXPECT_FALSE(s.shared_classifier);
  EXPECT_EQ(s.bos_token_id, 1);
  EXPECT_EQ(s.eos_token_id, 2);
  EXPECT_TRUE(s.Validate().ok());
  // Hugging Face's count for Llama-2-7b-hf.
  EXPECT_EQ(s.NumParameters(), 6'738'415'616);
}

TEST(SyntheticSpecTest, TinyIsSmallGqaWithSharedClassifier) {
  const ModelSpec s = Spec("tiny");
  EXPECT_EQ(s.name, "synthetic:tiny");
  EXPECT_EQ(s.num_layers, 2);
  EXPECT_EQ(s.dim, 64);
  EXPECT_EQ(s.hidden_dim, 128);
  EXPECT_EQ(s.num_heads, 4);
  EXPECT_EQ(s.num_kv_heads, 2);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(s.vocab_size, 256);
  EXPECT_EQ(s.max_context_tokens, 256);
  EXPECT_TRUE(s.shared_classifier);
  EXPECT_TRUE(s.Validate().ok());
}

TEST(SyntheticSpecTest, UnknownPresetListsTheValidOnes) {
  absl::StatusOr<ModelSpec> spec = SyntheticSpec("llama4-400b");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), AllOf(HasSubstr("llama4-400b"), HasSubstr("llama3-8b"),
                                             HasSubstr("llama2-7b"), HasSubstr("tiny")));
}

TEST(SyntheticWeightsTest, TensorsHaveTheSpecShapes) {
  const ModelSpec spec = Spec("tiny");
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(spec, 1);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->spec.name, spec.name);
  EXPECT_EQ(w->token_embedding.size(), 256u * 64);
  EXPECT_EQ(w->final_norm.size(), 64u);
  EXPECT_TRUE(w->classifier.empty());
  ASSERT_EQ(w->layers.size(), 2u);
  for (const LayerWeights& l : w->layers) {
    EXPECT_EQ(l.attn_norm.size(), 64u);
    EXPECT_EQ(l.wq.size(), 64u * 64);
    EXPECT_EQ(l.wk.size(), 32u * 64);
    EXPECT_EQ(l.wv.size(), 32u * 64);
    EXPECT_EQ(l.wo.size(), 64u * 64);
    EXPECT_EQ(l.ffn_norm.size(), 64u);
    EXPECT_EQ(l.w1.size(), 128u * 64);
    EXPECT_EQ(l.w2.size(), 64u * 128);
    EXPECT_EQ(l.w3.size(), 128u * 64);
  }

  ModelSpec unshared = spec;
  unshared.shared_classifier = false;
  absl::StatusOr<ModelWeights> u = MakeSyntheticWeights(unshared, 1);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->classifier.size(), 256u * 64);
  EXPECT_NE(u->classifier, u->token_embedding);
}

TEST(SyntheticWeightsTest, SameSeedSameWeightsOtherSeedOtherWeights) {
  const ModelSpec spec = Spec("tiny");
  absl::StatusOr<ModelWeights> a = MakeSyntheticWeights(spec, 7);
  absl::StatusOr<ModelWeights> b = MakeSyntheticWeights(spec, 7);
  absl::StatusOr<ModelWeights> c = MakeSyntheticWeights(spec, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->token_embedding, b->token_embedding);
  EXPECT_EQ(a->final_norm, b->final_norm);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(a->layers[l].wq, b->layers[l].wq);
    EXPECT_EQ(a->layers[l].w2, b->layers[l].w2);
    EXPECT_EQ(a->layers[l].ffn_norm, b->layers[l].ffn_norm);
  }
  EXPECT_NE(a->token_embedding, c->token_embedding);
  EXPECT_NE(a->layers[1].w3, c->layers[1].w3);
  EXPECT_NE(a->final_norm, c->final_norm);
  // Tensors of one model are independent streams, not copies of each other.
  EXPECT_NE(a->layers[0].wq, a->layers[1].wq);
  EXPECT_NE(a->layers[0].w1, a->layers[0].w3);
}

// Mean and standard deviation of a tensor.
std::pair<double, double> Moments(const std::vector<float>& v) {
  double sum = 0, sum_sq = 0;
  for (float x : v) {
    sum += x;
    sum_sq += double{x} * x;
  }
  const double mean = sum / v.size();
  return {mean, std::sqrt(sum_sq / v.size() - mean * mean)};
}

TEST(SyntheticWeightsTest, ScalesKeepActivationsBounded) {
  const ModelSpec spec = Spec("tiny");
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(spec, 3);
  ASSERT_TRUE(w.ok());
  for (const LayerWeights& l : w->layers) {
    for (const std::vector<float>* norm : {&l.attn_norm, &l.ffn_norm}) {
      for (float x : *norm) {
        EXPECT_GE(x, 0.9f);
        EXPECT_LE(x, 1.1f);
      }
    }
    // Matrices: mean ~0, standard deviation 1/sqrt(fan_in), within 10%.
    for (auto [matrix, fan_in] : {std::pair{&l.wq, 64}, {&l.wo, 64}, {&l.w1, 64}, {&l.w2, 128}}) {
      auto [mean, stddev] = Moments(*matrix);
      EXPECT_NEAR(mean, 0.0, 0.05 / std::sqrt(fan_in));
      EXPECT_NEAR(stddev * std::sqrt(fan_in), 1.0, 0.1);
      for (float x : *matrix) EXPECT_LE(std::abs(x), std::sqrt(3.0f / fan_in));
    }
  }
  auto [mean, stddev] = Moments(w->token_embedding);
  EXPECT_NEAR(stddev * 8.0, 1.0, 0.1);  // 1/sqrt(dim) = 1/8
}

TEST(SyntheticWeightsTest, RefusesWeightsOverTheHostLimit) {
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(Spec("llama3-8b"), 0);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kResourceExhausted);
  // 8,030,261,248 parameters * 4 bytes.
  EXPECT_THAT(w.status().message(),
              AllOf(HasSubstr("synthetic:llama3-8b"), HasSubstr("32121044992"),
                    HasSubstr(std::to_string(int64_t{4} << 30))));

  const ModelSpec tiny = Spec("tiny");
  const int64_t tiny_bytes = tiny.NumParameters() * 4;
  EXPECT_TRUE(MakeSyntheticWeights(tiny, 0, tiny_bytes).ok());
  EXPECT_EQ(MakeSyntheticWeights(tiny, 0, tiny_bytes - 1).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(ModelSpecTest, StopTokensAreEosAndBosFirstWhereTheModelEndsAtBos) {
  ModelSpec spec = Spec("tiny");
  EXPECT_EQ(spec.StopTokenIds(), std::vector<int32_t>{spec.eos_token_id});
  spec.ends_at_bos = true;
  EXPECT_EQ(spec.StopTokenIds(), (std::vector<int32_t>{spec.bos_token_id, spec.eos_token_id}));
  spec.eos_token_id = spec.vocab_size;
  const absl::Status s = spec.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("bos/eos token ids"));
}

// A model's other end tokens follow EOS, each once.
TEST(ModelSpecTest, OtherEndTokensFollowEosOnce) {
  ModelSpec spec = Spec("tiny");
  spec.other_end_token_ids = {7, spec.eos_token_id, 9, 7};
  EXPECT_EQ(spec.StopTokenIds(), (std::vector<int32_t>{spec.eos_token_id, 7, 9}));
  EXPECT_TRUE(spec.Validate().ok());
  spec.other_end_token_ids = {spec.vocab_size};
  const absl::Status s = spec.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("end token id"));
}

TEST(SyntheticWeightsTest, InvalidSpecIsRefused) {
  ModelSpec spec = Spec("tiny");
  spec.num_kv_heads = 3;
  absl::Status s = MakeSyntheticWeights(spec, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_kv_heads"));
}

}  // namespace
}  // namespace kvd
