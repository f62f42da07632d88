// Decode attention on tensor cores for bf16 KV (decode_kernels.h), what
// LaunchDecodeAttention runs for bf16 caches.

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_common.cuh"
#include "kernels/cuda/decode_kernels.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/hopper_sync.cuh"
#include "kernels/cuda/kv_row_map.h"
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
using decode::kMaxGroupPerCta;
using decode::LaunchDecodeGrid;
using decode::PlanDecodeCta;
using decode::RunWarpPipeline;
using decode::WarpKeys;

// Tensor-core decode for bf16 KV (DecodeMmaKernel). The GQA group's query heads are rows
// 0-7 of an m16n8k16 tile (up to 8 live), so every warp iteration of 16 keys is a handful of
// MMAs instead of thousands of CUDA-core FMAs:
//   S[head][key] = Q K^T : Q as a bf16 high part plus a bf16 residual (~16 significant bits,
//                          as the prefill kernel's split mode): head g's high part is row g,
//                          its residual row g + 8, so one MMA multiplies both and the score
//                          is the sum of the two rows; K fragments by ldmatrix from the
//                          staged tile;
//   O += P V             : P split the same way (high part row g, residual row g + 8), V
//                          fragments by ldmatrix.trans; rows g and g + 8 of O are summed at
//                          the end.
// Staging: each iteration's K and V tiles are [16 keys][head_dim] bf16 in shared memory,
// 16-byte chunk c of key k stored at chunk c ^ (k % 8) of its row, so the eight rows an
// ldmatrix reads fall in distinct banks. Pipeline, splits and the end of the CTA are the
// CUDA-core kernel's.
// With Cfg::kTma (head_dim 128) the tiles are loaded as TMA boxes (kv_row_map.h) where the
// iteration's 16 keys lie in one block inside the view: lane 0 issues four 2 KB boxes (K and
// V, two 64-dim halves each) that complete on the stage's mbarrier, in place of the warp's 32
// cp.async per lane. The tiles are then laid out as the boxes land, in the TMA's 128-byte
// swizzle, as conflict-free for ldmatrix:
//
//   stage: | K dims 0-63 | K dims 64-127 | V dims 0-63 | V dims 64-127 |   2 KB each
//   half:  [16 keys][8 chunks of 16 bytes], chunk c of key k at position c ^ (k % 8)
//
// Keys past the end in a TMA box are whatever the block holds: their scores are masked and
// their V rows zeroed in the fragments. Other iterations go through cp.async (same layout),
// tracked on the same mbarrier.
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
  // TMA boxes land at 1024-byte aligned addresses (the swizzle's period): room to align.
  static constexpr int kAlignSlack = Cfg::kTma ? 1024 : 0;
  static constexpr int kSmemBytes = std::max(kPipelineBytes, kCombineBytes) + kAlignSlack;
  static_assert(!Cfg::kTma ||
                (kRowBytes == kKvRowBytes && kTileBytes == 2 * kKvBoxRows * kKvBoxRowBytes));

  // Byte offset of 16-byte chunk `chunk` of key `key` in a K or V tile.
  __device__ __forceinline__ static int TileOffset(int key, int chunk) {
    if constexpr (Cfg::kTma) {
      return (chunk >> 3) * kKvBoxRows * kKvBoxRowBytes + key * kKvBoxRowBytes +
             (((chunk & 7) ^ (key & 7)) << 4);
    } else {
      return key * kRowBytes + ((chunk ^ (key & 7)) << 4);
    }
  }
  static_assert(kCopiesPerLane * 32 == kKeysPerIter * kChunks);
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
};

// grid (num_kv_heads * subgroups, num_seqs, max_splits), Cfg::kThreads threads,
// MmaDecodeShape::kSmemBytes of dynamic shared memory; subgroups of kMaxGroupPerCta heads.
template <int kHeadDim, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    DecodeMmaKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                    int block_shift, const __grid_constant__ KvRowMap rows) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  constexpr int kGroup = kMaxGroupPerCta;
  constexpr int kWarps = Cfg::kWarps;
  constexpr int kStages = Cfg::kStages;
  constexpr int kKeysPerIter = Shape::kKeysPerIter;
  constexpr int kStageBytes = Shape::kStageBytes;
  constexpr int kTileBytes = Shape::kTileBytes;
  constexpr int kRowBytes = Shape::kRowBytes;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ uint64_t stage_full[Cfg::kTma ? kWarps : 1][kStages];  // kTma: [warp][stage]
  unsigned char* smem = smem_raw;
  if constexpr (Cfg::kTma) {
    const uint32_t raw = SharedAddress(smem_raw);
    smem += ((raw + 1023) & ~1023u) - raw;
  }

  DecodeCta cta;
  if (!PlanDecodeCta(p, ws, group, subgroups, kGroup, Shape::kSplitGranule, cta)) return;
  const KvCacheView& c = p.cache;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if constexpr (Cfg::kTma) {
    // Each warp's own barriers: one counted arrival (lane 0's) a phase.
    if (lane == 0) {
      for (int stage = 0; stage < kStages; ++stage) MbarrierInit(&stage_full[warp][stage], 1);
      FenceMbarrierInit();
    }
    __syncwarp();
  }
  const int g = lane / 4;  // fragment row: head g of the subgroup
  const int t = lane % 4;

  // Q fragments of each k-step, pre-scaled to base-2 logits and split: a0 and a2 (row g,
  // dims 2t, 2t+1 and 2t+8, 2t+9) the high parts of head g, a1 and a3 (row g + 8, the same
  // dims) the residuals. Dead heads are zero.
  uint32_t q_frag[Shape::kDimSteps][4];
  {
    const bool live = g < cta.heads;
    const float scale = live ? p.sm_scale * kLog2e : 0.0f;
    const float* q_head =
        p.q + int64_t{cta.q_row} * p.q_stride + int64_t{cta.head_base + (live ? g : 0)} * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      const float* x = q_head + 16 * ks + 2 * t;  // q_stride may be odd: scalar loads
      SplitBf16x2(x[0] * scale, x[1] * scale, q_frag[ks][0], q_frag[ks][1]);
      SplitBf16x2(x[8] * scale, x[9] * scale, q_frag[ks][2], q_frag[ks][3]);
    }
  }

  const WarpKeys<__nv_bfloat16, kKeysPerIter, kWarps> keys(cta, c, block_shift, warp, lane);
  const int block_mask = c.block_size - 1;
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;
  unsigned char* warp_smem = smem + warp * kStages * kStageBytes;
  // Whether iteration `it`'s K and V go through TMA, and the row of its first K row in the
  // view (kTma), else -1: the 16 keys lie in lane 0's block (blocks of 16 or more keys), and
  // both runs of 16 rows lie in the view, on its row grid. The same answer in every lane.
  const int64_t v_rows_after_k = v_minus_k / kRowBytes;
  const bool tma_shape =
      Cfg::kTma && rows.num_rows > 0 && c.block_size >= kKvBoxRows && v_minus_k % kRowBytes == 0;
  auto tma_row = [&](int it, const char* ptrs) -> int64_t {
    if (!tma_shape) return -1;
    const uint64_t k_row = reinterpret_cast<uint64_t>(ShflPtr(ptrs, 0)) +
                           uint64_t(keys.start(it) & block_mask) * kRowBytes;
    if (k_row < rows.base || (k_row - rows.base) % kRowBytes != 0) return -1;
    const int64_t row = static_cast<int64_t>((k_row - rows.base) / kRowBytes);
    const int64_t v_row = row + v_rows_after_k;
    const bool inside =
        row + kKvBoxRows <= rows.num_rows && v_row >= 0 && v_row + kKvBoxRows <= rows.num_rows;
    return inside ? row : -1;
  };
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < keys.num_iters()) {
      const int start = keys.start(it);
      unsigned char* k_dst = warp_smem + stage * kStageBytes;
      const int64_t row = Cfg::kTma ? tma_row(it, ptrs) : -1;
      if (row >= 0) {
        if (lane == 0) {
          uint64_t* bar = &stage_full[warp][stage];
          MbarrierArriveExpectTx(bar, kStageBytes);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            unsigned char* dst = k_dst + half * kKvBoxRows * kKvBoxRowBytes;
            TmaLoad2d(dst, &rows.map, half * kKvBoxElements, static_cast<int>(row), bar);
            TmaLoad2d(dst + kTileBytes, &rows.map, half * kKvBoxElements,
                      static_cast<int>(row + v_rows_after_k), bar);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < Shape::kCopiesPerLane; ++i) {
          const int q = lane + 32 * i;
          const int key_in_iter = q / Shape::kChunks;
          const int chunk = q % Shape::kChunks;
          const int key = start + key_in_iter;
          const char* src = ShflPtr(ptrs, key_in_iter >> block_shift) +
                            int64_t{key & block_mask} * kRowBytes + chunk * 16;
          unsigned char* dst = k_dst + Shape::TileOffset(key_in_iter, chunk);
          if constexpr (Cfg::kL2Prefetch > 0) {
            CpAsync16Prefetch<Cfg::kL2Prefetch>(dst, src, key < cta.key_end);
            CpAsync16Prefetch<Cfg::kL2Prefetch>(dst + kTileBytes, src + v_minus_k,
                                                key < cta.key_end);
          } else {
            CpAsync16(dst, src, key < cta.key_end);
            CpAsync16(dst + kTileBytes, src + v_minus_k, key < cta.key_end);
          }
        }
        if constexpr (Cfg::kTma) {
          // Every lane's copies join the phase before lane 0's counted arrival ends it.
          CpAsyncTrackOnMbarrier(&stage_full[warp][stage]);
          __syncwarp();
          if (lane == 0) MbarrierArrive(&stage_full[warp][stage]);
        }
      }
    }
    if constexpr (!Cfg::kTma) CpAsyncCommit();
  };

  float o[Shape::kDimTiles][4];
#pragma unroll
  for (int n = 0; n < Shape::kDimTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Head g's softmax base over the warp's keys so far (NextSoftmaxBase: the running max, up
  // to kRescaleSlack stale; the same across the quad).
  float row_max = -INFINITY;
  float row_sum = 0.0f;  // over this lane's keys, relative to row_max

  // ldmatrix row addresses within a tile: matrix lane / 8, row lane % 8.
  const int matrix = lane / 8;
  const int k_key = (matrix >= 2 ? 8 : 0) + lane % 8;  // K: m0, m1 keys 0-7; m2, m3 keys 8-15
  const int k_chunk_odd = matrix & 1;                  // K: m1, m3 the second 8 dims
  const int v_key = (matrix & 1) * 8 + lane % 8;       // V: m0, m2 keys 0-7; m1, m3 keys 8-15
  const int v_chunk_odd = matrix >> 1;                 // V: m2, m3 the second dim tile

  RunWarpPipeline<kStages>(keys, issue, [&](int it, int read_stage) {
    if constexpr (Cfg::kTma) {
      MbarrierWait(&stage_full[warp][read_stage], (it / kStages) & 1);
    } else {
      __syncwarp();  // other lanes' copies of this stage have landed too
    }

    const unsigned char* k_tile = warp_smem + read_stage * kStageBytes;
    const unsigned char* v_tile = k_tile + kTileBytes;
    // S for keys 0-7 (sc[0]) and 8-15 (sc[1]), even and odd k-steps apart (two shorter
    // chains of dependent MMAs); in each, c0 and c1 the high parts' products, c2 and c3 the
    // residuals'.
    float sc[2][2][4] = {};
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      uint32_t b[4];
      const int chunk = 2 * ks + k_chunk_odd;
      LdMatrixX4<false>(b, k_tile + Shape::TileOffset(k_key, chunk));
      MmaBf16(sc[0][ks & 1], q_frag[ks], b[0], b[1]);
      MmaBf16(sc[1][ks & 1], q_frag[ks], b[2], b[3]);
    }
    // This lane's scores: head g, keys 2t, 2t+1, 8+2t, 9+2t of the iteration; keys past
    // the split only in its last iteration (the same answer in every lane).
    const int start = keys.start(it);
    const bool tail = start + kKeysPerIter > cta.key_end;
    float score[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float* even = sc[i / 2][0];
      const float* odd = sc[i / 2][1];
      score[i] = (even[i & 1] + even[2 + (i & 1)]) + (odd[i & 1] + odd[2 + (i & 1)]);
    }
    if (tail) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = start + (i >= 2 ? 8 : 0) + 2 * t + (i & 1);
        if (key >= cta.key_end) score[i] = -INFINITY;
      }
    }
    float iter_max = fmaxf(fmaxf(score[0], score[1]), fmaxf(score[2], score[3]));
    iter_max = fmaxf(iter_max, __shfl_xor_sync(0xffffffffu, iter_max, 1));
    iter_max = fmaxf(iter_max, __shfl_xor_sync(0xffffffffu, iter_max, 2));
    // The running base (tensor_core.cuh), finite: the iteration has a live key.
    const float new_max = NextSoftmaxBase(row_max, iter_max);
    const float rescale = FastExp2(row_max - new_max);  // 0 on the first iteration
    row_max = new_max;
    float prob[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) prob[i] = FastExp2(score[i] - new_max);
    row_sum = row_sum * rescale + ((prob[0] + prob[1]) + (prob[2] + prob[3]));
    // O only when some head's base moved (else every rescale is exactly 1), which after the
    // first iterations is rare.
    if (__any_sync(0xffffffffu, rescale != 1.0f)) {
#pragma unroll
      for (int n = 0; n < Shape::kDimTiles; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) o[n][r] *= rescale;
      }
    }
    // P as the A operand: a0 (row g, keys 2t, 2t+1) and a2 (row g, keys 2t+8, 2t+9) the high
    // parts, a1 and a3 (row g + 8) the residuals; masked keys have probability 0 and V rows
    // of zeros (zero-filled copies, or zeroed in the fragments).
    uint32_t p_frag[4];
    SplitBf16x2(prob[0], prob[1], p_frag[0], p_frag[1]);
    SplitBf16x2(prob[2], prob[3], p_frag[2], p_frag[3]);
    // kTma: V rows past the end may hold anything (NaN times probability 0 is NaN): zero
    // them in the fragments, whose registers hold keys 2t, 2t+1 (b0, b2) and 8+2t, 9+2t
    // (b1, b3), the lower key in the low half.
    uint32_t v_mask[2] = {0xffffffffu, 0xffffffffu};
    const bool mask_v = Cfg::kTma && tail;
    if (mask_v) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = start + 8 * j + 2 * t;
        v_mask[j] =
            (key < cta.key_end ? 0x0000ffffu : 0u) | (key + 1 < cta.key_end ? 0xffff0000u : 0u);
      }
    }
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; n += 2) {
      uint32_t b[4];
      const int chunk = n + v_chunk_odd;
      LdMatrixX4<true>(b, v_tile + Shape::TileOffset(v_key, chunk));
      if (mask_v) {
#pragma unroll
        for (int r = 0; r < 4; ++r) b[r] &= v_mask[r & 1];
      }
      MmaBf16(o[n], p_frag, b[0], b[1]);
      MmaBf16(o[n + 1], p_frag, b[2], b[3]);
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
    dst[0] = o[n][0] + o[n][2];  // rows g and g + 8: the high parts' and residuals' products
    dst[1] = o[n][1] + o[n][3];
  }
  if (t == 0) {
    slots.max[warp * kGroup + g] = row_max;
    slots.sum[warp * kGroup + g] = row_sum;
  }
  __syncthreads();
  FinishCta<kHeadDim, kGroup, Cfg>(p, ws, cta, slots.acc);
}

// The TMA variant of the default shape: what LaunchDecodeMma runs at head_dim 128 when a
// KvRowMap is given.
using TmaConfig = DecodeConfig<4, 3, 2, 0, true>;

template <int kHeadDim, typename Cfg = DefaultConfig>
cudaError_t LaunchMma(const PagedAttentionParams& p, const DecodeWorkspace& ws, cudaStream_t stream,
                      const KvRowMap* rows_map) {
  static const KvRowMap kNoRows{};
  return LaunchDecodeGrid(DecodeMmaKernel<kHeadDim, Cfg>, Cfg::kThreads,
                          MmaDecodeShape<kHeadDim, Cfg>::kSmemBytes, kMaxGroupPerCta, p, ws, stream,
                          rows_map != nullptr ? *rows_map : kNoRows);
}

}  // namespace

cudaError_t LaunchDecodeMma(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                            cudaStream_t stream, const KvRowMap* rows_map) {
  if (p.cache.head_dim == 128 && rows_map != nullptr && rows_map->num_rows > 0) {
    return LaunchMma<128, TmaConfig>(p, ws, stream, rows_map);
  }
  return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim,
                               LaunchMma<kHeadDim>(p, ws, stream, nullptr));
}

cudaError_t LaunchDecodeMmaShape(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                 int shape, const KvRowMap* rows_map, cudaStream_t stream,
                                 const char** name) {
  if (p.cache.head_dim != 128) return cudaErrorInvalidValue;
  switch (shape) {
    case 0:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM";
      return LaunchMma<128, DefaultConfig>(p, ws, stream, nullptr);
    case 1:
      *name = "tensor cores, 8 warps, 3 stages, 1 CTA/SM";
      return LaunchMma<128, DecodeConfig<8, 3, 1>>(p, ws, stream, nullptr);
    case 2:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM, L2::128B prefetch";
      return LaunchMma<128, DecodeConfig<4, 3, 2, 128>>(p, ws, stream, nullptr);
    case 3:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM, TMA boxes";
      if (rows_map == nullptr || rows_map->num_rows == 0) return cudaErrorInvalidValue;
      return LaunchMma<128, TmaConfig>(p, ws, stream, rows_map);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvd::cuda
