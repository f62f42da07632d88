#ifndef KVD_KERNELS_CUDA_PREFILL_COMMON_CUH_
#define KVD_KERNELS_CUDA_PREFILL_COMMON_CUH_

// Code shared by the tensor-core prefill kernels (prefill_attention_mma.h: the 64-row kernel
// of prefill_attention_mma.cu, the wide one of prefill_attention_wide.cu and the Hopper one of
// prefill_attention_sm90a.cu): what a work item covers, and the mma.sync kernels' swizzled K/V
// tiles with their cp.async gather from the paged arena. Only for .cu files.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/params.h"

namespace kvd::cuda::prefill {

// What a work item covers: one tile of kRows packed query rows (prefill_attention.h) of one
// KV head of one sequence.
struct Item {
  int q_begin;      // the sequence's first query row
  int q_len;        // its query rows
  int kv_len;       // its keys
  int packed_rows;  // q_len * group
  int kv_head;
  int tile_row0;              // the tile's first packed row
  int key_end;                // keys at or past it are visible to no row of the tile (not loaded)
  int num_key_tiles;          // tiles of kKeys keys below key_end (0 where it is 0 or less)
  const int32_t* seq_blocks;  // the sequence's block ids
};

// Work item `item` of the list tile_indptr counts (CeilDiv(q_len * group, kRows) *
// num_kv_heads items a sequence), in the order every tensor-core kernel takes them: a
// sequence's latest (costliest causal) tiles first, the KV heads of a tile one after another.
// tile_indptr[0] is never read, so that it may serve as a work counter.
template <int kRows, int kKeys>
__device__ __forceinline__ Item ItemOf(const PagedAttentionParams& p, const int32_t* tile_indptr,
                                       int item, int group) {
  const int s = FindSequence(tile_indptr, p.blocks.num_seqs, item);
  Item it;
  it.q_begin = p.q_indptr[s];
  it.q_len = p.q_indptr[s + 1] - it.q_begin;
  it.kv_len = SeqKvLen(p.blocks, s, p.cache.block_size);
  it.packed_rows = it.q_len * group;
  const int num_tiles = CeilDiv(it.packed_rows, kRows);
  const int local = item - (s == 0 ? 0 : tile_indptr[s]);
  it.kv_head = local % p.cache.num_kv_heads;
  it.tile_row0 = (num_tiles - 1 - local / p.cache.num_kv_heads) * kRows;
  const int last_row = min(it.packed_rows - 1, it.tile_row0 + kRows - 1);
  it.key_end = p.causal ? it.kv_len - it.q_len + last_row / group + 1 : it.kv_len;
  // No keys at all (a causal chunk longer than its context): no tiles, zero rows out.
  it.num_key_tiles = max(0, CeilDiv(it.key_end, kKeys));
  it.seq_blocks = p.blocks.indices + p.blocks.indptr[s];
  return it;
}

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][kHeadDim] bf16 tile whose
// chunks are XOR-swizzled by row (chunk c of row r at chunk c ^ (r % 8)), so that the eight
// rows an ldmatrix reads at one logical chunk fall in eight different bank groups.
template <int kHeadDim>
__device__ __forceinline__ int Swizzled(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
}

// Issues, from each of the kThreads threads of a CTA, the cp.async copies of K/V tile kt (keys
// [kt * kKeys, (kt + 1) * kKeys) of KV head `kv_head` of the sequence whose block ids are
// `seq_blocks`) into the Swizzled [kKeys][kHeadDim] tiles at s_k and s_v; keys at or past
// `key_end` become zeros (their V must not be read: the tail of the last block may hold
// anything). The caller commits the group.
template <int kHeadDim, int kKeys, int kThreads>
__device__ __forceinline__ void LoadKvTile(const KvCacheView& c, const int32_t* seq_blocks,
                                           int block_shift, int kv_head, int kt, int key_end,
                                           __nv_bfloat16* s_k, __nv_bfloat16* s_v) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kRounds = kKeys * kChunks / kThreads;
  static_assert(kRounds * kThreads == kKeys * kChunks);
  const int block_mask = c.block_size - 1;
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    const int index = round * kThreads + threadIdx.x;
    const int key_local = index / kChunks;
    const int chunk = index % kChunks;
    const int key = kt * kKeys + key_local;
    const bool valid = key < key_end;
    const int safe_key = valid ? key : 0;
    const char* src = reinterpret_cast<const char*>(BlockHead<__nv_bfloat16>(
                          c, seq_blocks[safe_key >> block_shift], c.k_offset_bytes, kv_head)) +
                      int64_t{(safe_key & block_mask) * kHeadDim + chunk * 8} * 2;
    const int dst = Swizzled<kHeadDim>(key_local, chunk);
    CpAsync16(s_k + dst, src, valid);
    CpAsync16(s_v + dst, src + v_minus_k, valid);
  }
}

}  // namespace kvd::cuda::prefill

#endif  // KVD_KERNELS_CUDA_PREFILL_COMMON_CUH_
