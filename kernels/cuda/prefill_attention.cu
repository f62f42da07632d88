#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/prefill_attention_mma.h"

namespace kvd::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kThreadsPerRow = 4;
constexpr int kTileRows = kThreads / kThreadsPerRow;  // packed query rows per item
constexpr int kTileKeys = 32;
constexpr int kPlanThreads = 1024;

// One CTA of kPlanThreads: tile_indptr[s + 1] - tile_indptr[s] = items of sequence s (0 for
// decodes), one per KV head and tile of `tile_rows` packed query rows; tile_indptr[0] = 0.
// The sequences are scanned kPlanThreads at a time (a warp scan, then a scan of the warp
// totals), so a large decode batch costs a few loads per thread, not one serial round trip to
// memory per sequence.
__global__ void __launch_bounds__(kPlanThreads)
    PlanTilesKernel(PagedAttentionParams p, int tile_rows, int32_t* tile_indptr) {
  constexpr int kPlanWarps = kPlanThreads / 32;
  static_assert(kPlanWarps == 32, "warp 0 scans one total per warp");
  __shared__ int32_t s_warp_total[kPlanWarps];
  __shared__ int32_t s_carry;  // items of all sequences of earlier rounds
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int num_seqs = p.blocks.num_seqs;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    s_carry = 0;
    tile_indptr[0] = 0;
  }
  for (int round_begin = 0; round_begin < num_seqs; round_begin += kPlanThreads) {
    const int s = round_begin + static_cast<int>(threadIdx.x);
    int32_t prefix = 0;  // inclusive, within the warp
    if (s < num_seqs) {
      const int q_len = p.q_indptr[s + 1] - p.q_indptr[s];
      if (q_len > 1) prefix = CeilDiv(q_len * group, tile_rows) * p.cache.num_kv_heads;
    }
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t below = __shfl_up_sync(0xffffffffu, prefix, offset);
      if (lane >= offset) prefix += below;
    }
    if (lane == 31) s_warp_total[warp] = prefix;
    __syncthreads();  // the totals, and s_carry of the previous round
    if (warp == 0) {
      int32_t total = s_warp_total[lane];
#pragma unroll
      for (int offset = 1; offset < 32; offset *= 2) {
        const int32_t below = __shfl_up_sync(0xffffffffu, total, offset);
        if (lane >= offset) total += below;
      }
      s_warp_total[lane] = total;  // inclusive over warps
    }
    __syncthreads();
    prefix += s_carry + (warp > 0 ? s_warp_total[warp - 1] : 0);
    if (s < num_seqs) tile_indptr[s + 1] = prefix;
    __syncthreads();  // every thread has read s_carry and s_warp_total
    // The last thread's prefix covers the whole round (sequences past the end count 0).
    if (threadIdx.x == kPlanThreads - 1) s_carry = prefix;
  }
}

// Thread t serves packed row t / 4 and the float4 columns (t % 4) + 4 i of head_dim, so the
// four threads of a row read 64 contiguous bytes of a shared K/V row and the eight rows of
// a warp read the same bytes (a broadcast).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    PrefillKernel(PagedAttentionParams p, const int32_t* tile_indptr, int block_shift) {
  constexpr int kVec = Vec16<T>::kSize;
  constexpr int kCols = kHeadDim / 4 / kThreadsPerRow;  // float4 columns per thread
  constexpr int kVecsPerRow = kHeadDim / kVec;
  constexpr int kLoadRounds = kTileKeys * kVecsPerRow / kThreads;
  static_assert(kLoadRounds * kThreads == kTileKeys * kVecsPerRow);

  __shared__ float4 s_k[kTileKeys][kHeadDim / 4];
  __shared__ float4 s_v[kTileKeys][kHeadDim / 4];

  const KvCacheView& c = p.cache;
  const int num_seqs = p.blocks.num_seqs;
  const int group = p.num_q_heads / c.num_kv_heads;
  const int total_items = tile_indptr[num_seqs];
  const int row_in_tile = threadIdx.x / kThreadsPerRow;
  const int sub = threadIdx.x % kThreadsPerRow;
  const float q_scale = p.sm_scale * kLog2e;

  for (int item = blockIdx.x; item < total_items; item += gridDim.x) {
    const int s = FindSequence(tile_indptr, num_seqs, item);
    const int q_begin = p.q_indptr[s];
    const int q_len = p.q_indptr[s + 1] - q_begin;
    const int kv_len = SeqKvLen(p.blocks, s, c.block_size);
    const int num_tiles = CeilDiv(q_len * group, kTileRows);
    const int local = item - (s == 0 ? 0 : tile_indptr[s]);  // [0] may be a work counter
    const int kv_head = local / num_tiles;
    const int tile = num_tiles - 1 - local % num_tiles;  // late (longest causal) tiles first
    const int32_t* seq_blocks = p.blocks.indices + p.blocks.indptr[s];

    // This thread's packed row; rows past the end repeat the last one and are not written.
    const int packed = tile * kTileRows + row_in_tile;
    const bool live = packed < q_len * group;
    const int row = live ? packed : q_len * group - 1;
    const int token = row / group;
    const int head = kv_head * group + row % group;
    const int pos = kv_len - q_len + token;  // this row's position; causal sees keys <= pos
    const int last_token = min(q_len - 1, (tile * kTileRows + kTileRows - 1) / group);
    const int key_end = p.causal ? min(kv_len, kv_len - q_len + last_token + 1) : kv_len;
    const int row_key_end = p.causal ? min(kv_len, pos + 1) : kv_len;

    float4 q[kCols];
    const float* q_row = p.q + int64_t{q_begin + token} * p.q_stride + int64_t{head} * kHeadDim;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int d = 4 * (sub + kThreadsPerRow * i);
      q[i] = make_float4(q_row[d] * q_scale, q_row[d + 1] * q_scale, q_row[d + 2] * q_scale,
                         q_row[d + 3] * q_scale);
    }
    float4 acc[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float running_max = -INFINITY;
    float running_sum = 0.0f;

    for (int key_tile = 0; key_tile < key_end; key_tile += kTileKeys) {
      // Stage the K and V tile as fp32; keys past key_end become zeros (masked below).
#pragma unroll
      for (int r = 0; r < kLoadRounds; ++r) {
        const int v_index = r * kThreads + threadIdx.x;
        const int j = v_index / kVecsPerRow;
        const int part = v_index % kVecsPerRow;
        const int key = key_tile + j;
        float kf[kVec];
        float vf[kVec];
        if (key < key_end) {
          Vec16<T>::Load(
              TokenRow<T>(c, seq_blocks, block_shift, key, c.k_offset_bytes, kv_head) + part * kVec,
              kf);
          Vec16<T>::Load(
              TokenRow<T>(c, seq_blocks, block_shift, key, c.v_offset_bytes, kv_head) + part * kVec,
              vf);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) kf[e] = vf[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < kVec; e += 4) {
          s_k[j][(part * kVec + e) / 4] = make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
          s_v[j][(part * kVec + e) / 4] = make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
        }
      }
      __syncthreads();

      float score[kTileKeys];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTileKeys; ++j) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const float4 k = s_k[j][sub + kThreadsPerRow * i];
          dot = fmaf(q[i].x, k.x, dot);
          dot = fmaf(q[i].y, k.y, dot);
          dot = fmaf(q[i].z, k.z, dot);
          dot = fmaf(q[i].w, k.w, dot);
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        score[j] = key_tile + j < row_key_end ? dot : -INFINITY;
        tile_max = fmaxf(tile_max, score[j]);
      }
      const float new_max = fmaxf(running_max, tile_max);
      // A row that has seen no key yet keeps sum and acc at 0 (all its exponents are -inf).
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = exp2f(running_max - base);
      running_max = new_max;
      running_sum *= rescale;
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        acc[i].x *= rescale;
        acc[i].y *= rescale;
        acc[i].z *= rescale;
        acc[i].w *= rescale;
      }
#pragma unroll
      for (int j = 0; j < kTileKeys; ++j) {
        const float prob = exp2f(score[j] - base);
        running_sum += prob;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const float4 v = s_v[j][sub + kThreadsPerRow * i];
          acc[i].x = fmaf(prob, v.x, acc[i].x);
          acc[i].y = fmaf(prob, v.y, acc[i].y);
          acc[i].z = fmaf(prob, v.z, acc[i].z);
          acc[i].w = fmaf(prob, v.w, acc[i].w);
        }
      }
      __syncthreads();  // the next tile overwrites s_k and s_v
    }

    if (live) {
      const float inv_sum = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
      float* out = p.out + int64_t{q_begin + token} * p.out_stride + int64_t{head} * kHeadDim;
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int d = 4 * (sub + kThreadsPerRow * i);
        out[d] = acc[i].x * inv_sum;
        out[d + 1] = acc[i].y * inv_sum;
        out[d + 2] = acc[i].z * inv_sum;
        out[d + 3] = acc[i].w * inv_sum;
      }
    }
  }
}

template <typename T, int kHeadDim>
cudaError_t Launch(const PagedAttentionParams& p, const int32_t* tile_indptr, int num_ctas,
                   cudaStream_t stream) {
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  PrefillKernel<T, kHeadDim><<<num_ctas, kThreads, 0, stream>>>(p, tile_indptr, block_shift);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPrefillAttention(const PagedAttentionParams& p, int32_t* tile_indptr,
                                   int num_ctas, cudaStream_t stream, MmaPrecision precision,
                                   bool allow_wgmma) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (num_ctas < 1) return cudaErrorInvalidValue;
  // bf16 KV: the tensor-core kernel; f32 KV (exact comparisons in tests): the fp32 kernel.
  const bool tensor_cores = p.cache.dtype == DType::kBF16;
  PlanTilesKernel<<<1, kPlanThreads, 0, stream>>>(
      p, tensor_cores ? MmaPrefillTileRows(precision) : kTileRows, tile_indptr);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (tensor_cores) {
    return LaunchPrefillAttentionMma(p, tile_indptr, num_ctas, precision, stream, allow_wgmma);
  }
  return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim,
                               Launch<float, kHeadDim>(p, tile_indptr, num_ctas, stream));
}

}  // namespace kvd::cuda
