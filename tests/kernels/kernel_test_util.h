#ifndef KVD_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
#define KVD_TESTS_KERNELS_KERNEL_TEST_UTIL_H_

// Helpers shared by the kernel tests: seeded random data, the error measure, and a host
// KV arena whose element addresses are computed straight from the layout diagram in
// kernels/params.h (independently of kernels/kv_addressing.h).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/params.h"

namespace kvd::kernel_test {

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The relative error every op test uses: for each row,
//   max_i |out[i] - ref[i]| / max(1, max_i |ref[i]|),
// and the maximum over rows. Rows are `cols` apart in both arrays.
inline double MaxRowRelError(const float* out, const double* ref, int64_t rows, int64_t cols,
                             int64_t out_stride = -1) {
  if (out_stride < 0) out_stride = cols;
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double max_diff = 0.0, max_ref = 1.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double o = out[r * out_stride + c];
      const double e = ref[r * cols + c];
      if (std::isnan(o)) return std::numeric_limits<double>::infinity();
      max_diff = std::max(max_diff, std::abs(o - e));
      max_ref = std::max(max_ref, std::abs(e));
    }
    worst = std::max(worst, max_diff / max_ref);
  }
  return worst;
}

constexpr double kMaxRelError = 1e-5;

// A host arena of `num_chunks` chunks of (1 << chunk_shift) blocks for `num_layers`
// layers, every float initialized to NaN so that any read of a slot nobody wrote poisons
// the result. Chunks listed in `released` are null in the chunk table.
//
//   chunk c: | L0 K | L0 V | L1 K | ... |, region = [blocks_per_chunk][heads][block_size][hd]
class TestArena {
 public:
  TestArena(int num_layers, int num_kv_heads, int block_size, int head_dim, int chunk_shift,
            int num_chunks, std::vector<int> released = {})
      : num_layers_(num_layers),
        num_kv_heads_(num_kv_heads),
        block_size_(block_size),
        head_dim_(head_dim),
        chunk_shift_(chunk_shift),
        storage_(num_chunks),
        table_(num_chunks) {
    for (int c = 0; c < num_chunks; ++c) {
      if (std::find(released.begin(), released.end(), c) != released.end()) continue;
      storage_[c].assign(ChunkFloats(), std::numeric_limits<float>::quiet_NaN());
      table_[c] = storage_[c].data();
    }
  }

  TestArena(const TestArena&) = delete;
  TestArena& operator=(const TestArena&) = delete;
  TestArena(TestArena&&) = default;  // chunk buffers, and so the table, stay put

  int64_t BlockFloats() const { return int64_t{num_kv_heads_} * block_size_ * head_dim_; }
  int64_t RegionFloats() const { return BlockFloats() << chunk_shift_; }
  int64_t ChunkFloats() const { return RegionFloats() * 2 * num_layers_; }
  int num_chunks() const { return static_cast<int>(table_.size()); }
  int blocks_per_chunk() const { return 1 << chunk_shift_; }
  bool present(int chunk) const { return table_[chunk] != nullptr; }
  // Contents of a chunk (empty when released). The buffers never move, so the chunk
  // table stays valid: contents change only through the methods below or At().
  const std::vector<float>& chunk(int c) const { return storage_[c]; }
  void FillRandom(uint32_t seed) {
    for (size_t c = 0; c < storage_.size(); ++c) {
      const std::vector<float> r = RandomFloats(storage_[c].size(), seed + c);
      std::copy(r.begin(), r.end(), storage_[c].begin());
    }
  }
  // REQUIRES: same geometry and released chunks.
  void CopyContentsFrom(const TestArena& other) {
    for (size_t c = 0; c < storage_.size(); ++c) {
      std::copy(other.storage_[c].begin(), other.storage_[c].end(), storage_[c].begin());
    }
  }

  KvCacheView View(int layer) {
    KvCacheView v;
    v.chunks = table_.data();
    v.num_chunks = num_chunks();
    v.chunk_shift = chunk_shift_;
    v.k_offset_bytes = RegionFloats() * (2 * layer) * 4;
    v.v_offset_bytes = RegionFloats() * (2 * layer + 1) * 4;
    v.block_bytes = BlockFloats() * 4;
    v.dtype = DType::kF32;
    v.num_kv_heads = num_kv_heads_;
    v.block_size = block_size_;
    v.head_dim = head_dim_;
    return v;
  }

  CopyBlocksParams CopyParams(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
    CopyBlocksParams p;
    p.chunks = table_.data();
    p.chunk_shift = chunk_shift_;
    p.chunk_region_bytes = RegionFloats() * 4;
    p.num_regions = 2 * num_layers_;
    p.block_bytes = BlockFloats() * 4;
    p.src = src.data();
    p.dst = dst.data();
    p.num_pairs = static_cast<int32_t>(src.size());
    return p;
  }

  // Element d of token row `offset`, head `head`, of block `block` in region
  // (layer, is_value).
  float& At(int layer, bool is_value, int64_t block, int head, int offset, int d) {
    const int64_t chunk = block >> chunk_shift_;
    const int64_t slot = block & (blocks_per_chunk() - 1);
    const int64_t region = 2 * layer + (is_value ? 1 : 0);
    return storage_[chunk][region * RegionFloats() + slot * BlockFloats() +
                           (int64_t{head} * block_size_ + offset) * head_dim_ + d];
  }

 private:
  int num_layers_, num_kv_heads_, block_size_, head_dim_, chunk_shift_;
  std::vector<std::vector<float>> storage_;
  std::vector<void*> table_;
};

}  // namespace kvd::kernel_test

#endif  // KVD_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
