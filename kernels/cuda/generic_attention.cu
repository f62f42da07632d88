#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/generic_attention.h"

namespace kvd::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxPerLane = kGenericAttentionMaxHeadDim / kWarp;
constexpr int kWarpsPerCta = 8;

__device__ __forceinline__ float Load(const float* p, int i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int i) {
  return __bfloat162float(p[i]);
}

// One warp: query row `row`, head `head` against keys [0, end) of its block table.
template <typename T>
__device__ void AttendRow(const PagedAttentionParams& p, int row, int head, int kv_head,
                          int first_block, int end, int lane) {
  const KvCacheView& c = p.cache;
  const int head_dim = c.head_dim;
  float q[kMaxPerLane], acc[kMaxPerLane];
  const float* q_row = p.q + int64_t{row} * p.q_stride + int64_t{head} * head_dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + i * kWarp;
    q[i] = d < head_dim ? q_row[d] * p.sm_scale : 0.0f;
    acc[i] = 0.0f;
  }
  float running_max = -FLT_MAX, denom = 0.0f;
  const int64_t bpc_mask = (int64_t{1} << c.chunk_shift) - 1;
  const int64_t head_offset = (int64_t{kv_head} * c.block_size) * head_dim;
  for (int t = 0; t < end; ++t) {
    const int32_t block = p.blocks.indices[first_block + t / c.block_size];
    const char* chunk = static_cast<const char*>(c.chunks[block >> c.chunk_shift]);
    const int64_t base = (block & bpc_mask) * c.block_bytes;
    const int64_t elem = head_offset + int64_t{t % c.block_size} * head_dim;
    const T* k = reinterpret_cast<const T*>(chunk + c.k_offset_bytes + base) + elem;
    const T* v = reinterpret_cast<const T*>(chunk + c.v_offset_bytes + base) + elem;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < head_dim) dot += q[i] * Load(k, d);
    }
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      dot += __shfl_xor_sync(0xFFFFFFFFu, dot, offset);
    }
    const float new_max = fmaxf(running_max, dot);
    const float rescale = expf(running_max - new_max);
    const float weight = expf(dot - new_max);
    denom = denom * rescale + weight;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + i * kWarp;
      acc[i] = acc[i] * rescale + (d < head_dim ? weight * Load(v, d) : 0.0f);
    }
    running_max = new_max;
  }
  float* out_row = p.out + int64_t{row} * p.out_stride + int64_t{head} * head_dim;
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < head_dim) out_row[d] = acc[i] * inv;
  }
}

// Grid: (num_seqs, num_q_heads). The CTA's warps take the sequence's query rows in turn;
// lane l holds dims l, l + 32, ... of the query and of the output accumulator.
template <typename T>
__global__ void GenericAttentionKernel(PagedAttentionParams p) {
  const int s = blockIdx.x;
  const int head = blockIdx.y;
  const int lane = threadIdx.x % kWarp;
  const KvCacheView& c = p.cache;
  const int kv_head = head / (p.num_q_heads / c.num_kv_heads);
  const int q_begin = p.q_indptr[s];
  const int q_len = p.q_indptr[s + 1] - q_begin;
  const int first_block = p.blocks.indptr[s];
  const int num_blocks = p.blocks.indptr[s + 1] - first_block;
  const int kv_len = (num_blocks - 1) * c.block_size + p.blocks.last_block_len[s];
  for (int j = threadIdx.x / kWarp; j < q_len; j += kWarpsPerCta) {
    AttendRow<T>(p, q_begin + j, head, kv_head, first_block,
                 p.causal ? kv_len - q_len + j + 1 : kv_len, lane);
  }
}

}  // namespace

cudaError_t LaunchGenericAttention(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.blocks.num_seqs <= 0 || p.num_q_heads <= 0) return cudaSuccess;
  if (p.num_q_heads > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.blocks.num_seqs), static_cast<unsigned>(p.num_q_heads));
  const dim3 block(kWarpsPerCta * kWarp);
  switch (p.cache.dtype) {
    case DType::kF32:
      GenericAttentionKernel<float><<<grid, block, 0, stream>>>(p);
      break;
    case DType::kBF16:
      GenericAttentionKernel<__nv_bfloat16><<<grid, block, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kvd::cuda
