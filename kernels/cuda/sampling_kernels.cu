// SampleKernel, the device side of Backend::Sample (sampling_kernels.h), and its launch.
// The per-row primitives are in sampling_row.cuh, the selections in sampling_select.cuh.

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/cuda/sampling_kernels.h"
#include "kernels/cuda/sampling_row.cuh"
#include "kernels/cuda/sampling_select.cuh"

namespace kvd::cuda {
namespace {

using sampling::Bucket;
using sampling::ChooseBucket;
using sampling::Cut;
using sampling::ForEachLogit;
using sampling::Histogram;
using sampling::HistValue;
using sampling::kBuckets;
using sampling::kCapacity;
using sampling::kCount;
using sampling::kFullMask;
using sampling::kMass;
using sampling::kMassMinP;
using sampling::kThreads;
using sampling::kWarps;
using sampling::Measure;
using sampling::OrderKey;
using sampling::RowConstants;
using sampling::RowStats;
using sampling::Select;
using sampling::SharedState;
using sampling::SortGathered;
using sampling::Walk;

// CTAs per row (a thread block cluster) share the statistics and histogram passes, which
// read and weigh the whole row; CTA 0 then finishes the row alone. More CTAs per row when
// there are few rows, so that small batches still spread over the SMs.
constexpr int kMaxClusterSize = 8;

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
