#ifndef KVD_KERNELS_CUDA_SAMPLING_RADIX_CUH_
#define KVD_KERNELS_CUDA_SAMPLING_RADIX_CUH_

// The radix-select fallback of SampleKernel (sampling_kernels.cu), for a value bucket with
// more candidates than shared memory can gather. Only for sampling_select.cuh.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/sampling_row.cuh"

namespace kvd::cuda::sampling {

// Bits per part when a 64-bit fixed-point mass is summed across a warp in 32-bit pieces.
inline constexpr int kPartBits = 21;
inline constexpr uint32_t kPartMask = (1u << kPartBits) - 1;

// Sum of v over the lanes in `peers` (which all call this with the same mask).
__device__ __forceinline__ uint64_t GroupSum(unsigned peers, uint64_t v) {
  const uint64_t low = __reduce_add_sync(peers, static_cast<uint32_t>(v) & kPartMask);
  const uint64_t mid = __reduce_add_sync(peers, static_cast<uint32_t>(v >> kPartBits) & kPartMask);
  const uint64_t high = __reduce_add_sync(peers, static_cast<uint32_t>(v >> (2 * kPartBits)));
  return low + (mid << kPartBits) + (high << (2 * kPartBits));
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

}  // namespace kvd::cuda::sampling

#endif  // KVD_KERNELS_CUDA_SAMPLING_RADIX_CUH_
