#ifndef KVD_MODEL_SAMPLER_H_
#define KVD_MODEL_SAMPLER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu_sampling.h"
#include "kernels/params.h"
#include "model/rng.h"

namespace kvd {

// Per-request sampling options. Plain aggregate; Validate() once before use.
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // 0 = off; else keep the k most probable tokens
  float top_p = 1.0f;        // 1 = off; keep the smallest most-probable set with mass >= top_p
  float min_p = 0.0f;        // 0 = off; drop tokens with p < min_p * p_max
  uint64_t seed = 0;         // seeds the Rng; same seed + same logits = same tokens

  // InvalidArgument naming the field, its value and the allowed range:
  // temperature finite and >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1.
  absl::Status Validate() const;
};

// Picks one token from a logits row. One per request; owns its Rng; not thread safe.
//
// The exact procedure is kernels/cpu_sampling.h's (SampleRow): each call draws
// u = Rng::NextFloat() (greedy included: the stream position depends only on the number of
// calls) and selects with this request's options and that u. NextRow() is the same step
// without the selection, for an engine that samples on a backend:
//   Sample(logits) == SampleRow(NextRow(), logits)   for a sampler in the same state.
class Sampler {
 public:
  // REQUIRES: params.Validate().ok() (aborts otherwise).
  explicit Sampler(const SamplingParams& params);

  // REQUIRES: !logits.empty(). Returns an id in [0, logits.size()).
  int32_t Sample(absl::Span<const float> logits);

  // Draws this step's u and returns the options for Backend::Sample. Advances the stream
  // exactly as Sample does.
  SamplingRow NextRow();

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  Rng rng_;
  SampleScratch scratch_;  // reused across calls
};

}  // namespace kvd

#endif  // KVD_MODEL_SAMPLER_H_
