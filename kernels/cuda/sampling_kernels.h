#ifndef KVD_KERNELS_CUDA_SAMPLING_KERNELS_H_
#define KVD_KERNELS_CUDA_SAMPLING_KERNELS_H_

// The device side of Backend::Sample: the procedure of kernels/cpu_sampling.h, one CTA per
// row, without sorting.
//
// Each row runs a statistics pass (max logit, lowest-id argmax, number of non-NaN logits)
// and then up to three radix selections over the 64-bit key
//
//   key(token) = (~monotone_bits(logit) << 32) | id,   NaN excluded, -0 read as +0,
//
// whose ascending order is exactly the reference order (logit descending, then id
// ascending). A selection fixes the key 8 bits at a time, high digit first: one pass over
// the row builds a 256-bin histogram (count and weight mass) of the candidates that share
// the digits fixed so far, and one warp scans it for the bin where the running total
// reaches the target; it stops as soon as that bin holds a single candidate. The three
// selections are top_k (by count, inclusive), top_p (by mass, inclusive, target top_p *
// total) and the draw (by mass, exclusive, target u * total); each later one only counts
// keys up to the earlier cut, and the draw also drops weights below min_p, all of which
// keep prefixes of the order. A top_k set of at most 2048 tokens is gathered into shared
// memory after its cut, so the later selections run over k candidates instead of the row.
// Greedy rows are the statistics pass alone.
//
// Numerics: weights are rounded as the CPU's expf is (the exponential is evaluated in
// double and rounded to fp32), and masses are summed as 64-bit fixed point (2^-S units,
// S = 62 - bit width of vocab_size), which is exact and order independent, so results are
// deterministic and differ from the CPU's double sums in sorted order only by rounding:
// the device may pick a neighbour of the reference token when u * total (or top_p * total)
// lies within about 1e-12 relative of a cumulative boundary.
//
// Histograms live in shared memory; lanes of a warp that hit the same bin are merged with
// __match_any_sync and __reduce_add_sync before one shared atomic, because nearly all
// logits share the top digits. No global scratch, no host synchronization; the launch
// shape depends only on num_rows, so the launch can be captured in a graph.

#include <cuda_runtime_api.h>

#include "kernels/params.h"

namespace kvd::cuda {

// REQUIRES: the caller validated the shapes (num_rows >= 0, vocab_size > 0, row_stride >=
// vocab_size, device pointers). Rows are read on the device and cannot be validated
// there: a row outside ValidateSamplingRow's ranges yields some token in [0, vocab_size)
// (a temperature that is not > 0 is greedy). num_rows == 0 launches nothing.
cudaError_t LaunchSample(const SampleParams& p, cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_SAMPLING_KERNELS_H_
