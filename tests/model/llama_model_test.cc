// The Llama forward pass on the CPU reference backend reproduces llama2.c's greedy
// outputs for stories260K token for token, through a scattered paged KV cache.

#include "model/llama_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_backend.h"
#include "model/llama2c_loader.h"
#include "model/model_loader.h"
#include "model/sampler.h"
#include "tests/model/hf_writer.h"

namespace kvd {
namespace {

const std::string kModels = std::string(KVD_SHARED_DIR) + "/models";

struct GoldenCase {
  std::vector<int32_t> prompt_tokens;
  int32_t max_new_tokens;
  std::vector<int32_t> output_tokens;
  std::string stop;
};

std::vector<GoldenCase> ReadGolden() {
  std::ifstream in(kModels + "/golden/stories260K_greedy.jsonl");
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    cases.push_back({j["prompt_tokens"].get<std::vector<int32_t>>(),
                     j["max_new_tokens"].get<int32_t>(),
                     j["output_tokens"].get<std::vector<int32_t>>(), j["stop"].get<std::string>()});
  }
  return cases;
}

// A single-chunk KV arena whose blocks are handed out in a shuffled order, so every
// sequence's block table is scattered.
class TestArena {
 public:
  TestArena(Backend* backend, const ModelSpec& spec, int32_t block_size, int32_t min_blocks,
            uint32_t seed)
      : spec_(spec), block_size_(block_size) {
    while ((1 << shift_) < min_blocks) ++shift_;
    const int64_t block_bytes =
        int64_t{spec.num_kv_heads} * block_size * spec.head_dim * sizeof(float);
    region_bytes_ = block_bytes << shift_;
    chunk_ = *backend->Allocate(region_bytes_ * 2 * spec.num_layers);
    chunks_[0] = chunk_.data();
    free_.resize(size_t{1} << shift_);
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(seed));
    for (int32_t l = 0; l < spec.num_layers; ++l) {
      views_.push_back({.chunks = chunks_,
                        .num_chunks = 1,
                        .chunk_shift = shift_,
                        .k_offset_bytes = region_bytes_ * (2 * l),
                        .v_offset_bytes = region_bytes_ * (2 * l + 1),
                        .block_bytes = block_bytes,
                        .dtype = DType::kF32,
                        .num_kv_heads = spec.num_kv_heads,
                        .block_size = block_size,
                        .head_dim = spec.head_dim});
    }
  }
  // Grows `blocks` to cover `tokens` positions.
  void Cover(std::vector<int32_t>* blocks, int32_t tokens) {
    while (static_cast<int32_t>(blocks->size()) * block_size_ < tokens) {
      ASSERT_FALSE(free_.empty());
      blocks->push_back(free_.back());
      free_.pop_back();
    }
  }
  absl::Span<const KvCacheView> views() const { return views_; }

 private:
  ModelSpec spec_;
  int32_t block_size_;
  int32_t shift_ = 0;
  int64_t region_bytes_ = 0;
  DeviceBuffer chunk_;
  void* chunks_[1] = {nullptr};
  std::vector<int32_t> free_;
  std::vector<KvCacheView> views_;
};

int32_t Argmax(const float* logits, int32_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// Greedy generation with llama2.c's stop rule (BOS ends a story). Prefill goes in chunks
// of `prefill_chunk` tokens.
std::vector<int32_t> Greedy(LlamaModel* model, TestArena* arena, const GoldenCase& c,
                            int32_t prefill_chunk, std::string* stop) {
  const int32_t bs = arena->views()[0].block_size;
  const int32_t vocab = model->spec().vocab_size;
  std::vector<int32_t> tokens = c.prompt_tokens;
  std::vector<int32_t> blocks;
  std::vector<int32_t> out;
  std::vector<float> logits;
  int32_t computed = 0;
  *stop = "length";
  while (static_cast<int32_t>(out.size()) < c.max_new_tokens) {
    const int32_t n =
        std::min<int32_t>(static_cast<int32_t>(tokens.size()) - computed, prefill_chunk);
    arena->Cover(&blocks, computed + n);
    ForwardBatch batch;
    const bool last_chunk = computed + n == static_cast<int32_t>(tokens.size());
    batch.AddSequence(absl::MakeConstSpan(tokens).subspan(computed, n), computed, blocks, bs,
                      last_chunk);
    absl::Status s = model->Forward(batch, arena->views(), &logits);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    computed += n;
    if (!last_chunk) continue;
    const int32_t next = Argmax(logits.data(), vocab);
    if (next == 1) {
      *stop = "bos";
      break;
    }
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

class LlamaGoldenTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(LlamaGoldenTest, GreedyMatchesLlama2c) {
  const int32_t block_size = GetParam();
  auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  CpuBackend backend(2);
  auto model = LlamaModel::Create(*weights, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto cases = ReadGolden();
  ASSERT_EQ(cases.size(), 12u);
  for (size_t i = 0; i < cases.size(); ++i) {
    TestArena arena(&backend, weights->spec, block_size, 512 / block_size + 2, 7 + i);
    std::string stop;
    // Alternate whole-prompt prefill and a chunked prefill that splits the prompt.
    const int32_t chunk = i % 2 == 0 ? 1 << 20 : 3;
    const auto out = Greedy(model->get(), &arena, cases[i], chunk, &stop);
    EXPECT_EQ(out, cases[i].output_tokens) << "case " << i;
    EXPECT_EQ(stop, cases[i].stop) << "case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, LlamaGoldenTest, ::testing::Values(1, 16, 64));

// stories260K as a Hugging Face directory (Q and K rows in transformers' half-rotation order,
// RoPE on halves) and as GGUF generates the same greedy tokens as the llama2.c checkpoint.
TEST(LlamaModelTest, HuggingFaceAndGgufCopiesGiveLlama2csGreedyOutputs) {
  const std::string dir = ::testing::TempDir() + "/golden_stories260K_hf";
  test::WriteHfStories260k(dir);
  CpuBackend backend(2);
  for (const std::string& path : {dir, kModels + "/stories260K.gguf"}) {
    auto weights = LoadModel(path);
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto model = LlamaModel::Create(*weights, &backend);
    ASSERT_TRUE(model.ok()) << model.status();
    const auto cases = ReadGolden();
    for (size_t i = 0; i < cases.size(); ++i) {
      TestArena arena(&backend, weights->spec, 16, 512 / 16 + 2, 11 + i);
      std::string stop;
      const auto out = Greedy(model->get(), &arena, cases[i], i % 2 == 0 ? 1 << 20 : 5, &stop);
      EXPECT_EQ(out, cases[i].output_tokens) << path << " case " << i;
      EXPECT_EQ(stop, cases[i].stop) << path << " case " << i;
    }
  }
}

TEST(LlamaModelTest, RejectsBadBatches) {
  auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  CpuBackend backend(1);
  auto model = LlamaModel::Create(*weights, &backend);
  ASSERT_TRUE(model.ok());
  TestArena arena(&backend, weights->spec, 16, 8, 1);
  std::vector<int32_t> blocks;
  arena.Cover(&blocks, 4);
  std::vector<float> logits;

  ForwardBatch out_of_vocab;
  out_of_vocab.AddSequence(std::vector<int32_t>{1, 512}, 0, blocks, 16, true);
  EXPECT_THAT(model->get()->Forward(out_of_vocab, arena.views(), &logits).message(),
              ::testing::HasSubstr("token id 512"));

  ForwardBatch ok;
  ok.AddSequence(std::vector<int32_t>{1, 2}, 0, blocks, 16, true);
  EXPECT_FALSE(model->get()->Forward(ok, arena.views().subspan(1), &logits).ok());
  EXPECT_TRUE(model->get()->Forward(ok, arena.views(), &logits).ok());
  EXPECT_EQ(logits.size(), 512u);

  // A hand-built batch whose arrays disagree: the message says which, with their sizes.
  auto refused = [&](void (*mutate)(ForwardBatch&)) {
    ForwardBatch b = ok;
    mutate(b);
    return std::string(model->get()->Forward(b, arena.views(), &logits).message());
  };
  using ::testing::HasSubstr;
  EXPECT_THAT(refused([](ForwardBatch& b) { b.positions.pop_back(); }),
              HasSubstr("same length; they have 2, 1 and 2"));
  EXPECT_THAT(refused([](ForwardBatch& b) { b.q_indptr.back() = 3; }),
              HasSubstr("q_indptr must run from 0 to the 2 tokens; it has 2 entries, from 0 to 3"));
  EXPECT_THAT(refused([](ForwardBatch& b) { b.kv_last_block_len.push_back(1); }),
              HasSubstr("q_indptr has 2 entries but kv_indptr has 2 entries and "
                        "kv_last_block_len 2"));
  EXPECT_THAT(refused([](ForwardBatch& b) { b.kv_indices.push_back(0); }),
              HasSubstr("kv_indptr must run from 0 to the 2 kv_indices; it runs from 0 to 1"));
  // Positions and slots that disagree with the block table (row 1 is position 1, slot
  // blocks[0] * 16 + 1).
  const std::string slot1 = std::to_string(int64_t{blocks[0]} * 16 + 1);
  EXPECT_THAT(refused([](ForwardBatch& b) { b.positions[1] = 5; }),
              HasSubstr("token row 1 (sequence 0) has position 5 and slot " + slot1 +
                        "; its block table puts it at position 1, slot " + slot1));
  EXPECT_THAT(refused([](ForwardBatch& b) { b.slot_mapping[1] += 1; }),
              HasSubstr("its block table puts it at position 1, slot " + slot1));

  // A KV view of another shape names the layer and both shapes.
  std::vector<KvCacheView> views(arena.views().begin(), arena.views().end());
  views[3].head_dim = 16;
  EXPECT_THAT(model->get()->Forward(ok, views, &logits).message(),
              HasSubstr("layer 3's KV view has 4 KV heads, head_dim 16 and block_size 16; the "
                        "model has 4 KV heads and head_dim 8"));
}

// What the model holds in backend memory (kvd_memory_bytes' weights): on the CPU backend its
// parameters in fp32 (the CUDA backend's bf16 is checked through the daemon, serve_check.sh).
TEST(LlamaModelTest, WeightBytesAreItsFp32ParametersOnTheCpu) {
  auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  const int64_t parameters = weights->spec.NumParameters();
  CpuBackend backend(1);
  auto model = LlamaModel::Create(*std::move(weights), &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weight_bytes(), parameters * 4);  // fp32 on the CPU
  // Before the first batch the weights are all the model holds; activations come with it.
  EXPECT_EQ(backend.allocated_bytes(), (*model)->weight_bytes());
  TestArena arena(&backend, (*model)->spec(), 16, 8, 1);
  const int64_t with_arena = backend.allocated_bytes();
  std::vector<int32_t> blocks;
  arena.Cover(&blocks, 5);
  ForwardBatch batch;
  batch.AddSequence(std::vector<int32_t>{1, 2, 3, 4, 5}, 0, blocks, 16, /*want_logits=*/true);
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward(batch, arena.views(), &logits).ok());
  EXPECT_GT(backend.allocated_bytes(), with_arena);
  EXPECT_EQ((*model)->weight_bytes(), parameters * 4);
}

// ActivationBytes counts per token the fp32 hidden row, Q/K/V, the attention output and the
// gate/up rows, and per sampled row the final norm's row and the logits.
TEST(LlamaModelTest, ActivationBytesArePerTokenAndPerSampledRow) {
  ModelSpec stories;  // stories260K's shape
  stories.dim = 64;
  stories.num_heads = 8;
  stories.num_kv_heads = 4;
  stories.head_dim = 8;
  stories.hidden_dim = 172;
  stories.vocab_size = 512;
  // 64 + (64 + 2 * 32) + 64 + 2 * 172 = 600 floats a token, 64 + 512 a sampled row.
  EXPECT_EQ(LlamaModel::ActivationBytes(stories, 40, 3), 4 * (40 * 600 + 3 * 576));
  ModelSpec llama3 = stories;  // Llama-3-8B's
  llama3.dim = 4096;
  llama3.num_heads = 32;
  llama3.num_kv_heads = 8;
  llama3.head_dim = 128;
  llama3.hidden_dim = 14336;
  llama3.vocab_size = 128256;
  EXPECT_EQ(LlamaModel::ActivationBytes(llama3, 1, 0), 172032);  // 168 KiB a token
  EXPECT_EQ(LlamaModel::ActivationBytes(llama3, 0, 1), 529408);
}

// ReserveActivations holds at once what the largest step would grow the activations to: a
// step of that size then allocates no more activation memory than the same step does on a
// model that grew them as it came.
TEST(LlamaModelTest, ReservedActivationsHoldTheLargestStep) {
  auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto again = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(again.ok()) << again.status();
  CpuBackend reserving_backend(1), growing_backend(1);
  auto reserving = LlamaModel::Create(*std::move(weights), &reserving_backend);
  ASSERT_TRUE(reserving.ok()) << reserving.status();
  auto growing = LlamaModel::Create(*std::move(again), &growing_backend);
  ASSERT_TRUE(growing.ok()) << growing.status();
  const ModelSpec& spec = (*reserving)->spec();
  const int64_t weights_bytes = (*reserving)->weight_bytes();

  ASSERT_TRUE((*reserving)->ReserveActivations(40, 3).ok());
  EXPECT_EQ(reserving_backend.allocated_bytes() - weights_bytes,
            LlamaModel::ActivationBytes(spec, 40, 3));

  // 40 tokens in three sequences, each sampling.
  TestArena reserving_kv(&reserving_backend, spec, 16, 8, 1);
  TestArena growing_kv(&growing_backend, spec, 16, 8, 1);
  ForwardBatch batch;
  int32_t token = 1;
  for (int32_t len : {20, 15, 5}) {
    std::vector<int32_t> prompt(len);
    for (int32_t& t : prompt) t = token++;
    std::vector<int32_t> reserving_blocks, growing_blocks;
    reserving_kv.Cover(&reserving_blocks, len);
    growing_kv.Cover(&growing_blocks, len);
    ASSERT_EQ(reserving_blocks, growing_blocks);  // the same seed: the same shuffled blocks
    batch.AddSequence(prompt, 0, reserving_blocks, 16, /*want_logits=*/true);
  }
  const int64_t reserved = reserving_backend.allocated_bytes();
  std::vector<float> reserving_logits, growing_logits;
  ASSERT_TRUE((*reserving)->Forward(batch, reserving_kv.views(), &reserving_logits).ok());
  ASSERT_TRUE((*growing)->Forward(batch, growing_kv.views(), &growing_logits).ok());
  EXPECT_EQ(reserving_logits, growing_logits);
  EXPECT_EQ(reserving_backend.allocated_bytes(), growing_backend.allocated_bytes());
  // Beyond the reservation, only the step's metadata (ids, positions, block tables).
  EXPECT_LT(reserving_backend.allocated_bytes() - reserved, 4096);
}

// ForwardAndSample samples each logit row on the backend with its own options: the tokens
// are what Sampler::Sample picks from Forward's logits (same sampler state), for greedy and
// for filtered, seeded sampling rows in one batch. A row count that does not match the
// batch's logit rows is refused.
TEST(LlamaModelTest, ForwardAndSampleEqualsHostSampling) {
  auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  CpuBackend backend(1);
  auto model = LlamaModel::Create(*weights, &backend);
  ASSERT_TRUE(model.ok());
  const std::vector<SamplingParams> options = {
      {.temperature = 0.0f},
      {.temperature = 1.0f, .seed = 7},
      {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 11},
      {.temperature = 1.3f, .top_p = 0.5f, .min_p = 0.05f, .seed = 12}};
  for (int trial = 0; trial < 8; ++trial) {
    TestArena arena(&backend, weights->spec, 16, 64, 3 + trial);
    ForwardBatch batch;
    std::mt19937 rng(trial);
    for (size_t i = 0; i < options.size(); ++i) {
      std::vector<int32_t> prompt(1 + rng() % 20);
      for (int32_t& t : prompt) t = 1 + static_cast<int32_t>(rng() % 511);
      std::vector<int32_t> blocks;
      arena.Cover(&blocks, static_cast<int32_t>(prompt.size()));
      batch.AddSequence(prompt, 0, blocks, 16, /*want_logits=*/true);
    }
    std::vector<Sampler> host, device;
    std::vector<SamplingRow> rows;
    for (const SamplingParams& o : options) {
      SamplingParams seeded = o;
      seeded.seed += trial;
      host.emplace_back(seeded);
      device.emplace_back(seeded);
      rows.push_back(device.back().NextRow());
    }
    std::vector<int32_t> tokens;
    ASSERT_TRUE(model->get()->ForwardAndSample(batch, arena.views(), rows, &tokens).ok());
    // The same batch again through Forward (K/V rewritten with the same values).
    std::vector<float> logits;
    ASSERT_TRUE(model->get()->Forward(batch, arena.views(), &logits).ok());
    const int32_t vocab = weights->spec.vocab_size;
    ASSERT_EQ(tokens.size(), options.size());
    for (size_t i = 0; i < options.size(); ++i) {
      EXPECT_EQ(tokens[i], host[i].Sample(absl::MakeConstSpan(logits).subspan(i * vocab, vocab)))
          << "trial " << trial << " row " << i;
    }
    rows.pop_back();
    EXPECT_THAT(model->get()->ForwardAndSample(batch, arena.views(), rows, &tokens).message(),
                ::testing::HasSubstr("3 sampling rows for 4 logit rows"));
  }
}

TEST(LlamaModelTest, RejectsWeightsThatDoNotMatchTheSpec) {
  auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
  ASSERT_TRUE(weights.ok());
  weights->layers[2].w2.pop_back();
  CpuBackend backend(1);
  auto model = LlamaModel::Create(*weights, &backend);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), ::testing::HasSubstr("layers[2].w2"));
}

}  // namespace
}  // namespace kvd
