#ifndef KVD_KERNELS_CUDA_SAMPLING_ROW_CUH_
#define KVD_KERNELS_CUDA_SAMPLING_ROW_CUH_

// How SampleKernel (sampling_kernels.cu) sees a row: the launch shape, the order key, the
// value buckets, the weights and their fixed-point masses, the vectorized pass over the
// row, and the CTA's shared-memory state. See sampling_kernels.h for the algorithm. Only
// for sampling_kernels.cu and the sampling_*.cuh it includes.

#include <cuda_runtime.h>

#include <cstdint>

namespace kvd::cuda::sampling {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;
inline constexpr uint64_t kNoBound = ~uint64_t{0};
// float4 loads each thread issues before using any: a pass is a stream of independent
// loads (from HBM in the statistics pass, from L2 after), and few bytes in flight per SM
// would leave it latency bound.
inline constexpr int kVecUnroll = 8;
// Value buckets over a row: 0 holds +inf, kBuckets - 1 holds -inf, finite logits spread by
// their distance below the largest finite one over [1, kBuckets - 2].
inline constexpr int kBuckets = 1024;
inline constexpr int kBucketsPerLane = kBuckets / 32;
// A bucket with at most this many candidates is gathered into shared memory and sorted;
// a larger one (thousands of equal logits) is resolved by the radix fallback.
inline constexpr int kCapacity = 2048;
inline constexpr int kItemsPerThread = kCapacity / kThreads;  // in the walk over a gathered bucket
// Radix fallback: 8-bit digits of the 64-bit order key.
inline constexpr int kDigitBits = 8;
inline constexpr int kBins = 1 << kDigitBits;
inline constexpr int kBinsPerLane = kBins / 32;
inline constexpr int kRadixUnroll = 4;

// What a selection counts per candidate: 1 (top_k), the weight of candidates with w > 0
// (top_p), or the weight of candidates with w > 0 and w >= min_p (the draw).
enum Measure : int { kCount = 0, kMass = 1, kMassMinP = 2 };

// Ascending key order is the reference order: logit descending, then id ascending. -0 is
// read as +0, which the reference treats as equal.
__device__ __forceinline__ uint64_t OrderKey(float logit, int32_t id) {
  const uint32_t bits = __float_as_uint(logit == 0.0f ? 0.0f : logit);
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}

__device__ __forceinline__ float KeyLogit(uint64_t key) {
  const uint32_t ascending = ~static_cast<uint32_t>(key >> 32);
  return __uint_as_float((ascending & 0x80000000u) != 0 ? (ascending & 0x7FFFFFFFu) : ~ascending);
}

// (value, id) that wins the argmax: larger value, then lower id; NaN loses to any number.
__device__ __forceinline__ bool Better(float v, int32_t i, float best, int32_t best_i) {
  if (isnan(v)) return false;
  if (isnan(best)) return true;
  return v > best || (v == best && i < best_i);
}

// The statistics pass's result over part of a row.
struct RowStats {
  float best;           // the lowest-id argmax's logit; NaN when there is none
  int32_t best_id;      // 0 when there is none
  int32_t num_numbers;  // non-NaN logits
  float max_finite;
  float min_finite;

  __device__ void Merge(const RowStats& o) {
    num_numbers += o.num_numbers;
    max_finite = fmaxf(max_finite, o.max_finite);
    min_finite = fminf(min_finite, o.min_finite);
    if (Better(o.best, o.best_id, best, best_id)) {
      best = o.best;
      best_id = o.best_id;
    }
  }
};

// Per-row constants of the weights and buckets, uniform over the CTA.
struct RowConstants {
  float max_logit;        // the weight-1 logit (may be +inf)
  float inv_temperature;  // 1 / T, as the CPU computes it
  float min_weight;       // min_p (0 = off)
  float max_finite;       // bucket origin
  float min_finite;
  float bucket_scale;  // (kBuckets - 3) / (max_finite - min_finite), finite, 0 when equal
  float fixed_scale;   // 2^S: a weight w is the fixed-point mass round(w * 2^S)
};

// Monotone: Before(a, b) in the reference order implies Bucket(a) <= Bucket(b), because
// each rounded step (difference, product, truncation, clamp) is monotone; an overflowing
// difference is +inf and lands in the last finite bucket. REQUIRES: !isnan(logit).
__device__ __forceinline__ int Bucket(float logit, const RowConstants& c) {
  if (logit > c.max_finite) return 0;
  if (logit < c.min_finite) return kBuckets - 1;
  const float scaled = __fmul_rn(__fsub_rn(c.max_finite, logit), c.bucket_scale);
  // floor of a value in [0, 2^23) without a conversion instruction: adding 2^23 rounding
  // toward zero leaves floor(value) in the mantissa.
  const float floored = __fadd_rz(fminf(scaled, static_cast<float>(kBuckets - 3)), 0x1p23f);
  return 1 + static_cast<int>(__float_as_uint(floored) & 0x7FFFFFu);
}

// The reference weight expf((logit - max) / T) to within CUDA expf's 2 ulp, and exactly
// (the exponential in double, rounded once to fp32, as glibc's expf rounds up to rare
// double-rounding ties) wherever a decision depends on it: near underflow (w > 0 keeps a
// candidate) and near min_p (w >= min_p keeps it). 2^-18 relative is far above 2 ulp, so
// the fast value is on the same side of min_p as the exact one whenever it is used.
__device__ __forceinline__ float Weight(float logit, const RowConstants& c) {
  if (logit == c.max_logit) return 1.0f;
  const float scaled = __fmul_rn(__fsub_rn(logit, c.max_logit), c.inv_temperature);
  const float fast = expf(scaled);
  if (fast < 0x1p-100f || fabsf(fast - c.min_weight) <= c.min_weight * 0x1p-18f) {
    return static_cast<float>(exp(static_cast<double>(scaled)));
  }
  return fast;
}

// round(w * 2^S) to nearest, ties to even: the product by a power of two is exact in fp32
// (2^-149 <= w <= 1, S <= 62), so one conversion rounds it once.
__device__ __forceinline__ uint64_t FixedPoint(float w, const RowConstants& c) {
  return __float2ull_rn(__fmul_rn(w, c.fixed_scale));
}

// The fixed-point amount a candidate adds to a selection's running total.
__device__ __forceinline__ uint64_t Amount(float logit, Measure m, const RowConstants& c) {
  if (m == kCount) return 1;
  const float w = Weight(logit, c);
  if (!(w > 0.0f) || (m == kMassMinP && w < c.min_weight)) return 0;
  return FixedPoint(w, c);
}

// Calls f(logit, id) for every element of row[0, n), each once; each thread sees its ids
// in increasing order. 16-byte loads, kVecUnroll of them in flight per thread.
template <typename F>
__device__ __forceinline__ void ForEachLogit(const float* __restrict__ row, int32_t n, F&& f) {
  const int32_t misaligned = static_cast<int32_t>((reinterpret_cast<uintptr_t>(row) / 4) & 3);
  const int32_t head = min(n, (4 - misaligned) & 3);
  const int t = threadIdx.x;
  if (t < head) f(__ldg(row + t), t);
  const float4* body = reinterpret_cast<const float4*>(row + head);
  const int32_t num_vectors = (n - head) / 4;
  for (int32_t base = 0; base < num_vectors; base += kThreads * kVecUnroll) {
    float4 v[kVecUnroll];
#pragma unroll
    for (int j = 0; j < kVecUnroll; ++j) {
      const int32_t k = base + j * kThreads + t;
      if (k < num_vectors) v[j] = __ldg(body + k);
    }
#pragma unroll
    for (int j = 0; j < kVecUnroll; ++j) {
      const int32_t k = base + j * kThreads + t;
      if (k < num_vectors) {
        const int32_t i = head + 4 * k;
        f(v[j].x, i);
        f(v[j].y, i + 1);
        f(v[j].z, i + 2);
        f(v[j].w, i + 3);
      }
    }
  }
  const int32_t tail = head + 4 * num_vectors + t;
  if (tail < n) f(__ldg(row + tail), tail);
}

struct RadixState {
  uint32_t count[kBins];
  unsigned long long mass[kBins];
  unsigned long long last_key[kBins];  // some key in the bin: the key when count == 1
};

struct SharedState {
  // The row's bucket histogram; mass_min_p is filled only when min_p > 0.
  // Masses are 64-bit fixed point held as two 32-bit words (low, high) so that the
  // histogram pass needs only native 32-bit shared atomics; a carry out of the low word is
  // detected from the atomic's old value and added to the high word.
  uint32_t count[kBuckets];
  uint32_t mass[2][kBuckets];
  uint32_t mass_min_p[2][kBuckets];
  union {
    unsigned long long keys[kCapacity];  // one gathered bucket, sorted by key
    RadixState radix;                    // or the fallback's digit histogram
  };
  // Written by one thread or warp 0, read by all after a barrier.
  int chosen_bucket;
  int num_gathered;
  int first_reached;  // index in keys
  int last_positive;  // index in keys
  int done;
  unsigned long long before;  // amount ordered before the chosen bucket / radix prefix
  unsigned long long prefix;  // radix: digits fixed so far
  unsigned long long result;
  double target;
  // Block reductions.
  unsigned long long warp_sums[3][kWarps];
  RowStats warp_stats[kWarps];
  RowStats cta_stats;  // this CTA's share of the row; read by the other CTAs of its cluster
};

}  // namespace kvd::cuda::sampling

#endif  // KVD_KERNELS_CUDA_SAMPLING_ROW_CUH_
