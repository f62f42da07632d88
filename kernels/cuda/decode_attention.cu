#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/tensor_core.cuh"

namespace kvd::cuda {
namespace {

constexpr int kMaxSplits = 128;
constexpr int kMaxGroupPerCta = 8;
// Launch shape: warps per CTA, cp.async stages per warp (kStages - 1 iterations in flight
// while one is scored) and the resident CTAs per multiprocessor the shared memory allows,
// which the split count aims to fill once.
template <int kWarpsT, int kStagesT, int kCtasPerSmT, int kL2PrefetchT = 0>
struct DecodeConfig {
  static constexpr int kL2Prefetch = kL2PrefetchT;  // 0, or the cp.async L2 prefetch size
  static constexpr int kWarps = kWarpsT;
  static constexpr int kThreads = 32 * kWarpsT;
  static constexpr int kStages = kStagesT;
  static constexpr int kCtasPerSm = kCtasPerSmT;
};
using DefaultConfig = DecodeConfig<4, 3, 2>;
constexpr float kLog2e = 1.4426950408889634f;

struct SplitPlan {
  int num_splits;
  int split_len;  // keys, a multiple of the granule
};

// Shared by every CTA of a sequence so all see the same cut: splits start at
// multiples of `granule` keys (DecodeShape::kSplitGranule, one iteration of every warp of a
// CTA) and hold at least `min_granules` granules unless the context is shorter.
__device__ __forceinline__ SplitPlan PlanSplits(int kv_len, int max_splits, int granule,
                                                int min_granules) {
  const int wanted = max(1, min(max_splits, CeilDiv(kv_len, max(1, min_granules) * granule)));
  const int len = max(1, CeilDiv(CeilDiv(kv_len, wanted), granule)) * granule;
  return {max(1, CeilDiv(kv_len, len)), len};
}

// Work layout of one warp, for 16-byte vectors of kVec elements of T:
//
//   lane = row * kLanesPerKey + slice. A key's head_dim is cut over kLanesPerKey lanes, each
//   holding kDims dims as kVecsPerLane vectors: slice owns vectors slice, slice + kLanesPerKey,
//   slice + 2 kLanesPerKey, ... so each copy instruction reads runs of kLanesPerKey * 16
//   contiguous bytes. `row` picks one of the kKeysPerRound keys of a round; one warp iteration
//   covers kKeysPerIter = kRounds * kKeysPerRound consecutive keys (round r, row q is key
//   r * kKeysPerRound + q). kDims = 64 / kGroup (within [kVec, head_dim], at most 32 for
//   fp32) keeps the query slices and partial outputs of the group at 64 registers each.
//
//   Scores: a lane dots its dims with all kGroup query heads, and a transposing butterfly
//   (ReduceScatter) leaves it the full score of one head, my_head = slice / kLanesPerHead:
//   kGroup - 1 + log2(kLanesPerHead) shuffles per round for the whole group. The lane then
//   runs the online softmax of that head over its row's keys (one exp2 per key and head, not
//   one per lane), and the probabilities of all heads of its key come back by kGroup
//   shuffles for O += P V. Rescaling happens once per iteration.
//
//   Shared memory per warp and stage: K then V, [kRounds][kVecsPerLane][32 lanes][16 bytes]
//   each; a lane only ever reads back the 16-byte slots it copied itself, so the cp.async
//   wait alone orders its reads.
template <typename T, int kHeadDim, int kGroup, typename Cfg>
struct DecodeShape {
  static constexpr int kWarps = Cfg::kWarps;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kVec = Vec16<T>::kSize;
  static constexpr int kMaxDims = sizeof(T) == 2 ? 64 : 32;
  static constexpr int kDims = std::min({64 / kGroup, kMaxDims, kHeadDim});
  static constexpr int kVecsPerLane = kDims / kVec;
  static constexpr int kLanesPerKey = kHeadDim / kDims;
  static constexpr int kLanesPerHead = kLanesPerKey / kGroup;
  static constexpr int kKeysPerRound = 32 / kLanesPerKey;
  static constexpr int kRowBytes = kHeadDim * static_cast<int>(sizeof(T));
  // About 8 KB of K and V per warp iteration.
  static constexpr int kKeysPerIter = std::max(kKeysPerRound, std::min(32, 8192 / (2 * kRowBytes)));
  static constexpr int kRounds = kKeysPerIter / kKeysPerRound;
  // Split boundaries: one iteration of each warp (64 keys for bf16, head_dim 128), so a
  // short context still makes many CTAs.
  static constexpr int kSplitGranule = kWarps * kKeysPerIter;
  static constexpr int kStageBytes = 2 * kKeysPerIter * kRowBytes;
  static constexpr int kPipelineBytes = kWarps * kStages * kStageBytes;
  // Combine area, reusing the pipeline: [kWarps][kGroup][kHeadDim] outputs, then
  // [kWarps][kGroup] maxima and sums.
  static constexpr int kCombineBytes = kWarps * kGroup * (kHeadDim + 2) * 4;
  static constexpr int kSmemBytes = std::max(kPipelineBytes, kCombineBytes);
  static_assert(kDims % kVec == 0 && kDims >= kVec);
  static_assert(kLanesPerKey * kDims == kHeadDim && 32 % kLanesPerKey == 0);
  static_assert(kGroup <= kLanesPerKey, "each lane ends up with the score of one head");
  static_assert(kRounds * kKeysPerRound == kKeysPerIter);
  static_assert(kRounds * kVecsPerLane * 32 * 16 == kKeysPerIter * kRowBytes);
  static_assert(kKeysPerIter <= 32, "one lane holds one block pointer of an iteration");
};

__device__ __forceinline__ const char* ShflPtr(const char* ptr, int src_lane) {
  const unsigned long long bits = reinterpret_cast<unsigned long long>(ptr);
  return reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, bits, src_lane));
}

// Transposing butterfly over aligned groups of 2 * kOffset lanes: v[i] holds this lane's
// partial sums of kN heads; each step halves the heads a lane holds (the lane with `kOffset`
// set keeps the upper half) while summing over the partner lane, and once one head is left
// the remaining steps are a plain all-reduce. Returns the full sum, over the lane group, of
// head (lane % (2 kOffset)) / (2 kOffset / kN) of the caller's original kN heads.
template <int kN, int kOffset>
__device__ __forceinline__ float ReduceScatter(const float (&v)[kN], int lane) {
  if constexpr (kOffset == 0) {
    static_assert(kN == 1, "more heads than lanes");
    return v[0];
  } else if constexpr (kN == 1) {
    const float kept[1] = {v[0] + __shfl_xor_sync(0xffffffffu, v[0], kOffset)};
    return ReduceScatter<1, kOffset / 2>(kept, lane);
  } else {
    const bool upper = (lane & kOffset) != 0;
    float kept[kN / 2];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const float send = upper ? v[i] : v[i + kN / 2];
      const float keep = upper ? v[i + kN / 2] : v[i];
      kept[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
    }
    return ReduceScatter<kN / 2, kOffset / 2>(kept, lane);
  }
}

// Combines the split partials of heads [head_base, head_base + heads) of sequence s into
// `out`, with the kThreads threads of one CTA: out = sum_i w_i partial_i / sum_i w_i with
// w_i = exp2(lse_i - max lse). `scratch` holds kGroup * (kMaxSplits + 1) floats. Partials
// written by other CTAs are read through L2 (__ldcg): L1 is not coherent across CTAs.
template <int kHeadDim, int kGroup, typename Cfg>
__device__ void MergeGroup(const PagedAttentionParams& p, const DecodeWorkspace& ws, int s,
                           int q_row, int head_base, int heads, int num_splits, float* scratch) {
  float* s_weight = scratch;                         // [kGroup][kMaxSplits]
  float* s_inv_sum = scratch + kGroup * kMaxSplits;  // [kGroup]
  const int64_t first = int64_t{s} * ws.max_splits;
  // Weights: one warp per head.
  const int lane = threadIdx.x % 32;
  for (int h = threadIdx.x / 32; h < heads; h += Cfg::kWarps) {
    float lse[kMaxSplits / 32];
    float max_lse = -INFINITY;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int i = lane + 32 * j;
      lse[j] = i < num_splits ? __ldcg(ws.partial_lse + (first + i) * p.num_q_heads + head_base + h)
                              : -INFINITY;
      max_lse = fmaxf(max_lse, lse[j]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int i = lane + 32 * j;
      const float w = max_lse == -INFINITY ? 0.0f : exp2f(lse[j] - max_lse);
      sum += w;
      if (i < num_splits) s_weight[h * kMaxSplits + i] = w;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) s_inv_sum[h] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  __syncthreads();
  constexpr int kColumns = kHeadDim / 4;
  for (int item = threadIdx.x; item < heads * kColumns; item += Cfg::kThreads) {
    const int h = item / kColumns;
    const int column = item % kColumns;
    const float* w = s_weight + h * kMaxSplits;
    const float4* part = reinterpret_cast<const float4*>(
                             ws.partial_out + (first * p.num_q_heads + head_base + h) * kHeadDim) +
                         column;
    const int64_t split_stride = int64_t{p.num_q_heads} * kColumns;  // float4s per split
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int i = 0; i < num_splits; ++i) {
      const float4 x = __ldcg(part + i * split_stride);
      o.x = fmaf(w[i], x.x, o.x);
      o.y = fmaf(w[i], x.y, o.y);
      o.z = fmaf(w[i], x.z, o.z);
      o.w = fmaf(w[i], x.w, o.w);
    }
    const float inv = s_inv_sum[h];
    float* out = p.out + int64_t{q_row} * p.out_stride + int64_t{head_base + h} * kHeadDim +
                 4 * column;  // out_stride need not keep float4 alignment
    out[0] = o.x * inv;
    out[1] = o.y * inv;
    out[2] = o.z * inv;
    out[3] = o.w * inv;
  }
}

// The end of a decode CTA once every warp's results are in shared memory: s_acc
// [kWarps][kGroup][kHeadDim] outputs normalized by nothing yet, then s_max and s_sum
// [kWarps][kGroup] (base-2 running maxima and sums; -inf and 0 for a warp that saw no key).
// Combines the warps and writes `out` (one split) or this split's partials; the last split
// of the (sequence, head group) to finish then merges them all into `out`.
// REQUIRES: called by every thread of the CTA after a __syncthreads() that follows the
// writes to s_acc.
template <int kHeadDim, int kGroup, typename Cfg>
__device__ void FinishCta(const PagedAttentionParams& p, const DecodeWorkspace& ws, int s,
                          int split, int q_row, int head_base, int heads, const SplitPlan& plan,
                          float* s_acc) {
  const float* s_max = s_acc + Cfg::kWarps * kGroup * kHeadDim;
  const float* s_sum = s_max + Cfg::kWarps * kGroup;
  const int64_t seq_split = int64_t{s} * ws.max_splits + split;
#pragma unroll 2
  for (int index = threadIdx.x; index < heads * kHeadDim; index += Cfg::kThreads) {
    const int h = index / kHeadDim;
    const int d = index % kHeadDim;
    float max_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) max_all = fmaxf(max_all, s_max[w * kGroup + h]);
    float sum = 0.0f;
    float o = 0.0f;
    if (max_all != -INFINITY) {  // else no key at all (an empty sequence): output 0
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) {
        const float weight = exp2f(s_max[w * kGroup + h] - max_all);  // 0 for idle warps
        sum = fmaf(weight, s_sum[w * kGroup + h], sum);
        o = fmaf(weight, s_acc[(w * kGroup + h) * kHeadDim + d], o);
      }
    }
    o = sum > 0.0f ? o / sum : 0.0f;
    const int head = head_base + h;
    if (plan.num_splits == 1) {
      p.out[int64_t{q_row} * p.out_stride + int64_t{head} * kHeadDim + d] = o;
    } else {
      ws.partial_out[(seq_split * p.num_q_heads + head) * kHeadDim + d] = o;
      if (d == 0) {
        ws.partial_lse[seq_split * p.num_q_heads + head] =
            sum > 0.0f ? max_all + log2f(sum) : -INFINITY;
      }
    }
  }
  if (plan.num_splits == 1) return;

  // In-kernel merge: the last CTA of this (sequence, head group) to finish combines every
  // split's partials (threadFenceReduction: each CTA publishes its partials, then counts
  // itself in; the counter goes back to 0 for the next launch).
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* arrivals = ws.arrivals + int64_t{s} * gridDim.x + blockIdx.x;
    const int done = atomicAdd(arrivals, 1) + 1;
    s_last = done == plan.num_splits;
    if (s_last) *arrivals = 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  MergeGroup<kHeadDim, kGroup, Cfg>(p, ws, s, q_row, head_base, heads, plan.num_splits, s_acc);
}

// grid (num_kv_heads * subgroups, num_seqs, max_splits), kThreads threads, Shape::kSmemBytes
// of dynamic shared memory.
template <typename T, int kHeadDim, int kGroup, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    DecodeKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                 int block_shift) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  using Shape = DecodeShape<T, kHeadDim, kGroup, Cfg>;
  constexpr int kWarps = Cfg::kWarps;
  constexpr int kStages = Cfg::kStages;
  constexpr int kVec = Shape::kVec;
  constexpr int kDims = Shape::kDims;
  constexpr int kVecsPerLane = Shape::kVecsPerLane;
  constexpr int kLanesPerKey = Shape::kLanesPerKey;
  constexpr int kLanesPerHead = Shape::kLanesPerHead;
  constexpr int kKeysPerRound = Shape::kKeysPerRound;
  constexpr int kRounds = Shape::kRounds;
  constexpr int kKeysPerIter = Shape::kKeysPerIter;
  constexpr int kStageBytes = Shape::kStageBytes;
  extern __shared__ __align__(16) unsigned char smem[];

  const int kv_head = blockIdx.x / subgroups;
  const int head_base = kv_head * group + (blockIdx.x % subgroups) * kGroup;
  const int heads = min(kGroup, (kv_head + 1) * group - head_base);  // live heads, >= 1
  const int s = blockIdx.y;
  const int split = blockIdx.z;
  // All sequence metadata in one round trip.
  const int q_row = p.q_indptr[s];
  const int q_next = p.q_indptr[s + 1];
  const int block_begin = p.blocks.indptr[s];
  const int num_seq_blocks = p.blocks.indptr[s + 1] - block_begin;
  const int last_len = p.blocks.last_block_len[s];
  if (q_next - q_row != 1) return;
  const KvCacheView& c = p.cache;
  const int kv_len = num_seq_blocks == 0 ? 0 : (num_seq_blocks - 1) * c.block_size + last_len;
  const SplitPlan plan =
      PlanSplits(kv_len, ws.max_splits, Shape::kSplitGranule, ws.min_split_granules);
  if (split >= plan.num_splits) return;
  const int key_begin = split * plan.split_len;
  const int key_end = min(kv_len, key_begin + plan.split_len);
  const int32_t* seq_blocks = p.blocks.indices + block_begin;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int row = lane / kLanesPerKey;
  const int slice = lane % kLanesPerKey;
  const int row_lane0 = lane - slice;
  // Dim of element i of this lane's vector j.
  auto dim_of = [&](int j, int i) { return (slice + j * kLanesPerKey) * kVec + i; };

  // Query slices, pre-scaled so that scores are base-2 logits.
  float q[kGroup][kDims];
  const float q_scale = p.sm_scale * kLog2e;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    const float* q_head = p.q + int64_t{q_row} * p.q_stride + int64_t{head_base + h} * kHeadDim;
#pragma unroll
    for (int j = 0; j < kVecsPerLane; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        q[h][j * kVec + i] = h < heads ? q_head[dim_of(j, i)] * q_scale : 0.0f;
      }
    }
  }

  // This warp's iterations start at key_begin + (warp + kWarps * i) * kKeysPerIter.
  const int cta_iters = CeilDiv(key_end - key_begin, kKeysPerIter);
  const int num_iters = cta_iters > warp ? CeilDiv(cta_iters - warp, kWarps) : 0;
  auto iter_start = [&](int it) { return key_begin + (warp + kWarps * it) * kKeysPerIter; };
  const int block_mask = c.block_size - 1;
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;

  // Lane j's K head pointer of block j of iteration `it` (the block table is read once per
  // block, an iteration ahead of its copies). Lanes past the iteration's blocks, and
  // blocks past the sequence's, repeat a real block so every address stays valid.
  const int blocks_per_iter = max(1, kKeysPerIter >> block_shift);
  auto block_ptrs = [&](int it) -> const char* {
    if (it >= num_iters) return nullptr;
    const int b =
        min((iter_start(it) >> block_shift) + min(lane, blocks_per_iter - 1), num_seq_blocks - 1);
    return reinterpret_cast<const char*>(BlockHead<T>(c, seq_blocks[b], c.k_offset_bytes, kv_head));
  };
  unsigned char* warp_smem = smem + warp * kStages * kStageBytes;
  auto slot = [&](int r, int j) { return ((r * kVecsPerLane + j) * 32 + lane) * 16; };
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < num_iters) {
      const int start = iter_start(it);
      unsigned char* k_dst = warp_smem + stage * kStageBytes;
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        const int key_in_iter = r * kKeysPerRound + row;
        const int key = start + key_in_iter;
        // start is a multiple of the block size whenever an iteration spans blocks, so
        // the iteration's block index of the key is key_in_iter >> block_shift.
        const char* src = ShflPtr(ptrs, key_in_iter >> block_shift) +
                          int64_t{key & block_mask} * Shape::kRowBytes + slice * 16;
#pragma unroll
        for (int j = 0; j < kVecsPerLane; ++j) {
          unsigned char* dst = k_dst + slot(r, j);
          const char* vec_src = src + j * kLanesPerKey * 16;
          CpAsync16(dst, vec_src, key < key_end);
          CpAsync16(dst + kStageBytes / 2, vec_src + v_minus_k, key < key_end);
        }
      }
    }
    CpAsyncCommit();  // empty groups too, so that group counts line up
  };

  // Partial outputs of every head of the group over this lane's row of keys, and the
  // online-softmax state of my_head (the same in every lane holding that head).
  float acc[kGroup][kDims];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[h][d] = 0.0f;
  }
  float my_max = -INFINITY;  // over the warp's keys so far
  float my_sum = 0.0f;       // over this lane's row of keys, relative to my_max

  // Pipeline: kStages - 1 iterations in flight while one is computed.
  const char* ptrs[kStages - 1];
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) ptrs[i] = block_ptrs(i);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, ptrs[i], i);
  const char* pending = block_ptrs(kStages - 1);
  int read_stage = 0;
  for (int it = 0; it < num_iters; ++it) {
    const int write_stage = read_stage == 0 ? kStages - 1 : read_stage - 1;
    __syncwarp();
    issue(it + kStages - 1, pending, write_stage);
    pending = block_ptrs(it + kStages);
    CpAsyncWait<kStages - 1>();

    const unsigned char* k_src = warp_smem + read_stage * kStageBytes;
    const unsigned char* v_src = k_src + kStageBytes / 2;
    const int start = iter_start(it);
    float score[kRounds];  // of my_head, for key r * kKeysPerRound + row
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      float part[kGroup];
#pragma unroll
      for (int h = 0; h < kGroup; ++h) part[h] = 0.0f;
#pragma unroll
      for (int j = 0; j < kVecsPerLane; ++j) {
        float k[kVec];
        Vec16<T>::Load(k_src + slot(r, j), k);
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) part[h] = fmaf(q[h][j * kVec + i], k[i], part[h]);
        }
      }
      const float dot = ReduceScatter<kGroup, kLanesPerKey / 2>(part, lane);
      score[r] = start + r * kKeysPerRound + row < key_end ? dot : -INFINITY;
    }

    // Online softmax of my_head: the iteration holds at least one live key, so the new max
    // is finite. Lanes holding the same head in other rows differ in the row bits.
    float iter_max = score[0];
#pragma unroll
    for (int r = 1; r < kRounds; ++r) iter_max = fmaxf(iter_max, score[r]);
#pragma unroll
    for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
      iter_max = fmaxf(iter_max, __shfl_xor_sync(0xffffffffu, iter_max, offset));
    }
    const float new_max = fmaxf(my_max, iter_max);
    const float my_rescale = exp2f(my_max - new_max);  // 0 on the first iteration
    my_max = new_max;
    float sum = my_sum * my_rescale;
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      score[r] = exp2f(score[r] - new_max);
      sum += score[r];
    }
    my_sum = sum;
    // Every head's factor from the lane of row 0 holding it.
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float rescale = __shfl_sync(0xffffffffu, my_rescale, h * kLanesPerHead);
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[h][d] *= rescale;
    }

    // Weighted values; masked keys have probability 0 and zero-filled V.
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      float prob[kGroup];
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        prob[h] = kLanesPerKey == 1
                      ? score[r]
                      : __shfl_sync(0xffffffffu, score[r], row_lane0 + h * kLanesPerHead);
      }
#pragma unroll
      for (int j = 0; j < kVecsPerLane; ++j) {
        float v[kVec];
        Vec16<T>::Load(v_src + slot(r, j), v);
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            acc[h][j * kVec + i] = fmaf(prob[h], v[i], acc[h][j * kVec + i]);
          }
        }
      }
    }
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
  }

  // Sum the rows of the warp (every lane of a head has the same max).
#pragma unroll
  for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
    my_sum += __shfl_xor_sync(0xffffffffu, my_sum, offset);
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[h][d] += __shfl_xor_sync(0xffffffffu, acc[h][d], offset);
    }
  }

  // Combine the warps through shared memory (the pipeline buffers are free once every
  // copy, including the empty tail groups, has landed).
  AllowDependentLaunch();  // past the KV stream: only the combine and merge are left
  CpAsyncWait<0>();
  __syncthreads();
  float* s_acc = reinterpret_cast<float*>(smem);      // [kWarps][kGroup][kHeadDim]
  float* s_max = s_acc + kWarps * kGroup * kHeadDim;  // [kWarps][kGroup]
  float* s_sum = s_max + kWarps * kGroup;             // [kWarps][kGroup]
  if (row == 0) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int j = 0; j < kVecsPerLane; ++j) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          s_acc[(warp * kGroup + h) * kHeadDim + dim_of(j, i)] = acc[h][j * kVec + i];
        }
      }
    }
    if (slice % kLanesPerHead == 0) {
      const int my_head = slice / kLanesPerHead;
      s_max[warp * kGroup + my_head] = my_max;
      s_sum[warp * kGroup + my_head] = my_sum;
    }
  }
  __syncthreads();

  FinishCta<kHeadDim, kGroup, Cfg>(p, ws, s, split, q_row, head_base, heads, plan, s_acc);
}

// Tensor-core decode for bf16 KV (DecodeMmaKernel). The GQA group's query heads are the
// rows of an m16n8k16 tile (up to 8 live; rows 8-15 stay zero), so every warp iteration of
// 16 keys is a handful of MMAs instead of thousands of CUDA-core FMAs:
//   S[head][key] = Q K^T : Q as a bf16 high part plus a bf16 residual (two MMAs per
//                          fragment, ~16 significant bits, as the prefill kernel's split
//                          mode), K fragments by ldmatrix from the staged tile;
//   O += P V             : P split the same way, V fragments by ldmatrix.trans.
// Staging: each iteration's K and V tiles are [16 keys][head_dim] bf16 in shared memory,
// 16-byte chunk c of key k stored at chunk c ^ (k % 8) of its row, so the eight rows an
// ldmatrix reads fall in distinct banks. Pipeline, splits and the end of the CTA are the
// CUDA-core kernel's.
template <int kHeadDim, typename Cfg>
struct MmaDecodeShape {
  static constexpr int kKeysPerIter = 16;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per key row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kTileBytes = kKeysPerIter * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K tile, then V tile
  static constexpr int kCopiesPerLane = kKeysPerIter * kChunks / 32;
  static constexpr int kDimSteps = kHeadDim / 16;  // k-steps of Q K^T
  static constexpr int kDimTiles = kHeadDim / 8;   // n-tiles of P V
  static constexpr int kSplitGranule = Cfg::kWarps * kKeysPerIter;
  static constexpr int kPipelineBytes = Cfg::kWarps * Cfg::kStages * kStageBytes;
  static constexpr int kCombineBytes = Cfg::kWarps * kMaxGroupPerCta * (kHeadDim + 2) * 4;
  static constexpr int kSmemBytes = std::max(kPipelineBytes, kCombineBytes);
  static_assert(kCopiesPerLane * 32 == kKeysPerIter * kChunks);
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
};

// grid (num_kv_heads * subgroups, num_seqs, max_splits), Cfg::kThreads threads,
// MmaDecodeShape::kSmemBytes of dynamic shared memory; subgroups of kMaxGroupPerCta heads.
template <int kHeadDim, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    DecodeMmaKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                    int block_shift) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  constexpr int kGroup = kMaxGroupPerCta;
  constexpr int kWarps = Cfg::kWarps;
  constexpr int kStages = Cfg::kStages;
  constexpr int kKeysPerIter = Shape::kKeysPerIter;
  constexpr int kStageBytes = Shape::kStageBytes;
  constexpr int kTileBytes = Shape::kTileBytes;
  constexpr int kRowBytes = Shape::kRowBytes;
  extern __shared__ __align__(16) unsigned char smem[];

  const int kv_head = blockIdx.x / subgroups;
  const int head_base = kv_head * group + (blockIdx.x % subgroups) * kGroup;
  const int heads = min(kGroup, (kv_head + 1) * group - head_base);  // live heads, >= 1
  const int s = blockIdx.y;
  const int split = blockIdx.z;
  const int q_row = p.q_indptr[s];
  const int q_next = p.q_indptr[s + 1];
  const int block_begin = p.blocks.indptr[s];
  const int num_seq_blocks = p.blocks.indptr[s + 1] - block_begin;
  const int last_len = p.blocks.last_block_len[s];
  if (q_next - q_row != 1) return;
  const KvCacheView& c = p.cache;
  const int kv_len = num_seq_blocks == 0 ? 0 : (num_seq_blocks - 1) * c.block_size + last_len;
  const SplitPlan plan =
      PlanSplits(kv_len, ws.max_splits, Shape::kSplitGranule, ws.min_split_granules);
  if (split >= plan.num_splits) return;
  const int key_begin = split * plan.split_len;
  const int key_end = min(kv_len, key_begin + plan.split_len);
  const int32_t* seq_blocks = p.blocks.indices + block_begin;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;  // fragment row: head g of the subgroup
  const int t = lane % 4;

  // Q fragments a0 (row g, dims 2t, 2t+1) and a2 (row g, dims 2t+8, 2t+9) of each k-step,
  // pre-scaled to base-2 logits and split; rows 8-15 (a1, a3) and dead heads are zero.
  uint32_t q_hi[Shape::kDimSteps][2];
  uint32_t q_lo[Shape::kDimSteps][2];
  {
    const bool live = g < heads;
    const float scale = live ? p.sm_scale * kLog2e : 0.0f;
    const float* q_head =
        p.q + int64_t{q_row} * p.q_stride + int64_t{head_base + (live ? g : 0)} * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      const float* x = q_head + 16 * ks + 2 * t;  // q_stride may be odd: scalar loads
      SplitBf16x2(x[0] * scale, x[1] * scale, q_hi[ks][0], q_lo[ks][0]);
      SplitBf16x2(x[8] * scale, x[9] * scale, q_hi[ks][1], q_lo[ks][1]);
    }
  }

  const int cta_iters = CeilDiv(key_end - key_begin, kKeysPerIter);
  const int num_iters = cta_iters > warp ? CeilDiv(cta_iters - warp, kWarps) : 0;
  auto iter_start = [&](int it) { return key_begin + (warp + kWarps * it) * kKeysPerIter; };
  const int block_mask = c.block_size - 1;
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;
  const int blocks_per_iter = max(1, kKeysPerIter >> block_shift);
  auto block_ptrs = [&](int it) -> const char* {
    if (it >= num_iters) return nullptr;
    const int b =
        min((iter_start(it) >> block_shift) + min(lane, blocks_per_iter - 1), num_seq_blocks - 1);
    return reinterpret_cast<const char*>(
        BlockHead<__nv_bfloat16>(c, seq_blocks[b], c.k_offset_bytes, kv_head));
  };
  unsigned char* warp_smem = smem + warp * kStages * kStageBytes;
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < num_iters) {
      const int start = iter_start(it);
      unsigned char* k_dst = warp_smem + stage * kStageBytes;
#pragma unroll
      for (int i = 0; i < Shape::kCopiesPerLane; ++i) {
        const int q = lane + 32 * i;
        const int key_in_iter = q / Shape::kChunks;
        const int chunk = q % Shape::kChunks;
        const int key = start + key_in_iter;
        const char* src = ShflPtr(ptrs, key_in_iter >> block_shift) +
                          int64_t{key & block_mask} * kRowBytes + chunk * 16;
        unsigned char* dst = k_dst + key_in_iter * kRowBytes + ((chunk ^ (key_in_iter & 7)) * 16);
        if constexpr (Cfg::kL2Prefetch > 0) {
          CpAsync16Prefetch<Cfg::kL2Prefetch>(dst, src, key < key_end);
          CpAsync16Prefetch<Cfg::kL2Prefetch>(dst + kTileBytes, src + v_minus_k, key < key_end);
        } else {
          CpAsync16(dst, src, key < key_end);
          CpAsync16(dst + kTileBytes, src + v_minus_k, key < key_end);
        }
      }
    }
    CpAsyncCommit();
  };

  float o[Shape::kDimTiles][4];
#pragma unroll
  for (int n = 0; n < Shape::kDimTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max = -INFINITY;  // of head g over the warp's keys so far (same across the quad)
  float row_sum = 0.0f;       // over this lane's keys, relative to row_max

  // ldmatrix row addresses within a tile: matrix lane / 8, row lane % 8.
  const int matrix = lane / 8;
  const int k_key = (matrix >= 2 ? 8 : 0) + lane % 8;  // K: m0, m1 keys 0-7; m2, m3 keys 8-15
  const int k_chunk_odd = matrix & 1;                  // K: m1, m3 the second 8 dims
  const int v_key = (matrix & 1) * 8 + lane % 8;       // V: m0, m2 keys 0-7; m1, m3 keys 8-15
  const int v_chunk_odd = matrix >> 1;                 // V: m2, m3 the second dim tile

  const char* ptrs[kStages - 1];
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) ptrs[i] = block_ptrs(i);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, ptrs[i], i);
  const char* pending = block_ptrs(kStages - 1);
  int read_stage = 0;
  for (int it = 0; it < num_iters; ++it) {
    const int write_stage = read_stage == 0 ? kStages - 1 : read_stage - 1;
    __syncwarp();
    issue(it + kStages - 1, pending, write_stage);
    pending = block_ptrs(it + kStages);
    CpAsyncWait<kStages - 1>();
    __syncwarp();  // other lanes' copies of this stage have landed too

    const unsigned char* k_tile = warp_smem + read_stage * kStageBytes;
    const unsigned char* v_tile = k_tile + kTileBytes;
    // S for keys 0-7 (sc[0]) and 8-15 (sc[1]).
    float sc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      uint32_t b[4];
      const int chunk = 2 * ks + k_chunk_odd;
      LdMatrixX4<false>(b, k_tile + k_key * kRowBytes + ((chunk ^ (k_key & 7)) * 16));
      const uint32_t a_hi[4] = {q_hi[ks][0], 0u, q_hi[ks][1], 0u};
      const uint32_t a_lo[4] = {q_lo[ks][0], 0u, q_lo[ks][1], 0u};
      MmaBf16(sc[0], a_hi, b[0], b[1]);
      MmaBf16(sc[1], a_hi, b[2], b[3]);
      MmaBf16(sc[0], a_lo, b[0], b[1]);
      MmaBf16(sc[1], a_lo, b[2], b[3]);
    }
    // This lane's scores: head g, keys 2t, 2t+1, 8+2t, 9+2t of the iteration.
    const int start = iter_start(it);
    float score[4] = {sc[0][0], sc[0][1], sc[1][0], sc[1][1]};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = start + (i >= 2 ? 8 : 0) + 2 * t + (i & 1);
      if (key >= key_end) score[i] = -INFINITY;
    }
    float iter_max = fmaxf(fmaxf(score[0], score[1]), fmaxf(score[2], score[3]));
    iter_max = fmaxf(iter_max, __shfl_xor_sync(0xffffffffu, iter_max, 1));
    iter_max = fmaxf(iter_max, __shfl_xor_sync(0xffffffffu, iter_max, 2));
    const float new_max = fmaxf(row_max, iter_max);  // finite: the iteration has a live key
    const float rescale = exp2f(row_max - new_max);  // 0 on the first iteration
    row_max = new_max;
    float prob[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) prob[i] = exp2f(score[i] - new_max);
    row_sum = row_sum * rescale + ((prob[0] + prob[1]) + (prob[2] + prob[3]));
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; ++n) {
      o[n][0] *= rescale;
      o[n][1] *= rescale;
    }
    // P as the A operand: a0 (g, keys 2t, 2t+1), a2 (g, keys 2t+8, 2t+9); masked keys have
    // probability 0 and zero-filled V.
    uint32_t p_hi[4] = {0u, 0u, 0u, 0u};
    uint32_t p_lo[4] = {0u, 0u, 0u, 0u};
    SplitBf16x2(prob[0], prob[1], p_hi[0], p_lo[0]);
    SplitBf16x2(prob[2], prob[3], p_hi[2], p_lo[2]);
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; n += 2) {
      uint32_t b[4];
      const int chunk = n + v_chunk_odd;
      LdMatrixX4<true>(b, v_tile + v_key * kRowBytes + ((chunk ^ (v_key & 7)) * 16));
      MmaBf16(o[n], p_hi, b[0], b[1]);
      MmaBf16(o[n + 1], p_hi, b[2], b[3]);
      MmaBf16(o[n], p_lo, b[0], b[1]);
      MmaBf16(o[n + 1], p_lo, b[2], b[3]);
    }
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
  }
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);

  AllowDependentLaunch();  // past the KV stream: only the combine and merge are left
  CpAsyncWait<0>();
  __syncthreads();
  float* s_acc = reinterpret_cast<float*>(smem);      // [kWarps][kGroup][kHeadDim]
  float* s_max = s_acc + kWarps * kGroup * kHeadDim;  // [kWarps][kGroup]
  float* s_sum = s_max + kWarps * kGroup;             // [kWarps][kGroup]
#pragma unroll
  for (int n = 0; n < Shape::kDimTiles; ++n) {
    float* dst = s_acc + (warp * kGroup + g) * kHeadDim + 8 * n + 2 * t;
    dst[0] = o[n][0];
    dst[1] = o[n][1];
  }
  if (t == 0) {
    s_max[warp * kGroup + g] = row_max;
    s_sum[warp * kGroup + g] = row_sum;
  }
  __syncthreads();
  FinishCta<kHeadDim, kGroup, Cfg>(p, ws, s, split, q_row, head_base, heads, plan, s_acc);
}

template <int kHeadDim, typename Cfg = DefaultConfig>
cudaError_t LaunchMma(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                      cudaStream_t stream) {
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int subgroups = (group + kMaxGroupPerCta - 1) / kMaxGroupPerCta;
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  const dim3 grid(p.cache.num_kv_heads * subgroups, p.blocks.num_seqs, ws.max_splits);
  auto* kernel = DecodeMmaKernel<kHeadDim, Cfg>;
  if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             Shape::kSmemBytes);
      err != cudaSuccess) {
    return err;
  }
  return LaunchDependent(kernel, grid, Cfg::kThreads, Shape::kSmemBytes, stream, p, ws, group,
                         subgroups, block_shift);
}

template <typename T, int kHeadDim, int kGroup, typename Cfg = DefaultConfig>
cudaError_t Launch(const PagedAttentionParams& p, const DecodeWorkspace& ws, cudaStream_t stream) {
  using Shape = DecodeShape<T, kHeadDim, kGroup, Cfg>;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int subgroups = (group + kGroup - 1) / kGroup;
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  const dim3 grid(p.cache.num_kv_heads * subgroups, p.blocks.num_seqs, ws.max_splits);
  auto* kernel = DecodeKernel<T, kHeadDim, kGroup, Cfg>;
  if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             Shape::kSmemBytes);
      err != cudaSuccess) {
    return err;
  }
  return LaunchDependent(kernel, grid, Cfg::kThreads, Shape::kSmemBytes, stream, p, ws, group,
                         subgroups, block_shift);
}

}  // namespace

int DecodeMaxSplits(int num_seqs, int num_kv_heads, int group_size, int num_sms) {
  const int subgroups = (group_size + kMaxGroupPerCta - 1) / kMaxGroupPerCta;
  const int64_t ctas = int64_t{num_seqs} * num_kv_heads * subgroups;
  if (ctas <= 0) return 1;
  // Rounded down: a second, partial wave costs more than the splits gain (measured by
  // tests/gpu/decode_sweep.cu on an H200: 32 x 4k reads 0.83 of copy bandwidth unsplit and
  // 0.79 in two splits).
  const int64_t wanted = int64_t{DefaultConfig::kCtasPerSm} * num_sms / ctas;
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, kMaxSplits));
}

int64_t DecodeArrivalCount(int num_seqs, int num_kv_heads, int group_size) {
  const int subgroups = (group_size + kMaxGroupPerCta - 1) / kMaxGroupPerCta;
  return int64_t{num_seqs} * num_kv_heads * subgroups;
}

int64_t DecodePartialOutSize(int num_seqs, int max_splits, int num_q_heads, int head_dim) {
  return int64_t{num_seqs} * max_splits * num_q_heads * head_dim;
}

int64_t DecodePartialLseSize(int num_seqs, int max_splits, int num_q_heads) {
  return int64_t{num_seqs} * max_splits * num_q_heads;
}

cudaError_t LaunchDecodeAttentionVariant(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                         int variant, cudaStream_t stream, const char** name) {
  if (p.cache.dtype != DType::kBF16 || p.cache.head_dim != 128 ||
      p.num_q_heads != 4 * p.cache.num_kv_heads || ws.max_splits < 1 ||
      ws.max_splits > kMaxSplits || (ws.max_splits > 1 && ws.arrivals == nullptr)) {
    return cudaErrorInvalidValue;
  }
  using T = __nv_bfloat16;
  switch (variant) {
    case 0:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM (default)";
      return LaunchMma<128, DefaultConfig>(p, ws, stream);
    case 1:
      *name = "CUDA cores, 4 warps, 3 stages, 2 CTAs/SM";
      return Launch<T, 128, 4, DefaultConfig>(p, ws, stream);
    case 2:
      *name = "tensor cores, 8 warps, 3 stages, 1 CTA/SM";
      return LaunchMma<128, DecodeConfig<8, 3, 1>>(p, ws, stream);
    case 3:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM, L2::128B prefetch";
      return LaunchMma<128, DecodeConfig<4, 3, 2, 128>>(p, ws, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchDecodeAttention(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                  cudaStream_t stream) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (ws.max_splits < 1 || ws.max_splits > kMaxSplits) return cudaErrorInvalidValue;
  if (ws.max_splits > 1 && (ws.partial_out == nullptr || ws.arrivals == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  if (p.cache.dtype == DType::kBF16) {
    return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim, LaunchMma<kHeadDim>(p, ws, stream));
  }
  return KVD_DISPATCH_STORAGE_DTYPE(
      p.cache.dtype, T,
      KVD_DISPATCH_HEAD_DIM(
          p.cache.head_dim, kHeadDim,
          KVD_DISPATCH_GROUP_SIZE(group, kGroup, Launch<T, kHeadDim, kGroup>(p, ws, stream))));
}

}  // namespace kvd::cuda
