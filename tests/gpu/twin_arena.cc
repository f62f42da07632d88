#include "tests/gpu/twin_arena.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {

TwinArena::TwinArena(Backend& cpu, Backend& gpu, ArenaShape shape)
    : cpu_(cpu), gpu_(gpu), shape_(std::move(shape)) {
  std::vector<void*> cpu_table(shape_.num_chunks, nullptr);
  std::vector<void*> gpu_table(shape_.num_chunks, nullptr);
  for (int c = 0; c < shape_.num_chunks; ++c) {
    const bool released =
        std::find(shape_.released.begin(), shape_.released.end(), c) != shape_.released.end();
    if (released) {
      cpu_chunks_.emplace_back();
      gpu_chunks_.emplace_back();
      continue;
    }
    cpu_chunks_.push_back(Poisoned(cpu_, ChunkBytes(false)));
    gpu_chunks_.push_back(Poisoned(gpu_, ChunkBytes(true)));
    cpu_table[c] = cpu_chunks_.back().data();
    gpu_table[c] = gpu_chunks_.back().data();
  }
  cpu_table_ = Upload(cpu_, cpu_table);
  gpu_table_ = Upload(gpu_, gpu_table);
}

int64_t TwinArena::BlockBytes(bool on_gpu) const {
  const int elem = on_gpu ? DTypeBits(shape_.gpu_dtype) / 8 : 4;
  return int64_t{shape_.num_kv_heads} * shape_.block_size * shape_.head_dim * elem;
}

KvCacheView TwinArena::View(int layer, bool on_gpu) const {
  KvCacheView v;
  v.chunks = on_gpu ? gpu_table() : cpu_table();
  v.num_chunks = shape_.num_chunks;
  v.chunk_shift = shape_.chunk_shift;
  v.k_offset_bytes = RegionBytes(on_gpu) * (2 * layer);
  v.v_offset_bytes = RegionBytes(on_gpu) * (2 * layer + 1);
  v.block_bytes = BlockBytes(on_gpu);
  v.dtype = on_gpu ? shape_.gpu_dtype : DType::kF32;
  v.num_kv_heads = shape_.num_kv_heads;
  v.block_size = shape_.block_size;
  v.head_dim = shape_.head_dim;
  return v;
}

std::vector<int32_t> TwinArena::ShuffledBlockIds(uint32_t seed) const {
  std::vector<int32_t> ids;
  for (int c = 0; c < shape_.num_chunks; ++c) {
    if (cpu_chunks_[c].data() == nullptr) continue;
    for (int32_t slot = 0; slot < (1 << shape_.chunk_shift); ++slot) {
      ids.push_back((c << shape_.chunk_shift) + slot);
    }
  }
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

std::vector<float> TwinArena::CpuValues() const {
  std::vector<float> values;
  for (const DeviceBuffer& chunk : cpu_chunks_) {
    if (chunk.data() == nullptr) continue;
    const std::vector<float> part = DownloadFloats(cpu_, chunk.data(), chunk.bytes() / 4);
    values.insert(values.end(), part.begin(), part.end());
  }
  return values;
}

std::vector<float> TwinArena::GpuValues() const {
  std::vector<float> values;
  for (const DeviceBuffer& chunk : gpu_chunks_) {
    if (chunk.data() == nullptr) continue;
    const std::vector<uint8_t> bytes = DownloadBytes(gpu_, chunk.data(), chunk.bytes());
    if (shape_.gpu_dtype == DType::kF32) {
      const size_t n = bytes.size() / 4;
      const size_t at = values.size();
      values.resize(at + n);
      std::memcpy(values.data() + at, bytes.data(), bytes.size());
    } else {
      for (size_t i = 0; i < bytes.size(); i += 2) {
        uint16_t bits;
        std::memcpy(&bits, bytes.data() + i, 2);
        values.push_back(Bf16ToFloat(bits));
      }
    }
  }
  return values;
}

void TwinArena::FillRandom(uint32_t seed) {
  for (size_t c = 0; c < cpu_chunks_.size(); ++c) {
    if (cpu_chunks_[c].data() == nullptr) continue;
    const std::vector<float> values = RandomFloats(cpu_chunks_[c].bytes() / 4, seed + c);
    OrDie(cpu_.CopyToDevice(cpu_chunks_[c].data(), values.data(), cpu_chunks_[c].bytes()),
          "fill cpu chunk");
    OrDie(gpu_.CopyToDevice(gpu_chunks_[c].data(), values.data(), gpu_chunks_[c].bytes()),
          "fill gpu chunk");
  }
}

}  // namespace kvd::gpu_test
