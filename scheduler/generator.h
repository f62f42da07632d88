#ifndef KVD_SCHEDULER_GENERATOR_H_
#define KVD_SCHEDULER_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "scheduler/engine_loop.h"
#include "scheduler/request.h"

namespace kvd {

// One prompt to complete.
struct GenerationRequest {
  std::vector<int32_t> prompt;   // token ids, BOS included when the model wants it
  int32_t max_new_tokens = 256;  // >= 0; 0: nothing runs (empty output, kLength)
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends (token not emitted) on any of these
  std::string session_id;               // optional: keep this conversation's KV pinned
};

struct GenerationResult {
  std::vector<int32_t> output;                  // generated ids, stop token excluded
  FinishReason finish = FinishReason::kLength;  // kLength, kStop or kContextLimit
  Usage usage;                                  // cached_prompt_tokens, preemptions, ...
};

// Runs a fixed set of requests to completion through the EngineLoop on the calling
// thread (continuous batching, prefix reuse and preemption included): the offline engine
// behind `kvd generate`, the CPU benchmark and the engine tests. Not thread safe.
class Generator {
 public:
  // Called after each generated token: (request index, token id).
  using TokenCallback = std::function<void(size_t, int32_t)>;

  // `model` and `cache` must outlive the generator. options.max_waiting_requests is ignored:
  // Run takes any number of requests.
  Generator(LlamaModel* model, KvCacheManager* cache, EngineOptions options = {});

  // Fails with the first request's error (InvalidArgument naming the request and field,
  // ResourceExhausted) before anything runs, or with the engine's error.
  absl::StatusOr<std::vector<GenerationResult>> Run(absl::Span<const GenerationRequest> requests,
                                                    const TokenCallback& on_token = nullptr);

  EngineStats stats() const { return engine_.Stats(); }

 private:
  RealClock clock_;
  EngineLoop engine_;
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_GENERATOR_H_
