#ifndef KVD_TESTS_GPU_TWIN_ARENA_H_
#define KVD_TESTS_GPU_TWIN_ARENA_H_

// TwinArena: the same paged KV arena on the CPU backend (f32, the reference's only KV
// type) and on the CUDA backend (f32 or bf16), each with its own chunk table in its own
// memory, every byte poisoned (NaN) at creation.
//
//   chunk c: | L0 K | L0 V | L1 K | L1 V | ... |   region = [blocks_per_chunk][block]
//   block:   [num_kv_heads][block_size][head_dim] of the backend's KV dtype
//
// Chunks listed in `released` are null in both tables; no block id from them is handed out.

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/params.h"

namespace kvd::gpu_test {

struct ArenaShape {
  int num_layers = 2;
  int num_kv_heads = 2;
  int head_dim = 64;
  int block_size = 16;
  int chunk_shift = 2;
  int num_chunks = 3;
  std::vector<int> released;
  DType gpu_dtype = DType::kF32;
};

class TwinArena {
 public:
  TwinArena(Backend& cpu, Backend& gpu, ArenaShape shape);

  const ArenaShape& shape() const { return shape_; }
  KvCacheView CpuView(int layer) const { return View(layer, /*on_gpu=*/false); }
  KvCacheView GpuView(int layer) const { return View(layer, /*on_gpu=*/true); }
  void* const* cpu_table() const { return cpu_table_.as<void*>(); }
  void* const* gpu_table() const { return gpu_table_.as<void*>(); }
  // Chunk c's GPU memory (null for a released chunk).
  void* GpuChunk(int c) const { return gpu_chunks_[c].data(); }
  int64_t BlockBytes(bool on_gpu) const;
  int64_t RegionBytes(bool on_gpu) const { return BlockBytes(on_gpu) << shape_.chunk_shift; }
  int64_t ChunkBytes(bool on_gpu) const { return RegionBytes(on_gpu) * 2 * shape_.num_layers; }

  // Every usable block id (in present chunks), shuffled by `seed`.
  std::vector<int32_t> ShuffledBlockIds(uint32_t seed) const;

  // Whole arena as fp32 values, chunk by chunk (released chunks omitted), widened from the
  // backend's dtype; poisoned bytes read as NaN.
  std::vector<float> CpuValues() const;
  std::vector<float> GpuValues() const;

  // Overwrites both arenas with the same random fp32 values. REQUIRES: gpu_dtype kF32.
  void FillRandom(uint32_t seed);

 private:
  KvCacheView View(int layer, bool on_gpu) const;

  Backend& cpu_;
  Backend& gpu_;
  ArenaShape shape_;
  std::vector<DeviceBuffer> cpu_chunks_;
  std::vector<DeviceBuffer> gpu_chunks_;
  DeviceBuffer cpu_table_;
  DeviceBuffer gpu_table_;
};

}  // namespace kvd::gpu_test

#endif  // KVD_TESTS_GPU_TWIN_ARENA_H_
