// The Hopper prefill kernel of prefill_attention_mma.h (kBf16 mode, head_dim 128): the wide
// kernel's work items (128 packed query rows of one sequence and KV head, from the work
// counter, costliest first) computed with warpgroup MMAs. Built for sm_90a only (see
// kernels/cuda/CMakeLists.txt); on any other device LaunchPrefillAttentionHopper reports
// cudaErrorNoKernelImageForDevice and the wide kernel runs instead.
//
// A CTA is two warpgroups, 64 packed rows each:
//
//   Q tile   -> bf16 (scaled to base-2 logits), stored in shared memory in wgmma's 128-byte
//               swizzled K-major layout (two 64-dim halves)
//   per 128-key tile (double-buffered; all 256 threads gather K and V from the paged arena
//   with cp.async straight into the same swizzled layout):
//     S = Q K^T     8 wgmma m64n128k16, A and B from shared memory
//     mask          only on tiles that cross a row's last visible key
//     softmax       online, fp32, in the accumulator registers (a quad of lanes per row)
//     O += P V      8 wgmma m64n128k16, P from registers (packed in place from S), V from
//                   shared memory as an MN-major operand
//
// Numerics are the wide kernel's: Q and P rounded to bf16, fp32 accumulation.

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/prefill_attention_mma.h"
#include "kernels/cuda/tensor_core.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace kvd::cuda {
namespace {

constexpr int kHeadDim = 128;
constexpr int kThreads = 256;  // two warpgroups
constexpr int kRows = 128;     // packed query rows per item
constexpr int kGroupRows = 64;  // per warpgroup
constexpr int kKeys = 128;     // keys per K/V tile
constexpr int kStages = 2;
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
constexpr int kRowBytes = 128;         // one swizzled row: 64 dims
constexpr int kQBytes = kRows * kHeadDim * 2;
constexpr int kTileBytes = kKeys * kHeadDim * 2;
constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + 1024;  // + alignment slack
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kRows == MmaPrefillTileRows(MmaPrecision::kBf16));

// Byte offset of 16-byte chunk `chunk` (0..15) of row `row` in a region of `rows` rows stored
// as two 64-dim halves of 128-byte swizzled rows.
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk, int rows) {
  return (chunk >> 3) * rows * kRowBytes + row * kRowBytes + (((chunk & 7) ^ (row & 7)) << 4);
}

__global__ void __launch_bounds__(kThreads, 1)
    PrefillHopperKernel(PagedAttentionParams p, int32_t* tile_indptr, int block_shift) {
#if KVD_HAVE_WGMMA
  extern __shared__ unsigned char smem_raw[];
  __shared__ int s_item;
  // Swizzled regions must be 1024-byte aligned in the shared address space.
  const uint32_t raw_address = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = ((raw_address + 1023) & ~1023u) - raw_address;
  unsigned char* smem = smem_raw + pad;
  const uint32_t q_address = raw_address + pad;
  // [Q][K stage 0][V stage 0][K stage 1][V stage 1]
  auto k_address = [&](int buf) { return q_address + kQBytes + 2 * buf * kTileBytes; };

  const KvCacheView& c = p.cache;
  const int num_seqs = p.blocks.num_seqs;
  const int group = p.num_q_heads / c.num_kv_heads;
  const int warpgroup = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const float q_scale = p.sm_scale * kLog2e;
  const int block_mask = c.block_size - 1;
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;
  // This thread's load slot: chunk `load_chunk` of keys load_key0, load_key0 + 16, ...
  const int load_chunk = threadIdx.x % kChunks;
  const int load_key0 = threadIdx.x / kChunks;

  cudaGridDependencySynchronize();  // tile_indptr is written by the planning kernel
  const int total_items = tile_indptr[num_seqs];
  if (total_items == 0) return;
  int32_t* work_counter = tile_indptr;  // [0]: offset 0 by definition, never read as one

  for (;;) {
    if (threadIdx.x == 0) s_item = atomicAdd(work_counter, 1);
    __syncthreads();  // also: the previous item is done with shared memory
    const int item = s_item;
    if (item >= total_items) break;
    const int s = FindSequence(tile_indptr, num_seqs, item);
    const int q_begin = p.q_indptr[s];
    const int q_len = p.q_indptr[s + 1] - q_begin;
    const int kv_len = SeqKvLen(p.blocks, s, c.block_size);
    const int packed_rows = q_len * group;
    const int num_tiles = CeilDiv(packed_rows, kRows);
    const int local = item - (s == 0 ? 0 : tile_indptr[s]);
    const int tile = num_tiles - 1 - local / c.num_kv_heads;  // latest (costliest) first
    const int kv_head = local % c.num_kv_heads;
    const int32_t* seq_blocks = p.blocks.indices + p.blocks.indptr[s];
    const int tile_row0 = tile * kRows;
    const int group_row0 = tile_row0 + warpgroup * kGroupRows;
    const int first_pos = kv_len - q_len;  // position of token 0

    // As in the wide kernel: keys at or past key_end are visible to no row of the tile (not
    // loaded), at or past group_key_end to no row of this warpgroup (not computed); keys below
    // group_unmasked_end are visible to all of its rows. Rows past the end repeat the last
    // row's limits; a warpgroup with no rows computes nothing.
    const bool group_live = group_row0 < packed_rows;
    const int last_row = min(packed_rows - 1, tile_row0 + kRows - 1);
    const int key_end = p.causal ? first_pos + last_row / group + 1 : kv_len;
    const int group_key_end =
        p.causal ? first_pos + min(packed_rows - 1, group_row0 + kGroupRows - 1) / group + 1
                 : kv_len;
    const int group_unmasked_end =
        p.causal ? first_pos + min(packed_rows - 1, group_row0) / group + 1 : kv_len;
    const int thread_row0 = group_row0 + warp * 16 + g;  // and thread_row0 + 8
    int row_key_end[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = min(packed_rows - 1, thread_row0 + 8 * half);
      row_key_end[half] = p.causal ? first_pos + r / group + 1 : kv_len;
    }

    // Q tile -> bf16, scaled; rows past the end are zeros (never written out).
#pragma unroll 2
    for (int round = 0; round < kRows * kChunks / kThreads; ++round) {
      const int index = round * kThreads + threadIdx.x;
      const int r = index / kChunks;
      const int chunk = index % kChunks;
      const int packed = tile_row0 + r;
      uint4 bits = make_uint4(0, 0, 0, 0);
      if (packed < packed_rows) {
        const int token = packed / group;
        const int head = kv_head * group + packed % group;
        const float* src =
            p.q + int64_t{q_begin + token} * p.q_stride + int64_t{head} * kHeadDim + chunk * 8;
        bits.x = PackBf16x2(src[0] * q_scale, src[1] * q_scale);
        bits.y = PackBf16x2(src[2] * q_scale, src[3] * q_scale);
        bits.z = PackBf16x2(src[4] * q_scale, src[5] * q_scale);
        bits.w = PackBf16x2(src[6] * q_scale, src[7] * q_scale);
      }
      *reinterpret_cast<uint4*>(smem + SwizzledOffset(r, chunk, kRows)) = bits;
    }

    const int num_key_tiles = CeilDiv(key_end, kKeys);
    // K/V tile kt into buffer `buf`; keys at or past key_end become zeros (their V must not
    // be read: the tail of the last block may hold anything).
    auto load_tile = [&](int kt, int buf) {
      unsigned char* k_tile = smem + kQBytes + 2 * buf * kTileBytes;
      unsigned char* v_tile = k_tile + kTileBytes;
#pragma unroll
      for (int round = 0; round < kKeys * kChunks / kThreads; ++round) {
        const int key_local = round * (kThreads / kChunks) + load_key0;
        const int key = kt * kKeys + key_local;
        const bool valid = key < key_end;
        const int safe_key = valid ? key : 0;
        const char* src = reinterpret_cast<const char*>(BlockHead<__nv_bfloat16>(
                              c, seq_blocks[safe_key >> block_shift], c.k_offset_bytes, kv_head)) +
                          int64_t{(safe_key & block_mask) * kHeadDim + load_chunk * 8} * 2;
        const uint32_t dst = SwizzledOffset(key_local, load_chunk, kKeys);
        CpAsync16(k_tile + dst, src, valid);
        CpAsync16(v_tile + dst, src + v_minus_k, valid);
      }
      CpAsyncCommit();
    };

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};  // this thread's columns only

    // Descriptors: Q rows of this warpgroup (A), K (B, K-major), V (B, MN-major).
    const uint32_t q_group = q_address + warpgroup * kGroupRows * kRowBytes;
    constexpr uint32_t kSbo = 8 * kRowBytes;
    constexpr uint32_t kHalfQ = kRows * kRowBytes;
    constexpr uint32_t kHalfTile = kKeys * kRowBytes;

    if (num_key_tiles > 0) load_tile(0, 0);
    int buf = 0;
    for (int kt = 0; kt < num_key_tiles; ++kt) {
      CpAsyncWait<0>();         // this thread's copies of tile kt have landed
      FenceProxyAsyncShared();  // ... and its Q stores: both are read by wgmma
      __syncthreads();          // everyone's; and tile kt - 1's buffer is free
      if (kt + 1 < num_key_tiles) load_tile(kt + 1, buf ^ 1);
      const int key0 = kt * kKeys;
      if (group_live && key0 < group_key_end) {
        const uint32_t k_tile = k_address(buf);
        const uint32_t v_tile = k_tile + kTileBytes;

        // S = Q K^T over eight 16-dim steps.
        float sc[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) sc[i] = 0.0f;
        PinRegisters(sc);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          // 64-dim half kk / 4, 16-dim step kk % 4 within it (32 bytes of each row).
          const uint32_t step = (kk & 3) * 32;
          const uint64_t desc_q = SwizzledDescriptor(q_group + (kk >> 2) * kHalfQ + step, 16, kSbo);
          const uint64_t desc_k =
              SwizzledDescriptor(k_tile + (kk >> 2) * kHalfTile + step, 16, kSbo);
          WgmmaM64N128K16SS(sc, desc_q, desc_k, true);
        }
        WgmmaCommit();
        WgmmaWait<0>();
        PinRegisters(sc);

        if (key0 + kKeys > group_unmasked_end) {
#pragma unroll
          for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = key0 + 8 * n + 2 * t + (e & 1);
              if (key >= row_key_end[e >> 1]) sc[4 * n + e] = -INFINITY;
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
            tile_max = fmaxf(tile_max, fmaxf(sc[4 * n + 2 * half], sc[4 * n + 2 * half + 1]));
          }
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          const float new_max = fmaxf(row_max[half], tile_max);
          // A row that has seen no key yet keeps sum and output at 0.
          base[half] = new_max == -INFINITY ? 0.0f : new_max;
          rescale[half] = exp2f(row_max[half] - base[half]);
          row_max[half] = new_max;
          row_sum[half] *= rescale[half];
        }
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          sc[i] = exp2f(sc[i] - base[(i >> 1) & 1]);
          row_sum[(i >> 1) & 1] += sc[i];
          o[i] *= rescale[(i >> 1) & 1];
        }

        // P's A fragments, one k16 step (16 keys) each, packed from the S layout.
        uint32_t pa[kKeys / 16][4];
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
          for (int reg = 0; reg < 4; ++reg) {
            pa[kk][reg] = PackBf16x2(sc[8 * kk + 2 * reg], sc[8 * kk + 2 * reg + 1]);
          }
        }

        // O += P V over eight 16-key steps; V's two 64-dim halves are LBO apart.
        PinRegisters(o);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          const uint64_t desc_v = SwizzledDescriptor(v_tile + kk * 16 * kRowBytes, kHalfTile, kSbo);
          WgmmaM64N128K16RS(o, pa[kk], desc_v, true);
        }
        WgmmaCommit();
        WgmmaWait<0>();
        PinRegisters(o);
      }
      buf ^= 1;
    }

    if (group_live) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float sum = row_sum[half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int packed = thread_row0 + 8 * half;
        if (packed >= packed_rows) continue;
        const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
        const int token = packed / group;
        const int head = kv_head * group + packed % group;
        float* out = p.out + int64_t{q_begin + token} * p.out_stride + int64_t{head} * kHeadDim;
#pragma unroll
        for (int n = 0; n < kHeadDim / 8; ++n) {
          *reinterpret_cast<float2*>(out + 8 * n + 2 * t) =
              make_float2(o[4 * n + 2 * half] * inv_sum, o[4 * n + 2 * half + 1] * inv_sum);
        }
      }
    }
  }
#endif  // KVD_HAVE_WGMMA
}

}  // namespace

cudaError_t LaunchPrefillAttentionHopper(const PagedAttentionParams& p, int32_t* tile_indptr,
                                         int max_ctas, cudaStream_t stream) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (p.cache.dtype != DType::kBF16 || p.cache.head_dim != kHeadDim || max_ctas < 1) {
    return cudaErrorInvalidValue;
  }
  auto* kernel = PrefillHopperKernel;
  if (cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
      err != cudaSuccess) {
    return err;
  }
  int device = 0;
  int num_sms = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (cudaError_t err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
      err != cudaSuccess) {
    return err;
  }
  // One CTA per multiprocessor (160 KB of shared memory); items come from the work counter.
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(std::min(max_ctas, num_sms));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  return cudaLaunchKernelEx(&config, kernel, p, tile_indptr, block_shift);
}

}  // namespace kvd::cuda
