// Specification of CpuBackend::AppendKv (alone, and fused into Rope) and
// CpuBackend::CopyBlocks against the arena layout of kernels/params.h: addresses here come
// from TestArena::At, which follows the layout diagram and shares no code with the backend.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace kvd {
namespace {

using kernel_test::RandomFloats;
using kernel_test::TestArena;
using ::testing::HasSubstr;

struct Geometry {
  int layers, heads, block_size, head_dim, chunk_shift, chunks;
};

TEST(AppendKvTest, EveryValueLandsWhereTheLayoutSaysAndNothingElseChanges) {
  CpuBackend backend(2);
  for (Geometry g :
       {Geometry{2, 2, 16, 8, 2, 3}, Geometry{3, 4, 5, 12, 1, 4}, Geometry{1, 1, 1, 4, 0, 5}}) {
    SCOPED_TRACE(::testing::Message() << "block_size=" << g.block_size);
    TestArena arena(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks);
    const int layer = g.layers - 1;
    // Distinct random slots across the whole arena, with padded input rows.
    const int64_t num_slots = int64_t{g.chunks << g.chunk_shift} * g.block_size;
    std::vector<int64_t> slots(num_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(g.block_size));
    const int num_tokens = static_cast<int>(std::min<int64_t>(num_slots, 23));
    slots.resize(num_tokens);
    const int k_stride = g.heads * g.head_dim + 1, v_stride = g.heads * g.head_dim + 7;
    const std::vector<float> k = RandomFloats(num_tokens * k_stride, 1);
    const std::vector<float> v = RandomFloats(num_tokens * v_stride, 2);
    AppendKvParams p{arena.View(layer), k.data(), v.data(), slots.data(),
                     num_tokens,        k_stride, v_stride};
    ASSERT_TRUE(backend.AppendKv(p).ok());

    int64_t written = 0;
    for (int t = 0; t < num_tokens; ++t) {
      const int64_t block = slots[t] / g.block_size;
      const int offset = static_cast<int>(slots[t] % g.block_size);
      for (int h = 0; h < g.heads; ++h) {
        for (int d = 0; d < g.head_dim; ++d) {
          ASSERT_EQ(arena.At(layer, false, block, h, offset, d),
                    k[t * k_stride + h * g.head_dim + d])
              << "K token " << t << " head " << h << " dim " << d;
          ASSERT_EQ(arena.At(layer, true, block, h, offset, d),
                    v[t * v_stride + h * g.head_dim + d])
              << "V token " << t << " head " << h << " dim " << d;
          written += 2;
        }
      }
    }
    // Every other float of the arena (other layers, slots, padding) is still NaN.
    int64_t non_nan = 0;
    for (int c = 0; c < arena.num_chunks(); ++c) {
      for (float x : arena.chunk(c)) non_nan += !std::isnan(x);
    }
    EXPECT_EQ(non_nan, written);
  }
}

// kNoSlot (a decode graph's padding rows): that token writes nothing, the others land; any
// other negative slot is refused (BadAppendKvParams below).
TEST(AppendKvTest, ATokenWithNoSlotWritesNothing) {
  CpuBackend backend(1);
  const Geometry g{1, 2, 4, 8, 1, 3};
  TestArena arena(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks);
  const int width = g.heads * g.head_dim;
  const std::vector<float> k = RandomFloats(3 * width, 1), v = RandomFloats(3 * width, 2);
  const std::vector<int64_t> slots = {kNoSlot, 5, kNoSlot};
  ASSERT_TRUE(
      backend.AppendKv({arena.View(0), k.data(), v.data(), slots.data(), 3, width, width}).ok());
  int64_t non_nan = 0;
  for (int c = 0; c < arena.num_chunks(); ++c) {
    for (float x : arena.chunk(c)) non_nan += !std::isnan(x);
  }
  EXPECT_EQ(non_nan, 2 * width);  // token 1's K and V rows only
  EXPECT_EQ(arena.At(0, false, 1, 1, 1, 3), k[width + g.head_dim + 3]);  // slot 5: block 1, row 1
  EXPECT_EQ(arena.At(0, true, 1, 0, 1, 0), v[width]);
}

// RopeParams::append_kv: the same q, k and arena, bit for bit, as Rope followed by AppendKv
// of the rotated k; bad append params are refused before anything (q, k, arena) is written.
TEST(RopeAppendKvTest, EqualsRopeThenAppendKvAndChecksTheAppendFirst) {
  CpuBackend backend(2);
  const Geometry g{2, 2, 16, 8, 2, 3};
  const int q_heads = 4, tokens = 9;
  const int stride = (q_heads + 2 * g.heads) * g.head_dim;  // fused qkv rows
  const std::vector<float> qkv = RandomFloats(tokens * stride, 5);
  std::vector<int32_t> positions(tokens);
  std::vector<int64_t> slots(tokens);
  for (int t = 0; t < tokens; ++t) {
    positions[t] = 3 * t + 1;
    slots[t] = (7 * t + 2) % (int64_t{g.chunks << g.chunk_shift} * g.block_size);
  }
  auto rope = [&](float* rows, const KvCacheView& cache, bool append) {
    RopeParams p;
    p.q = rows;
    p.k = rows + q_heads * g.head_dim;
    p.positions = positions.data();
    p.num_tokens = tokens;
    p.num_q_heads = q_heads;
    p.num_kv_heads = g.heads;
    p.head_dim = g.head_dim;
    p.q_stride = p.k_stride = stride;
    p.append_kv = append;
    p.cache = cache;
    p.v = rows + (q_heads + g.heads) * g.head_dim;
    p.slot_mapping = slots.data();
    p.v_stride = stride;
    return p;
  };
  TestArena fused_arena(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks);
  std::vector<float> fused_rows = qkv;
  ASSERT_TRUE(backend.Rope(rope(fused_rows.data(), fused_arena.View(1), true)).ok());
  TestArena arena(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks);
  std::vector<float> rows = qkv;
  const RopeParams separate = rope(rows.data(), arena.View(1), false);
  ASSERT_TRUE(backend.Rope(separate).ok());
  ASSERT_TRUE(
      backend
          .AppendKv({arena.View(1), separate.k, separate.v, slots.data(), tokens, stride, stride})
          .ok());
  EXPECT_EQ(0, std::memcmp(fused_rows.data(), rows.data(), rows.size() * sizeof(float)));
  for (int c = 0; c < arena.num_chunks(); ++c) {
    ASSERT_EQ(0, std::memcmp(fused_arena.chunk(c).data(), arena.chunk(c).data(),
                             arena.chunk(c).size() * sizeof(float)))
        << "chunk " << c;
  }

  // A slot past the arena, or a cache of other heads: refused, nothing rotated or written.
  TestArena untouched(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks);
  std::vector<float> bad_rows = qkv;
  std::vector<int64_t> good_slots = slots;
  slots[4] = int64_t{1} << 40;
  absl::Status s = backend.Rope(rope(bad_rows.data(), untouched.View(1), true));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("slot_mapping[4]"));
  slots = good_slots;
  RopeParams other_heads = rope(bad_rows.data(), untouched.View(1), true);
  other_heads.cache.num_kv_heads = 1;
  s = backend.Rope(other_heads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("append_kv"));
  // No v rows, or rows shorter than the KV heads: refused by the checks every backend shares.
  RopeParams no_v = rope(bad_rows.data(), untouched.View(1), true);
  no_v.v = nullptr;
  s = backend.Rope(no_v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("append_kv needs k, v and slot_mapping"));
  RopeParams short_v = rope(bad_rows.data(), untouched.View(1), true);
  short_v.v_stride = g.heads * g.head_dim - 1;
  s = backend.Rope(short_v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("v_stride"));
  EXPECT_EQ(bad_rows, qkv);
  for (int c = 0; c < untouched.num_chunks(); ++c) {
    for (float x : untouched.chunk(c)) ASSERT_TRUE(std::isnan(x));
  }
}

TEST(CopyBlocksTest, CopiesEveryLayersKAndVOfEachPairAndNothingElse) {
  CpuBackend backend(3);
  const Geometry g{3, 2, 5, 4, 2, 4};  // 16 blocks, 6 regions
  TestArena arena(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks);
  arena.FillRandom(40);
  // Defragmentation-style moves from the top chunk down, and one copy-on-write.
  const std::vector<int32_t> src = {15, 12, 13, 2};
  const std::vector<int32_t> dst = {0, 5, 9, 11};
  // Expected: a snapshot with each dst block replaced by its src block in every region.
  TestArena expected(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks);
  expected.CopyContentsFrom(arena);
  for (size_t i = 0; i < src.size(); ++i) {
    for (int layer = 0; layer < g.layers; ++layer) {
      for (bool value : {false, true}) {
        for (int h = 0; h < g.heads; ++h) {
          for (int o = 0; o < g.block_size; ++o) {
            for (int d = 0; d < g.head_dim; ++d) {
              expected.At(layer, value, dst[i], h, o, d) = arena.At(layer, value, src[i], h, o, d);
            }
          }
        }
      }
    }
  }
  ASSERT_TRUE(backend.CopyBlocks(arena.CopyParams(src, dst)).ok());
  for (int c = 0; c < arena.num_chunks(); ++c) {
    EXPECT_EQ(0, std::memcmp(arena.chunk(c).data(), expected.chunk(c).data(),
                             arena.chunk(c).size() * sizeof(float)))
        << "chunk " << c;
  }
}

TEST(KvCacheOpsTest, ZeroTokensOrPairsIsANoOp) {
  CpuBackend backend(1);
  EXPECT_TRUE(backend.AppendKv({}).ok());
  EXPECT_TRUE(backend.CopyBlocks({}).ok());
}

TEST(KvCacheOpsTest, BadAppendKvParamsAreInvalidArgumentAndWriteNothing) {
  CpuBackend backend(2);
  const Geometry g{1, 2, 4, 8, 1, 3};  // 6 blocks of 4 slots; chunk 1 released
  const std::vector<float> k = RandomFloats(3 * 16, 1), v = RandomFloats(3 * 16, 2);
  auto expect_invalid = [&](const char* field, auto mutate) {
    TestArena arena(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks, {1});
    std::vector<int64_t> slots = {0, 1, 23};
    AppendKvParams p{arena.View(0), k.data(), v.data(), slots.data(), 3, 16, 16};
    mutate(p, slots);
    const absl::Status s = backend.AppendKv(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("AppendKv"));
    EXPECT_THAT(s.message(), HasSubstr(field));
    for (int c = 0; c < arena.num_chunks(); ++c) {
      for (float x : arena.chunk(c)) ASSERT_TRUE(std::isnan(x)) << field << ": arena written";
    }
  };
  using Slots = std::vector<int64_t>;
  expect_invalid("k is", [](AppendKvParams& p, Slots&) { p.k = nullptr; });
  expect_invalid("slot_mapping", [](AppendKvParams& p, Slots&) { p.slot_mapping = nullptr; });
  expect_invalid("num_tokens", [](AppendKvParams& p, Slots&) { p.num_tokens = -1; });
  expect_invalid("k_stride", [](AppendKvParams& p, Slots&) { p.k_stride = 15; });
  expect_invalid("v is null", [](AppendKvParams& p, Slots&) { p.v = nullptr; });
  expect_invalid("v_stride (15)", [](AppendKvParams& p, Slots&) { p.v_stride = 15; });
  expect_invalid("cache.num_kv_heads", [](AppendKvParams& p, Slots&) { p.cache.num_kv_heads = 0; });
  expect_invalid("cache.chunks", [](AppendKvParams& p, Slots&) { p.cache.chunks = nullptr; });
  expect_invalid("slot_mapping[2]", [](AppendKvParams&, Slots& s) { s[2] = 24; });  // block 6
  expect_invalid("slot_mapping[1] is -3; allowed: >= 0, or -1 for no write",
                 [](AppendKvParams&, Slots& s) { s[1] = -3; });
  expect_invalid("null", [](AppendKvParams&, Slots& s) { s[2] = 2 * 4 + 1; });  // chunk 1
}

TEST(KvCacheOpsTest, BadCopyBlocksParamsAreInvalidArgumentAndWriteNothing) {
  CpuBackend backend(2);
  const Geometry g{2, 1, 4, 4, 1, 3};
  auto expect_invalid = [&](const char* field, auto mutate) {
    TestArena arena(g.layers, g.heads, g.block_size, g.head_dim, g.chunk_shift, g.chunks, {1});
    arena.FillRandom(17);  // every block different: a copy anywhere would show
    std::vector<int32_t> src = {0, 5}, dst = {1, 4};
    CopyBlocksParams p = arena.CopyParams(src, dst);
    const std::vector<float> chunk0 = arena.chunk(0), chunk2 = arena.chunk(2);
    mutate(p, src, dst);
    const absl::Status s = backend.CopyBlocks(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("CopyBlocks"));
    EXPECT_THAT(s.message(), HasSubstr(field));
    EXPECT_TRUE(arena.chunk(0) == chunk0 && arena.chunk(2) == chunk2) << field << ": written";
  };
  using Ids = std::vector<int32_t>;
  expect_invalid("chunks", [](CopyBlocksParams& p, Ids&, Ids&) { p.chunks = nullptr; });
  expect_invalid("src", [](CopyBlocksParams& p, Ids&, Ids&) { p.src = nullptr; });
  expect_invalid("num_pairs", [](CopyBlocksParams& p, Ids&, Ids&) { p.num_pairs = -2; });
  expect_invalid("block_bytes", [](CopyBlocksParams& p, Ids&, Ids&) { p.block_bytes = 0; });
  expect_invalid("num_regions", [](CopyBlocksParams& p, Ids&, Ids&) { p.num_regions = 0; });
  expect_invalid("chunk_region_bytes",
                 [](CopyBlocksParams& p, Ids&, Ids&) { p.chunk_region_bytes -= 4; });
  // 2^62 << chunk_shift (1) wraps past int64: the region must still be found too small.
  expect_invalid("chunk_region_bytes",
                 [](CopyBlocksParams& p, Ids&, Ids&) { p.block_bytes = int64_t{1} << 62; });
  expect_invalid("chunk_shift", [](CopyBlocksParams& p, Ids&, Ids&) { p.chunk_shift = 31; });
  expect_invalid("block -1", [](CopyBlocksParams&, Ids& src, Ids&) { src[1] = -1; });
  expect_invalid("null", [](CopyBlocksParams&, Ids&, Ids& dst) { dst[0] = 3; });  // chunk 1
}

TEST(KvCacheOpsTest, NonF32CacheIsUnimplemented) {
  CpuBackend backend(1);
  TestArena arena(1, 1, 4, 4, 0, 1);
  const std::vector<float> kv(4, 1.0f);
  const int64_t slot = 0;
  AppendKvParams p{arena.View(0), kv.data(), kv.data(), &slot, 1, 4, 4};
  p.cache.dtype = DType::kInt4;
  const absl::Status s = backend.AppendKv(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("AppendKv"));
  EXPECT_THAT(s.message(), HasSubstr("int4"));
}

}  // namespace
}  // namespace kvd
