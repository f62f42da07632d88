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
  static_assert(!Cfg::kTma || (kRowBytes == kKvRowBytes && kKvBoxRowBytes == 128 &&
                               kTileBytes == 2 * kKvBoxRows * kKvBoxRowBytes));

  // Byte offset of 16-byte chunk `chunk` of key `key` in a K or V tile.
  __device__ __forceinline__ static int TileOffset(int key, int chunk) {
    if constexpr (Cfg::kTma) {
      return Swizzle128Offset(key, chunk, kKvBoxRows);
    } else {
      return key * kRowBytes + ((chunk ^ (key & 7)) << 4);
    }
  }
  static_assert(kCopiesPerLane * 32 == kKeysPerIter * kChunks);
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
};

// One warp's share of the tensor-core decode math: its query heads' Q fragments, O
// accumulators and softmax state, fed one staged iteration of kKeysPerIter keys at a time.
template <int kHeadDim, typename Cfg>
struct MmaWarpMath {
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  static constexpr int kKeysPerIter = Shape::kKeysPerIter;

  // Loads the Q fragments of heads [head_base, head_base + heads) of query row q_row.
  __device__ __forceinline__ MmaWarpMath(const PagedAttentionParams& p, int q_row, int head_base,
                                         int heads, int lane)
      : g(lane / 4), t(lane % 4) {
    // Q fragments of each k-step, pre-scaled to base-2 logits and split: a0 and a2 (row g,
    // dims 2t, 2t+1 and 2t+8, 2t+9) the high parts of head g, a1 and a3 (row g + 8, the same
    // dims) the residuals. Dead heads are zero.
    const bool live = g < heads;
    const float scale = live ? p.sm_scale * kLog2e : 0.0f;
    const float* q_head =
        p.q + int64_t{q_row} * p.q_stride + int64_t{head_base + (live ? g : 0)} * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      const float* x = q_head + 16 * ks + 2 * t;  // q_stride may be odd: scalar loads
      SplitBf16x2(x[0] * scale, x[1] * scale, q_frag[ks][0], q_frag[ks][1]);
      SplitBf16x2(x[8] * scale, x[9] * scale, q_frag[ks][2], q_frag[ks][3]);
    }
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // ldmatrix row addresses within a tile: matrix lane / 8, row lane % 8.
    const int matrix = lane / 8;
    k_key = (matrix >= 2 ? 8 : 0) + lane % 8;  // K: m0, m1 keys 0-7; m2, m3 keys 8-15
    k_chunk_odd = matrix & 1;                  // K: m1, m3 the second 8 dims
    v_key = (matrix & 1) * 8 + lane % 8;       // V: m0, m2 keys 0-7; m1, m3 keys 8-15
    v_chunk_odd = matrix >> 1;                 // V: m2, m3 the second dim tile
  }

  // Keys [start, start + kKeysPerIter) staged at k_tile (V a tile later); keys at or past
  // key_end are masked. At least one key is below key_end.
  __device__ __forceinline__ void Consume(const unsigned char* k_tile, int start, int key_end) {
    const unsigned char* v_tile = k_tile + Shape::kTileBytes;
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
    // the end only in a range's last iteration (the same answer in every lane).
    const bool tail = start + kKeysPerIter > key_end;
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
        if (key >= key_end) score[i] = -INFINITY;
      }
    }
    // Head g's row is a quad of lanes, as an accumulator row of the prefill kernels; rescale
    // is 0 on the first iteration (which has a live key).
    float rescale;
    const float base = OnlineSoftmaxStep</*kFastExp2=*/true>(
        fmaxf(fmaxf(score[0], score[1]), fmaxf(score[2], score[3])), row_max, row_sum, rescale);
    float prob[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) prob[i] = FastExp2(score[i] - base);
    row_sum += (prob[0] + prob[1]) + (prob[2] + prob[3]);
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
        v_mask[j] = (key < key_end ? 0x0000ffffu : 0u) | (key + 1 < key_end ? 0xffff0000u : 0u);
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
  }

  // After the last Consume: this lane's row sum over the quad's keys.
  __device__ __forceinline__ void ReduceSum() {
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
  }

  // Leaves the warp's results in its CombineSlots entries (FinishCta combines the warps).
  template <typename Slots>
  __device__ __forceinline__ void Store(const Slots& slots, int warp) const {
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; ++n) {
      float* dst = slots.acc + (warp * kMaxGroupPerCta + g) * kHeadDim + 8 * n + 2 * t;
      dst[0] = o[n][0] + o[n][2];  // rows g and g + 8: the high parts' and residuals' products
      dst[1] = o[n][1] + o[n][3];
    }
    if (t == 0) {
      slots.max[warp * kMaxGroupPerCta + g] = row_max;
      slots.sum[warp * kMaxGroupPerCta + g] = row_sum;
    }
  }

  int g;  // fragment row: head g of the subgroup
  int t;
  int k_key, k_chunk_odd, v_key, v_chunk_odd;
  uint32_t q_frag[Shape::kDimSteps][4];
  float o[Shape::kDimTiles][4];
  // Head g's softmax base over the warp's keys so far (NextSoftmaxBase: the running max, up
  // to kRescaleSlack stale; the same across the quad).
  float row_max = -INFINITY;
  float row_sum = 0.0f;  // over this lane's keys, relative to row_max
};

// Stages a warp's iterations: K and V of 16 keys into one of its pipeline buffers, as TMA
// boxes where they can go (Cfg::kTma; see MmaDecodeShape) and by cp.async otherwise.
template <int kHeadDim, typename Cfg>
struct MmaStageLoader {
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  static constexpr int kRowBytes = Shape::kRowBytes;

  __device__ __forceinline__ MmaStageLoader(const KvCacheView& c, const KvRowMap& rows,
                                            int block_shift, unsigned char* warp_smem,
                                            uint64_t* stage_full, int lane)
      : rows_(rows),
        block_shift_(block_shift),
        block_mask_(c.block_size - 1),
        v_minus_k_(c.v_offset_bytes - c.k_offset_bytes),
        v_rows_after_k_(v_minus_k_ / kRowBytes),
        tma_shape_(Cfg::kTma && rows.num_rows > 0 && c.block_size >= kKvBoxRows &&
                   v_minus_k_ % kRowBytes == 0),
        warp_smem_(warp_smem),
        stage_full_(stage_full),
        lane_(lane) {}

  // Stage `stage`'s K tile (V a tile later).
  __device__ __forceinline__ unsigned char* Tile(int stage) const {
    return warp_smem_ + stage * Shape::kStageBytes;
  }

  // Keys [start, start + 16) of the sequence, `ptrs` lane j's K head pointer of the j-th
  // block they touch (WarpKeys::BlockPtrs), into `stage`; keys at or past key_end are zeros
  // or (TMA) whatever their block holds. kTma: completes on the stage's barrier; else the
  // caller commits the cp.async group.
  __device__ __forceinline__ void Issue(int start, const char* ptrs, int key_end, int stage) const {
    unsigned char* k_dst = Tile(stage);
    const int64_t row = Cfg::kTma ? TmaRow(start, ptrs) : -1;
    if (row >= 0) {
      if (lane_ == 0) {
        uint64_t* bar = &stage_full_[stage];
        MbarrierArriveExpectTx(bar, Shape::kStageBytes);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          unsigned char* dst = k_dst + half * kKvBoxRows * kKvBoxRowBytes;
          TmaLoad2d(dst, &rows_.map, half * kKvBoxElements, static_cast<int>(row), bar);
          TmaLoad2d(dst + Shape::kTileBytes, &rows_.map, half * kKvBoxElements,
                    static_cast<int>(row + v_rows_after_k_), bar);
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < Shape::kCopiesPerLane; ++i) {
      const int q = lane_ + 32 * i;
      const int key_in_iter = q / Shape::kChunks;
      const int chunk = q % Shape::kChunks;
      const int key = start + key_in_iter;
      const char* src = ShflPtr(ptrs, key_in_iter >> block_shift_) +
                        int64_t{key & block_mask_} * kRowBytes + chunk * 16;
      unsigned char* dst = k_dst + Shape::TileOffset(key_in_iter, chunk);
      if constexpr (Cfg::kL2Prefetch > 0) {
        CpAsync16Prefetch<Cfg::kL2Prefetch>(dst, src, key < key_end);
        CpAsync16Prefetch<Cfg::kL2Prefetch>(dst + Shape::kTileBytes, src + v_minus_k_,
                                            key < key_end);
      } else {
        CpAsync16(dst, src, key < key_end);
        CpAsync16(dst + Shape::kTileBytes, src + v_minus_k_, key < key_end);
      }
    }
    if constexpr (Cfg::kTma) {
      // Every lane's copies join the phase before lane 0's counted arrival ends it.
      CpAsyncTrackOnMbarrier(&stage_full_[stage]);
      __syncwarp();
      if (lane_ == 0) MbarrierArrive(&stage_full_[stage]);
    }
  }

 private:
  // The view row of the iteration's first K row when its K and V go through TMA, else -1:
  // the 16 keys lie in lane 0's block (blocks of 16 or more keys), and both runs of 16 rows
  // lie in the view, on its row grid. The same answer in every lane.
  __device__ __forceinline__ int64_t TmaRow(int start, const char* ptrs) const {
    if (!tma_shape_) return -1;
    const uint64_t k_row =
        reinterpret_cast<uint64_t>(ShflPtr(ptrs, 0)) + uint64_t(start & block_mask_) * kRowBytes;
    if (k_row < rows_.base || (k_row - rows_.base) % kRowBytes != 0) return -1;
    const int64_t row = static_cast<int64_t>((k_row - rows_.base) / kRowBytes);
    const int64_t v_row = row + v_rows_after_k_;
    const bool inside =
        row + kKvBoxRows <= rows_.num_rows && v_row >= 0 && v_row + kKvBoxRows <= rows_.num_rows;
    return inside ? row : -1;
  }

  const KvRowMap& rows_;
  int block_shift_;
  int block_mask_;
  int64_t v_minus_k_;
  int64_t v_rows_after_k_;
  bool tma_shape_;
  unsigned char* warp_smem_;
  uint64_t* stage_full_;  // kTma: the warp's [kStages] barriers
  int lane_;
};

// The shared memory of a decode CTA: the warps' pipeline buffers (kTma: 1024-byte aligned),
// and kTma's per-warp, per-stage barriers, each initialized to one counted arrival a phase.
template <typename Cfg>
__device__ __forceinline__ unsigned char* DecodeSmem(unsigned char* smem_raw,
                                                     uint64_t (*stage_full)[Cfg::kStages], int warp,
                                                     int lane) {
  unsigned char* smem = smem_raw;
  if constexpr (Cfg::kTma) {
    smem += PadTo1024(SharedAddress(smem_raw));
    if (lane == 0) {
      for (int stage = 0; stage < Cfg::kStages; ++stage) MbarrierInit(&stage_full[warp][stage], 1);
      FenceMbarrierInit();
    }
    __syncwarp();
  }
  return smem;
}

// grid (num_kv_heads * subgroups, num_seqs, max_splits), Cfg::kThreads threads,
// MmaDecodeShape::kSmemBytes of dynamic shared memory; subgroups of kMaxGroupPerCta heads.
template <int kHeadDim, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    DecodeMmaKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                    int block_shift, const __grid_constant__ KvRowMap rows) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  constexpr int kGroup = kMaxGroupPerCta;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ uint64_t stage_full[Cfg::kTma ? Cfg::kWarps : 1][kStages];  // kTma: [warp][stage]

  DecodeCta cta;
  if (!PlanDecodeCta(p, ws, group, subgroups, kGroup, Shape::kSplitGranule, cta)) return;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  unsigned char* smem = DecodeSmem<Cfg>(smem_raw, stage_full, warp, lane);

  MmaWarpMath<kHeadDim, Cfg> math(p, cta.q_row, cta.head_base, cta.heads, lane);
  const WarpKeys<__nv_bfloat16, Shape::kKeysPerIter, Cfg::kWarps> keys(cta, p.cache, block_shift,
                                                                       warp, lane);
  const MmaStageLoader<kHeadDim, Cfg> loader(p.cache, rows, block_shift,
                                             smem + warp * kStages * Shape::kStageBytes,
                                             stage_full[Cfg::kTma ? warp : 0], lane);
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < keys.num_iters()) loader.Issue(keys.start(it), ptrs, cta.key_end, stage);
    if constexpr (!Cfg::kTma) CpAsyncCommit();
  };
  RunWarpPipeline<kStages>(keys, issue, [&](int it, int read_stage) {
    if constexpr (Cfg::kTma) {
      MbarrierWait(&stage_full[warp][read_stage], (it / kStages) & 1);
    } else {
      __syncwarp();  // other lanes' copies of this stage have landed too
    }
    math.Consume(loader.Tile(read_stage), keys.start(it), cta.key_end);
  });
  math.ReduceSum();

  AllowDependentLaunch();  // past the KV stream: only the combine and merge are left
  CpAsyncWait<0>();
  __syncthreads();
  const CombineSlots<kHeadDim, kGroup, Cfg> slots(smem);
  math.Store(slots, warp);
  __syncthreads();
  FinishCta<kHeadDim, kGroup, Cfg>(p, ws, cta, slots.acc);
}

// The TMA variant of the default shape: what LaunchDecodeMma runs at head_dim 128 when a
// KvRowMap is given.
using TmaConfig = DecodeConfig<DefaultConfig::kWarps, DefaultConfig::kStages,
                               DefaultConfig::kCtasPerSm, /*kL2PrefetchT=*/0, /*kTmaT=*/true>;

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
  if (p.cache.head_dim == 128 && HasRows(rows_map)) {
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
      if (!HasRows(rows_map)) return cudaErrorInvalidValue;
      return LaunchMma<128, TmaConfig>(p, ws, stream, rows_map);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvd::cuda
