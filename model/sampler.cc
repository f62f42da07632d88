#include "model/sampler.h"

#include <cstdio>
#include <cstdlib>

namespace kvd {

absl::Status SamplingParams::Validate() const {
  // The per-step checks are the backend's; u = 0 always passes.
  return ValidateSamplingRow(
      SamplingRow{.temperature = temperature, .top_k = top_k, .top_p = top_p, .min_p = min_p},
      "sampling.");
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  if (absl::Status status = params.Validate(); !status.ok()) {
    std::fprintf(stderr, "Sampler: invalid SamplingParams: %s\n", status.ToString().c_str());
    std::abort();
  }
}

SamplingRow Sampler::NextRow() {
  return SamplingRow{.temperature = params_.temperature,
                     .top_k = params_.top_k,
                     .top_p = params_.top_p,
                     .min_p = params_.min_p,
                     .u = rng_.NextFloat()};
}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  if (logits.empty()) {
    std::fprintf(stderr, "Sampler::Sample: empty logits\n");
    std::abort();
  }
  return SampleRow(NextRow(), logits, &scratch_);
}

}  // namespace kvd
