#ifndef KVD_SCHEDULER_ENGINE_LOOP_H_
#define KVD_SCHEDULER_ENGINE_LOOP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "scheduler/engine_stats.h"
#include "scheduler/request.h"

namespace kvd {

enum class AdmissionMode {
  kPredicted,   // uncached prompt + min(max_tokens, predicted output); may preempt
  kReserveMax,  // whole prompt + max_tokens; never preempts
  kOptimistic,  // uncached prompt only
};

struct EngineOptions {
  int32_t max_batch_size = 64;            // sequences per step, >= 1
  int32_t max_num_batched_tokens = 2048;  // tokens per step, prefill chunks and decodes;
                                          // >= max_batch_size (each sequence needs one)
  int32_t prefill_chunk_tokens = 512;     // most prompt tokens of one sequence per step, >= 1
  int32_t max_waiting_requests = 256;     // Submit fails with ResourceExhausted beyond; >= 1
  AdmissionMode admission = AdmissionMode::kPredicted;
  double predictor_quantile = 0.9;                    // of observed output lengths, [0, 1]
  int32_t predictor_default_tokens = 128;             // prediction before any finished, >= 1
  absl::Duration idle_tick = absl::Milliseconds(50);  // cache Tick() period while idle, >= 0
  // Positions a sequence may fill: the model's context, or this when smaller and > 0
  // (kv_cache_config.max_seq_length); >= 0. A sequence that fills it before max_tokens ends
  // with kContextLimit.
  int32_t max_context_tokens = 0;

  // InvalidArgument naming the first field outside its range (above), its value and what is
  // allowed. The daemon's config (InferenceConfig::Validate) never yields one.
  absl::Status Validate() const;
};

// The engine thread: continuous batching over one model and one KV cache.
//
// Submit/Cancel/CloseSession/Stats/BeginDrain are thread safe; everything else (the
// scheduler, the cache, the backend) runs on the engine thread that Start() spawns. Each
// step drains new requests and cancellations, expires idle sessions, admits waiting
// requests by predicted KV growth, runs one forward pass over a StepPlan that mixes
// prefill chunks and decodes, samples, streams deltas and retires finished requests. When
// the pool runs short, the lowest-priority, most recently admitted request is preempted
// (its blocks freed, re-queued, recomputed later with identical greedy output).
// Does not own the model, cache, tokenizer or clock; they must outlive it. Without a
// tokenizer (offline token-id runs) events carry no text and stop strings are refused.
class EngineLoop {
 public:
  // REQUIRES: options.Validate() is OK (checked: aborts with its message otherwise; a step
  // of no tokens would spin forever).
  EngineLoop(const EngineOptions& options, LlamaModel* model, KvCacheManager* cache,
             const Tokenizer* tokenizer, Clock* clock);
  ~EngineLoop();  // Stop()s

  // Spawns the engine thread.
  void Start();
  // Finishes every request at once (kAborted) and joins the engine thread. A second call,
  // from any thread, returns once the first has done so.
  void Stop();
  // Offline use instead of Start(): runs steps on the calling thread until nothing is
  // waiting or running. REQUIRES: Start() was not called.
  void RunUntilIdle();

  // Queues a request; its events go to `on_event`. Errors, with nothing queued, judged in
  // this order: first the request itself, InvalidArgument (bad fields, naming the field and
  // allowed range) and ResourceExhausted when the prompt, or the prompt with max_tokens,
  // cannot fit the whole pool (an accepted request can always run to its end alone); then the
  // engine's state, Unavailable (failed, draining or stopped) and ResourceExhausted (the
  // waiting queue is full). So a request that could never run is refused as such even while
  // draining (Unavailable would invite a retry elsewhere that fails the same way). Returns an
  // engine-wide request handle.
  absl::StatusOr<uint64_t> Submit(Request request, StreamCallback on_event);
  // Cancels a request; its blocks are freed within one step and it gets a final event
  // with kCancelled. Unknown or finished handles are ignored, and so is every handle once
  // the engine is stopping or has failed (its requests are aborted).
  void Cancel(uint64_t handle);
  // Releases a session's pinned KV now. Its turns submitted before the close run on without
  // the session (their KV is not pinned at their end), those not started yet included. A
  // turn submitted after the close starts the session afresh. NotFound for a session neither
  // held nor named by a queued turn. Before Start() it runs on the calling thread, which
  // must then be RunUntilIdle's.
  absl::Status CloseSession(const std::string& session_id);
  // The clock the engine measures time on: Request::deadline is a time on it.
  const Clock& clock() const;
  // Stops accepting (Submit returns Unavailable); requests already accepted run on.
  void BeginDrain();
  // Waits until nothing is waiting or running, or the timeout passes. True when idle.
  bool WaitIdle(absl::Duration timeout);

  // A snapshot for metrics and GetCacheStats as of the last step's end, except
  // requests_waiting and requests_running: those are current also mid-step (from a stream
  // callback, say), and requests_waiting is what Submit holds to max_waiting_requests.
  EngineStats Stats() const;

  // OK while the backend works. A step that fails with DataLoss (the backend is unusable
  // from then on: a device fault lost the CUDA context) stops the engine: every request
  // accepted is finished (kAborted, Unavailable naming the failure), Submit and
  // CloseSession return Unavailable, and this returns the failure, so that the daemon can
  // stop serving and exit. Any other failed step aborts only the requests in it.
  absl::Status Failure() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_ENGINE_LOOP_H_
