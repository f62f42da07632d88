#ifndef KVD_TESTS_FUZZ_STORIES260K_GOLDEN_H_
#define KVD_TESTS_FUZZ_STORIES260K_GOLDEN_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/llama2c_loader.h"
#include "model/llama_model.h"
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

}  // namespace kvd::fuzz

#endif  // KVD_TESTS_FUZZ_STORIES260K_GOLDEN_H_
