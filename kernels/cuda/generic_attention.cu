#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/generic_attention.h"
#include "kernels/kv_quant.h"

namespace kvd::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerCta = 8;

// Value i of a K or V row; `scale` is the row's int8 scale (1 for the other types).
__device__ __forceinline__ float Load(const float* p, int i, float) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int i, float) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float Load(const int8_t* p, int i, float scale) {
  return DequantizeInt8Kv(p[i], scale);
}

// The scale of row `row` of `kv_head` in the block at `block_base` of the region at
// `region` bytes into its chunk: an int8 cache's stored one, 1 otherwise.
template <typename T>
__device__ __forceinline__ float RowScale(const KvCacheView& c, const char* block_base, int kv_head,
                                          int row) {
  if constexpr (std::is_same_v<T, int8_t>) {
    return reinterpret_cast<const float*>(
        block_base + c.scale_offset_bytes)[int64_t{kv_head} * c.block_size + row];
  } else {
    return 1.0f;
  }
}

// One warp: query row `row`, head `head` against keys [0, end) of its block table; lane l
// holds dims l, l + 32, ... up to kMaxPerLane of them.
template <typename T, int kMaxPerLane>
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
    const int key_row = t % c.block_size;
    const int64_t elem = head_offset + int64_t{key_row} * head_dim;
    const char* k_block = chunk + c.k_offset_bytes + base;
    const char* v_block = chunk + c.v_offset_bytes + base;
    const T* k = reinterpret_cast<const T*>(k_block) + elem;
    const T* v = reinterpret_cast<const T*>(v_block) + elem;
    const float k_scale = RowScale<T>(c, k_block, kv_head, key_row);
    const float v_scale = RowScale<T>(c, v_block, kv_head, key_row);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < head_dim) dot += q[i] * Load(k, d, k_scale);
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
      acc[i] = acc[i] * rescale + (d < head_dim ? weight * Load(v, d, v_scale) : 0.0f);
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
template <typename T, int kMaxPerLane>
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
    AttendRow<T, kMaxPerLane>(p, q_begin + j, head, kv_head, first_block,
                              p.causal ? kv_len - q_len + j + 1 : kv_len, lane);
  }
}

}  // namespace

cudaError_t LaunchGenericAttention(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.blocks.num_seqs <= 0 || p.num_q_heads <= 0) return cudaSuccess;
  if (p.num_q_heads > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.blocks.num_seqs), static_cast<unsigned>(p.num_q_heads));
  const dim3 block(kWarpsPerCta * kWarp);
  if (p.cache.head_dim > kGenericAttentionMaxInt8HeadDim) return cudaErrorInvalidValue;
  // One value a lane up to 32 dims, four up to 128.
  const bool wide = p.cache.head_dim > kWarp;
  switch (p.cache.dtype) {
    case DType::kF32:
      wide ? GenericAttentionKernel<float, 4><<<grid, block, 0, stream>>>(p)
           : GenericAttentionKernel<float, 1><<<grid, block, 0, stream>>>(p);
      break;
    case DType::kBF16:
      wide ? GenericAttentionKernel<__nv_bfloat16, 4><<<grid, block, 0, stream>>>(p)
           : GenericAttentionKernel<__nv_bfloat16, 1><<<grid, block, 0, stream>>>(p);
      break;
    case DType::kInt8:
      wide ? GenericAttentionKernel<int8_t, 4><<<grid, block, 0, stream>>>(p)
           : GenericAttentionKernel<int8_t, 1><<<grid, block, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kvd::cuda
