#ifndef KVD_SCHEDULER_REQUEST_H_
#define KVD_SCHEDULER_REQUEST_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/sampler.h"

namespace kvd {

// What a client asks for, after the server has validated and tokenized it. Plain aggregate.
struct Request {
  std::string request_id;       // client's id, or one the server made up
  std::vector<int32_t> prompt;  // token ids, BOS included where the model wants it
  int32_t max_tokens = 256;     // most tokens to generate (>= 1)
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends on these (not emitted)
  std::vector<std::string> stop;        // stop strings: text ends before the first match
  std::string session_id;               // keep this conversation's KV between turns
  int32_t priority = 0;                 // larger runs first; the smallest is preempted first
  int32_t expected_output_tokens = 0;   // client's hint for admission (0 = none)
  absl::Time deadline = absl::InfiniteFuture();  // on the engine's clock (EngineLoop::clock())
};

// Why a request ended. Names are the API's finish_reason strings.
enum class FinishReason {
  kLength,        // max_tokens generated
  kStop,          // a stop token or stop string
  kContextLimit,  // the context (EngineOptions::max_context_tokens) filled before max_tokens
  kCancelled,     // the client cancelled or went away
  kDeadline,      // the request's deadline passed
  kAborted,       // the engine stopped (drain timeout) or failed
};
inline constexpr int kNumFinishReasons = static_cast<int>(FinishReason::kAborted) + 1;
std::string_view FinishReasonName(FinishReason r);  // "length", "stop", ...

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens whose KV was reused (prefix or session)
  int32_t completion_tokens = 0;
  int32_t num_preemptions = 0;
  absl::Duration queue_time;           // submit -> first scheduled (or finish, if never)
  absl::Duration time_to_first_token;  // submit -> first token
  absl::Duration total_time;           // submit -> finish
};

// One message of a request's stream. Every request gets zero or more deltas and exactly
// one final event (finished = true), which may also carry the last tokens.
struct StreamEvent {
  std::vector<int32_t> token_ids;  // tokens new since the previous event
  std::string text;                // their text (UTF-8; never a partial stop string)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;  // set when finished
  Usage usage;                                         // set when finished
  absl::Status error;  // non-OK only on a final event the engine could not complete
};

// Receives a request's events, on the engine thread, in order. Must be quick and must not
// call back into the engine (queue the event and return).
using StreamCallback = std::function<void(const StreamEvent&)>;

}  // namespace kvd

#endif  // KVD_SCHEDULER_REQUEST_H_
