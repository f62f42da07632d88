#ifndef KVD_KERNELS_CPU_SAMPLING_H_
#define KVD_KERNELS_CPU_SAMPLING_H_

// Token selection from a logits row: the exact reference procedure every backend's
// Sample op reproduces, and the CPU backend's implementation of it.
//
// The procedure, for one row (SamplingRow in kernels/params.h) and its logits:
//   1. temperature == 0: the argmax, lowest id on ties, NaN ignored (0 if all are NaN).
//      u is not used (it was still drawn, so the stream advances the same way).
//   2. Otherwise the candidates are all tokens in the order "logit descending, then id
//      ascending" (i.e. descending probability, ties by lower id); NaN logits are never
//      candidates (all NaN gives token 0). +0 and -0 are equal logits. Filters apply in
//      this order, each on what the previous one kept:
//        top_k: keep the first k;
//        weights w = (logit == max_logit) ? 1 : expf((logit - max_logit) * (1.0f / T)),
//          in fp32, so the most probable has weight exactly 1 (also when it is +inf);
//          tokens whose weight underflows to 0 are dropped (they have probability 0);
//        top_p: keep the shortest prefix whose weight sum >= top_p * (sum of weights);
//        min_p: drop tokens with w < min_p (p < min_p * p_max).
//   3. The result is the first kept token in that order whose cumulative weight exceeds
//      u * (sum of kept weights), i.e. u < cdf(token) of the renormalised distribution
//      (the last kept token if rounding leaves none). Sums are in double.
// Every filter keeps a prefix of the order (weights never increase along it), so a
// device implementation can find each cut by selection instead of sorting.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvd {

// One candidate token while a row is being sampled.
struct SampleCandidate {
  float logit;
  int32_t id;
  float weight;  // exp((logit - max_logit) / temperature), in (0, 1] once computed
};

// Working memory for SampleRow, reused across calls so that sampling does not allocate
// in steady state. Contents between calls are meaningless. One per thread.
struct SampleScratch {
  std::vector<SampleCandidate> candidates;
  std::vector<SampleCandidate> buffer;
  std::vector<double> bucket_mass;
  std::vector<size_t> bucket_count;
};

// InvalidArgument naming the field (prefixed by `field_prefix`, e.g. "sampling." or
// "Sample: rows[3]."), its value and the allowed range: temperature finite and >= 0,
// top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, 0 <= u < 1.
absl::Status ValidateSamplingRow(const SamplingRow& row, absl::string_view field_prefix);

// The token the procedure above selects. Cost: a few linear passes over the row (bucketing
// by logit finds the top-k set, the top-p cut and the drawn token; only the one bucket
// holding a cut is sorted). Thread safe for distinct scratches.
// REQUIRES: ValidateSamplingRow(row).ok(), !logits.empty(), scratch != nullptr.
// Returns an id in [0, logits.size()).
int32_t SampleRow(const SamplingRow& row, absl::Span<const float> logits, SampleScratch* scratch);

// The CPU backend's Sample: SampleRow for every row, rows in parallel on `pool`.
// InvalidArgument (naming the op and field, before anything is written) for a negative
// num_rows, vocab_size <= 0, row_stride < vocab_size, a null pointer or an invalid row.
absl::Status CpuSample(const SampleParams& p, ThreadPool& pool);

}  // namespace kvd

#endif  // KVD_KERNELS_CPU_SAMPLING_H_
