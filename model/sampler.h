#ifndef KVD_MODEL_SAMPLER_H_
#define KVD_MODEL_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
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
// The exact procedure (so another backend can reproduce it):
//   1. u = Rng::NextFloat(), drawn on every call, greedy included: the stream position
//      depends only on the number of calls.
//   2. temperature == 0: the argmax, lowest id on ties.
//   3. Otherwise the candidates are all tokens in the order "logit descending, then id
//      ascending" (i.e. descending probability, ties by lower id); NaN logits are never
//      candidates. Filters apply in this order, each on what the previous one kept:
//        top_k: keep the first k;
//        weights w = exp((logit - max_logit) / temperature), so the most probable is 1;
//        top_p: keep the shortest prefix whose weight sum >= top_p * (sum of weights);
//        min_p: drop tokens with w < min_p (p < min_p * p_max).
//      Tokens whose weight underflows to 0 are dropped (they have probability 0).
//   4. The result is the first kept token in that order whose cumulative weight exceeds
//      u * (sum of kept weights), i.e. u < cdf(token) of the renormalised distribution
//      (the last kept token if rounding leaves none). Sums are in double.
// Cost is a few linear passes per call: bucketing by logit, not sorting, finds the top-k
// set, the top-p cut and the sampled token (only the one bucket holding the cut is sorted).
class Sampler {
 public:
  // REQUIRES: params.Validate().ok() (aborts otherwise).
  explicit Sampler(const SamplingParams& params);

  // REQUIRES: !logits.empty(). Returns an id in [0, logits.size()).
  int32_t Sample(absl::Span<const float> logits);

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
    float weight;  // exp((logit - max_logit) / temperature), in (0, 1]
  };

  SamplingParams params_;
  Rng rng_;
  std::vector<Candidate> candidates_;  // scratch, reused across calls
  std::vector<Candidate> scratch_;     // selection's working memory
};

}  // namespace kvd

#endif  // KVD_MODEL_SAMPLER_H_
