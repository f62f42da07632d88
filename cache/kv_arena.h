#ifndef KVD_CACHE_KV_ARENA_H_
#define KVD_CACHE_KV_ARENA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/block_links.h"
#include "cache/kv_layout.h"
#include "kernels/backend.h"
#include "kernels/params.h"

namespace kvd {

// KvArena owns the backend memory of the paged KV cache: a stack of equally sized chunks
// (layout in kv_layout.h and kernels/params.h) and the chunk address table the kernels
// read. The table lives in backend memory with `max_chunks` slots; slots at and above
// num_chunks() hold nullptr. A host copy is kept and uploaded (Backend::CopyToDevice)
// whenever a chunk is added or released. Chunk memory is uninitialized.
//
// Only the top chunk can be released, so present chunks are always [0, num_chunks()).
// Not thread safe: the engine thread drives it. Does not own the backend, which must
// outlive it.
class KvArena {
 public:
  // Block pairs a copy can name without growing the id buffer.
  static constexpr int32_t kInitialCopyPairs = 16;

  // Unimplemented for KV dtypes the arena cannot store yet (fp8, int4);
  // InvalidArgument for chunk_shift outside [0, 30] or max_chunks < 1.
  static absl::StatusOr<std::unique_ptr<KvArena>> Create(const KvLayout& layout,
                                                         int32_t chunk_shift, int32_t max_chunks,
                                                         Backend* backend);

  const KvLayout& layout() const { return layout_; }
  Backend* backend() const { return backend_; }
  int32_t chunk_shift() const { return chunk_shift_; }
  int32_t blocks_per_chunk() const { return int32_t{1} << chunk_shift_; }
  int32_t num_chunks() const { return static_cast<int32_t>(chunks_.size()); }
  int32_t max_chunks() const { return max_chunks_; }
  int64_t chunk_bytes() const { return layout_.chunk_bytes(blocks_per_chunk()); }
  // Backend bytes held by chunks now.
  int64_t bytes() const { return chunk_bytes() * num_chunks(); }

  // Device memory AddChunk leaves free (KvCacheOptions::device_headroom_bytes); 0, the
  // default, leaves none.
  void set_device_headroom_bytes(int64_t bytes) { device_headroom_bytes_ = bytes; }
  int64_t device_headroom_bytes() const { return device_headroom_bytes_; }

  // Allocates chunk num_chunks(). ResourceExhausted at max_chunks, and where the backend
  // reports its device's free memory and the chunk would leave less than the headroom; the
  // backend's error if it cannot allocate (the arena is unchanged then).
  absl::Status AddChunk();
  // Frees the top chunk. REQUIRES: num_chunks() > 0 and no block table names its blocks.
  absl::Status ReleaseTopChunk();

  // The kernels' view of `layer`. Valid until the next AddChunk/ReleaseTopChunk (the table
  // pointer itself stays fixed; num_chunks changes). REQUIRES: 0 <= layer < num_layers.
  KvCacheView LayerView(int32_t layer) const;

  // Copies whole blocks (all layers, K and V) src[i] -> dst[i] through the backend,
  // asynchronously on a device backend (Backend::Synchronize waits). Up to
  // kInitialCopyPairs pairs allocate nothing; more grow the id buffer first (its failure is
  // returned before anything is copied).
  // REQUIRES: equal lengths, ids in present chunks, no id both a source and a destination.
  absl::Status CopyBlocks(absl::Span<const BlockId> src, absl::Span<const BlockId> dst);

  // Host address of `block`'s bytes in `region` (2 * layer + {0: K, 1: V}): its elements,
  // then its scales (KvLayout). For tests and host backends only. REQUIRES: the block's chunk is
  // present.
  void* BlockAddress(BlockId block, int32_t region) const;

 private:
  KvArena(const KvLayout& layout, int32_t chunk_shift, int32_t max_chunks, Backend* backend)
      : layout_(layout), chunk_shift_(chunk_shift), max_chunks_(max_chunks), backend_(backend) {}

  absl::Status UploadTable();

  const KvLayout layout_;
  const int32_t chunk_shift_;
  const int32_t max_chunks_;
  Backend* const backend_;
  DeviceBuffer table_;                // [max_chunks] void*, backend memory
  std::vector<void*> host_table_;     // [max_chunks] host copy of table_
  std::vector<DeviceBuffer> chunks_;  // [num_chunks]
  DeviceBuffer pairs_;                // [2 * pair_capacity_] int32 src ids then dst ids
  int32_t pair_capacity_ = 0;
  int64_t device_headroom_bytes_ = 0;
};

}  // namespace kvd

#endif  // KVD_CACHE_KV_ARENA_H_
