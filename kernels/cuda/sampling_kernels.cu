#include <cstdint>

#include "kernels/cuda/sampling_kernels.h"

namespace kvd::cuda {
namespace {

constexpr int kThreads = 512;
// Logits each thread loads before using any: a pass is a stream of independent loads (from
// L2 after the first), and one load in flight per thread would leave it latency bound.
constexpr int kUnroll = 8;
constexpr int kTile = kThreads * kUnroll;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerLane = kBins / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr uint64_t kNoBound = ~uint64_t{0};
// A top_k set at most this large is gathered into shared memory, and the later selections
// run over it instead of the whole row.
constexpr int kMaxGathered = 2048;
// Bits per part when a 64-bit fixed-point mass is summed across a warp in 32-bit pieces:
// 32 lanes of 21-bit parts cannot overflow 32 bits.
constexpr int kPartBits = 21;
constexpr uint32_t kPartMask = (1u << kPartBits) - 1;

// Ascending key order is the reference order: logit descending, then id ascending. The
// float's bits are mapped monotonically onto unsigned order (negative: all bits flipped;
// positive: sign bit set), then inverted for "descending". -0 is read as +0, which the
// reference treats as equal.
__device__ __forceinline__ uint64_t OrderKey(float logit, int32_t id) {
  const uint32_t bits = __float_as_uint(logit == 0.0f ? 0.0f : logit);
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}

// The reference weight. (logit - max) * inv_temperature is the same two fp32 operations as
// on the CPU; the exponential in double rounded once to fp32 matches glibc's expf (itself
// within 0.502 ulp) except in rare double-rounding ties.
__device__ __forceinline__ float Weight(float logit, float max_logit, float inv_temperature) {
  if (logit == max_logit) return 1.0f;
  const float scaled = __fmul_rn(__fsub_rn(logit, max_logit), inv_temperature);
  return static_cast<float>(exp(static_cast<double>(scaled)));
}

// (value, id) that wins the argmax: larger value, then lower id; NaN loses to any number.
__device__ __forceinline__ bool Better(float v, int32_t i, float best, int32_t best_i) {
  if (isnan(v)) return false;
  if (isnan(best)) return true;
  return v > best || (v == best && i < best_i);
}

// Sum of v over the lanes in `peers` (which all call this with the same mask).
__device__ __forceinline__ uint64_t GroupSum(unsigned peers, uint64_t v) {
  const uint64_t low = __reduce_add_sync(peers, static_cast<uint32_t>(v) & kPartMask);
  const uint64_t mid = __reduce_add_sync(peers, static_cast<uint32_t>(v >> kPartBits) & kPartMask);
  const uint64_t high = __reduce_add_sync(peers, static_cast<uint32_t>(v >> (2 * kPartBits)));
  return low + (mid << kPartBits) + (high << (2 * kPartBits));
}

// Which candidates a selection counts. Every condition keeps a prefix of the key order.
struct Filter {
  uint64_t max_key = kNoBound;  // an earlier cut: keys above it are out
  bool weighted = false;        // count weight mass and drop w == 0 and w < min_weight
  float max_logit = 0.0f;
  float inv_temperature = 0.0f;
  float min_weight = 0.0f;
  double fixed_scale = 0.0;  // 2^S: weight -> fixed-point mass
};

// Where a selection reads its candidates: the whole row from global memory...
struct RowSource {
  const float* __restrict__ logits;
  int32_t size;
  __device__ __forceinline__ float Logit(int64_t i) const { return __ldg(logits + i); }
  __device__ __forceinline__ int32_t Id(int64_t i) const { return static_cast<int32_t>(i); }
};

// ... or the top_k candidates gathered into shared memory.
struct GatheredSource {
  const float* logits;
  const int32_t* ids;
  int32_t size;
  __device__ __forceinline__ float Logit(int64_t i) const { return logits[i]; }
  __device__ __forceinline__ int32_t Id(int64_t i) const { return ids[i]; }
};

struct SharedState {
  // Per pass: the histogram of the candidates whose key starts with the fixed digits.
  uint32_t count[kBins];
  unsigned long long mass[kBins];      // fixed point; count mode leaves it unused
  unsigned long long last_key[kBins];  // some key in the bin: the key when count == 1
  // Written by warp 0 after each pass, read by all.
  unsigned long long prefix;  // digits fixed so far
  unsigned long long before;  // count or mass of the candidates ordered before the prefix
  double target;
  int done;
  unsigned long long result;
  // The gathered top_k candidates, in no particular order (selection does not need one).
  float gathered_logit[kMaxGathered];
  int32_t gathered_id[kMaxGathered];
  int32_t num_gathered;
  // Statistics pass.
  float warp_best[kWarps];
  int32_t warp_best_id[kWarps];
  int32_t warp_count[kWarps];
};

// Warp 0: finds the bin holding the element where the running count/mass reaches the target
// (>= when inclusive, else >), and records it in `s`. The first pass of a mass selection
// sets target = fraction * total. If nothing reaches the target (only by a caller's
// out-of-range fraction), the last candidate in order is chosen, as the reference does.
__device__ void ChooseBin(SharedState& s, bool use_mass, int shift, bool first_pass,
                          double fraction, bool inclusive) {
  const int lane = threadIdx.x & 31;
  const uint64_t before = s.before;
  double target = s.target;
  uint64_t values[kBinsPerLane];
  uint64_t lane_sum = 0;
  bool lane_nonempty = false;
  for (int j = 0; j < kBinsPerLane; ++j) {
    const int b = lane * kBinsPerLane + j;
    values[j] = use_mass ? s.mass[b] : s.count[b];
    lane_sum += values[j];
    lane_nonempty |= s.count[b] != 0;
  }
  uint64_t inclusive_sum = lane_sum;
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint64_t other = __shfl_up_sync(kFullMask, inclusive_sum, offset);
    if (lane >= offset) inclusive_sum += other;
  }
  if (first_pass && use_mass) {
    target = fraction * static_cast<double>(__shfl_sync(kFullMask, inclusive_sum, 31));
  }
  auto reached = [&](uint64_t cumulative) {
    const double c = static_cast<double>(cumulative);
    return inclusive ? c >= target : c > target;
  };
  const unsigned hit = __ballot_sync(kFullMask, reached(before + inclusive_sum));
  const unsigned nonempty = __ballot_sync(kFullMask, lane_nonempty);
  if (nonempty == 0) {  // no candidate at all: unreachable for valid rows; pick id 0
    if (lane == 0) {
      s.done = 1;
      s.result = 0;
    }
    return;
  }
  const int owner = hit != 0 ? __ffs(hit) - 1 : 31 - __clz(nonempty);
  if (lane != owner) return;
  uint64_t cumulative = before + inclusive_sum - lane_sum;
  int chosen = -1;
  uint64_t chosen_before = cumulative;
  for (int j = 0; j < kBinsPerLane; ++j) {
    const int b = lane * kBinsPerLane + j;
    if (s.count[b] == 0) continue;
    if (hit == 0) {  // the last non-empty bin; later passes keep taking the last
      chosen = b;
      chosen_before = cumulative;
    } else if (reached(cumulative + values[j])) {
      chosen = b;
      chosen_before = cumulative;
      break;
    }
    cumulative += values[j];
  }
  if (chosen < 0) {  // rounding in the lane's own sum; take its last non-empty bin
    for (int j = kBinsPerLane - 1; j >= 0 && chosen < 0; --j) {
      if (s.count[lane * kBinsPerLane + j] != 0) chosen = lane * kBinsPerLane + j;
    }
  }
  s.before = chosen_before;
  s.target = hit != 0 ? target : static_cast<double>(INFINITY);  // take the last from now on
  s.prefix |= static_cast<unsigned long long>(chosen) << shift;
  if (s.count[chosen] == 1) {
    s.done = 1;
    s.result = s.last_key[chosen];
  } else if (shift == 0) {
    s.done = 1;
    s.result = s.prefix;
  }
}

// The key of the element where the running count (use_mass false: every non-NaN logit
// counts 1) or weight mass of the candidates, in key order, reaches the target: `target`
// itself for counts, fraction * (total mass) for masses.
template <typename Source>
__device__ uint64_t RadixSelect(Source source, Filter f, bool use_mass, double target_or_fraction,
                                bool inclusive, SharedState& s) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.before = 0;
    s.target = use_mass ? 0.0 : target_or_fraction;
    s.done = 0;
  }
  for (int shift = 64 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    if (threadIdx.x < kBins) {
      s.count[threadIdx.x] = 0;
      s.mass[threadIdx.x] = 0;
    }
    __syncthreads();
    const uint64_t prefix = s.prefix;
    const uint64_t fixed_mask = shift + kDigitBits >= 64 ? 0 : ~uint64_t{0} << (shift + kDigitBits);
    for (int64_t base = 0; base < source.size; base += kTile) {
      float xs[kUnroll];  // NaN past the end: never a candidate
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t i = base + j * kThreads + threadIdx.x;
        xs[j] = i < source.size ? source.Logit(i) : NAN;
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t i = base + j * kThreads + threadIdx.x;
        const float x = xs[j];
        bool active = false;
        uint64_t key = 0;
        uint64_t mass = 0;
        if (!isnan(x)) {
          key = OrderKey(x, source.Id(i));
          active = key <= f.max_key && (key & fixed_mask) == prefix;
          if (active && f.weighted) {
            const float w = Weight(x, f.max_logit, f.inv_temperature);
            active = w > 0.0f && w >= f.min_weight;
            mass = __double2ull_rn(static_cast<double>(w) * f.fixed_scale);
          }
        }
        const unsigned active_lanes = __ballot_sync(kFullMask, active);
        if (active) {
          const uint32_t bin = static_cast<uint32_t>(key >> shift) & (kBins - 1);
          const unsigned peers = __match_any_sync(active_lanes, bin);
          const uint64_t group_mass = use_mass ? GroupSum(peers, mass) : 0;
          if (lane == __ffs(peers) - 1) {
            atomicAdd(&s.count[bin], static_cast<uint32_t>(__popc(peers)));
            if (use_mass) atomicAdd(&s.mass[bin], static_cast<unsigned long long>(group_mass));
            s.last_key[bin] = key;
          }
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      ChooseBin(s, use_mass, shift, shift == 64 - kDigitBits, target_or_fraction, inclusive);
    }
    __syncthreads();
    if (s.done) break;
  }
  const uint64_t result = s.result;
  __syncthreads();  // s is reused by the next selection
  return result;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p, double fixed_scale) {
  __shared__ SharedState s;
  const int32_t r = static_cast<int32_t>(blockIdx.x);
  const float* __restrict__ logits = p.logits + static_cast<int64_t>(r) * p.row_stride;
  const SamplingRow row = p.rows[r];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;

  // Statistics: the lowest-id argmax (also the maximum logit) and the non-NaN count.
  float best = NAN;
  int32_t best_id = 0;
  int32_t num_numbers = 0;
  for (int64_t base = 0; base < p.vocab_size; base += kTile) {
    float xs[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * kThreads + threadIdx.x;
      xs[j] = i < p.vocab_size ? __ldg(logits + i) : NAN;
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int32_t i = static_cast<int32_t>(base + j * kThreads + threadIdx.x);
      num_numbers += !isnan(xs[j]);
      if (Better(xs[j], i, best, best_id)) {
        best = xs[j];
        best_id = i;
      }
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_down_sync(kFullMask, best, offset);
    const int32_t i = __shfl_down_sync(kFullMask, best_id, offset);
    num_numbers += __shfl_down_sync(kFullMask, num_numbers, offset);
    if (Better(v, i, best, best_id)) {
      best = v;
      best_id = i;
    }
  }
  if (lane == 0) {
    s.warp_best[warp] = best;
    s.warp_best_id[warp] = best_id;
    s.warp_count[warp] = num_numbers;
  }
  __syncthreads();
  best = s.warp_best[0];
  best_id = s.warp_best_id[0];
  num_numbers = s.warp_count[0];
  for (int w = 1; w < kWarps; ++w) {
    num_numbers += s.warp_count[w];
    if (Better(s.warp_best[w], s.warp_best_id[w], best, best_id)) {
      best = s.warp_best[w];
      best_id = s.warp_best_id[w];
    }
  }
  // Greedy, or nothing to prefer (all NaN: best_id stayed 0).
  if (!(row.temperature > 0.0f) || num_numbers == 0) {
    if (threadIdx.x == 0) p.out_tokens[r] = best_id;
    return;
  }

  const RowSource row_source{logits, p.vocab_size};
  Filter f;
  bool gathered = false;
  if (row.top_k > 0 && row.top_k < num_numbers) {
    f.max_key = RadixSelect(row_source, f, /*use_mass=*/false, row.top_k, /*inclusive=*/true, s);
    gathered = row.top_k <= kMaxGathered;
    if (gathered) {  // exactly top_k keys are <= the cut
      if (threadIdx.x == 0) s.num_gathered = 0;
      __syncthreads();
      for (int64_t base = 0; base < p.vocab_size; base += kTile) {
        float xs[kUnroll];
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
          const int64_t i = base + j * kThreads + threadIdx.x;
          xs[j] = i < p.vocab_size ? __ldg(logits + i) : NAN;
        }
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
          const int32_t i = static_cast<int32_t>(base + j * kThreads + threadIdx.x);
          if (!isnan(xs[j]) && OrderKey(xs[j], i) <= f.max_key) {
            const int32_t slot = atomicAdd(&s.num_gathered, 1);
            s.gathered_logit[slot] = xs[j];
            s.gathered_id[slot] = i;
          }
        }
      }
      __syncthreads();
    }
  }
  f.weighted = true;
  f.max_logit = best;
  f.inv_temperature = 1.0f / row.temperature;
  f.fixed_scale = fixed_scale;
  const GatheredSource gathered_source{s.gathered_logit, s.gathered_id, row.top_k};
  // top_p: by mass, inclusive, target top_p * total; then the draw: by mass, exclusive,
  // target u * total, among the weights >= min_p.
  auto select_by_mass = [&](double fraction, bool inclusive) {
    return gathered ? RadixSelect(gathered_source, f, /*use_mass=*/true, fraction, inclusive, s)
                    : RadixSelect(row_source, f, /*use_mass=*/true, fraction, inclusive, s);
  };
  if (row.top_p < 1.0f) f.max_key = select_by_mass(row.top_p, /*inclusive=*/true);
  if (row.min_p > 0.0f) f.min_weight = row.min_p;
  const uint64_t key = select_by_mass(row.u, /*inclusive=*/false);
  if (threadIdx.x == 0) p.out_tokens[r] = static_cast<int32_t>(key & 0xFFFFFFFFu);
}

}  // namespace

cudaError_t LaunchSample(const SampleParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) return cudaSuccess;
  // Fixed-point masses in units of 2^-S: vocab_size weights <= 1 sum below 2^62.
  int vocab_bits = 0;
  while (vocab_bits < 31 && (int64_t{1} << vocab_bits) <= p.vocab_size) ++vocab_bits;
  const double fixed_scale = static_cast<double>(uint64_t{1} << (62 - vocab_bits));
  SampleKernel<<<p.num_rows, kThreads, 0, stream>>>(p, fixed_scale);
  return cudaGetLastError();
}

}  // namespace kvd::cuda
