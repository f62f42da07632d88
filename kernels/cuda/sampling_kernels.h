#ifndef KVD_KERNELS_CUDA_SAMPLING_KERNELS_H_
#define KVD_KERNELS_CUDA_SAMPLING_KERNELS_H_

// The device side of Backend::Sample: the procedure of kernels/cpu_sampling.h, a thread
// block cluster per row (8 CTAs at batch <= 8, 4 at <= 32, 2 at <= 64, then 1), without
// sorting the row.
//
// Each row makes a statistics pass (max logit, lowest-id argmax, non-NaN count, finite
// range); greedy rows stop there. Sampled rows then build one value-bucket histogram:
//
//   bucket(logit) = 0 for +inf, 1023 for -inf, else 1 + floor((max_finite - logit) * scale)
//                   over [1, 1022]; monotone, so the reference order (logit descending,
//                   then id ascending) visits buckets in increasing order,
//
// holding per bucket the candidate count, the weight mass and the mass of weights >= min_p.
// Every filter keeps a prefix of the order, so each selection (top_k by count, top_p by
// mass, the draw by mass among weights >= min_p) finds the bucket where its running total
// reaches the target with one warp scan of the histogram, gathers that bucket's
// candidates (at most 2048) into shared memory in one pass, sorts them by key
//
//   key(token) = (~monotone_bits(logit) << 32) | id,   NaN excluded, -0 read as +0,
//
// and walks them. The cluster's CTAs split the statistics and histogram passes (the ones
// that weigh every logit) and merge through distributed shared memory; CTA 0 then does the
// selections alone. A top_k of at most 2048 gathers its whole set once instead, and top_p
// and the draw are walks over it (no mass histogram, no further passes). A bucket too large
// to gather (thousands of equal logits) falls back to a radix selection over the key,
// restricted to that bucket, 8 bits per pass. Passes after the first read the row from L2.
//
// Numerics: a weight is CUDA's expf of the same fp32 argument as the CPU's, within 2 ulp of
// glibc's expf; where a decision depends on the exact value (w near 0, where it may
// underflow, and w within 2^-18 relative of min_p) it is recomputed as the exponential in
// double rounded once to fp32, which is glibc's result except in rare double-rounding
// ties. So the kept sets are the CPU's, and masses differ from the CPU's only by those
// 2-ulp weight differences and summation order. Masses are summed as 64-bit fixed point
// (2^-S units, S = 62 - bit width of vocab_size), exact and order independent, so results
// are deterministic; the device may pick a neighbour of the reference token only when
// u * total (or top_p * total) lies within about 1e-7 relative of a cumulative boundary.
//
// Shared memory only (about 37 KB static), no global scratch, no host synchronization,
// one launch (cudaLaunchKernelEx with a cluster dimension) whose shape depends only on
// num_rows, so it can be captured in a graph. Requires sm_90.

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
