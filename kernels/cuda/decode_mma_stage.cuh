#ifndef KVD_KERNELS_CUDA_DECODE_MMA_STAGE_CUH_
#define KVD_KERNELS_CUDA_DECODE_MMA_STAGE_CUH_

// How the tensor-core decode kernel (decode_attention_mma.cu) stages K and V in shared memory:
// the tile shape, a warp's stage loader and the CTA's shared-memory setup. Only for .cu files.
//
// Staging: each iteration's K and V tiles are [16 keys][head_dim] bf16 in shared memory,
// 16-byte chunk c of key k stored at chunk c ^ (k % 8) of its row, so the eight rows an
// ldmatrix reads fall in distinct banks.
// With Cfg::kTma (head_dim 128) the tiles are loaded as TMA boxes (kv_row_map.h) where the
// iteration's 16 keys lie in one block inside the view: lane 0 issues four 2 KB boxes (K and
// V, two 64-dim halves each) that complete on the stage's mbarrier, in place of the warp's 32
// cp.async per lane. The tiles are then laid out as the boxes land, in the TMA's 128-byte
// swizzle, as conflict-free for ldmatrix:
//
//   stage: | K dims 0-63 | K dims 64-127 | V dims 0-63 | V dims 64-127 |   2 KB each
//   half:  [16 keys][8 chunks of 16 bytes], chunk c of key k at position c ^ (k % 8)
//
// Keys past the end in a TMA box are whatever the block holds: their scores are masked and
// their V rows zeroed in the fragments. Other iterations go through cp.async (same layout),
// tracked on the same mbarrier.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_common.cuh"
#include "kernels/cuda/hopper_sync.cuh"
#include "kernels/cuda/kv_row_map.h"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/params.h"

namespace kvd::cuda::decode {

template <int kHeadDim, typename Cfg>
struct MmaDecodeShape {
  static constexpr int kKeysPerIter = 16;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per key row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kTileBytes = kKeysPerIter * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K tile, then V tile
  static constexpr int kCopiesPerLane = kKeysPerIter * kChunks / 32;
  static constexpr int kDimSteps = kHeadDim / 16;  // k-steps of Q K^T
  static constexpr int kDimTiles = kHeadDim / 8;   // n-tiles of P V
  static constexpr int kSplitGranule = Cfg::kWarps * kKeysPerIter;
  static constexpr int kPipelineBytes = Cfg::kWarps * Cfg::kStages * kStageBytes;
  static constexpr int kCombineBytes = CombineSlots<kHeadDim, kMaxGroupPerCta, Cfg>::kBytes;
  // TMA boxes land at 1024-byte aligned addresses (the swizzle's period): room to align.
  static constexpr int kAlignSlack = Cfg::kTma ? 1024 : 0;
  static constexpr int kSmemBytes = std::max(kPipelineBytes, kCombineBytes) + kAlignSlack;
  static_assert(!Cfg::kTma || (kRowBytes == kKvRowBytes && kKvBoxRowBytes == 128 &&
                               kTileBytes == 2 * kKvBoxRows * kKvBoxRowBytes));

  // Byte offset of 16-byte chunk `chunk` of key `key` in a K or V tile.
  __device__ __forceinline__ static int TileOffset(int key, int chunk) {
    if constexpr (Cfg::kTma) {
      return Swizzle128Offset(key, chunk, kKvBoxRows);
    } else {
      return key * kRowBytes + ((chunk ^ (key & 7)) << 4);
    }
  }
  static_assert(kCopiesPerLane * 32 == kKeysPerIter * kChunks);
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
};

// Stages a warp's iterations: K and V of 16 keys into one of its pipeline buffers, as TMA
// boxes where they can go (Cfg::kTma; see the file comment) and by cp.async otherwise.
template <int kHeadDim, typename Cfg>
struct MmaStageLoader {
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  static constexpr int kRowBytes = Shape::kRowBytes;

  __device__ __forceinline__ MmaStageLoader(const KvCacheView& c, const KvRowMap& rows,
                                            int block_shift, unsigned char* warp_smem,
                                            uint64_t* stage_full, int lane)
      : rows_(rows),
        block_shift_(block_shift),
        block_mask_(c.block_size - 1),
        v_minus_k_(c.v_offset_bytes - c.k_offset_bytes),
        v_rows_after_k_(v_minus_k_ / kRowBytes),
        tma_shape_(Cfg::kTma && rows.num_rows > 0 && c.block_size >= kKvBoxRows &&
                   v_minus_k_ % kRowBytes == 0),
        warp_smem_(warp_smem),
        stage_full_(stage_full),
        lane_(lane),
        evict_first_(Cfg::kTma ? L2EvictFirstPolicy() : 0) {}

  // Stage `stage`'s K tile (V a tile later).
  __device__ __forceinline__ unsigned char* Tile(int stage) const {
    return warp_smem_ + stage * Shape::kStageBytes;
  }

  // Keys [start, start + 16) of the sequence, `ptrs` lane j's K head pointer of the j-th
  // block they touch (WarpKeys::BlockPtrs), into `stage`; keys at or past key_end are zeros
  // or (TMA) whatever their block holds. kTma: completes on the stage's barrier; else the
  // caller commits the cp.async group.
  __device__ __forceinline__ void Issue(int start, const char* ptrs, int key_end, int stage) const {
    unsigned char* k_dst = Tile(stage);
    const int64_t row = Cfg::kTma ? TmaRow(start, ptrs) : -1;
    if (row >= 0) {
      if (lane_ == 0) {
        uint64_t* bar = &stage_full_[stage];
        MbarrierArriveExpectTx(bar, Shape::kStageBytes);
        // K/V are read once a step: their lines go first from L2. (H200, back to back in a
        // graph, three rounds alternating with plain boxes: 8 x 4k 2% faster, 16 x 16k and
        // 4 x 128k 0.7-0.8%, 128 x 2k 0.5%, 32 x 4k and 64 x 4k within 0.2%; measured while
        // the boxes still had the 256-byte L2 promotion, kv_row_map.cc.)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          unsigned char* dst = k_dst + half * kKvBoxRows * kKvBoxRowBytes;
          TmaLoad2d(dst, &rows_.map, half * kKvBoxElements, static_cast<int>(row), bar,
                    evict_first_);
          TmaLoad2d(dst + Shape::kTileBytes, &rows_.map, half * kKvBoxElements,
                    static_cast<int>(row + v_rows_after_k_), bar, evict_first_);
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < Shape::kCopiesPerLane; ++i) {
      const int q = lane_ + 32 * i;
      const int key_in_iter = q / Shape::kChunks;
      const int chunk = q % Shape::kChunks;
      const int key = start + key_in_iter;
      const char* src = ShflPtr(ptrs, key_in_iter >> block_shift_) +
                        int64_t{key & block_mask_} * kRowBytes + chunk * 16;
      unsigned char* dst = k_dst + Shape::TileOffset(key_in_iter, chunk);
      if constexpr (Cfg::kL2Prefetch > 0) {
        CpAsync16Prefetch<Cfg::kL2Prefetch>(dst, src, key < key_end);
        CpAsync16Prefetch<Cfg::kL2Prefetch>(dst + Shape::kTileBytes, src + v_minus_k_,
                                            key < key_end);
      } else {
        CpAsync16(dst, src, key < key_end);
        CpAsync16(dst + Shape::kTileBytes, src + v_minus_k_, key < key_end);
      }
    }
    if constexpr (Cfg::kTma) {
      // Every lane's copies join the phase before lane 0's counted arrival ends it.
      CpAsyncTrackOnMbarrier(&stage_full_[stage]);
      __syncwarp();
      if (lane_ == 0) MbarrierArrive(&stage_full_[stage]);
    }
  }

  // Starts bringing the K and V rows of keys [start, start + 16) into L2 (every lane calls,
  // lane 0 issues), where they lie in one block (blocks of 16 keys or more).
  __device__ __forceinline__ void PrefetchL2(int start, const char* ptrs) const {
    const char* k_row = ShflPtr(ptrs, 0) + int64_t{start & block_mask_} * kRowBytes;
    if (block_mask_ + 1 >= Shape::kKeysPerIter && lane_ == 0) {
      BulkPrefetchL2(k_row, Shape::kTileBytes);
      BulkPrefetchL2(k_row + v_minus_k_, Shape::kTileBytes);
    }
  }

 private:
  // The view row of the iteration's first K row when its K and V go through TMA, else -1:
  // the 16 keys lie in lane 0's block (blocks of 16 or more keys), and both runs of 16 rows
  // lie in the view, on its row grid. The same answer in every lane.
  __device__ __forceinline__ int64_t TmaRow(int start, const char* ptrs) const {
    if (!tma_shape_) return -1;
    const uint64_t k_row =
        reinterpret_cast<uint64_t>(ShflPtr(ptrs, 0)) + uint64_t(start & block_mask_) * kRowBytes;
    if (k_row < rows_.base || (k_row - rows_.base) % kRowBytes != 0) return -1;
    const int64_t row = static_cast<int64_t>((k_row - rows_.base) / kRowBytes);
    const int64_t v_row = row + v_rows_after_k_;
    const bool inside =
        row + kKvBoxRows <= rows_.num_rows && v_row >= 0 && v_row + kKvBoxRows <= rows_.num_rows;
    return inside ? row : -1;
  }

  const KvRowMap& rows_;
  int block_shift_;
  int block_mask_;
  int64_t v_minus_k_;
  int64_t v_rows_after_k_;
  bool tma_shape_;
  unsigned char* warp_smem_;
  uint64_t* stage_full_;  // kTma: the warp's [kStages] barriers
  int lane_;
  uint64_t evict_first_;  // kTma: L2EvictFirstPolicy() for the boxes
};

// The shared memory of a decode CTA: the warps' pipeline buffers (kTma: 1024-byte aligned),
// and kTma's per-warp, per-stage barriers, each initialized to one counted arrival a phase.
template <typename Cfg>
__device__ __forceinline__ unsigned char* DecodeSmem(unsigned char* smem_raw,
                                                     uint64_t (*stage_full)[Cfg::kStages], int warp,
                                                     int lane) {
  unsigned char* smem = smem_raw;
  if constexpr (Cfg::kTma) {
    smem += PadTo1024(SharedAddress(smem_raw));
    if (lane == 0) {
      for (int stage = 0; stage < Cfg::kStages; ++stage) MbarrierInit(&stage_full[warp][stage], 1);
      FenceMbarrierInit();
    }
    __syncwarp();
  }
  return smem;
}

}  // namespace kvd::cuda::decode

#endif  // KVD_KERNELS_CUDA_DECODE_MMA_STAGE_CUH_
