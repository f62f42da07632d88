#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/kv_cache_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/kv_quant.h"

namespace kvd::cuda {
namespace {

constexpr int kThreads = 256;

// One CTA per token; threads stride over its num_kv_heads * head_dim values of K and V.
template <typename T>
__global__ void __launch_bounds__(kThreads) AppendKvKernel(AppendKvParams p) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  const int t = blockIdx.x;
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0) return;
  const KvCacheView& c = p.cache;
  const int64_t block = slot / c.block_size;
  const int offset = static_cast<int>(slot % c.block_size);
  const int row_len = c.num_kv_heads * c.head_dim;
  const float* k = p.k + int64_t{t} * p.k_stride;
  const float* v = p.v + int64_t{t} * p.v_stride;
  // The block's address once (a chunk-table read), then the row's loads all in flight.
  T* k_block = BlockHead<T>(c, block, c.k_offset_bytes, 0);
  T* v_block = BlockHead<T>(c, block, c.v_offset_bytes, 0);
  const int64_t head_elems = int64_t{c.block_size} * c.head_dim;
#pragma unroll 4
  for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
    const int head = i / c.head_dim;
    const int d = i % c.head_dim;
    const int64_t at = head * head_elems + int64_t{offset} * c.head_dim + d;
    k_block[at] = FromFloat<T>(k[i]);
    v_block[at] = FromFloat<T>(v[i]);
  }
}

// One CTA per token, as AppendKvKernel; warp w quantizes heads w, w + kWarps, ... of K and V
// (kernels/kv_quant.h, the CPU backend's arithmetic, so both store the same bytes): the warp's
// max |x| (a NaN kept), the row's scale, then each lane's values.
__global__ void __launch_bounds__(kThreads) AppendKvInt8Kernel(AppendKvParams p) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  constexpr int kWarps = kThreads / 32;
  const int t = blockIdx.x;
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0) return;
  const KvCacheView& c = p.cache;
  const int64_t block = slot / c.block_size;
  const int offset = static_cast<int>(slot % c.block_size);
  const int lane = threadIdx.x % 32;
  for (int h = threadIdx.x / 32; h < 2 * c.num_kv_heads; h += kWarps) {
    const bool value = h >= c.num_kv_heads;
    const int head = value ? h - c.num_kv_heads : h;
    const float* x = (value ? p.v + int64_t{t} * p.v_stride : p.k + int64_t{t} * p.k_stride) +
                     int64_t{head} * c.head_dim;
    float max_abs = 0.0f;
    for (int d = lane; d < c.head_dim; d += 32) {
      const float a = fabsf(x[d]);
      if (a > max_abs || a != a) max_abs = a;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, max_abs, o);
      if (other > max_abs || other != other) max_abs = other;
    }
    const float scale = Int8KvScale(max_abs);
    const int64_t region = value ? c.v_offset_bytes : c.k_offset_bytes;
    int8_t* row = BlockHead<int8_t>(c, block, region, head) + int64_t{offset} * c.head_dim;
    for (int d = lane; d < c.head_dim; d += 32) row[d] = QuantizeInt8Kv(x[d], scale);
    if (lane == 0) Int8Scales(c, block, region, head)[offset] = scale;
  }
}

// grid (pairs, regions): CTA (i, r) copies block src[i] -> dst[i] of region r in units of
// Word (uint4 or uint8_t).
template <typename Word>
__global__ void __launch_bounds__(kThreads) CopyBlocksKernel(CopyBlocksParams p) {
  const int i = blockIdx.x;
  const int64_t region_offset = int64_t{blockIdx.y} * p.chunk_region_bytes;
  const int64_t mask = (int64_t{1} << p.chunk_shift) - 1;
  const int64_t src_block = p.src[i];
  const int64_t dst_block = p.dst[i];
  const char* src = static_cast<const char*>(p.chunks[src_block >> p.chunk_shift]) + region_offset +
                    (src_block & mask) * p.block_bytes;
  char* dst = static_cast<char*>(p.chunks[dst_block >> p.chunk_shift]) + region_offset +
              (dst_block & mask) * p.block_bytes;
  const int64_t words = p.block_bytes / static_cast<int64_t>(sizeof(Word));
  const Word* from = reinterpret_cast<const Word*>(src);
  Word* to = reinterpret_cast<Word*>(dst);
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) to[w] = from[w];
}

}  // namespace

cudaError_t LaunchAppendKv(const AppendKvParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.cache.dtype == DType::kInt8) {
    return LaunchDependent(AppendKvInt8Kernel, p.num_tokens, kThreads, 0, stream, p);
  }
  return KVD_DISPATCH_STORAGE_DTYPE(p.cache.dtype, T, [&] {
    return LaunchDependent(AppendKvKernel<T>, p.num_tokens, kThreads, 0, stream, p);
  }());
}

cudaError_t LaunchCopyBlocks(const CopyBlocksParams& p, cudaStream_t stream) {
  if (p.num_pairs == 0 || p.num_regions == 0) return cudaSuccess;
  if (p.num_regions > 65535) return cudaErrorInvalidValue;
  const dim3 grid(p.num_pairs, p.num_regions);
  // Chunk bases come from cudaMalloc (256-byte aligned), so 16-byte moves need only the
  // sizes to be multiples of 16.
  const bool aligned = p.block_bytes % 16 == 0 && p.chunk_region_bytes % 16 == 0;
  if (aligned) {
    CopyBlocksKernel<uint4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    CopyBlocksKernel<uint8_t><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace kvd::cuda
