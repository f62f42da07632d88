#ifndef KVD_KERNELS_CUDA_SAMPLING_SELECT_CUH_
#define KVD_KERNELS_CUDA_SAMPLING_SELECT_CUH_

// The selections of SampleKernel (sampling_kernels.cu) over a row's value-bucket histogram:
// the histogram itself, the warp scan that picks a bucket, and the gather, bitonic sort and
// walk of that bucket's candidates (or the radix fallback of sampling_radix.cuh). Only for
// sampling_kernels.cu.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/sampling_radix.cuh"
#include "kernels/cuda/sampling_row.cuh"

namespace kvd::cuda::sampling {

// The part of the row a selection sees: buckets before `bucket` entirely, and within
// `bucket` the candidates with key <= key (kNoBound: all). amounts[m] is what that part of
// `bucket` contributes to measure m. Every filter keeps a prefix of the key order, so one
// such cut describes what all earlier filters kept. bucket == kBuckets: the whole row.
struct Cut {
  int bucket = kBuckets;
  uint64_t key = kNoBound;
  uint64_t amounts[3] = {0, 0, 0};
};

__device__ __forceinline__ uint64_t HistValue(const SharedState& s, Measure m, int b) {
  if (m == kCount) return s.count[b];
  const uint32_t(&words)[2][kBuckets] = m == kMass ? s.mass : s.mass_min_p;
  return (static_cast<uint64_t>(words[1][b]) << 32) + words[0][b];
}

// Adds a fixed-point amount to a (low, high) word pair in shared memory. Exact and order
// independent modulo 2^64 (the total stays below 2^62).
__device__ __forceinline__ void AddMass(uint32_t (&words)[2][kBuckets], int b, uint64_t amount) {
  const uint32_t low = static_cast<uint32_t>(amount);
  const uint32_t old = atomicAdd(&words[0][b], low);
  const uint32_t high = static_cast<uint32_t>(amount >> 32) + (old > 0xFFFFFFFFu - low ? 1u : 0u);
  if (high != 0) atomicAdd(&words[1][b], high);
}

// Sums three values over the CTA; every thread gets the result. Ends with a barrier.
__device__ void BlockSum3(uint64_t v[3], SharedState& s) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;
  for (int q = 0; q < 3; ++q) {
    for (int offset = 16; offset > 0; offset /= 2)
      v[q] += __shfl_down_sync(kFullMask, v[q], offset);
    if (lane == 0) s.warp_sums[q][warp] = v[q];
  }
  __syncthreads();
  for (int q = 0; q < 3; ++q) {
    v[q] = 0;
    for (int w = 0; w < kWarps; ++w) v[q] += s.warp_sums[q][w];
  }
  __syncthreads();
}

// Adds one candidate of logit x to the per-measure sums (mass_min_p only with min_p).
__device__ __forceinline__ void AddCandidate(float x, const RowConstants& c, uint64_t (&sums)[3]) {
  sums[kCount] += 1;
  sums[kMass] += Amount(x, kMass, c);
  if (c.min_weight > 0.0f) sums[kMassMinP] += Amount(x, kMassMinP, c);
}

__device__ __forceinline__ uint64_t SelectedValue(const SharedState& s, const Cut& cut, Measure m,
                                                  int b) {
  return b < cut.bucket ? HistValue(s, m, b) : (b == cut.bucket ? cut.amounts[m] : 0);
}

// Warp 0: the first bucket (up to cut.bucket) where the running amount of measure m
// reaches the target (>= when inclusive, else >), or the last bucket with a positive
// amount if rounding leaves none. The target is `value`, or value * (total amount) when
// `fraction`. Sets s.chosen_bucket (-1: nothing selectable), s.before (the amount of the
// buckets before it) and s.target (inf when none reached: the bucket's walk then takes its
// last candidate with a positive amount).
__device__ void ChooseBucket(SharedState& s, const Cut& cut, Measure m, double value, bool fraction,
                             bool inclusive) {
  const int lane = threadIdx.x & 31;
  const int first = lane * kBucketsPerLane;
  uint64_t lane_sum = 0;
  for (int b = first; b < first + kBucketsPerLane; ++b) lane_sum += SelectedValue(s, cut, m, b);
  uint64_t inclusive_sum = lane_sum;
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint64_t other = __shfl_up_sync(kFullMask, inclusive_sum, offset);
    if (lane >= offset) inclusive_sum += other;
  }
  const double total = static_cast<double>(__shfl_sync(kFullMask, inclusive_sum, 31));
  const double target = fraction ? value * total : value;
  auto reached = [&](uint64_t cumulative) {
    const double c = static_cast<double>(cumulative);
    return inclusive ? c >= target : c > target;
  };
  const unsigned hit = __ballot_sync(kFullMask, lane_sum != 0 && reached(inclusive_sum));
  const unsigned nonempty = __ballot_sync(kFullMask, lane_sum != 0);
  if (nonempty == 0) {  // unreachable for valid rows (the maximum always counts)
    if (lane == 0) {
      s.chosen_bucket = -1;
      s.before = 0;
      s.target = target;
    }
    return;
  }
  const int owner = hit != 0 ? __ffs(hit) - 1 : 31 - __clz(nonempty);
  if (lane != owner) return;
  uint64_t cumulative = inclusive_sum - lane_sum;
  int chosen = -1;
  uint64_t chosen_before = 0;
  for (int b = first; b < first + kBucketsPerLane; ++b) {
    const uint64_t v = SelectedValue(s, cut, m, b);
    if (v == 0) continue;
    chosen = b;
    chosen_before = cumulative;
    cumulative += v;
    if (hit != 0 && reached(cumulative)) break;
  }
  s.chosen_bucket = chosen;
  s.before = chosen_before;
  s.target = hit != 0 ? target : static_cast<double>(INFINITY);
}

// Sorts s.keys[0, n) ascending (bitonic, padded with kNoBound to a power of two).
// REQUIRES: 1 <= n <= kCapacity. Starts and ends with a barrier.
__device__ void SortGathered(SharedState& s, int n) {
  int size = 1;
  while (size < n) size *= 2;
  __syncthreads();
  for (int i = n + threadIdx.x; i < size; i += kThreads) s.keys[i] = kNoBound;
  __syncthreads();
  for (int k = 2; k <= size; k *= 2) {
    for (int j = k / 2; j > 0; j /= 2) {
      for (int t = threadIdx.x; t < size / 2; t += kThreads) {
        const int lo = 2 * t - (t & (j - 1));
        const int hi = lo + j;
        const uint64_t a = s.keys[lo];
        const uint64_t b = s.keys[hi];
        if ((a > b) == ((lo & k) == 0)) {
          s.keys[lo] = b;
          s.keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Walks the sorted candidates s.keys[0, num): the index of the first whose running amount
// of measure m, starting at `before`, reaches the target (>= when inclusive, else >), or
// the last with a positive amount when none does (rounding, or target = inf). The target is
// `value`, or value * (the amount of all num candidates) when `fraction` (before == 0).
// Each thread owns kItemsPerThread consecutive candidates. Starts and ends with a barrier.
__device__ int Walk(SharedState& s, int num, Measure m, const RowConstants& c, uint64_t before,
                    double value, bool fraction, bool inclusive) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;
  const int i0 = kItemsPerThread * threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    s.first_reached = kCapacity;
    s.last_positive = -1;
  }
  uint64_t amount[kItemsPerThread];
  uint64_t mine = 0;
#pragma unroll
  for (int q = 0; q < kItemsPerThread; ++q) {
    amount[q] = i0 + q < num ? Amount(KeyLogit(s.keys[i0 + q]), m, c) : 0;
    mine += amount[q];
  }
  uint64_t scan = mine;
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint64_t other = __shfl_up_sync(kFullMask, scan, offset);
    if (lane >= offset) scan += other;
  }
  if (lane == 31) s.warp_sums[0][warp] = scan;
  __syncthreads();
  uint64_t running = before + scan - mine;
  uint64_t total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) running += s.warp_sums[0][w];
    total += s.warp_sums[0][w];
  }
  const double target = fraction ? value * static_cast<double>(total) : value;
  int first_reached = kCapacity;
  int last_positive = -1;
#pragma unroll
  for (int q = 0; q < kItemsPerThread; ++q) {
    if (amount[q] == 0) continue;
    running += amount[q];
    const double v = static_cast<double>(running);
    const bool reached = inclusive ? v >= target : v > target;
    first_reached = reached && first_reached == kCapacity ? i0 + q : first_reached;
    last_positive = i0 + q;
  }
  first_reached = __reduce_min_sync(kFullMask, first_reached);
  last_positive = __reduce_max_sync(kFullMask, last_positive);
  if (lane == 0) {
    atomicMin(&s.first_reached, first_reached);
    atomicMax(&s.last_positive, last_positive);
  }
  __syncthreads();
  int index = s.first_reached < kCapacity ? s.first_reached : s.last_positive;
  if (index < 0) index = max(num - 1, 0);  // nothing positive: unreachable for a chosen bucket
  __syncthreads();
  return index;
}

// One selection over the part of the row `cut` describes: finds the candidate, in key
// order, where the running amount of measure m reaches target, and returns the cut that
// keeps everything up to it.
__device__ Cut Select(const float* __restrict__ logits, int32_t n, const RowConstants& c,
                      const Cut& cut, Measure m, double value, bool fraction, bool inclusive,
                      SharedState& s) {
  if (threadIdx.x < 32) ChooseBucket(s, cut, m, value, fraction, inclusive);
  __syncthreads();
  const int bucket = s.chosen_bucket;
  const uint64_t before = s.before;
  const double walk_target = s.target;
  __syncthreads();  // s.before and s.target are reused below
  Cut next;
  next.bucket = bucket;
  if (bucket < 0) {  // no candidates at all: token 0
    next.bucket = 0;
    next.key = 0;
    return next;
  }
  const uint64_t bound = bucket == cut.bucket ? cut.key : kNoBound;
  const uint32_t size =
      bucket == cut.bucket ? static_cast<uint32_t>(cut.amounts[kCount]) : s.count[bucket];
  if (size <= kCapacity) {
    if (threadIdx.x == 0) s.num_gathered = 0;
    __syncthreads();
    ForEachLogit(logits, n, [&](float x, int32_t i) {
      if (isnan(x)) return;
      const uint64_t key = OrderKey(x, i);
      if (key <= bound && Bucket(x, c) == bucket) s.keys[atomicAdd(&s.num_gathered, 1)] = key;
    });
    __syncthreads();
    const int num = s.num_gathered;
    SortGathered(s, num);
    const int index = Walk(s, num, m, c, before, walk_target, /*fraction=*/false, inclusive);
    next.key = s.keys[index];
    // What the kept part of the bucket contributes to each measure, for later selections.
    uint64_t sums[3] = {0, 0, 0};
    const int i0 = kItemsPerThread * threadIdx.x;
    for (int q = 0; q < kItemsPerThread; ++q) {
      if (i0 + q > index) continue;
      AddCandidate(KeyLogit(s.keys[i0 + q]), c, sums);
    }
    BlockSum3(sums, s);
    for (int q = 0; q < 3; ++q) next.amounts[q] = sums[q];
    return next;
  }
  // Fallback: a radix selection restricted to the bucket, then one pass for its sums.
  next.key = RadixSelect(logits, n, c, bucket, bound, m, walk_target - static_cast<double>(before),
                         inclusive, s);
  uint64_t sums[3] = {0, 0, 0};
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    const float x = __ldg(logits + i);
    if (isnan(x) || OrderKey(x, i) > next.key || Bucket(x, c) != bucket) continue;
    AddCandidate(x, c, sums);
  }
  BlockSum3(sums, s);
  for (int q = 0; q < 3; ++q) next.amounts[q] = sums[q];
  return next;
}

// The row's bucket histogram: per bucket the candidate count (`counts`) and the weight
// masses (`masses`; mass_min_p only with min_p). Starts and ends with a barrier.
__device__ void Histogram(const float* __restrict__ logits, int32_t n, const RowConstants& c,
                          bool counts, bool masses, SharedState& s) {
  // logits[0, n) is the part of the row this CTA histograms.
  __syncthreads();
  for (int b = threadIdx.x; b < kBuckets; b += kThreads) {
    if (counts) s.count[b] = 0;
    for (int q = 0; q < 2; ++q) {
      s.mass[q][b] = 0;
      s.mass_min_p[q][b] = 0;
    }
  }
  __syncthreads();
  const bool with_min_p = c.min_weight > 0.0f;
  ForEachLogit(logits, n, [&](float x, int32_t) {
    if (isnan(x)) return;
    const int b = Bucket(x, c);
    if (counts) atomicAdd(&s.count[b], 1u);
    if (!masses) return;
    const float w = Weight(x, c);
    if (w > 0.0f) {
      const uint64_t fixed = FixedPoint(w, c);
      AddMass(s.mass, b, fixed);
      if (with_min_p && w >= c.min_weight) AddMass(s.mass_min_p, b, fixed);
    }
  });
  __syncthreads();
}

}  // namespace kvd::cuda::sampling

#endif  // KVD_KERNELS_CUDA_SAMPLING_SELECT_CUH_
