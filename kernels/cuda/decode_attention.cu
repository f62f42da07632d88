#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/paged_kv.cuh"

namespace kvd::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 64;
constexpr int kMinKeysPerSplit = 256;
constexpr int kMaxSplits = 32;
constexpr int kMaxGroupPerCta = 8;
constexpr float kLog2e = 1.4426950408889634f;

struct SplitPlan {
  int num_splits;
  int split_len;  // keys, a multiple of kTileKeys
};

// Shared by the decode and merge kernels so both see the same cut.
__device__ __forceinline__ SplitPlan PlanSplits(int kv_len, int max_splits) {
  const int wanted = max(1, min(max_splits, CeilDiv(kv_len, kMinKeysPerSplit)));
  const int len = max(1, CeilDiv(CeilDiv(kv_len, wanted), kTileKeys)) * kTileKeys;
  return {max(1, CeilDiv(kv_len, len)), len};
}

// Thread layout, for 16-byte vectors of VEC elements:
//   QK: a warp scores kKeysPerWarp keys at once, kThreadsPerKey lanes per key, each lane
//       one 16-byte slice of the key; the dot product is reduced across those lanes.
//   PV: the CTA's threads form kKeyLanes groups of kThreadsPerKey; group l accumulates keys
//       l, l + kKeyLanes, ... of each tile for its slice of head_dim, and the groups are
//       summed once at the end.
template <typename T, int kHeadDim, int kGroup>
struct DecodeShape {
  static constexpr int kVec = Vec16<T>::kSize;
  static constexpr int kThreadsPerKey = kHeadDim / kVec;
  static constexpr int kKeysPerWarp = 32 / kThreadsPerKey;
  static constexpr int kQkRounds = kTileKeys / (kWarps * kKeysPerWarp);
  static constexpr int kKeyLanes = kThreads / kThreadsPerKey;
  static constexpr int kPvRounds = kTileKeys / kKeyLanes;
  static_assert(kThreadsPerKey <= 32 && 32 % kThreadsPerKey == 0);
  static_assert(kQkRounds >= 1 && kPvRounds >= 1);
};

// grid (num_kv_heads * subgroups, num_seqs, max_splits), kThreads threads.
template <typename T, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                 int block_shift) {
  using Shape = DecodeShape<T, kHeadDim, kGroup>;
  constexpr int kVec = Shape::kVec;
  constexpr int kTpk = Shape::kThreadsPerKey;

  __shared__ float s_p[kGroup][kTileKeys];  // scores, then probabilities, of one tile
  __shared__ float s_max[kGroup];           // running max (base-2 logits)
  __shared__ float s_sum[kGroup];           // running sum of exp2(logit - max)
  __shared__ float s_rescale[kGroup];       // factor for acc after this tile's max update
  __shared__ float s_reduce[Shape::kKeyLanes][kHeadDim];

  const int kv_head = blockIdx.x / subgroups;
  const int head_base = kv_head * group + (blockIdx.x % subgroups) * kGroup;
  const int heads = min(kGroup, (kv_head + 1) * group - head_base);  // live heads, >= 1
  const int s = blockIdx.y;
  const int split = blockIdx.z;
  const int q_row = p.q_indptr[s];
  if (p.q_indptr[s + 1] - q_row != 1) return;
  const KvCacheView& c = p.cache;
  const int kv_len = SeqKvLen(p.blocks, s, c.block_size);
  const SplitPlan plan = PlanSplits(kv_len, ws.max_splits);
  if (split >= plan.num_splits) return;
  const int key_begin = split * plan.split_len;
  const int key_end = min(kv_len, key_begin + plan.split_len);
  const int32_t* seq_blocks = p.blocks.indices + p.blocks.indptr[s];

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int slice = lane % kTpk;  // this thread's 16-byte slice of head_dim
  const int dim0 = slice * kVec;

  // Query slices in registers, pre-scaled so that scores are base-2 logits.
  float q[kGroup][kVec];
  const float q_scale = p.sm_scale * kLog2e;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    const float* q_head = p.q + int64_t{q_row} * p.q_stride + int64_t{head_base + h} * kHeadDim;
#pragma unroll
    for (int i = 0; i < kVec; ++i) q[h][i] = h < heads ? q_head[dim0 + i] * q_scale : 0.0f;
  }
  float acc[kGroup][kVec];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[h][i] = 0.0f;
  }
  if (tid < kGroup) {
    s_max[tid] = -INFINITY;
    s_sum[tid] = 0.0f;
  }

  for (int tile = key_begin; tile < key_end; tile += kTileKeys) {
    // --- scores: all loads of the tile first, then the dot products ---
    float k[Shape::kQkRounds][kVec];
#pragma unroll
    for (int r = 0; r < Shape::kQkRounds; ++r) {
      const int key = tile + (r * kWarps + warp) * Shape::kKeysPerWarp + lane / kTpk;
      if (key < key_end) {
        Vec16<T>::Load(
            TokenRow<T>(c, seq_blocks, block_shift, key, c.k_offset_bytes, kv_head) + dim0, k[r]);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) k[r][i] = 0.0f;
      }
    }
#pragma unroll
    for (int r = 0; r < Shape::kQkRounds; ++r) {
      const int key_in_tile = (r * kWarps + warp) * Shape::kKeysPerWarp + lane / kTpk;
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot = fmaf(q[h][i], k[r][i], dot);
#pragma unroll
        for (int offset = kTpk / 2; offset > 0; offset /= 2) {
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        }
        if (slice == 0) s_p[h][key_in_tile] = tile + key_in_tile < key_end ? dot : -INFINITY;
      }
    }
    __syncthreads();

    // --- online softmax update, one warp per head ---
    for (int h = warp; h < kGroup; h += kWarps) {
      float tile_max = -INFINITY;
      for (int j = lane; j < kTileKeys; j += 32) tile_max = fmaxf(tile_max, s_p[h][j]);
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      }
      const float old_max = s_max[h];
      const float new_max = fmaxf(old_max, tile_max);  // finite: the tile has a live key
      float tile_sum = 0.0f;
      for (int j = lane; j < kTileKeys; j += 32) {
        const float e = exp2f(s_p[h][j] - new_max);
        s_p[h][j] = e;
        tile_sum += e;
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
      }
      __syncwarp();
      if (lane == 0) {
        const float rescale = exp2f(old_max - new_max);
        s_rescale[h] = rescale;
        s_sum[h] = s_sum[h] * rescale + tile_sum;
        s_max[h] = new_max;
      }
    }
    __syncthreads();

    // --- weighted values ---
    const int key_lane = tid / kTpk;
    float v[Shape::kPvRounds][kVec];
#pragma unroll
    for (int r = 0; r < Shape::kPvRounds; ++r) {
      const int key = tile + key_lane + r * Shape::kKeyLanes;
      if (key < key_end) {
        Vec16<T>::Load(
            TokenRow<T>(c, seq_blocks, block_shift, key, c.v_offset_bytes, kv_head) + dim0, v[r]);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[r][i] = 0.0f;  // its probability is 0 too
      }
    }
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float rescale = s_rescale[h];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[h][i] *= rescale;
#pragma unroll
      for (int r = 0; r < Shape::kPvRounds; ++r) {
        const float prob = s_p[h][key_lane + r * Shape::kKeyLanes];
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[h][i] = fmaf(prob, v[r][i], acc[h][i]);
      }
    }
    __syncthreads();  // s_p is rewritten by the next tile
  }

  // --- sum the key lanes' partial outputs and write, head by head ---
  const int key_lane = tid / kTpk;
  const int64_t seq_split = int64_t{s} * ws.max_splits + split;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) s_reduce[key_lane][dim0 + i] = acc[h][i];
    __syncthreads();
    if (h < heads) {
      const float sum = s_sum[h];
      const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int head = head_base + h;
      for (int d = tid; d < kHeadDim; d += kThreads) {
        float o = 0.0f;
#pragma unroll
        for (int l = 0; l < Shape::kKeyLanes; ++l) o += s_reduce[l][d];
        o *= inv_sum;
        if (plan.num_splits == 1) {
          p.out[int64_t{q_row} * p.out_stride + int64_t{head} * kHeadDim + d] = o;
        } else {
          ws.partial_out[(seq_split * p.num_q_heads + head) * kHeadDim + d] = o;
        }
      }
      if (plan.num_splits > 1 && tid == 0) {
        ws.partial_lse[seq_split * p.num_q_heads + head] =
            sum > 0.0f ? s_max[h] + log2f(sum) : -INFINITY;
      }
    }
    __syncthreads();  // s_reduce is rewritten for the next head
  }
}

// grid (num_q_heads, num_seqs), head_dim threads: combines a split sequence's partial
// outputs weighted by exp2(lse_i - max lse).
__global__ void MergeKernel(PagedAttentionParams p, DecodeWorkspace ws) {
  const int head = blockIdx.x;
  const int s = blockIdx.y;
  const int d = threadIdx.x;
  const int q_row = p.q_indptr[s];
  if (p.q_indptr[s + 1] - q_row != 1) return;
  const int kv_len = SeqKvLen(p.blocks, s, p.cache.block_size);
  const SplitPlan plan = PlanSplits(kv_len, ws.max_splits);
  if (plan.num_splits == 1) return;
  const int64_t first = int64_t{s} * ws.max_splits;
  float max_lse = -INFINITY;
  for (int i = 0; i < plan.num_splits; ++i) {
    max_lse = fmaxf(max_lse, ws.partial_lse[(first + i) * p.num_q_heads + head]);
  }
  float weight_sum = 0.0f;
  float o = 0.0f;
  for (int i = 0; i < plan.num_splits; ++i) {
    const float w = exp2f(ws.partial_lse[(first + i) * p.num_q_heads + head] - max_lse);
    weight_sum += w;
    o = fmaf(w, ws.partial_out[((first + i) * p.num_q_heads + head) * p.cache.head_dim + d], o);
  }
  p.out[int64_t{q_row} * p.out_stride + int64_t{head} * p.cache.head_dim + d] =
      weight_sum > 0.0f ? o / weight_sum : 0.0f;
}

template <typename T, int kHeadDim, int kGroup>
cudaError_t Launch(const PagedAttentionParams& p, const DecodeWorkspace& ws, cudaStream_t stream) {
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int subgroups = (group + kGroup - 1) / kGroup;
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  const dim3 grid(p.cache.num_kv_heads * subgroups, p.blocks.num_seqs, ws.max_splits);
  DecodeKernel<T, kHeadDim, kGroup>
      <<<grid, kThreads, 0, stream>>>(p, ws, group, subgroups, block_shift);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (ws.max_splits > 1) {
    MergeKernel<<<dim3(p.num_q_heads, p.blocks.num_seqs), kHeadDim, 0, stream>>>(p, ws);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

int DecodeMaxSplits(int num_seqs, int num_kv_heads, int group_size, int num_sms) {
  const int subgroups = (group_size + kMaxGroupPerCta - 1) / kMaxGroupPerCta;
  const int64_t ctas = int64_t{num_seqs} * num_kv_heads * subgroups;
  if (ctas <= 0) return 1;
  const int64_t wanted = (2 * int64_t{num_sms} + ctas - 1) / ctas;
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, kMaxSplits));
}

int64_t DecodePartialOutSize(int num_seqs, int max_splits, int num_q_heads, int head_dim) {
  return int64_t{num_seqs} * max_splits * num_q_heads * head_dim;
}

int64_t DecodePartialLseSize(int num_seqs, int max_splits, int num_q_heads) {
  return int64_t{num_seqs} * max_splits * num_q_heads;
}

cudaError_t LaunchDecodeAttention(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                  cudaStream_t stream) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (ws.max_splits < 1 || ws.max_splits > kMaxSplits) return cudaErrorInvalidValue;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  return KVD_DISPATCH_STORAGE_DTYPE(
      p.cache.dtype, T,
      KVD_DISPATCH_HEAD_DIM(
          p.cache.head_dim, kHeadDim,
          KVD_DISPATCH_GROUP_SIZE(group, kGroup, Launch<T, kHeadDim, kGroup>(p, ws, stream))));
}

}  // namespace kvd::cuda
