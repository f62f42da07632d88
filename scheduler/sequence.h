#ifndef KVD_SCHEDULER_SEQUENCE_H_
#define KVD_SCHEDULER_SEQUENCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "model/sampler.h"
#include "model/streaming_decoder.h"
#include "scheduler/request.h"
#include "scheduler/stop_matcher.h"

namespace kvd {

// The engine's state for one request, waiting or running. Counts tokens, not phases:
// `tokens` is prompt + generated, `num_computed` of them have K/V in the cache, and a
// step advances num_computed toward tokens.size(); prefill, chunked prefill, decode and
// recompute after preemption are the same path. Engine thread only.
struct Sequence {
  uint64_t handle = 0;   // engine-wide id, also the cache's SeqId
  Request request;
  StreamCallback on_event;
  std::vector<int32_t> tokens;
  int32_t num_computed = 0;
  int32_t num_generated = 0;
  std::optional<Sampler> sampler;
  std::optional<StreamingDecoder> decoder;
  std::optional<StopMatcher> stop;
  bool in_cache = false;          // AddSequence done, blocks held
  int64_t admit_order = 0;        // larger = admitted more recently
  int32_t predicted_output = 0;   // at first admission
  Usage usage;
  absl::Time submit_time;
  absl::Time last_token_time;
  bool scheduled_once = false;
  std::vector<int32_t> unsent_tokens;  // generated but not yet in an event
  std::string unsent_text;

  std::optional<FinishReason> finish_reason;  // set once finished

  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
  bool finished() const { return finish_reason.has_value(); }
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_SEQUENCE_H_
