#ifndef KVD_TESTS_FUZZ_STORIES260K_GOLDEN_H_
#define KVD_TESTS_FUZZ_STORIES260K_GOLDEN_H_

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "model/llama2c_loader.h"
#include "model/llama_model.h"
#include "scheduler/request.h"
#include "tests/fuzz/fuzz_check.h"

namespace kvd::fuzz {

// One of llama2.c's greedy runs of stories260K (../shared/models/golden): its prompt and
// what it generated, up to max_new_tokens or the story's end (never the stop token 1).
struct GoldenStory {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};

// The 12 golden stories, each output at least 2 tokens long, read once for the process.
inline const std::vector<GoldenStory>& Stories260kGolden() {
  static const std::vector<GoldenStory>* golden = [] {
    auto* stories = new std::vector<GoldenStory>;
    std::ifstream in(KVD_SHARED_DIR "/models/golden/stories260K_greedy.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      stories->push_back({j["prompt_tokens"].get<std::vector<int32_t>>(),
                          j["output_tokens"].get<std::vector<int32_t>>()});
    }
    Require(stories->size() == 12, "the golden file does not hold 12 stories");
    for (const GoldenStory& g : *stories) {
      Require(g.output.size() >= 2, "a golden output under 2 tokens");
    }
    return stories;
  }();
  return *golden;
}

// stories260K's weights on `backend`, its spec in `*spec`; aborts when they do not load.
inline std::unique_ptr<LlamaModel> LoadStories260k(Backend* backend, ModelSpec* spec) {
  auto weights = LoadLlama2cCheckpoint(KVD_SHARED_DIR "/models/stories260K.bin");
  Require(weights.ok(), "stories260K.bin did not load");
  *spec = weights->spec;
  auto model = LlamaModel::Create(*std::move(weights), backend);
  Require(model.ok(), "the model did not build");
  return *std::move(model);
}

// stories260K on a CPU backend of one thread, loaded once for the process.
struct Stories260kOnCpu {
  CpuBackend backend{1};
  ModelSpec spec;
  std::unique_ptr<LlamaModel> model;
};

inline Stories260kOnCpu& TheStories260kOnCpu() {
  static Stories260kOnCpu* world = [] {
    auto* w = new Stories260kOnCpu;
    w->model = LoadStories260k(&w->backend, &w->spec);
    return w;
  }();
  return *world;
}

// A greedy request for golden story g's prompt followed by the first `skip` tokens of its
// output, for the next max_tokens of it: GoldenContinuation. It ends by length, as no golden
// output holds the stop token 1. REQUIRES: skip + max_tokens <= g.output.size().
inline Request GoldenRequest(const GoldenStory& g, int skip, int max_tokens) {
  Request r;
  r.prompt = g.prompt;
  r.prompt.insert(r.prompt.end(), g.output.begin(), g.output.begin() + skip);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.stop_token_ids = {1};
  return r;
}

inline std::vector<int32_t> GoldenContinuation(const GoldenStory& g, int skip, int max_tokens) {
  return {g.output.begin() + skip, g.output.begin() + skip + max_tokens};
}

// Whether `tokens` begin `expected` (or are all of it).
inline bool IsPrefixOf(const std::vector<int32_t>& tokens, const std::vector<int32_t>& expected) {
  return tokens.size() <= expected.size() &&
         std::equal(tokens.begin(), tokens.end(), expected.begin());
}

}  // namespace kvd::fuzz

#endif  // KVD_TESTS_FUZZ_STORIES260K_GOLDEN_H_
