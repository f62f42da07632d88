#ifndef KVD_TESTS_KERNELS_RANDOM_SAMPLING_ROW_H_
#define KVD_TESTS_KERNELS_RANDOM_SAMPLING_ROW_H_

// A random SamplingRow for the sampling tests (CPU reference and CUDA kernel): temperature,
// top-k, top-p and min-p each drawn from a few values that include the disabled setting and
// the edge cases, and a uniform u in [0, 1).

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <random>

#include "kernels/params.h"

namespace kvd {

// `allow_greedy` false leaves out temperature 0.
inline SamplingRow RandomSamplingRow(std::mt19937& rng, bool allow_greedy = true) {
  const float temperatures[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.5f};
  const int32_t top_ks[] = {0, 1, 5, 50, 1000};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
  const float min_ps[] = {0.0f, 0.05f};
  auto pick = [&](const auto& options, size_t first = 0) {
    return options[std::uniform_int_distribution<size_t>(first, std::size(options) - 1)(rng)];
  };
  SamplingRow row;
  row.temperature = pick(temperatures, allow_greedy ? 0 : 1);
  row.top_k = pick(top_ks);
  row.top_p = pick(top_ps);
  row.min_p = pick(min_ps);
  row.u = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
  if (row.u >= 1.0f) row.u = 0.0f;
  return row;
}

}  // namespace kvd

#endif  // KVD_TESTS_KERNELS_RANDOM_SAMPLING_ROW_H_
