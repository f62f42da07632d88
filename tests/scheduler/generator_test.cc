// The engine behind `kvd generate`: greedy outputs equal llama2.c's for every golden
// prompt, all prompts running together in one continuous batch, for several KV block
// sizes; every sequence's KV lives in blocks from the KvCacheManager.

#include "scheduler/generator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache/clock.h"
#include "kernels/cpu_backend.h"
#include "model/llama2c_loader.h"
#include "tests/cache/fake_backend.h"
#include "tools/engine_setup.h"

namespace kvd {
namespace {

const std::string kModels = std::string(KVD_SHARED_DIR) + "/models";

struct Golden {
  GenerationRequest request;
  std::vector<int32_t> output;
  FinishReason finish;
};

std::vector<Golden> ReadGolden() {
  std::ifstream in(kModels + "/golden/stories260K_greedy.jsonl");
  std::vector<Golden> cases;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    Golden g;
    g.request.prompt = j["prompt_tokens"].get<std::vector<int32_t>>();
    g.request.max_new_tokens = j["max_new_tokens"].get<int32_t>();
    g.request.sampling.temperature = 0;
    g.request.stop_token_ids = {1};
    g.output = j["output_tokens"].get<std::vector<int32_t>>();
    g.finish = j["stop"] == "bos" ? FinishReason::kStop : FinishReason::kLength;
    cases.push_back(g);
  }
  return cases;
}

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
    ASSERT_TRUE(weights.ok()) << weights.status();
    spec_ = weights->spec;
    auto model = LlamaModel::Create(*weights, &backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    golden_ = ReadGolden();
    ASSERT_EQ(golden_.size(), 12u);
  }

  std::unique_ptr<KvCacheManager> Cache(int32_t block_size, int32_t num_sequences,
                                        bool prefix_caching = true) {
    auto cache = CreateCacheForSequences(spec_, &backend_, &clock_, block_size, num_sequences,
                                         prefix_caching);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? std::move(*cache) : nullptr;
  }

  CpuBackend backend_{2};
  FakeClock clock_;
  ModelSpec spec_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<Golden> golden_;
};

class GeneratorGoldenTest : public GeneratorTest, public ::testing::WithParamInterface<int32_t> {};

TEST_P(GeneratorGoldenTest, AllGoldenPromptsInOneBatch) {
  auto cache = Cache(GetParam(), 12);
  ASSERT_NE(cache, nullptr);
  std::vector<GenerationRequest> requests;
  for (const Golden& g : golden_) requests.push_back(g.request);
  // A small token budget forces chunked prefill mixed with decodes.
  Generator gen(model_.get(), cache.get(), {.max_batch_size = 12, .max_num_batched_tokens = 24});
  auto results = gen.Run(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  for (size_t i = 0; i < golden_.size(); ++i) {
    EXPECT_EQ((*results)[i].output, golden_[i].output) << "case " << i;
    EXPECT_EQ((*results)[i].finish, golden_[i].finish) << "case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, GeneratorGoldenTest, ::testing::Values(1, 16, 64));

TEST_F(GeneratorTest, RejectsBadRequestsAndFreesEverything) {
  auto cache = Cache(16, 2);
  Generator gen(model_.get(), cache.get());
  GenerationRequest empty;
  EXPECT_EQ(gen.Run({empty}).status().code(), absl::StatusCode::kInvalidArgument);
  GenerationRequest bad_token;
  bad_token.prompt = {1, 600};
  EXPECT_THAT(gen.Run({golden_[0].request, bad_token}).status().message(),
              ::testing::HasSubstr("600"));
  GenerationRequest too_long;
  too_long.prompt.assign(513, 300);
  EXPECT_THAT(gen.Run({too_long}).status().message(), ::testing::HasSubstr("513"));
  GenerationRequest negative = golden_[2].request;
  negative.max_new_tokens = -3;
  const absl::Status refused = gen.Run({golden_[0].request, negative}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("request 1: max_new_tokens must be >= 0, got -3"));
  GenerationRequest none = golden_[0].request;
  none.max_new_tokens = 0;
  const auto nothing = gen.Run({none});
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_TRUE((*nothing)[0].output.empty());
  EXPECT_EQ((*nothing)[0].finish, FinishReason::kLength);
  // Nothing of the refused runs is left: no sequence, no block in use.
  EXPECT_EQ(cache->stats().num_sequences, 0);
  EXPECT_EQ(cache->stats().used_blocks, 0);
  // The pool is whole again: a full-size run still fits.
  auto ok = gen.Run({golden_[1].request, golden_[3].request});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0].output, golden_[1].output);
}

TEST_F(GeneratorTest, RunReturnsOnlyOnceEveryRequestHasFinished) {
  // KV memory that cannot grow past its first chunk of 8 blocks: a prompt that needs more is
  // aborted when its blocks cannot be had. The request behind it still runs to its end
  // before Run returns the error (its callbacks point into Run's frame).
  FakeBackend arena_memory;
  const KvShape shape{spec_.num_layers, spec_.num_kv_heads, spec_.head_dim};
  const int64_t block_bytes = KvLayout::Create(shape, DType::kF32, 16)->block_bytes();
  KvCacheOptions o;
  o.chunk_bytes = block_bytes * 8;
  o.initial_pool_bytes = o.chunk_bytes;
  o.max_pool_bytes = o.chunk_bytes * 4;
  o.defrag_background_planning = false;
  auto cache = KvCacheManager::Create(o, shape, &arena_memory, &clock_);
  ASSERT_TRUE(cache.ok()) << cache.status();
  arena_memory.FailAllocationsAfter(arena_memory.num_allocations());
  Generator gen(model_.get(), cache->get());
  GenerationRequest big;
  big.prompt.assign(200, 300);  // 13 blocks
  big.max_new_tokens = 4;
  GenerationRequest small = golden_[2].request;
  small.max_new_tokens = 20;
  std::vector<int32_t> small_output;
  auto results = gen.Run({big, small}, [&](size_t i, int32_t token) {
    if (i == 1) small_output.push_back(token);
  });
  EXPECT_EQ(results.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(small_output,
            std::vector<int32_t>(golden_[2].output.begin(), golden_[2].output.begin() + 20));
  const KvCacheStats st = (*cache)->stats();
  EXPECT_EQ(st.num_sequences, 0);
  EXPECT_EQ(st.used_blocks, 0);
}

// The waiting-queue bound is the daemon's back-pressure on clients; a batch larger than it
// runs whole (Run submits every request before the engine takes any).
TEST_F(GeneratorTest, RunsMoreRequestsThanTheWaitingQueueHolds) {
  auto cache = Cache(16, 4);
  Generator gen(model_.get(), cache.get(), {.max_waiting_requests = 8});
  std::vector<GenerationRequest> requests(20, golden_[0].request);
  for (GenerationRequest& r : requests) r.max_new_tokens = 3;
  auto results = gen.Run(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 20u);
  const std::vector<int32_t> want(golden_[0].output.begin(), golden_[0].output.begin() + 3);
  for (const GenerationResult& r : *results) EXPECT_EQ(r.output, want);
  EXPECT_EQ(cache->stats().used_blocks, 0);
}

TEST_F(GeneratorTest, ContextLimitEndsGeneration) {
  auto cache = Cache(16, 1);
  Generator gen(model_.get(), cache.get());
  GenerationRequest r = golden_[6].request;  // never emits BOS within its budget
  r.max_new_tokens = 10000;
  auto results = gen.Run({r});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].finish, FinishReason::kContextLimit);
  // Every position of the context was used: prompt + output = context + 1 (the last token
  // is emitted but never fed back).
  EXPECT_EQ(r.prompt.size() + (*results)[0].output.size(), 513u);
}

TEST_F(GeneratorTest, SharedPrefixIsPrefilledOnceAndChangesNoOutput) {
  // Case 10's prompt extends case 0's story; run case 0 first, then case 10 and 11.
  auto cache = Cache(16, 3);
  Generator gen(model_.get(), cache.get());
  GenerationRequest first = golden_[0].request;
  first.max_new_tokens = 40;
  ASSERT_TRUE(gen.Run({first}).ok());
  auto results = gen.Run({golden_[10].request});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].output, golden_[10].output);
  // The 32-token prompt shares "<s> Once upon a time, there was a little girl named Lily.
  // She lo..." with the first run's tokens: at least one full 16-token block is reused and
  // only the rest is prefilled.
  EXPECT_GE((*results)[0].usage.cached_prompt_tokens, 16);
  EXPECT_LT((*results)[0].usage.cached_prompt_tokens, 32);

  auto cold = Cache(16, 3, /*prefix_caching=*/false);
  Generator cold_gen(model_.get(), cold.get());
  ASSERT_TRUE(cold_gen.Run({first}).ok());
  auto cold_results = cold_gen.Run({golden_[10].request});
  ASSERT_TRUE(cold_results.ok());
  EXPECT_EQ((*cold_results)[0].usage.cached_prompt_tokens, 0);
  EXPECT_EQ((*cold_results)[0].output, (*results)[0].output);
}

}  // namespace
}  // namespace kvd
