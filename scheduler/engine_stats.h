#ifndef KVD_SCHEDULER_ENGINE_STATS_H_
#define KVD_SCHEDULER_ENGINE_STATS_H_

#include <array>
#include <cstdint>
#include <vector>

#include "cache/kv_cache_stats.h"
#include "scheduler/request.h"

namespace kvd {

// A histogram with fixed upper bounds, kept per bucket: counts[i] counts observations in
// (bounds[i - 1], bounds[i]] (counts[0] those <= bounds[0]), and the last count, one past the
// bounds, those above every bound (+Inf). The exporter sums them into Prometheus's cumulative
// buckets.
struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // [bounds.size() + 1], one bucket each, not cumulative
  double sum = 0;
  int64_t count = 0;

  explicit Histogram(std::vector<double> upper_bounds = {});
  void Observe(double value);
};

// The model backend's memory by what holds it, in bytes, as of the engine's last step.
// weights + kv_pool + activations = Backend::allocated_bytes() where the model's and the
// arena's buffers are that backend's own (the daemon's and the tools' setups); workspace is
// the backend's own, beside them. What the backend's device holds besides (a CUDA context, cuBLAS's
// handles, recorded graphs, other processes) is not here: Backend::QueryDeviceMemory.
struct MemoryStats {
  int64_t weights_bytes = 0;  // LlamaModel::weight_bytes()
  // The KV arena's chunks (KvCacheStats::total_bytes), where the arena is on the model's
  // backend; 0 otherwise.
  int64_t kv_pool_bytes = 0;
  // Every other buffer: activations (on CUDA the largest step's, held from startup; on the
  // CPU grown to the largest batch so far), batch metadata,
  // decode-graph buffers, sampling buffers, the arena's chunk table and block-copy list.
  int64_t activation_bytes = 0;
  int64_t workspace_bytes = 0;  // Backend::workspace_bytes()
};

// A snapshot of the engine's state and counters. Times are in seconds.
struct EngineStats {
  int32_t requests_waiting = 0;
  int32_t requests_running = 0;
  int64_t requests_finished = 0;
  // requests_finished by FinishReason (indexed by its value); they sum to it.
  std::array<int64_t, kNumFinishReasons> requests_finished_by_reason{};
  int64_t requests_rejected = 0;  // admission rejections (RESOURCE_EXHAUSTED)
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t prompt_tokens = 0;  // tokens in (all prompts)
  // Prompt tokens prefilled at each request's first admission: the rest of prompt_tokens came
  // from the prefix or session cache, or belong to requests never admitted. Recomputing after
  // a preemption is not counted (preemptions is), so this never exceeds prompt_tokens.
  int64_t computed_prompt_tokens = 0;
  int64_t generated_tokens = 0;        // tokens out
  double predicted_output_tokens = 0;  // the predictor's current value
  Histogram time_to_first_token;       // seconds
  Histogram inter_token_latency;       // seconds
  Histogram end_to_end_latency;        // seconds
  Histogram output_length;             // actual output tokens per finished request
  Histogram prediction_error;          // actual - predicted output tokens
  KvCacheStats cache;
  MemoryStats memory;
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_ENGINE_STATS_H_
