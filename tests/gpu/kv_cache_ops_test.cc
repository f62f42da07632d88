// CUDA AppendKv (alone and fused into Rope) and CopyBlocks against the CPU reference, over a
// chunked arena with a released chunk and scattered block ids.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
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

// An arena of `chunks` chunks of 2^chunk_shift blocks, chunk 1 released.
ArenaShape ScatteredArena(int num_kv_heads, int head_dim, int block_size, int chunk_shift,
                          int chunks, DType gpu_dtype) {
  return ArenaShape{.num_kv_heads = num_kv_heads,
                    .head_dim = head_dim,
                    .block_size = block_size,
                    .chunk_shift = chunk_shift,
                    .num_chunks = chunks,
                    .released = {1},
                    .gpu_dtype = gpu_dtype};
}

TEST_F(KvCacheOpsTest, AppendKvWritesExactlyTheMappedSlots) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int block_size : {1, 16, 64}) {
      SCOPED_TRACE(testing::Message() << DTypeName(dtype) << " block_size " << block_size);
      const ArenaShape shape = ScatteredArena(4, 64, block_size, /*chunk_shift=*/3, 4, dtype);
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

// RopeParams::append_kv: the GPU's one pass (rotation, K and V into the cache) against the
// CPU's Rope then AppendKv. The rotations agree to 5e-4 (the Rope test's bound: fp32 angles
// of positions up to 4096); a bf16 cache adds its rounding of each side's value (2^-8 of
// |x| <= 1.5). A wrong head, slot or pairing errs by O(1) or leaves poison (NaN) behind.
TEST_F(KvCacheOpsTest, RopeWithAppendKvMatchesRopeThenAppendKv) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int block_size : {1, 16}) {
      SCOPED_TRACE(testing::Message() << DTypeName(dtype) << " block_size " << block_size);
      const ArenaShape shape = ScatteredArena(2, 128, block_size, /*chunk_shift=*/4, 3, dtype);
      TwinArena arena(cpu(), gpu(), shape);
      const int q_heads = 8, tokens = 21;
      const int stride = (q_heads + 2 * shape.num_kv_heads) * shape.head_dim;
      const std::vector<float> qkv = RandomFloats(size_t(tokens) * stride, 17);
      const std::vector<int32_t> ids = arena.ShuffledBlockIds(5);
      std::vector<int32_t> positions(tokens);
      std::vector<int64_t> slots(tokens);
      for (int t = 0; t < tokens; ++t) {
        positions[t] = 190 * t;
        slots[t] = int64_t{ids[t % ids.size()]} * block_size + (t / ids.size()) % block_size;
      }
      std::sort(slots.begin(), slots.end());
      ASSERT_EQ(std::unique(slots.begin(), slots.end()), slots.end()) << "distinct slots";
      auto params = [&](Backend& b, DeviceBuffer& rows, DeviceBuffer& pos, DeviceBuffer& map) {
        RopeParams p;
        p.q = rows.as<float>();
        p.k = rows.as<float>() + q_heads * shape.head_dim;
        p.positions = pos.as<int32_t>();
        p.num_tokens = tokens;
        p.num_q_heads = q_heads;
        p.num_kv_heads = shape.num_kv_heads;
        p.head_dim = shape.head_dim;
        p.q_stride = p.k_stride = stride;
        p.theta = 500000.0f;
        p.append_kv = true;
        p.cache = &b == &gpu() ? arena.GpuView(1) : arena.CpuView(1);
        p.v = rows.as<float>() + (q_heads + shape.num_kv_heads) * shape.head_dim;
        p.slot_mapping = map.as<int64_t>();
        p.v_stride = stride;
        return p;
      };
      DeviceBuffer cpu_rows = Upload(cpu(), qkv), gpu_rows = Upload(gpu(), qkv);
      DeviceBuffer cpu_pos = Upload(cpu(), positions), gpu_pos = Upload(gpu(), positions);
      DeviceBuffer cpu_map = Upload(cpu(), slots), gpu_map = Upload(gpu(), slots);
      ASSERT_TRUE(cpu().Rope(params(cpu(), cpu_rows, cpu_pos, cpu_map)).ok());
      const absl::Status s = gpu().Rope(params(gpu(), gpu_rows, gpu_pos, gpu_map));
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_rows.data(), qkv.size()),
                           DownloadFloats(cpu(), cpu_rows.data(), qkv.size()), 0, 5e-4));
      const std::vector<float> got = arena.GpuValues();
      const std::vector<float> want = arena.CpuValues();
      ASSERT_EQ(got.size(), want.size());
      const double rtol = dtype == DType::kBF16 ? 1.0 / 128 : 0.0;
      int64_t written = 0, bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i])) {
          bad += !std::isnan(got[i]);
          continue;
        }
        ++written;
        bad += !(std::fabs(got[i] - want[i]) <= 5e-4 + rtol * std::fabs(want[i]));
      }
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(written, int64_t{2} * tokens * shape.num_kv_heads * shape.head_dim);
    }
  }
}

TEST_F(KvCacheOpsTest, RopeRefusesAnAppendToACacheOfOtherHeads) {
  ArenaShape shape;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.num_chunks = 1;
  TwinArena arena(cpu(), gpu(), shape);
  DeviceBuffer buf = Poisoned(gpu(), 8192);
  RopeParams p;
  p.num_tokens = 1;
  p.num_q_heads = 2;
  p.num_kv_heads = 1;  // the cache has 2
  p.head_dim = 64;
  p.q_stride = p.k_stride = p.v_stride = 256;
  p.q = buf.as<float>();
  p.k = buf.as<float>() + 128;
  p.v = buf.as<float>() + 192;
  p.positions = buf.as<int32_t>() + 1024;
  p.slot_mapping = reinterpret_cast<const int64_t*>(buf.as<int32_t>() + 1040);
  p.append_kv = true;
  p.cache = arena.GpuView(0);
  const absl::Status s = gpu().Rope(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("append_kv"), std::string::npos) << s;
  EXPECT_TRUE(gpu().Synchronize().ok());
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
