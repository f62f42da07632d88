// Specification of the CPU backend's int8 KV cache (kernels/kv_quant.h, kernels/params.h):
// AppendKv stores each row (one token's head) as int8 with one fp32 scale, max|x| / 127, at
// the block's scale offset; PagedAttention reads an int8 cache exactly as an f32 cache holding
// the dequantized values; CopyBlocks moves the scales with the values. Addresses come from
// Int8Arena below, which follows the layout and shares no code with the backend.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
using ::testing::HasSubstr;

constexpr unsigned char kPoison = 0x5a;

// One chunk of 2^shift blocks for `layers` layers, in int8 (elements, then scales, then 8
// bytes of padding per block) or f32.
class Arena {
 public:
  Arena(DType dtype, int layers, int heads, int block_size, int head_dim, int shift)
      : dtype_(dtype), heads_(heads), block_size_(block_size), head_dim_(head_dim), shift_(shift) {
    const int64_t elems = int64_t{heads} * block_size * head_dim;
    if (dtype == DType::kInt8) {
      scale_offset_ = (elems + 3) / 4 * 4;
      block_bytes_ = scale_offset_ + 4 * int64_t{heads} * block_size + 8;
    } else {
      block_bytes_ = 4 * elems;
    }
    region_bytes_ = block_bytes_ << shift;
    bytes_.assign(region_bytes_ * 2 * layers, kPoison);
    table_[0] = bytes_.data();
  }

  KvCacheView View(int layer) const {
    return {.chunks = table_,
            .num_chunks = 1,
            .chunk_shift = shift_,
            .k_offset_bytes = region_bytes_ * 2 * layer,
            .v_offset_bytes = region_bytes_ * (2 * layer + 1),
            .block_bytes = block_bytes_,
            .scale_offset_bytes = scale_offset_,
            .dtype = dtype_,
            .num_kv_heads = heads_,
            .block_size = block_size_,
            .head_dim = head_dim_};
  }
  unsigned char* Block(int layer, bool value, int64_t block) {
    return bytes_.data() + region_bytes_ * (2 * layer + value) + block * block_bytes_;
  }
  int8_t Q(int layer, bool value, int64_t block, int head, int row, int d) {
    return static_cast<int8_t>(
        Block(layer, value, block)[(int64_t{head} * block_size_ + row) * head_dim_ + d]);
  }
  float Scale(int layer, bool value, int64_t block, int head, int row) {
    float s;
    std::memcpy(
        &s, Block(layer, value, block) + scale_offset_ + 4 * (int64_t{head} * block_size_ + row),
        4);
    return s;
  }
  float& F32(int layer, bool value, int64_t block, int head, int row, int d) {
    return reinterpret_cast<float*>(
        Block(layer, value, block))[(int64_t{head} * block_size_ + row) * head_dim_ + d];
  }
  int64_t block_bytes() const { return block_bytes_; }
  int64_t region_bytes() const { return region_bytes_; }
  std::vector<unsigned char>& bytes() { return bytes_; }
  void* const* table() const { return table_; }

 private:
  DType dtype_;
  int heads_, block_size_, head_dim_, shift_;
  int64_t scale_offset_ = 0, block_bytes_ = 0, region_bytes_ = 0;
  std::vector<unsigned char> bytes_;
  void* table_[1] = {nullptr};
};

TEST(Int8KvTest, AppendStoresEachRowAsInt8TimesItsMaxAbsOver127) {
  CpuBackend backend(2);
  const int layers = 2, heads = 3, bs = 4, hd = 12, shift = 3, tokens = 19;
  Arena arena(DType::kInt8, layers, heads, bs, hd, shift);
  std::vector<int64_t> slots(int64_t{bs} << shift);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(7));
  slots.resize(tokens);
  const int width = heads * hd, k_stride = width + 3, v_stride = width;
  std::vector<float> k = RandomFloats(tokens * k_stride, 1, -3.0f, 3.0f);
  std::vector<float> v = RandomFloats(tokens * v_stride, 2, -0.01f, 0.01f);
  // Token 0's K head 1 is all zero; token 1's V head 2 holds a NaN and token 2's K head 0 an
  // infinity.
  std::fill_n(k.begin() + 0 * k_stride + hd, hd, 0.0f);
  v[1 * v_stride + 2 * hd + 5] = std::numeric_limits<float>::quiet_NaN();
  k[2 * k_stride + 0 * hd + 3] = -std::numeric_limits<float>::infinity();
  const int layer = 1;
  ASSERT_TRUE(backend
                  .AppendKv({arena.View(layer), k.data(), v.data(), slots.data(), tokens, k_stride,
                             v_stride})
                  .ok());

  int64_t rows_checked = 0;
  for (int t = 0; t < tokens; ++t) {
    const int64_t block = slots[t] / bs;
    const int row = static_cast<int>(slots[t] % bs);
    for (int h = 0; h < heads; ++h) {
      for (bool value : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "token " << t << " head " << h << " V " << value);
        const float* x = (value ? v.data() + t * v_stride : k.data() + t * k_stride) + h * hd;
        const float scale = arena.Scale(layer, value, block, h, row);
        bool finite = true;
        float max_abs = 0.0f;
        for (int d = 0; d < hd; ++d) {
          finite = finite && std::isfinite(x[d]);
          max_abs = std::max(max_abs, std::fabs(x[d]));
        }
        if (!finite) {
          EXPECT_TRUE(std::isnan(scale)) << scale;  // the row reads back NaN, not finite values
        } else {
          EXPECT_EQ(scale, max_abs / 127.0f);
        }
        for (int d = 0; d < hd; ++d) {
          const int8_t q = arena.Q(layer, value, block, h, row, d);
          if (!finite || max_abs == 0.0f) {
            ASSERT_EQ(q, 0);
            continue;
          }
          ASSERT_EQ(q, static_cast<int8_t>(std::nearbyint(x[d] / scale))) << "dim " << d;
          ASSERT_LE(std::fabs(q * scale - x[d]), scale * 0.5f * (1 + 1e-6f)) << "dim " << d;
        }
        ++rows_checked;
      }
    }
  }
  EXPECT_EQ(rows_checked, 2 * heads * tokens);
  // Nothing outside the written rows and their scales changed: not the other layer, not the
  // unwritten slots, not the padding.
  int64_t changed = 0;
  for (unsigned char b : arena.bytes()) changed += b != kPoison;
  EXPECT_LE(changed, 2 * int64_t{tokens} * heads * (hd + 4));
  EXPECT_GE(changed, 2 * int64_t{tokens} * heads * hd / 2);  // most int8 values are not 0x5a
  for (int64_t b = 0; b < (int64_t{1} << shift); ++b) {
    for (bool value : {false, true}) {
      const unsigned char* pad = arena.Block(layer, value, b) + arena.block_bytes() - 8;
      EXPECT_TRUE(std::all_of(pad, pad + 8, [](unsigned char c) { return c == kPoison; }));
      const unsigned char* other = arena.Block(0, value, b);
      EXPECT_TRUE(std::all_of(other, other + arena.block_bytes(),
                              [](unsigned char c) { return c == kPoison; }));
    }
  }
}

// Attention over an int8 cache equals, bit for bit, attention over an f32 cache holding the
// dequantized values (q * scale): a mixed batch of prefill chunks and decodes, GQA groups of
// 1 and 4, scattered blocks.
TEST(Int8KvTest, AttentionReadsTheDequantizedValues) {
  CpuBackend backend(3);
  for (int group : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "group " << group);
    const int heads = 2, bs = 8, hd = 16, shift = 5;
    const std::vector<std::pair<int, int>> seqs = {{5, 20}, {1, 1}, {1, 37}, {9, 9}, {1, 64}};
    Arena int8(DType::kInt8, 1, heads, bs, hd, shift);
    Arena f32(DType::kF32, 1, heads, bs, hd, shift);
    std::vector<int32_t> free_blocks(1 << shift);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(group));
    std::vector<int32_t> indptr{0}, indices, last_len, q_indptr{0};
    std::vector<int64_t> slots;
    for (auto [q_len, kv_len] : seqs) {
      const int blocks = (kv_len + bs - 1) / bs;
      const int first = static_cast<int>(indices.size());
      for (int b = 0; b < blocks; ++b) {
        indices.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last_len.push_back(kv_len - (blocks - 1) * bs);
      q_indptr.push_back(q_indptr.back() + q_len);
      for (int t = 0; t < kv_len; ++t)
        slots.push_back(int64_t{indices[first + t / bs]} * bs + t % bs);
    }
    const int n = static_cast<int>(slots.size()), width = heads * hd;
    const std::vector<float> k = RandomFloats(n * width, 11, -2.0f, 2.0f);
    const std::vector<float> v = RandomFloats(n * width, 12);
    ASSERT_TRUE(
        backend.AppendKv({int8.View(0), k.data(), v.data(), slots.data(), n, width, width}).ok());
    // The f32 cache gets what the int8 one stores, dequantized.
    for (int64_t slot : slots) {
      for (int h = 0; h < heads; ++h) {
        for (bool value : {false, true}) {
          const int64_t b = slot / bs;
          const int row = static_cast<int>(slot % bs);
          for (int d = 0; d < hd; ++d) {
            f32.F32(0, value, b, h, row, d) = static_cast<float>(int8.Q(0, value, b, h, row, d)) *
                                              int8.Scale(0, value, b, h, row);
          }
        }
      }
    }
    const int rows = q_indptr.back(), q_heads = heads * group;
    const std::vector<float> q = RandomFloats(rows * q_heads * hd, 13);
    std::vector<float> out_int8(rows * q_heads * hd, -1.0f), out_f32(out_int8.size(), -2.0f);
    auto attend = [&](const Arena& arena, float* out) {
      PagedAttentionParams p;
      p.out = out;
      p.q = q.data();
      p.q_indptr = q_indptr.data();
      p.cache = arena.View(0);
      p.blocks = {indptr.data(), indices.data(), last_len.data(),
                  static_cast<int32_t>(seqs.size())};
      p.num_q_heads = q_heads;
      p.q_stride = p.out_stride = q_heads * hd;
      p.sm_scale = 1.0f / std::sqrt(static_cast<float>(hd));
      return backend.PagedAttention(p);
    };
    ASSERT_TRUE(attend(int8, out_int8.data()).ok());
    ASSERT_TRUE(attend(f32, out_f32.data()).ok());
    for (size_t i = 0; i < out_f32.size(); ++i) {
      ASSERT_EQ(out_int8[i], out_f32[i]) << "element " << i;
    }
  }
}

TEST(Int8KvTest, CopyBlocksMovesTheScalesWithTheValues) {
  CpuBackend backend(1);
  const int layers = 2, heads = 2, bs = 4, hd = 8, shift = 2;
  Arena arena(DType::kInt8, layers, heads, bs, hd, shift);
  const int width = heads * hd, tokens = bs;
  const std::vector<float> k = RandomFloats(tokens * width, 3), v = RandomFloats(tokens * width, 4);
  std::vector<int64_t> slots(tokens);
  std::iota(slots.begin(), slots.end(), 1 * bs);  // block 1
  for (int l = 0; l < layers; ++l) {
    ASSERT_TRUE(
        backend.AppendKv({arena.View(l), k.data(), v.data(), slots.data(), tokens, width, width})
            .ok());
  }
  const int32_t src = 1, dst = 3;
  CopyBlocksParams p;
  p.chunks = arena.table();
  p.chunk_shift = shift;
  p.chunk_region_bytes = arena.region_bytes();
  p.num_regions = 2 * layers;
  p.block_bytes = arena.block_bytes();
  p.src = &src;
  p.dst = &dst;
  p.num_pairs = 1;
  ASSERT_TRUE(backend.CopyBlocks(p).ok());
  for (int l = 0; l < layers; ++l) {
    for (bool value : {false, true}) {
      for (int h = 0; h < heads; ++h) {
        for (int row = 0; row < bs; ++row) {
          EXPECT_EQ(arena.Scale(l, value, dst, h, row), arena.Scale(l, value, src, h, row));
          EXPECT_GT(arena.Scale(l, value, dst, h, row), 0.0f);
          for (int d = 0; d < hd; ++d) {
            ASSERT_EQ(arena.Q(l, value, dst, h, row, d), arena.Q(l, value, src, h, row, d));
          }
        }
      }
    }
  }
}

TEST(Int8KvTest, ScalesOutsideTheirPlaceAreRefusedBeforeAnythingIsWritten) {
  CpuBackend backend(1);
  const int heads = 2, bs = 4, hd = 8;
  Arena arena(DType::kInt8, 1, heads, bs, hd, 1);
  const std::vector<float> k = RandomFloats(heads * hd, 1), v = RandomFloats(heads * hd, 2);
  const int64_t slot = 0;
  auto append = [&](KvCacheView view) {
    return backend.AppendKv({view, k.data(), v.data(), &slot, 1, heads * hd, heads * hd});
  };
  KvCacheView overlapping = arena.View(0);
  overlapping.scale_offset_bytes = 4;  // inside the elements
  KvCacheView past_the_block = arena.View(0);
  past_the_block.scale_offset_bytes = past_the_block.block_bytes - 4;  // 8 scales do not fit
  KvCacheView unaligned = arena.View(0);
  unaligned.scale_offset_bytes += 2;
  for (const KvCacheView& view : {overlapping, past_the_block, unaligned}) {
    const absl::Status s = append(view);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("scale_offset_bytes"));
  }
  EXPECT_TRUE(std::all_of(arena.bytes().begin(), arena.bytes().end(),
                          [](unsigned char c) { return c == kPoison; }));
  EXPECT_TRUE(append(arena.View(0)).ok());
}

}  // namespace
}  // namespace kvd
