#ifndef KVD_KERNELS_CUDA_PAGED_KV_CUH_
#define KVD_KERNELS_CUDA_PAGED_KV_CUH_

// Device-side helpers shared by the KV and attention kernels: 16-byte vector loads that
// widen the storage type to fp32, scalar conversions, a pointer shuffle, log2(e) for base-2
// logits, packed prefill Q rows and row alignment (for StageScaledQ), the work-item lookup,
// and paged-arena addressing (kernels/params.h, KvCacheView):
//
//   chunks[b >> chunk_shift] + region_offset + (b & (blocks_per_chunk - 1)) * block_bytes
//     -> [num_kv_heads][block_size][head_dim] of T      (one block of one region)
//
// Only for .cu files.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/params.h"

namespace kvd::cuda {

// Sixteen bytes of T, widened to kSize floats.
template <typename T>
struct Vec16;

template <>
struct Vec16<float> {
  static constexpr int kSize = 4;
  __device__ __forceinline__ static void Load(const void* src, float (&out)[kSize]) {
    const float4 v = *static_cast<const float4*>(src);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};

template <>
struct Vec16<__nv_bfloat16> {
  static constexpr int kSize = 8;
  __device__ __forceinline__ static void Load(const void* src, float (&out)[kSize]) {
    const uint4 raw = *static_cast<const uint4*>(src);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // A bf16 is the top half of an fp32: widening is a shift, exact.
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Start of block `block`'s rows for `kv_head` in the region at `region_offset_bytes`:
// [block_size][head_dim] of T. REQUIRES: the block's chunk is present.
template <typename T>
__device__ __forceinline__ T* BlockHead(const KvCacheView& c, int64_t block,
                                        int64_t region_offset_bytes, int kv_head) {
  const int64_t slot = block & ((int64_t{1} << c.chunk_shift) - 1);
  char* base = static_cast<char*>(c.chunks[block >> c.chunk_shift]) + region_offset_bytes +
               slot * c.block_bytes;
  return reinterpret_cast<T*>(base) + int64_t{kv_head} * c.block_size * c.head_dim;
}

// An int8 view's scales of `kv_head` in block `block` of the region at `region_offset_bytes`:
// [block_size] floats, one a row (kernels/params.h).
__device__ __forceinline__ float* Int8Scales(const KvCacheView& c, int64_t block,
                                             int64_t region_offset_bytes, int kv_head) {
  const int64_t slot = block & ((int64_t{1} << c.chunk_shift) - 1);
  char* base = static_cast<char*>(c.chunks[block >> c.chunk_shift]) + region_offset_bytes +
               slot * c.block_bytes + c.scale_offset_bytes;
  return reinterpret_cast<float*>(base) + int64_t{kv_head} * c.block_size;
}

// Row of key/value `token` (0-based within its sequence) for `kv_head`, given the
// sequence's block ids and log2(block_size). [head_dim] of T.
template <typename T>
__device__ __forceinline__ const T* TokenRow(const KvCacheView& c, const int32_t* seq_blocks,
                                             int block_shift, int token,
                                             int64_t region_offset_bytes, int kv_head) {
  const int32_t block = seq_blocks[token >> block_shift];
  const int offset = token & ((1 << block_shift) - 1);
  return BlockHead<T>(c, block, region_offset_bytes, kv_head) + int64_t{offset} * c.head_dim;
}

// KV length of sequence s of a CSR block table (kernels/params.h, BlockTableView).
__device__ __forceinline__ int SeqKvLen(const BlockTableView& b, int s, int block_size) {
  const int num_blocks = b.indptr[s + 1] - b.indptr[s];
  return num_blocks == 0 ? 0 : (num_blocks - 1) * block_size + b.last_block_len[s];
}

// `ptr` of lane `src_lane` of the warp (all lanes take part).
__device__ __forceinline__ const char* ShflPtr(const char* ptr, int src_lane) {
  const unsigned long long bits = reinterpret_cast<unsigned long long>(ptr);
  return reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, bits, src_lane));
}

__device__ __forceinline__ int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Attention scales logits by sm_scale * kLog2e and exponentiates base 2.
inline constexpr float kLog2e = 1.4426950408889634f;

// Element offset of packed prefill row `packed` of KV head `kv_head` (prefill_attention.h: the
// row of token packed / group and query head kv_head * group + packed % group) in a
// [tokens][stride] array of rows of kHeadDim-wide heads, counting tokens from `first_token`.
template <int kHeadDim>
__device__ __forceinline__ int64_t PackedRowOffset(int first_token, int packed, int group,
                                                   int kv_head, int64_t stride) {
  return int64_t{first_token + packed / group} * stride +
         int64_t{kv_head * group + packed % group} * kHeadDim;
}

// Chunk `chunk` (eight floats) of packed Q row `packed` of a prefill tile whose rows end at
// `packed_rows` (>= 1), for StageScaledQ: a row past the end reads the last real row and is
// not `live`.
template <int kHeadDim>
__device__ __forceinline__ const float* PackedQChunk(const PagedAttentionParams& p, int q_begin,
                                                     int packed, int packed_rows, int group,
                                                     int kv_head, int chunk, bool& live) {
  live = packed < packed_rows;
  return p.q +
         PackedRowOffset<kHeadDim>(q_begin, min(packed, packed_rows - 1), group, kv_head,
                                   p.q_stride) +
         chunk * 8;
}

// Whether every row of a float array (`stride` floats apart from `base`) starts on a
// sizeof(V) boundary, so that V-wide loads or stores may cover it.
template <typename V>
__device__ __forceinline__ bool RowsAligned(const float* base, int stride) {
  constexpr int kFloats = sizeof(V) / sizeof(float);
  return stride % kFloats == 0 && reinterpret_cast<uintptr_t>(base) % sizeof(V) == 0;
}

// Last s with item_indptr[s] <= item, over num_seqs + 1 nondecreasing entries (the sequence
// a work item of a CSR work list belongs to). REQUIRES: item < item_indptr[num_seqs].
__device__ __forceinline__ int FindSequence(const int32_t* item_indptr, int num_seqs, int item) {
  int lo = 0;
  int hi = num_seqs;  // item_indptr[num_seqs] > item
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (item_indptr[mid] <= item) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_PAGED_KV_CUH_
