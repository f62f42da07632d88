#include <cuda_bf16.h>

#include <algorithm>
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
constexpr int kRows = MmaPrefillTileRows(MmaPrecision::kSplit);  // 16 per warp
constexpr int kKeys = 64;                                        // keys per K/V tile
static_assert(kRows == 16 * kWarps);

// Shared memory: K tiles [2][kKeys][kHeadDim] then V tiles [2][kKeys][kHeadDim], bf16 and
// Swizzled (prefill_common.cuh), then Q residual fragments [kHeadDim / 16][kThreads] of uint4
// (a thread reads only its own).
template <int kHeadDim>
struct MmaShape {
  static constexpr int kTileElems = kKeys * kHeadDim;
  static constexpr int kDimStepsQ = kHeadDim / 16;
  // K and V double-buffered, then (split precision) each thread's Q residual fragments.
  static constexpr int kSmemBytes = 4 * kTileElems * 2 + kDimStepsQ * kThreads * 16;
  static constexpr int kDimSteps = kHeadDim / 16;  // k-steps of Q K^T, pairs of O n-tiles
  static constexpr int kDimTiles = kHeadDim / 8;   // n-tiles of O
};

// Persistent grid of kThreads-thread CTAs with MmaShape::kSmemBytes of dynamic shared memory.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    PrefillMmaKernel(PagedAttentionParams p, const int32_t* tile_indptr, int block_shift) {
  using Shape = MmaShape<kHeadDim>;
  constexpr int kDimSteps = Shape::kDimSteps;
  constexpr int kDimTiles = Shape::kDimTiles;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* s_k = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* s_v = s_k + 2 * Shape::kTileElems;
  uint4* s_q_lo = reinterpret_cast<uint4*>(s_v + 2 * Shape::kTileElems);  // [kDimSteps][kThreads]

  const KvCacheView& c = p.cache;
  const int num_seqs = p.blocks.num_seqs;
  const int group = p.num_q_heads / c.num_kv_heads;
  const int total_items = tile_indptr[num_seqs];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;  // fragment row
  const int t = lane % 4;  // fragment column pair
  const float q_scale = p.sm_scale * kLog2e;

  for (int item = blockIdx.x; item < total_items; item += gridDim.x) {
    const Item it = ItemOf<kRows, kKeys>(p, tile_indptr, item, group);
    // Keys below unmasked_end are visible to every row of the tile.
    const int unmasked_end = p.causal ? it.kv_len - it.q_len + it.tile_row0 / group + 1 : it.kv_len;

    // This thread's two fragment rows (g and g + 8 of its warp); rows past the end repeat
    // the last one and are not written.
    int row_key_end[2];
    const float* q_rows[2];
    bool live[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int packed = it.tile_row0 + warp * 16 + g + 8 * half;
      live[half] = packed < it.packed_rows;
      const int r = min(packed, it.packed_rows - 1);
      row_key_end[half] = p.causal ? it.kv_len - it.q_len + r / group + 1 : it.kv_len;
      q_rows[half] = p.q + PackedRowOffset<kHeadDim>(it.q_begin, r, group, it.kv_head, p.q_stride);
    }

    // Q as A fragments (scaled to base-2 logits): the bf16 high parts in registers, the
    // residuals in this thread's own shared-memory slots, read back per k-step. All loads go
    // out before the first store (see StageScaledQ).
    float q_in[kDimSteps][4][2];
#pragma unroll
    for (int kk = 0; kk < kDimSteps; ++kk) {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const float* src = q_rows[reg & 1] + 16 * kk + 2 * t + 8 * (reg >> 1);
        q_in[kk][reg][0] = src[0];
        q_in[kk][reg][1] = src[1];
      }
    }
    uint32_t q_hi[kDimSteps][4];
#pragma unroll
    for (int kk = 0; kk < kDimSteps; ++kk) {
      uint32_t lo[4];
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        SplitBf16x2(q_in[kk][reg][0] * q_scale, q_in[kk][reg][1] * q_scale, q_hi[kk][reg],
                    lo[reg]);
      }
      s_q_lo[kk * kThreads + threadIdx.x] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }

    // K/V tile kt into buffer `buf`.
    auto load_tile = [&](int kt, int buf) {
      LoadKvTile<kHeadDim, kKeys, kThreads>(c, it.seq_blocks, block_shift, it.kv_head, kt,
                                            it.key_end, s_k + buf * Shape::kTileElems,
                                            s_v + buf * Shape::kTileElems);
      CpAsyncCommit();
    };

    float o[kDimTiles][4];
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};  // this thread's columns only, summed over the quad at end

    const int num_key_tiles = it.num_key_tiles;
    // An item with no key tiles loads nothing: a copy left in flight would land in the next
    // item's buffer 0, and its block id may lie past the block table.
    if (num_key_tiles > 0) load_tile(0, 0);
    for (int kt = 0; kt < num_key_tiles; ++kt) {
      if (kt + 1 < num_key_tiles) {
        load_tile(kt + 1, (kt + 1) & 1);
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
      __syncthreads();
      const __nv_bfloat16* k_tile = s_k + (kt & 1) * Shape::kTileElems;
      const __nv_bfloat16* v_tile = s_v + (kt & 1) * Shape::kTileElems;

      // S = Q K^T: sc[n] is the 16x8 block of keys 8n .. 8n+7.
      float sc[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kDimSteps; ++kk) {
        const uint4 lo = s_q_lo[kk * kThreads + threadIdx.x];
        const uint32_t q_lo[4] = {lo.x, lo.y, lo.z, lo.w};
#pragma unroll
        for (int j = 0; j < kKeys / 16; ++j) {
          uint32_t b[4];
          const int key = 16 * j + (lane & 7) + ((lane >> 4) & 1) * 8;
          const int chunk = 2 * kk + ((lane >> 3) & 1);
          LdMatrixX4<false>(b, k_tile + Swizzled<kHeadDim>(key, chunk));
          MmaBf16(sc[2 * j], q_hi[kk], b[0], b[1]);
          MmaBf16(sc[2 * j + 1], q_hi[kk], b[2], b[3]);
          MmaBf16(sc[2 * j], q_lo, b[0], b[1]);
          MmaBf16(sc[2 * j + 1], q_lo, b[2], b[3]);
        }
      }

      const int key0 = kt * kKeys;
      if (key0 + kKeys > unmasked_end) {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + 8 * n + 2 * t + (e & 1);
            if (key >= row_key_end[e >> 1]) sc[n][e] = -INFINITY;
          }
        }
      }

      // Online softmax per row; a row's four threads (one quad) share its max.
      float rescale[2];
      float base[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          tile_max = fmaxf(tile_max, fmaxf(sc[n][2 * half], sc[n][2 * half + 1]));
        }
        base[half] = OnlineSoftmaxStep</*kFastExp2=*/false>(tile_max, row_max[half],
                                                            row_sum[half], rescale[half]);
      }
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        o[n][0] *= rescale[0];
        o[n][1] *= rescale[0];
        o[n][2] *= rescale[1];
        o[n][3] *= rescale[1];
      }
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[n][e] = exp2f(sc[n][e] - base[e >> 1]);
          row_sum[e >> 1] += sc[n][e];
        }
      }

      // O += P V, 16 keys per k-step; P's A fragment comes straight from the S layout.
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t p_hi[4];
        uint32_t p_lo[4];
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          const float* pair = &sc[2 * kk + (reg >> 1)][2 * (reg & 1)];
          SplitBf16x2(pair[0], pair[1], p_hi[reg], p_lo[reg]);
        }
#pragma unroll
        for (int j = 0; j < kDimSteps; ++j) {
          uint32_t b[4];
          const int key = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
          const int chunk = 2 * j + (lane >> 4);
          LdMatrixX4<true>(b, v_tile + Swizzled<kHeadDim>(key, chunk));
          MmaBf16(o[2 * j], p_hi, b[0], b[1]);
          MmaBf16(o[2 * j + 1], p_hi, b[2], b[3]);
          MmaBf16(o[2 * j], p_lo, b[0], b[1]);
          MmaBf16(o[2 * j + 1], p_lo, b[2], b[3]);
        }
      }
      __syncthreads();  // the next iteration's copies overwrite this buffer pair
    }

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (!live[half]) continue;
      const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int packed = it.tile_row0 + warp * 16 + g + 8 * half;
      float* out =
          p.out + PackedRowOffset<kHeadDim>(it.q_begin, packed, group, it.kv_head, p.out_stride);
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        out[8 * n + 2 * t] = o[n][2 * half] * inv_sum;
        out[8 * n + 2 * t + 1] = o[n][2 * half + 1] * inv_sum;
      }
    }
  }
}

template <int kHeadDim>
cudaError_t Launch(const PagedAttentionParams& p, const int32_t* tile_indptr, int max_ctas,
                   cudaStream_t stream) {
  constexpr int kSmemBytes = MmaShape<kHeadDim>::kSmemBytes;
  auto* kernel = PrefillMmaKernel<kHeadDim>;
  if (cudaError_t err = AllowDynamicSmem(kernel, kSmemBytes); err != cudaSuccess) {
    return err;
  }
  int num_sms = 0;
  int per_sm = 0;
  if (cudaError_t err = CurrentDeviceSms(num_sms); err != cudaSuccess) return err;
  if (cudaError_t err =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmemBytes);
      err != cudaSuccess) {
    return err;
  }
  const int num_ctas = std::max(1, std::min(max_ctas, std::max(1, per_sm) * num_sms));
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  kernel<<<num_ctas, kThreads, kSmemBytes, stream>>>(p, tile_indptr, block_shift);
  return cudaGetLastError();
}

}  // namespace

bool HopperPrefillSupported() {
  int device = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();  // answered "no": leave no error for the next launch to report
    return false;
  }
  return major == 9 && minor == 0;
}

cudaError_t LaunchPrefillAttentionMma(const PagedAttentionParams& p, int32_t* tile_indptr,
                                      int max_ctas, MmaPrecision precision, cudaStream_t stream,
                                      bool allow_wgmma) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (p.cache.dtype != DType::kBF16 || max_ctas < 1) return cudaErrorInvalidValue;
  if (precision == MmaPrecision::kBf16) {
    if (allow_wgmma && p.cache.head_dim == kHopperPrefillHeadDim && HopperPrefillSupported()) {
      const cudaError_t err = LaunchPrefillAttentionHopper(p, tile_indptr, max_ctas, stream);
      if (err != cudaErrorNotSupported) return err;  // else this build's kernel cannot run
      cudaGetLastError();  // handled: the fallback's launch must not report it
    }
    return LaunchPrefillAttentionWide(p, tile_indptr, max_ctas, stream);
  }
  return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim,
                               Launch<kHeadDim>(p, tile_indptr, max_ctas, stream));
}

}  // namespace kvd::cuda
