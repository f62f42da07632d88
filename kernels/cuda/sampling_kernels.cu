#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/cuda/sampling_kernels.h"

namespace kvd::cuda {
namespace {

constexpr int kThreads = 512;
// CTAs per row (a thread block cluster) share the statistics and histogram passes, which
// read and weigh the whole row; CTA 0 then finishes the row alone. More CTAs per row when
// there are few rows, so that small batches still spread over the SMs.
constexpr int kMaxClusterSize = 8;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr uint64_t kNoBound = ~uint64_t{0};
// float4 loads each thread issues before using any: a pass is a stream of independent
// loads (from HBM in the statistics pass, from L2 after), and few bytes in flight per SM
// would leave it latency bound.
constexpr int kVecUnroll = 8;
// Value buckets over a row: 0 holds +inf, kBuckets - 1 holds -inf, finite logits spread by
// their distance below the largest finite one over [1, kBuckets - 2].
constexpr int kBuckets = 1024;
constexpr int kBucketsPerLane = kBuckets / 32;
// A bucket with at most this many candidates is gathered into shared memory and sorted;
// a larger one (thousands of equal logits) is resolved by the radix fallback.
constexpr int kCapacity = 2048;
constexpr int kItemsPerThread = kCapacity / kThreads;  // in the walk over a gathered bucket
// Radix fallback: 8-bit digits of the 64-bit order key.
constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerLane = kBins / 32;
constexpr int kRadixUnroll = 4;
// Bits per part when a 64-bit fixed-point mass is summed across a warp in 32-bit pieces.
constexpr int kPartBits = 21;
constexpr uint32_t kPartMask = (1u << kPartBits) - 1;

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

// Sum of v over the lanes in `peers` (which all call this with the same mask).
__device__ __forceinline__ uint64_t GroupSum(unsigned peers, uint64_t v) {
  const uint64_t low = __reduce_add_sync(peers, static_cast<uint32_t>(v) & kPartMask);
  const uint64_t mid = __reduce_add_sync(peers, static_cast<uint32_t>(v >> kPartBits) & kPartMask);
  const uint64_t high = __reduce_add_sync(peers, static_cast<uint32_t>(v >> (2 * kPartBits)));
  return low + (mid << kPartBits) + (high << (2 * kPartBits));
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

// Radix fallback (a bucket too large to gather): the key of the candidate in `bucket`
// (key <= bound) where the running amount, starting from 0, reaches `target`; the last one
// with a positive amount when none does. 8 bits of the key per pass over the row.
__device__ uint64_t RadixSelect(const float* __restrict__ logits, int32_t n, const RowConstants& c,
                                int bucket, uint64_t bound, Measure m, double target,
                                bool inclusive, SharedState& s) {
  const int lane = threadIdx.x & 31;
  RadixState& r = s.radix;
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.before = 0;
    s.target = target;
    s.done = 0;
  }
  for (int shift = 64 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    if (threadIdx.x < kBins) {
      r.count[threadIdx.x] = 0;
      r.mass[threadIdx.x] = 0;
    }
    __syncthreads();
    const uint64_t prefix = s.prefix;
    const uint64_t fixed_mask = shift + kDigitBits >= 64 ? 0 : ~uint64_t{0} << (shift + kDigitBits);
    for (int32_t base = 0; base < n; base += kThreads * kRadixUnroll) {
      float xs[kRadixUnroll];  // NaN past the end: never a candidate
#pragma unroll
      for (int j = 0; j < kRadixUnroll; ++j) {
        const int32_t i = base + j * kThreads + threadIdx.x;
        xs[j] = i < n ? __ldg(logits + i) : NAN;
      }
#pragma unroll
      for (int j = 0; j < kRadixUnroll; ++j) {
        const int32_t i = base + j * kThreads + threadIdx.x;
        const float x = xs[j];
        bool active = false;
        uint64_t key = 0;
        uint64_t amount = 0;
        if (!isnan(x)) {
          key = OrderKey(x, i);
          active = key <= bound && (key & fixed_mask) == prefix && Bucket(x, c) == bucket;
          if (active) {
            amount = Amount(x, m, c);
            active = amount != 0;
          }
        }
        const unsigned active_lanes = __ballot_sync(kFullMask, active);
        if (active) {
          const uint32_t bin = static_cast<uint32_t>(key >> shift) & (kBins - 1);
          const unsigned peers = __match_any_sync(active_lanes, bin);
          const uint64_t group = GroupSum(peers, amount);
          if (lane == __ffs(peers) - 1) {
            atomicAdd(&r.count[bin], static_cast<uint32_t>(__popc(peers)));
            atomicAdd(&r.mass[bin], static_cast<unsigned long long>(group));
            r.last_key[bin] = key;
          }
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const uint64_t before = s.before;
      const double t = s.target;
      uint64_t lane_sum = 0;
      for (int j = 0; j < kBinsPerLane; ++j) lane_sum += r.mass[lane * kBinsPerLane + j];
      uint64_t inclusive_sum = lane_sum;
      for (int offset = 1; offset < 32; offset *= 2) {
        const uint64_t other = __shfl_up_sync(kFullMask, inclusive_sum, offset);
        if (lane >= offset) inclusive_sum += other;
      }
      auto reached = [&](uint64_t cumulative) {
        const double v = static_cast<double>(cumulative);
        return inclusive ? v >= t : v > t;
      };
      const unsigned hit =
          __ballot_sync(kFullMask, lane_sum != 0 && reached(before + inclusive_sum));
      const unsigned nonempty = __ballot_sync(kFullMask, lane_sum != 0);
      if (nonempty == 0) {
        if (lane == 0) {
          s.done = 1;
          s.result = s.prefix;
        }
      } else {
        const int owner = hit != 0 ? __ffs(hit) - 1 : 31 - __clz(nonempty);
        if (lane == owner) {
          uint64_t cumulative = before + inclusive_sum - lane_sum;
          int chosen = -1;
          uint64_t chosen_before = 0;
          for (int j = 0; j < kBinsPerLane; ++j) {
            const uint64_t v = r.mass[lane * kBinsPerLane + j];
            if (v == 0) continue;
            chosen = lane * kBinsPerLane + j;
            chosen_before = cumulative;
            cumulative += v;
            if (hit != 0 && reached(cumulative)) break;
          }
          s.before = chosen_before;
          if (hit == 0) s.target = static_cast<double>(INFINITY);
          s.prefix |= static_cast<unsigned long long>(chosen) << shift;
          if (r.count[chosen] == 1) {
            s.done = 1;
            s.result = r.last_key[chosen];
          } else if (shift == 0) {
            s.done = 1;
            s.result = s.prefix;
          }
        }
      }
    }
    __syncthreads();
    if (s.done) break;
  }
  const uint64_t result = s.result;
  __syncthreads();
  return result;
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
      const float x = KeyLogit(s.keys[i0 + q]);
      sums[kCount] += 1;
      sums[kMass] += Amount(x, kMass, c);
      if (c.min_weight > 0.0f) sums[kMassMinP] += Amount(x, kMassMinP, c);
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
    sums[kCount] += 1;
    sums[kMass] += Amount(x, kMass, c);
    if (c.min_weight > 0.0f) sums[kMassMinP] += Amount(x, kMassMinP, c);
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

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p, int fixed_shift) {
  __shared__ SharedState s;
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int num_ranks = static_cast<int>(cluster.num_blocks());
  const int32_t r = static_cast<int32_t>(blockIdx.x) / num_ranks;
  const float* __restrict__ logits = p.logits + static_cast<int64_t>(r) * p.row_stride;
  const int32_t n = p.vocab_size;
  // This CTA's share of the row for the statistics and histogram passes.
  const int32_t begin = static_cast<int32_t>(int64_t{n} * rank / num_ranks);
  const int32_t end = static_cast<int32_t>(int64_t{n} * (rank + 1) / num_ranks);
  const SamplingRow row = p.rows[r];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;

  // Statistics: the lowest-id argmax (also the maximum logit), the non-NaN count and the
  // finite range. A thread sees its ids in increasing order, so a strict > keeps the
  // lowest id on ties.
  RowStats stats{-INFINITY, -1, 0, -INFINITY, INFINITY};  // best_id -1: none yet
  ForEachLogit(logits + begin, end - begin, [&](float x, int32_t i) {
    const bool number = !isnan(x);
    stats.num_numbers += number;
    if (x > stats.best || (stats.best_id < 0 && number)) {
      stats.best = x;
      stats.best_id = begin + i;
    }
    const float finite = fabsf(x) < INFINITY ? x : NAN;  // fmaxf and fminf skip NaN
    stats.max_finite = fmaxf(stats.max_finite, finite);
    stats.min_finite = fminf(stats.min_finite, finite);
  });
  if (stats.best_id < 0) {  // only NaN: loses every comparison below
    stats.best = NAN;
    stats.best_id = 0;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    RowStats other;
    other.best = __shfl_down_sync(kFullMask, stats.best, offset);
    other.best_id = __shfl_down_sync(kFullMask, stats.best_id, offset);
    other.num_numbers = __shfl_down_sync(kFullMask, stats.num_numbers, offset);
    other.max_finite = __shfl_down_sync(kFullMask, stats.max_finite, offset);
    other.min_finite = __shfl_down_sync(kFullMask, stats.min_finite, offset);
    stats.Merge(other);
  }
  if (lane == 0) s.warp_stats[warp] = stats;
  __syncthreads();
  if (threadIdx.x == 0) {
    stats = s.warp_stats[0];
    for (int w = 1; w < kWarps; ++w) stats.Merge(s.warp_stats[w]);
    s.cta_stats = stats;
  }
  cluster.sync();  // every CTA's cta_stats is visible to the cluster
  stats = *cluster.map_shared_rank(&s.cta_stats, 0);
  for (int k = 1; k < num_ranks; ++k) stats.Merge(*cluster.map_shared_rank(&s.cta_stats, k));
  const float best = stats.best;
  const int32_t num_numbers = stats.num_numbers;
  const float max_finite = stats.max_finite;
  const float min_finite = stats.min_finite;
  // Greedy, or nothing to prefer (all NaN: best_id stayed 0). Uniform over the cluster.
  if (!(row.temperature > 0.0f) || num_numbers == 0) {
    if (rank == 0 && threadIdx.x == 0) p.out_tokens[r] = stats.best_id;
    cluster.sync();  // the others' cta_stats stay readable until all have read them
    return;
  }

  RowConstants c;
  c.max_logit = best;
  c.inv_temperature = 1.0f / row.temperature;
  c.min_weight = row.min_p > 0.0f ? row.min_p : 0.0f;
  c.max_finite = max_finite;
  c.min_finite = min_finite;
  // In double: the distance between two finite floats can overflow a float.
  const double range = static_cast<double>(max_finite) - static_cast<double>(min_finite);
  c.bucket_scale = range > 0.0 ? static_cast<float>(fmin((kBuckets - 3) / range, 3e38)) : 0.0f;
  c.fixed_scale = ldexpf(1.0f, fixed_shift);

  const bool with_min_p = c.min_weight > 0.0f;
  const Measure draw = with_min_p ? kMassMinP : kMass;
  const bool top_k = row.top_k > 0 && row.top_k < num_numbers;
  // A small top_k set is gathered whole: the histogram then needs only counts, and top_p
  // and the draw are walks over the sorted set in shared memory, with no further passes.
  const bool small_top_k = top_k && row.top_k <= kCapacity;
  // The cluster histograms its shares; CTA 0 adds the others' into its own and goes on
  // alone (the others wait until it has read them).
  Histogram(logits + begin, end - begin, c, /*counts=*/true, /*masses=*/!small_top_k, s);
  cluster.sync();
  if (rank != 0) {
    cluster.sync();
    return;
  }
  for (int b = threadIdx.x; b < kBuckets; b += kThreads) {
    uint32_t count = s.count[b];
    uint64_t mass = HistValue(s, kMass, b);
    uint64_t mass_min_p = HistValue(s, kMassMinP, b);
    for (int k = 1; k < num_ranks; ++k) {
      const SharedState& other = *cluster.map_shared_rank(&s, k);
      count += other.count[b];
      mass += HistValue(other, kMass, b);
      mass_min_p += HistValue(other, kMassMinP, b);
    }
    s.count[b] = count;
    s.mass[0][b] = static_cast<uint32_t>(mass);
    s.mass[1][b] = static_cast<uint32_t>(mass >> 32);
    s.mass_min_p[0][b] = static_cast<uint32_t>(mass_min_p);
    s.mass_min_p[1][b] = static_cast<uint32_t>(mass_min_p >> 32);
  }
  cluster.sync();
  if (small_top_k) {
    if (threadIdx.x < 32) {
      ChooseBucket(s, Cut{}, kCount, row.top_k, /*fraction=*/false, /*inclusive=*/true);
    }
    __syncthreads();
    const int last_bucket = s.chosen_bucket;  // >= 0: top_k < num_numbers candidates
    const uint64_t num_candidates = s.before + s.count[last_bucket];
    __syncthreads();
    if (num_candidates <= kCapacity) {
      if (threadIdx.x == 0) s.num_gathered = 0;
      __syncthreads();
      ForEachLogit(logits, n, [&](float x, int32_t i) {
        if (!isnan(x) && Bucket(x, c) <= last_bucket) {
          s.keys[atomicAdd(&s.num_gathered, 1)] = OrderKey(x, i);
        }
      });
      __syncthreads();
      SortGathered(s, static_cast<int>(num_candidates));
      int num = row.top_k;
      if (row.top_p < 1.0f) {
        num = 1 + Walk(s, num, kMass, c, 0, row.top_p, /*fraction=*/true, /*inclusive=*/true);
      }
      const int index = Walk(s, num, draw, c, 0, row.u, /*fraction=*/true, /*inclusive=*/false);
      if (threadIdx.x == 0) p.out_tokens[r] = static_cast<int32_t>(s.keys[index] & 0xFFFFFFFFu);
      return;
    }
    Histogram(logits, n, c, /*counts=*/false, /*masses=*/true, s);  // a huge tied bucket
  }

  Cut cut;  // the whole row
  if (top_k) {
    cut = Select(logits, n, c, cut, kCount, static_cast<double>(row.top_k), /*fraction=*/false,
                 /*inclusive=*/true, s);
  }
  if (row.top_p < 1.0f) {
    cut = Select(logits, n, c, cut, kMass, row.top_p, /*fraction=*/true, /*inclusive=*/true, s);
  }
  cut = Select(logits, n, c, cut, draw, row.u, /*fraction=*/true, /*inclusive=*/false, s);
  if (threadIdx.x == 0) p.out_tokens[r] = static_cast<int32_t>(cut.key & 0xFFFFFFFFu);
}

}  // namespace

cudaError_t LaunchSample(const SampleParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) return cudaSuccess;
  // Fixed-point masses in units of 2^-S: vocab_size weights <= 1 sum below 2^62.
  int vocab_bits = 0;
  while (vocab_bits < 31 && (int64_t{1} << vocab_bits) <= p.vocab_size) ++vocab_bits;
  // Enough CTAs for the SMs (about 132 on an H200, one CTA each) at small batches.
  int cluster_size = 1;
  // Clusters of 8 need 8 free SMs of one GPC, so they are used only while few are needed.
  while (cluster_size < kMaxClusterSize) {
    const int next = cluster_size * 2;
    if (int64_t{p.num_rows} * next > (next == kMaxClusterSize ? 64 : 128)) break;
    cluster_size = next;
  }
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(cluster_size);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.num_rows * cluster_size));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, SampleKernel, p, 62 - vocab_bits);
}

}  // namespace kvd::cuda
