#include "cache/kv_arena.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"

namespace kvd {

absl::StatusOr<std::unique_ptr<KvArena>> KvArena::Create(const KvLayout& layout,
                                                         int32_t chunk_shift, int32_t max_chunks,
                                                         Backend* backend) {
  if (layout.dtype() == DType::kFp8E4M3 || layout.dtype() == DType::kInt4) {
    return absl::UnimplementedError(
        absl::StrCat("kv_dtype ", std::string(DTypeName(layout.dtype())),
                     " is not stored by the KV arena yet; use f32, bf16, fp16 or int8"));
  }
  if (chunk_shift < 0 || chunk_shift > 30) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_shift must be in [0, 30], got ", chunk_shift));
  }
  if (max_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_chunks must be >= 1, got ", max_chunks));
  }
  if (backend == nullptr) return absl::InvalidArgumentError("KvArena needs a backend");
  std::unique_ptr<KvArena> arena(new KvArena(layout, chunk_shift, max_chunks, backend));
  absl::StatusOr<DeviceBuffer> table = backend->Allocate(sizeof(void*) * max_chunks);
  if (!table.ok()) return table.status();
  arena->table_ = *std::move(table);
  arena->host_table_.assign(max_chunks, nullptr);
  if (absl::Status s = arena->UploadTable(); !s.ok()) return s;
  // Room for the ids of a few copies from the start, so that a fork's one-block copy never
  // has to allocate (and cannot fail for want of memory after a block was taken for it).
  absl::StatusOr<DeviceBuffer> pairs = backend->Allocate(sizeof(int32_t) * 2 * kInitialCopyPairs);
  if (!pairs.ok()) return pairs.status();
  arena->pairs_ = *std::move(pairs);
  arena->pair_capacity_ = kInitialCopyPairs;
  return arena;
}

absl::Status KvArena::UploadTable() {
  return backend_->CopyToDevice(table_.data(), host_table_.data(),
                                sizeof(void*) * host_table_.size());
}

absl::Status KvArena::AddChunk() {
  if (num_chunks() >= max_chunks_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV arena is at its maximum of ", max_chunks_, " chunks"));
  }
  if (device_headroom_bytes_ > 0) {
    if (const std::optional<Backend::DeviceMemory> memory = backend_->QueryDeviceMemory()) {
      const int64_t left = memory->free_bytes - chunk_bytes();
      if (left < device_headroom_bytes_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("allocating KV arena chunk ", num_chunks() + 1, " of ", max_chunks_, " (",
                         chunk_bytes(), " bytes) would leave ", std::max<int64_t>(left, 0),
                         " bytes of device memory free, under the ", device_headroom_bytes_,
                         " kept for the engine's buffers (kv_cache_config.memory_pool.device_headroom)"));
      }
    }
  }
  absl::StatusOr<DeviceBuffer> chunk = backend_->Allocate(chunk_bytes());
  if (!chunk.ok()) {
    return absl::Status(
        chunk.status().code(),
        absl::StrCat("allocating KV arena chunk ", num_chunks() + 1, " of ", max_chunks_, " (",
                     chunk_bytes(), " bytes): ", chunk.status().message()));
  }
  host_table_[num_chunks()] = chunk->data();
  chunks_.push_back(*std::move(chunk));
  absl::Status s = UploadTable();
  if (!s.ok()) {
    host_table_[num_chunks() - 1] = nullptr;
    chunks_.pop_back();
  }
  return s;
}

absl::Status KvArena::ReleaseTopChunk() {
  KVD_CACHE_CHECK(!chunks_.empty(), "no chunk to release");
  host_table_[num_chunks() - 1] = nullptr;
  absl::Status s = UploadTable();
  // The kernels must not see a dangling pointer, so free only once the table is updated;
  // a device backend orders the free after the upload.
  chunks_.pop_back();
  return s;
}

KvCacheView KvArena::LayerView(int32_t layer) const {
  KVD_CACHE_CHECK(layer >= 0 && layer < layout_.num_layers(), "layer out of range");
  KvCacheView v;
  v.chunks = static_cast<void* const*>(table_.data());
  v.num_chunks = num_chunks();
  v.chunk_shift = chunk_shift_;
  v.k_offset_bytes = layout_.k_offset_bytes(layer, blocks_per_chunk());
  v.v_offset_bytes = layout_.v_offset_bytes(layer, blocks_per_chunk());
  v.block_bytes = layout_.region_block_bytes();
  v.scale_offset_bytes = layout_.quantized() ? layout_.region_scale_offset_bytes() : 0;
  v.dtype = layout_.dtype();
  v.num_kv_heads = layout_.shape().num_kv_heads;
  v.block_size = layout_.block_size();
  v.head_dim = layout_.shape().head_dim;
  return v;
}

absl::Status KvArena::CopyBlocks(absl::Span<const BlockId> src, absl::Span<const BlockId> dst) {
  KVD_CACHE_CHECK(src.size() == dst.size(), "CopyBlocks: src and dst lengths differ");
  if (src.empty()) return absl::OkStatus();
  const int32_t n = static_cast<int32_t>(src.size());
  if (n > pair_capacity_) {
    const int32_t capacity = std::max(n, 2 * pair_capacity_);
    absl::StatusOr<DeviceBuffer> pairs = backend_->Allocate(sizeof(int32_t) * 2 * capacity);
    if (!pairs.ok()) return pairs.status();
    pairs_ = *std::move(pairs);
    pair_capacity_ = capacity;
  }
  int32_t* src_ids = pairs_.as<int32_t>();
  int32_t* dst_ids = src_ids + pair_capacity_;
  if (absl::Status s = backend_->CopyToDevice(src_ids, src.data(), sizeof(int32_t) * n); !s.ok()) {
    return s;
  }
  if (absl::Status s = backend_->CopyToDevice(dst_ids, dst.data(), sizeof(int32_t) * n); !s.ok()) {
    return s;
  }
  CopyBlocksParams p;
  p.chunks = static_cast<void* const*>(table_.data());
  p.chunk_shift = chunk_shift_;
  p.chunk_region_bytes = layout_.region_bytes(blocks_per_chunk());
  p.num_regions = layout_.num_regions();
  p.block_bytes = layout_.region_block_bytes();
  p.src = src_ids;
  p.dst = dst_ids;
  p.num_pairs = n;
  return backend_->CopyBlocks(p);
}

void* KvArena::BlockAddress(BlockId block, int32_t region) const {
  const int32_t chunk = block >> chunk_shift_;
  KVD_CACHE_CHECK(chunk >= 0 && chunk < num_chunks(), "block's chunk is not present");
  const int64_t slot = block & (blocks_per_chunk() - 1);
  return static_cast<char*>(host_table_[chunk]) +
         layout_.region_bytes(blocks_per_chunk()) * region + slot * layout_.region_block_bytes();
}

}  // namespace kvd
