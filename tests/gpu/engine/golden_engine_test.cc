// The stories260K golden file through the whole engine on the GPU: llama2.c checkpoint ->
// LlamaModel on CudaBackend (bf16 weights, bf16 KV) -> KvCacheManager -> Generator, all 12
// prompts in one continuous batch, greedy.
//
// Tolerance: the reference is fp32 (llama2.c's run.c); bf16 weights and KV move logits by
// roughly 1e-2, and the golden file's smallest top-2 margin is smaller than that, so a
// late divergence is expected and allowed. The test asserts that the first 20 generated
// tokens of every case equal the reference (all of them when a case has fewer). For every
// case it prints the first divergence, if any, with the logit margins at that step: the
// fp32 CPU reference's (reference token minus the token CUDA chose, and its top-1 minus
// top-2) and the CUDA model's, both recomputed by teacher forcing the reference prefix.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache/clock.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/llama2c_loader.h"
#include "model/llama_model.h"
#include "scheduler/generator.h"
#include "tools/engine_setup.h"

namespace kvd {
namespace {

// Tokens at the start of every case that must match the fp32 reference exactly.
constexpr size_t kExactPrefixTokens = 20;

// $KVD_SHARED_DIR (set by the GPU bundle's env.sh) or the build's shared folder.
std::string SharedDir() {
  const char* env = std::getenv("KVD_SHARED_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(KVD_SHARED_DIR);
}

struct Golden {
  GenerationRequest request;
  std::vector<int32_t> output;
  std::string prompt_text;
};

std::vector<Golden> ReadGolden(const std::string& path) {
  std::ifstream in(path);
  std::vector<Golden> cases;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    Golden g;
    g.request.prompt = j["prompt_tokens"].get<std::vector<int32_t>>();
    g.request.max_new_tokens = j["max_new_tokens"].get<int32_t>();
    g.request.sampling.temperature = 0;
    g.request.stop_token_ids = {1};  // llama2.c stops at BOS
    g.output = j["output_tokens"].get<std::vector<int32_t>>();
    g.prompt_text = j["prompt"].get<std::string>();
    cases.push_back(std::move(g));
  }
  return cases;
}

// Logits after teacher forcing `tokens` (one prefill) on `backend`.
absl::StatusOr<std::vector<float>> LogitsAfter(LlamaModel& model, Backend& backend,
                                               const std::vector<int32_t>& tokens) {
  FakeClock clock;
  auto cache = CreateCacheForSequences(model.spec(), &backend, &clock, 16, 1, false);
  if (!cache.ok()) return cache.status();
  auto computed = (*cache)->AddSequence(0, tokens);
  if (!computed.ok()) return computed.status();
  if (!(*cache)->Reserve(0, static_cast<int32_t>(tokens.size()))) {
    return absl::ResourceExhaustedError("no KV blocks for the teacher-forced prefix");
  }
  ForwardBatch batch;
  batch.AddSequence(tokens, 0, (*cache)->BlockIds(0), 16, /*want_logits=*/true);
  std::vector<KvCacheView> views;
  for (int32_t l = 0; l < model.spec().num_layers; ++l) views.push_back((*cache)->LayerView(l));
  std::vector<float> logits;
  if (absl::Status s = model.Forward(batch, views, &logits); !s.ok()) return s;
  return logits;
}

// Largest minus second largest.
float TopTwoMargin(const std::vector<float>& logits) {
  std::vector<float> sorted = logits;
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  return sorted[0] - sorted[1];
}

TEST(GpuEngineGoldenTest, Stories260KGreedyMatchesReferenceThroughCuda) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string models = SharedDir() + "/models";
  auto weights = LoadLlama2cCheckpoint(models + "/stories260K.bin");
  ASSERT_TRUE(weights.ok()) << weights.status();
  const std::vector<Golden> golden = ReadGolden(models + "/golden/stories260K_greedy.jsonl");
  ASSERT_EQ(golden.size(), 12u) << "golden file missing or changed: " << models;

  auto gpu = CudaBackend::Create(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto model = LlamaModel::Create(*weights, gpu->get());
  ASSERT_TRUE(model.ok()) << model.status();
  RealClock clock;
  auto cache = CreateCacheForSequences(weights->spec, gpu->get(), &clock, 16, 12);
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_EQ((*cache)->layout().dtype(), DType::kBF16) << "the CUDA engine keeps bf16 KV";

  std::vector<GenerationRequest> requests;
  for (const Golden& g : golden) requests.push_back(g.request);
  Generator generator(model->get(), cache->get(), {.max_batch_size = 12});
  auto results = generator.Run(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), golden.size());

  // The fp32 reference engine, only for the margins at divergences.
  CpuBackend cpu(2);
  auto cpu_model = LlamaModel::Create(*weights, &cpu);
  ASSERT_TRUE(cpu_model.ok()) << cpu_model.status();

  std::printf("%-4s %-28s %6s %6s %10s %10s %10s %10s\n", "case", "prompt", "ref", "cuda",
              "diverges", "ref gap", "ref top2", "cuda gap");
  int exact_cases = 0;
  for (size_t c = 0; c < golden.size(); ++c) {
    const std::vector<int32_t>& want = golden[c].output;
    const std::vector<int32_t>& got = (*results)[c].output;
    size_t d = 0;
    while (d < want.size() && d < got.size() && want[d] == got[d]) ++d;
    const bool same = d == want.size() && d == got.size();
    exact_cases += same ? 1 : 0;
    std::string where = same ? "none" : std::to_string(d);
    double ref_gap = 0, ref_top2 = 0, cuda_gap = 0;
    if (!same && d < want.size() && d < got.size()) {
      // Margins at step d, from the same reference prefix on both backends.
      std::vector<int32_t> prefix = golden[c].request.prompt;
      prefix.insert(prefix.end(), want.begin(), want.begin() + d);
      auto ref = LogitsAfter(**cpu_model, cpu, prefix);
      auto ours = LogitsAfter(**model, **gpu, prefix);
      ASSERT_TRUE(ref.ok()) << ref.status();
      ASSERT_TRUE(ours.ok()) << ours.status();
      ref_gap = (*ref)[want[d]] - (*ref)[got[d]];
      ref_top2 = TopTwoMargin(*ref);
      cuda_gap = (*ours)[want[d]] - (*ours)[got[d]];
    }
    std::printf("%-4zu %-28.28s %6zu %6zu %10s %10.5f %10.5f %10.5f\n", c,
                golden[c].prompt_text.c_str(), want.size(), got.size(), where.c_str(), ref_gap,
                ref_top2, cuda_gap);
    const size_t must_match = std::min(kExactPrefixTokens, want.size());
    ASSERT_GE(got.size(), must_match) << "case " << c << " stopped early";
    EXPECT_TRUE(std::equal(want.begin(), want.begin() + must_match, got.begin()))
        << "case " << c << " ('" << golden[c].prompt_text << "') diverges at token " << d
        << ", inside the first " << kExactPrefixTokens << " tokens";
  }
  std::printf("%d of %zu cases match the fp32 reference token for token\n", exact_cases,
              golden.size());
  std::fflush(stdout);
}

}  // namespace
}  // namespace kvd
