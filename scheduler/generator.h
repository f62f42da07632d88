#ifndef KVD_SCHEDULER_GENERATOR_H_
#define KVD_SCHEDULER_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/kv_cache_manager.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "scheduler/request.h"

namespace kvd {

// One prompt to complete.
struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included when the model wants it
  int32_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends (token not emitted) on any of these
  std::string session_id;               // optional: keep this conversation's KV pinned
};

struct GenerationResult {
  std::vector<int32_t> output;       // generated ids, stop token excluded
  FinishReason finish = FinishReason::kLength;  // kLength, kStop or kContextLimit
  int32_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from the cache
  int32_t computed_prompt_tokens = 0;  // prompt tokens prefilled by this run
};

struct GeneratorOptions {
  int32_t max_num_batched_tokens = 2048;  // tokens per forward step, all sequences together
  int32_t max_batch_size = 64;            // sequences per step
};

// Runs a fixed set of requests to completion with continuous batching on one thread:
// every step feeds each unfinished sequence its next prefill chunk or its one decode
// token, as budgets allow, through the model and the KV cache manager (every sequence's
// KV lives in blocks the manager hands out; prefix hits skip prefill). This is the
// offline engine behind `kvd generate` and the CPU benchmarks; the daemon's EngineLoop
// adds admission, preemption and streaming to many clients. Not thread safe.
class Generator {
 public:
  // Called after each generated token: (request index, token id).
  using TokenCallback = std::function<void(size_t, int32_t)>;

  // `model` and `cache` must outlive the generator.
  Generator(LlamaModel* model, KvCacheManager* cache, GeneratorOptions options = {});

  // Fails with InvalidArgument for an empty prompt or a token outside the vocabulary, and
  // with ResourceExhausted when the pool cannot hold the running sequences.
  absl::StatusOr<std::vector<GenerationResult>> Run(absl::Span<const GenerationRequest> requests,
                                                    const TokenCallback& on_token = nullptr);

  // Forward steps run so far.
  int64_t num_steps() const { return num_steps_; }

 private:
  LlamaModel* model_;
  KvCacheManager* cache_;
  GeneratorOptions options_;
  int64_t num_steps_ = 0;
  int64_t next_seq_id_ = 1;
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_GENERATOR_H_
