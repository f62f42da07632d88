// The kBf16 tensor-core prefill kernel of prefill_attention_mma.h: 128-row work items, four
// warps of 32 rows (two m16 tiles), Q in shared memory, a work counter.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/prefill_attention_mma.h"
#include "kernels/cuda/prefill_common.cuh"
#include "kernels/cuda/tensor_core.cuh"

namespace kvd::cuda {
namespace {

using prefill::Item;
using prefill::ItemOf;
using prefill::LoadKvTile;
using prefill::Swizzled;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kWarpRows = 32;  // two m16 tiles per warp
constexpr int kRows = kWarps * kWarpRows;
constexpr int kCtasPerSm = 2;
constexpr int kStages = 3;  // K/V tiles in shared memory
static_assert(kRows == MmaPrefillTileRows(MmaPrecision::kBf16));

// Shared memory, bf16: K tiles [kStages][kKeys][kHeadDim], V tiles likewise, then the Q tile
// [kRows][kHeadDim], every one Swizzled (prefill_common.cuh).
template <int kHeadDim>
struct WideShape {
  // Keys per K/V tile: with head_dim 128, O already takes 128 registers a thread and a 64-key
  // S another 64, which spills; 32 keys fit.
  static constexpr int kKeys = kHeadDim == 128 ? 32 : 64;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kTileElems = kKeys * kHeadDim;
  static constexpr int kQElems = kRows * kHeadDim;
  static constexpr int kSmemBytes = (2 * kStages * kTileElems + kQElems) * 2;  // 80 KB at d128
  static constexpr int kQRounds = kRows * kChunks / kThreads;
  static constexpr int kDimSteps = kHeadDim / 16;  // k-steps of Q K^T, pairs of O n-tiles
  static constexpr int kDimTiles = kHeadDim / 8;   // n-tiles of O
  static_assert(kQRounds * kThreads == kRows * kChunks);
};

// Grid of any size of kThreads-thread CTAs with WideShape::kSmemBytes of dynamic shared
// memory; a programmatic dependent of the planning kernel that writes tile_indptr.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    PrefillWideKernel(PagedAttentionParams p, int32_t* tile_indptr, int block_shift) {
  using Shape = WideShape<kHeadDim>;
  constexpr int kDimSteps = Shape::kDimSteps;
  constexpr int kDimTiles = Shape::kDimTiles;
  constexpr int kChunks = Shape::kChunks;
  constexpr int kKeys = Shape::kKeys;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_item;
  __nv_bfloat16* s_k = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* s_v = s_k + kStages * Shape::kTileElems;
  __nv_bfloat16* s_q = s_v + kStages * Shape::kTileElems;

  const KvCacheView& c = p.cache;
  const int num_seqs = p.blocks.num_seqs;
  const int group = p.num_q_heads / c.num_kv_heads;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;  // fragment row
  const int t = lane % 4;  // fragment column pair
  const float q_scale = p.sm_scale * kLog2e;
  const bool q_aligned = RowsAligned<float4>(p.q, p.q_stride);  // Q chunks as 16-byte loads
  // ldmatrix row/chunk offsets of this lane: A operand (Q, 16x16), K as B (two 8-key
  // n-tiles x 16 dims), V as B through .trans (16 keys x two 8-dim n-tiles).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_chunk = lane >> 4;
  const int k_row = (lane & 7) + ((lane >> 4) & 1) * 8;
  const int k_chunk = (lane >> 3) & 1;
  const int v_row = a_row;
  const int v_chunk = a_chunk;

  cudaGridDependencySynchronize();  // tile_indptr is written by the planning kernel
  const int total_items = tile_indptr[num_seqs];
  if (total_items == 0) return;
  int32_t* work_counter = tile_indptr;  // [0]: offset 0 by definition, never read as one

  for (;;) {
    if (threadIdx.x == 0) s_item = atomicAdd(work_counter, 1);
    __syncthreads();  // also: the previous item is done with shared memory
    const int item = s_item;
    // Every thread has read s_item before thread 0 may write the next: an item with no key
    // tiles reaches no other barrier.
    __syncthreads();
    if (item >= total_items) break;
    const Item it = ItemOf<kRows, kKeys>(p, tile_indptr, item, group);
    const int warp_row0 = it.tile_row0 + warp * kWarpRows;
    const int first_pos = it.kv_len - it.q_len;  // position of token 0

    // Keys at or past it.key_end are visible to no row of the tile (not loaded), at or past
    // warp_key_end to no row of this warp (not computed); keys below warp_unmasked_end are
    // visible to every row of the warp. Rows past the end repeat the last row's limits.
    const int warp_key_end =
        p.causal ? first_pos + min(it.packed_rows - 1, warp_row0 + kWarpRows - 1) / group + 1
                 : it.kv_len;
    const int warp_unmasked_end =
        p.causal ? first_pos + min(it.packed_rows - 1, warp_row0) / group + 1 : it.kv_len;
    int row_key_end[2][2];  // [m tile][half]: rows warp_row0 + 16 m + g + 8 half
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = min(it.packed_rows - 1, warp_row0 + 16 * m + g + 8 * half);
        row_key_end[m][half] = p.causal ? first_pos + r / group + 1 : it.kv_len;
      }
    }

    // Q tile -> bf16, scaled to base-2 logits; rows past the end are zeros (never written
    // out). Ordinary stores, read by ldmatrix after the first tile's barrier. In batches of
    // eight rounds, a loop not unrolled (unrolled, at head_dim 128, it spills registers).
    constexpr int kQPart = 8;
    static_assert(Shape::kQRounds % kQPart == 0);
#pragma unroll 1
    for (int part = 0; part < Shape::kQRounds / kQPart; ++part) {
      StageScaledQ<kQPart>(
          q_aligned, q_scale,
          [&](int round, bool& live) {
            const int index = (part * kQPart + round) * kThreads + threadIdx.x;
            return PackedQChunk<kHeadDim>(p, it.q_begin, it.tile_row0 + index / kChunks,
                                          it.packed_rows, group, it.kv_head, index % kChunks, live);
          },
          [&](int round, uint4 bits) {
            const int index = (part * kQPart + round) * kThreads + threadIdx.x;
            *reinterpret_cast<uint4*>(s_q + Swizzled<kHeadDim>(index / kChunks, index % kChunks)) =
                bits;
          });
    }

    const int num_key_tiles = it.num_key_tiles;
    // K/V tile kt into buffer `buf` (past the last tile, none: an empty group keeps the group
    // count in step).
    auto load_tile = [&](int kt, int buf) {
      if (kt < num_key_tiles) {
        LoadKvTile<kHeadDim, kKeys, kThreads>(c, it.seq_blocks, block_shift, it.kv_head, kt,
                                              it.key_end, s_k + buf * Shape::kTileElems,
                                              s_v + buf * Shape::kTileElems);
      }
      CpAsyncCommit();
    };

    // O of the warp's two m16 tiles. Two arrays, not one [2][...]: a 512-byte array is not
    // promoted to registers (it would live in local memory).
    float o0[kDimTiles][4];
    float o1[kDimTiles][4];
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o0[n][e] = o1[n][e] = 0.0f;
    }
    float row_max[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float row_sum[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // this thread's columns only

    const __nv_bfloat16* q_warp = s_q + warp * kWarpRows * kHeadDim;
    // Pipeline: tiles kt + 1 .. kt + kStages - 1 in flight while tile kt is computed. The
    // barrier at the top of iteration kt follows every warp's reads of tile kt - 1, so the
    // copies issued after it may refill that tile's buffer.
#pragma unroll
    for (int kt = 0; kt < kStages - 1; ++kt) load_tile(kt, kt);
    int buf = 0;  // kt % kStages
    for (int kt = 0; kt < num_key_tiles; ++kt) {
      CpAsyncWait<kStages - 2>();  // this thread's copies of tile kt have landed
      __syncthreads();             // everyone's have, the Q tile is stored, tile kt - 1 is consumed
      load_tile(kt + kStages - 1, buf == 0 ? kStages - 1 : buf - 1);
      const int key0 = kt * kKeys;
      if (key0 < warp_key_end) {
        const __nv_bfloat16* k_tile = s_k + buf * Shape::kTileElems;
        const __nv_bfloat16* v_tile = s_v + buf * Shape::kTileElems;

        // S = Q K^T: sc[m][n] is the 16x8 block of rows 16 m .. and keys 8n .. 8n+7.
        float sc[2][kKeys / 8][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
          for (int n = 0; n < kKeys / 8; ++n) {
            sc[m][n][0] = sc[m][n][1] = sc[m][n][2] = sc[m][n][3] = 0.0f;
          }
        }
        // Not unrolled: an unrolled loop lets the compiler hoist every Q fragment, which
        // does not fit beside O and S in 255 registers.
#pragma unroll 1
        for (int kk = 0; kk < kDimSteps; ++kk) {
          uint32_t qa[2][4];
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            // Rows of a warp's Q are rows of the tile: row & 7 is the swizzle key either way.
            LdMatrixX4<false>(qa[m], q_warp + Swizzled<kHeadDim>(16 * m + a_row, 2 * kk + a_chunk));
          }
#pragma unroll
          for (int j = 0; j < kKeys / 16; ++j) {
            uint32_t b[4];
            LdMatrixX4<false>(b, k_tile + Swizzled<kHeadDim>(16 * j + k_row, 2 * kk + k_chunk));
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              MmaBf16(sc[m][2 * j], qa[m], b[0], b[1]);
              MmaBf16(sc[m][2 * j + 1], qa[m], b[2], b[3]);
            }
          }
        }

        if (key0 + kKeys > warp_unmasked_end) {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int key = key0 + 8 * n + 2 * t + (e & 1);
                if (key >= row_key_end[m][e >> 1]) sc[m][n][e] = -INFINITY;
              }
            }
          }
        }

        // Online softmax per row; a row's four threads (one quad) share its max.
        float rescale[2][2];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          float base[2];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float tile_max = -INFINITY;
#pragma unroll
            for (int n = 0; n < kKeys / 8; ++n) {
              tile_max = fmaxf(tile_max, fmaxf(sc[m][n][2 * half], sc[m][n][2 * half + 1]));
            }
            base[half] = OnlineSoftmaxStep</*kFastExp2=*/false>(
                tile_max, row_max[m][half], row_sum[m][half], rescale[m][half]);
          }
#pragma unroll
          for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              sc[m][n][e] = exp2f(sc[m][n][e] - base[e >> 1]);
              row_sum[m][e >> 1] += sc[m][n][e];
            }
          }
        }

#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            o0[n][e] *= rescale[0][e >> 1];
            o1[n][e] *= rescale[1][e >> 1];
          }
        }

        // O += P V, 16 keys per k-step; P's A fragments come straight from the S layout.
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          uint32_t pa[2][4];
#pragma unroll
          for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int reg = 0; reg < 4; ++reg) {
              const float* pair = &sc[m][2 * kk + (reg >> 1)][2 * (reg & 1)];
              pa[m][reg] = PackBf16x2(pair[0], pair[1]);
            }
          }
#pragma unroll
          for (int j = 0; j < kDimSteps; ++j) {
            uint32_t b[4];
            LdMatrixX4<true>(b, v_tile + Swizzled<kHeadDim>(16 * kk + v_row, 2 * j + v_chunk));
            MmaBf16(o0[2 * j], pa[0], b[0], b[1]);
            MmaBf16(o0[2 * j + 1], pa[0], b[2], b[3]);
            MmaBf16(o1[2 * j], pa[1], b[0], b[1]);
            MmaBf16(o1[2 * j + 1], pa[1], b[2], b[3]);
          }
        }
      }
      buf = buf == kStages - 1 ? 0 : buf + 1;
    }
    CpAsyncWait<0>();  // only empty groups are left; none may outlive the item's buffers

    auto store_rows = [&](const float(&om)[kDimTiles][4], int m) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float sum = row_sum[m][half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int packed = warp_row0 + 16 * m + g + 8 * half;
        if (packed >= it.packed_rows) continue;
        const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
        float* out =
            p.out + PackedRowOffset<kHeadDim>(it.q_begin, packed, group, it.kv_head, p.out_stride);
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          out[8 * n + 2 * t] = om[n][2 * half] * inv_sum;
          out[8 * n + 2 * t + 1] = om[n][2 * half + 1] * inv_sum;
        }
      }
    };
    store_rows(o0, 0);
    store_rows(o1, 1);
  }
}

template <int kHeadDim>
cudaError_t Launch(const PagedAttentionParams& p, int32_t* tile_indptr, int max_ctas,
                   cudaStream_t stream) {
  constexpr int kSmemBytes = WideShape<kHeadDim>::kSmemBytes;
  auto* kernel = PrefillWideKernel<kHeadDim>;
  if (cudaError_t err = AllowDynamicSmem(kernel, kSmemBytes); err != cudaSuccess) {
    return err;
  }
  // Programmatic dependent launch: the grid is set up while the planning kernel runs and
  // waits in cudaGridDependencySynchronize for its tile_indptr.
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  return LaunchDependent(kernel, dim3(max_ctas), dim3(kThreads), kSmemBytes, stream, p,
                         tile_indptr, block_shift);
}

}  // namespace

cudaError_t LaunchPrefillAttentionWide(const PagedAttentionParams& p, int32_t* tile_indptr,
                                       int max_ctas, cudaStream_t stream) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (p.cache.dtype != DType::kBF16 || max_ctas < 1) return cudaErrorInvalidValue;
  return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim,
                               Launch<kHeadDim>(p, tile_indptr, max_ctas, stream));
}

}  // namespace kvd::cuda
