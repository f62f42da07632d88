// CUDA AppendKv and CopyBlocks against the CPU reference, over a chunked arena with a
// released chunk and scattered block ids.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/twin_arena.h"

namespace kvd::gpu_test {
namespace {

using KvCacheOpsTest = GpuVsCpuTest;

// Same value, or both NaN (a slot nobody wrote keeps its poison on both backends).
::testing::AssertionResult SameArena(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < gpu.size(); ++i) {
    const bool both_nan = std::isnan(gpu[i]) && std::isnan(cpu[i]);
    if (!both_nan && gpu[i] != cpu[i]) {
      return ::testing::AssertionFailure()
             << "arena value " << i << ": gpu " << gpu[i] << " cpu " << cpu[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_F(KvCacheOpsTest, AppendKvWritesExactlyTheMappedSlots) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int block_size : {1, 16, 64}) {
      SCOPED_TRACE(testing::Message() << DTypeName(dtype) << " block_size " << block_size);
      ArenaShape shape;
      shape.num_kv_heads = 4;
      shape.head_dim = 64;
      shape.block_size = block_size;
      shape.chunk_shift = 3;
      shape.num_chunks = 4;
      shape.released = {1};
      shape.gpu_dtype = dtype;
      TwinArena arena(cpu(), gpu(), shape);

      // 50 tokens into distinct slots all over the arena; rows wider than the heads.
      const int tokens = 50;
      const int row = shape.num_kv_heads * shape.head_dim;
      const int stride = row + 32;
      const std::vector<int32_t> blocks = arena.ShuffledBlockIds(block_size);
      std::vector<int64_t> slots;
      for (int t = 0; t < tokens; ++t) {
        const int64_t block = blocks[t % blocks.size()];
        const int64_t offset = (t / blocks.size() + 7 * t) % block_size;
        slots.push_back(block * block_size + offset);
      }
      std::sort(slots.begin(), slots.end());
      slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
      std::vector<float> k = RandomFloats(slots.size() * stride, 3);
      std::vector<float> v = RandomFloats(slots.size() * stride, 4);
      if (dtype == DType::kBF16) {
        k = RoundBf16(k);
        v = RoundBf16(v);
      }
      DeviceBuffer cpu_k = Upload(cpu(), k), cpu_v = Upload(cpu(), v);
      DeviceBuffer gpu_k = Upload(gpu(), k), gpu_v = Upload(gpu(), v);
      DeviceBuffer cpu_slots = Upload(cpu(), slots), gpu_slots = Upload(gpu(), slots);

      AppendKvParams p;
      p.num_tokens = static_cast<int32_t>(slots.size());
      p.k_stride = stride;
      p.v_stride = stride;
      p.cache = arena.CpuView(/*layer=*/1);
      p.k = cpu_k.as<float>();
      p.v = cpu_v.as<float>();
      p.slot_mapping = cpu_slots.as<int64_t>();
      ASSERT_TRUE(cpu().AppendKv(p).ok());
      p.cache = arena.GpuView(/*layer=*/1);
      p.k = gpu_k.as<float>();
      p.v = gpu_v.as<float>();
      p.slot_mapping = gpu_slots.as<int64_t>();
      const absl::Status s = gpu().AppendKv(p);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(SameArena(arena.GpuValues(), arena.CpuValues()));
    }
  }
}

TEST_F(KvCacheOpsTest, AppendKvRoundsToNearestEvenBf16) {
  ArenaShape shape;
  shape.num_kv_heads = 1;
  shape.head_dim = 64;
  shape.block_size = 16;
  shape.num_chunks = 1;
  shape.gpu_dtype = DType::kBF16;
  TwinArena arena(cpu(), gpu(), shape);
  const std::vector<float> k = RandomFloats(64, 8, -100, 100);  // unrounded on purpose
  const std::vector<int64_t> slots = {5};
  DeviceBuffer gpu_k = Upload(gpu(), k), gpu_slots = Upload(gpu(), slots);
  AppendKvParams p;
  p.num_tokens = 1;
  p.k_stride = 64;
  p.v_stride = 64;
  p.cache = arena.GpuView(0);
  p.k = gpu_k.as<float>();
  p.v = gpu_k.as<float>();
  p.slot_mapping = gpu_slots.as<int64_t>();
  ASSERT_TRUE(gpu().AppendKv(p).ok());
  const std::vector<float> values = arena.GpuValues();
  // Layer 0 K region, block 0, head 0, offset 5.
  for (int d = 0; d < 64; ++d) ASSERT_EQ(values[5 * 64 + d], RoundBf16(k[d])) << d;
}

TEST_F(KvCacheOpsTest, CopyBlocksMovesEveryRegionAcrossChunks) {
  for (const int head_dim : {64, 6}) {  // 6: block_bytes not a multiple of 16 bytes
    SCOPED_TRACE(testing::Message() << "head_dim " << head_dim);
    ArenaShape shape;
    shape.num_layers = 3;
    shape.num_kv_heads = 2;
    shape.head_dim = head_dim;
    shape.block_size = 4;
    shape.chunk_shift = 2;
    shape.num_chunks = 4;
    shape.released = {2};
    TwinArena arena(cpu(), gpu(), shape);
    arena.FillRandom(21);

    // Sources and destinations disjoint, both scattered over the present chunks.
    const std::vector<float> gpu_before = arena.GpuValues();
    const std::vector<int32_t> ids = arena.ShuffledBlockIds(5);
    std::vector<int32_t> src(ids.begin(), ids.begin() + 4);
    std::vector<int32_t> dst(ids.begin() + 4, ids.begin() + 8);
    DeviceBuffer cpu_src = Upload(cpu(), src), cpu_dst = Upload(cpu(), dst);
    DeviceBuffer gpu_src = Upload(gpu(), src), gpu_dst = Upload(gpu(), dst);
    CopyBlocksParams p;
    p.chunk_shift = shape.chunk_shift;
    p.chunk_region_bytes = arena.RegionBytes(false);
    p.num_regions = 2 * shape.num_layers;
    p.block_bytes = arena.BlockBytes(false);
    p.num_pairs = static_cast<int32_t>(src.size());
    p.chunks = arena.cpu_table();
    p.src = cpu_src.as<int32_t>();
    p.dst = cpu_dst.as<int32_t>();
    ASSERT_TRUE(cpu().CopyBlocks(p).ok());
    p.chunks = arena.gpu_table();
    p.src = gpu_src.as<int32_t>();
    p.dst = gpu_dst.as<int32_t>();
    const absl::Status s = gpu().CopyBlocks(p);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> gpu_after = arena.GpuValues();
    EXPECT_NE(gpu_after, gpu_before) << "nothing was copied";
    EXPECT_TRUE(SameArena(gpu_after, arena.CpuValues()));
  }
}

}  // namespace
}  // namespace kvd::gpu_test
