// Decode attention on CUDA cores (decode_kernels.h): every dtype, the f32 path of
// LaunchDecodeAttention.

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_common.cuh"
#include "kernels/cuda/decode_kernels.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace kvd::cuda {
namespace {

using decode::CombineSlots;
using decode::DecodeCta;
using decode::DefaultConfig;
using decode::FinishCta;
using decode::LaunchDecodeGrid;
using decode::PlanDecodeCta;
using decode::RunWarpPipeline;
using decode::WarpKeys;

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
  // Combine area (CombineSlots), reusing the pipeline.
  static constexpr int kCombineBytes = CombineSlots<kHeadDim, kGroup, Cfg>::kBytes;
  static constexpr int kSmemBytes = std::max(kPipelineBytes, kCombineBytes);
  static_assert(kDims % kVec == 0 && kDims >= kVec);
  static_assert(kLanesPerKey * kDims == kHeadDim && 32 % kLanesPerKey == 0);
  static_assert(kGroup <= kLanesPerKey, "each lane ends up with the score of one head");
  static_assert(kRounds * kKeysPerRound == kKeysPerIter);
  static_assert(kRounds * kVecsPerLane * 32 * 16 == kKeysPerIter * kRowBytes);
  static_assert(kKeysPerIter <= 32, "one lane holds one block pointer of an iteration");
};

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

// grid (num_kv_heads * subgroups, num_seqs, max_splits), kThreads threads, Shape::kSmemBytes
// of dynamic shared memory.
template <typename T, int kHeadDim, int kGroup, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    DecodeKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                 int block_shift) {
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

  // The sequence metadata and the block table are read before the wait for the preceding
  // kernel (launch.cuh), K/V and Q after it (RunWarpPipeline's start).
  DecodeCta cta;
  if (!PlanDecodeCta(p, ws, group, subgroups, kGroup, Shape::kSplitGranule, cta)) {
    WaitForPrecedingGrid();  // launch.cuh: every CTA waits, also one with nothing to do
    return;
  }
  const KvCacheView& c = p.cache;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int row = lane / kLanesPerKey;
  const int slice = lane % kLanesPerKey;
  const int row_lane0 = lane - slice;
  // Dim of element i of this lane's vector j.
  auto dim_of = [&](int j, int i) { return (slice + j * kLanesPerKey) * kVec + i; };

  // Query slices, pre-scaled so that scores are base-2 logits. The loads go out first after
  // the wait (load_q, RunWarpPipeline's start), but are waited for (scale_q, its primed)
  // only once the first K/V copies are issued, so that the round trips overlap.
  float q[kGroup][kDims];
  auto load_q = [&](const auto& /*block_ptrs*/) {
    WaitForPrecedingGrid();  // launch.cuh: before reading what kernels write (K/V, Q)
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float* q_head = p.q + int64_t{cta.q_row} * p.q_stride +
                            int64_t{cta.head_base + min(h, cta.heads - 1)} * kHeadDim;
#pragma unroll
      for (int j = 0; j < kVecsPerLane; ++j) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) q[h][j * kVec + i] = q_head[dim_of(j, i)];
      }
    }
  };
  auto scale_q = [&] {
    const float q_scale = p.sm_scale * kLog2e;
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int d = 0; d < kDims; ++d) q[h][d] = h < cta.heads ? q[h][d] * q_scale : 0.0f;
    }
  };

  const WarpKeys<T, kKeysPerIter, kWarps> keys(cta, c, block_shift, warp, lane);
  const int block_mask = c.block_size - 1;
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;
  unsigned char* warp_smem = smem + warp * kStages * kStageBytes;
  auto slot = [&](int r, int j) { return ((r * kVecsPerLane + j) * 32 + lane) * 16; };
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < keys.num_iters()) {
      const int start = keys.start(it);
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
          CpAsync16(dst, vec_src, key < cta.key_end);
          CpAsync16(dst + kStageBytes / 2, vec_src + v_minus_k, key < cta.key_end);
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

  // Each lane reads back only its own copies: no __syncwarp before consuming.
  RunWarpPipeline<kStages>(keys, load_q, issue, scale_q, [&](int it, int read_stage) {
    CpAsyncWait<kStages - 1>();
    const unsigned char* k_src = warp_smem + read_stage * kStageBytes;
    const unsigned char* v_src = k_src + kStageBytes / 2;
    const int start = keys.start(it);
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
      score[r] = start + r * kKeysPerRound + row < cta.key_end ? dot : -INFINITY;
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
  });

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
  const CombineSlots<kHeadDim, kGroup, Cfg> slots(smem);
  if (row == 0) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int j = 0; j < kVecsPerLane; ++j) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          slots.Row(warp, h)[dim_of(j, i)] = acc[h][j * kVec + i];
        }
      }
    }
    if (slice % kLanesPerHead == 0) {
      const int my_head = slice / kLanesPerHead;
      slots.max[warp * kGroup + my_head] = my_max;
      slots.sum[warp * kGroup + my_head] = my_sum;
    }
  }
  __syncthreads();

  FinishCta<kHeadDim, kGroup, Cfg>(p, ws, cta, slots.acc);
}

template <typename T, int kHeadDim, int kGroup, typename Cfg = DefaultConfig>
cudaError_t Launch(const PagedAttentionParams& p, const DecodeWorkspace& ws, cudaStream_t stream) {
  return LaunchDecodeGrid(DecodeKernel<T, kHeadDim, kGroup, Cfg>, Cfg::kThreads,
                          DecodeShape<T, kHeadDim, kGroup, Cfg>::kSmemBytes, kGroup, p, ws,
                          stream);
}

}  // namespace

int DecodeSimtSplitGranule(DType dtype, int head_dim, int group_size) {
  int granule = 0;
  const cudaError_t err = KVD_DISPATCH_STORAGE_DTYPE(
      dtype, T,
      KVD_DISPATCH_HEAD_DIM(
          head_dim, kHeadDim,
          KVD_DISPATCH_GROUP_SIZE(
              group_size, kGroup,
              (granule = DecodeShape<T, kHeadDim, kGroup, DefaultConfig>::kSplitGranule,
               cudaSuccess))));
  return err == cudaSuccess ? granule : 0;
}

cudaError_t LaunchDecodeSimt(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                             cudaStream_t stream) {
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  return KVD_DISPATCH_STORAGE_DTYPE(
      p.cache.dtype, T,
      KVD_DISPATCH_HEAD_DIM(
          p.cache.head_dim, kHeadDim,
          KVD_DISPATCH_GROUP_SIZE(group, kGroup, Launch<T, kHeadDim, kGroup>(p, ws, stream))));
}

}  // namespace kvd::cuda
