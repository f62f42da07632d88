// Decode attention on tensor cores for bf16 KV (decode_kernels.h), what
// LaunchDecodeAttention runs for bf16 caches.

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_common.cuh"
#include "kernels/cuda/decode_kernels.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/tensor_core.cuh"

namespace kvd::cuda {
namespace {

using decode::CombineSlots;
using decode::DecodeConfig;
using decode::DecodeCta;
using decode::DefaultConfig;
using decode::FinishCta;
using decode::kLog2e;
using decode::LaunchDecodeGrid;
using decode::kMaxGroupPerCta;
using decode::PlanDecodeCta;
using decode::RunWarpPipeline;
using decode::WarpKeys;

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

  DecodeCta cta;
  if (!PlanDecodeCta(p, ws, group, subgroups, kGroup, Shape::kSplitGranule, cta)) return;
  const KvCacheView& c = p.cache;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;  // fragment row: head g of the subgroup
  const int t = lane % 4;

  // Q fragments a0 (row g, dims 2t, 2t+1) and a2 (row g, dims 2t+8, 2t+9) of each k-step,
  // pre-scaled to base-2 logits and split; rows 8-15 (a1, a3) and dead heads are zero.
  uint32_t q_hi[Shape::kDimSteps][2];
  uint32_t q_lo[Shape::kDimSteps][2];
  {
    const bool live = g < cta.heads;
    const float scale = live ? p.sm_scale * kLog2e : 0.0f;
    const float* q_head =
        p.q + int64_t{cta.q_row} * p.q_stride + int64_t{cta.head_base + (live ? g : 0)} * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      const float* x = q_head + 16 * ks + 2 * t;  // q_stride may be odd: scalar loads
      SplitBf16x2(x[0] * scale, x[1] * scale, q_hi[ks][0], q_lo[ks][0]);
      SplitBf16x2(x[8] * scale, x[9] * scale, q_hi[ks][1], q_lo[ks][1]);
    }
  }

  const WarpKeys<__nv_bfloat16, kKeysPerIter, kWarps> keys(cta, c, block_shift, warp, lane);
  const int block_mask = c.block_size - 1;
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;
  unsigned char* warp_smem = smem + warp * kStages * kStageBytes;
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < keys.num_iters()) {
      const int start = keys.start(it);
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
          CpAsync16Prefetch<Cfg::kL2Prefetch>(dst, src, key < cta.key_end);
          CpAsync16Prefetch<Cfg::kL2Prefetch>(dst + kTileBytes, src + v_minus_k, key < cta.key_end);
        } else {
          CpAsync16(dst, src, key < cta.key_end);
          CpAsync16(dst + kTileBytes, src + v_minus_k, key < cta.key_end);
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

  RunWarpPipeline<kStages>(keys, issue, [&](int it, int read_stage) {
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
    const int start = keys.start(it);
    float score[4] = {sc[0][0], sc[0][1], sc[1][0], sc[1][1]};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = start + (i >= 2 ? 8 : 0) + 2 * t + (i & 1);
      if (key >= cta.key_end) score[i] = -INFINITY;
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
  });
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);

  AllowDependentLaunch();  // past the KV stream: only the combine and merge are left
  CpAsyncWait<0>();
  __syncthreads();
  const CombineSlots<kHeadDim, kGroup, Cfg> slots(smem);
#pragma unroll
  for (int n = 0; n < Shape::kDimTiles; ++n) {
    float* dst = slots.acc + (warp * kGroup + g) * kHeadDim + 8 * n + 2 * t;
    dst[0] = o[n][0];
    dst[1] = o[n][1];
  }
  if (t == 0) {
    slots.max[warp * kGroup + g] = row_max;
    slots.sum[warp * kGroup + g] = row_sum;
  }
  __syncthreads();
  FinishCta<kHeadDim, kGroup, Cfg>(p, ws, cta, slots.acc);
}

template <int kHeadDim, typename Cfg = DefaultConfig>
cudaError_t LaunchMma(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                      cudaStream_t stream) {
  return LaunchDecodeGrid(DecodeMmaKernel<kHeadDim, Cfg>, Cfg::kThreads,
                          MmaDecodeShape<kHeadDim, Cfg>::kSmemBytes, kMaxGroupPerCta, p, ws,
                          stream);
}

}  // namespace

cudaError_t LaunchDecodeMma(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                            cudaStream_t stream) {
  return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim, LaunchMma<kHeadDim>(p, ws, stream));
}

cudaError_t LaunchDecodeMmaShape(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                 int shape, cudaStream_t stream, const char** name) {
  if (p.cache.head_dim != 128) return cudaErrorInvalidValue;
  switch (shape) {
    case 0:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM (default)";
      return LaunchMma<128, DefaultConfig>(p, ws, stream);
    case 1:
      *name = "tensor cores, 8 warps, 3 stages, 1 CTA/SM";
      return LaunchMma<128, DecodeConfig<8, 3, 1>>(p, ws, stream);
    case 2:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM, L2::128B prefetch";
      return LaunchMma<128, DecodeConfig<4, 3, 2, 128>>(p, ws, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvd::cuda
