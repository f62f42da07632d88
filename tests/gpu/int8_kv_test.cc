// The CUDA backend's int8 KV cache against the CPU reference's (kernels/kv_quant.h): AppendKv
// stores the same bytes, values and scales, on both; PagedAttention over those bytes agrees
// within fp32 accumulation order for prefill chunks and decodes, GQA groups 1, 4 and 8, head
// sizes 8, 64 and 128; Rope with append_kv stores what Rope then AppendKv store.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using Int8KvTest = GpuVsCpuTest;

int64_t RoundUp16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// One layer's int8 arena of one chunk of 2^shift blocks on a backend, laid out as KvLayout
// lays out int8 (elements, then scales on a 16-byte boundary, the slot rounded to 16 bytes).
struct Int8Arena {
  Int8Arena(Backend& b, int heads, int block_size, int head_dim, int shift)
      : view{.num_chunks = 1,
             .chunk_shift = shift,
             .dtype = DType::kInt8,
             .num_kv_heads = heads,
             .block_size = block_size,
             .head_dim = head_dim} {
    const int64_t elems = int64_t{heads} * block_size * head_dim;
    view.scale_offset_bytes = RoundUp16(elems);
    view.block_bytes = RoundUp16(view.scale_offset_bytes + 4 * int64_t{heads} * block_size);
    view.k_offset_bytes = 0;
    view.v_offset_bytes = view.block_bytes << shift;
    bytes = 2 * view.v_offset_bytes;
    chunk = Poisoned(b, bytes);
    void* base = chunk.data();
    table = Upload(b, &base, sizeof(base));
    view.chunks = static_cast<void* const*>(table.data());
  }
  KvCacheView view;
  int64_t bytes = 0;
  DeviceBuffer chunk, table;
};

struct Shape {
  int heads, group, head_dim, block_size;
};

// A batch of sequences (q_len, kv_len) over scattered blocks of a 2^shift-block arena.
struct Batch {
  Batch(const std::vector<std::pair<int, int>>& seqs, int block_size, int shift, uint32_t seed) {
    std::vector<int32_t> free_blocks(1 << shift);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(seed));
    for (auto [q_len, kv_len] : seqs) {
      const int blocks = (kv_len + block_size - 1) / block_size;
      const size_t first = indices.size();
      for (int b = 0; b < blocks; ++b) {
        indices.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last_len.push_back(kv_len - (blocks - 1) * block_size);
      q_indptr.push_back(q_indptr.back() + q_len);
      max_q_len = std::max(max_q_len, q_len);
      max_kv_len = std::max(max_kv_len, kv_len);
      for (int t = 0; t < kv_len; ++t) {
        slots.push_back(int64_t{indices[first + t / block_size]} * block_size + t % block_size);
      }
    }
  }
  std::vector<int32_t> indptr{0}, indices, last_len, q_indptr{0};
  std::vector<int64_t> slots;
  int max_q_len = 0, max_kv_len = 0;
};

// K and V rows of `tokens` tokens, with a zero row, a row with a NaN and one with an
// infinity among them when `special`.
std::vector<float> KvRows(int tokens, int width, int head_dim, uint32_t seed, bool special) {
  std::vector<float> rows = RandomFloats(size_t(tokens) * width, seed, -3.0f, 3.0f);
  if (special && tokens >= 3) {
    std::fill_n(rows.begin() + width, head_dim, 0.0f);
    rows[2 * width + 1] = std::numeric_limits<float>::quiet_NaN();
    if (width > head_dim) rows[2 * width + head_dim] = std::numeric_limits<float>::infinity();
  }
  return rows;
}

TEST_F(Int8KvTest, AppendStoresTheCpuBackendsBytes) {
  for (const Shape s :
       {Shape{2, 1, 8, 16}, Shape{8, 4, 64, 16}, Shape{8, 4, 128, 16}, Shape{4, 1, 128, 1}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << s.head_dim << " block " << s.block_size);
    const int shift = 6, width = s.heads * s.head_dim;
    const int64_t slots_in_arena = int64_t{s.block_size} << shift;
    std::vector<int64_t> slots(slots_in_arena);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(s.head_dim));
    const int tokens = static_cast<int>(std::min<int64_t>(slots_in_arena, 53));
    slots.resize(tokens);
    slots[4] = kNoSlot;  // writes nothing
    const std::vector<float> k = KvRows(tokens, width, s.head_dim, 1, true);
    const std::vector<float> v = KvRows(tokens, width, s.head_dim, 2, true);
    Int8Arena on_gpu(gpu(), s.heads, s.block_size, s.head_dim, shift);
    Int8Arena on_cpu(cpu(), s.heads, s.block_size, s.head_dim, shift);
    for (auto [backend, arena] : {std::pair<Backend*, Int8Arena*>{&gpu(), &on_gpu},
                                  std::pair<Backend*, Int8Arena*>{&cpu(), &on_cpu}}) {
      DeviceBuffer kb = Upload(*backend, k), vb = Upload(*backend, v), sb = Upload(*backend, slots);
      OrDie(backend->AppendKv({arena->view, kb.as<float>(), vb.as<float>(), sb.as<int64_t>(),
                               tokens, width, width}),
            "AppendKv");
      OrDie(backend->Synchronize(), "Synchronize");
    }
    const std::vector<uint8_t> g = DownloadBytes(gpu(), on_gpu.chunk.data(), on_gpu.bytes);
    const std::vector<uint8_t> c = DownloadBytes(cpu(), on_cpu.chunk.data(), on_cpu.bytes);
    ASSERT_EQ(g.size(), c.size());
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] != c[i] && differ++ == 0) first = static_cast<int64_t>(i);
    }
    EXPECT_EQ(differ, 0) << "first differing byte " << first << " of " << g.size();
  }
}

TEST_F(Int8KvTest, AttentionAgreesWithTheCpuOverTheSameBytes) {
  for (const Shape s :
       {Shape{2, 4, 8, 16}, Shape{8, 1, 64, 16}, Shape{8, 4, 128, 16}, Shape{2, 8, 128, 32}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << s.head_dim << " group " << s.group);
    const int shift = 9;
    const Batch batch({{7, 20}, {1, 1}, {1, 333}, {12, 12}, {1, 2049}, {5, 64}}, s.block_size,
                      shift, static_cast<uint32_t>(s.head_dim + s.group));
    const int width = s.heads * s.head_dim, n = static_cast<int>(batch.slots.size());
    const std::vector<float> k = KvRows(n, width, s.head_dim, 3, false);
    const std::vector<float> v = KvRows(n, width, s.head_dim, 4, false);
    const int rows = batch.q_indptr.back(), q_heads = s.heads * s.group;
    const std::vector<float> q = RandomFloats(size_t(rows) * q_heads * s.head_dim, 5);
    std::vector<std::vector<float>> outs;
    for (Backend* backend : {static_cast<Backend*>(&gpu()), static_cast<Backend*>(&cpu())}) {
      Int8Arena arena(*backend, s.heads, s.block_size, s.head_dim, shift);
      DeviceBuffer kb = Upload(*backend, k), vb = Upload(*backend, v),
                   sb = Upload(*backend, batch.slots);
      OrDie(backend->AppendKv(
                {arena.view, kb.as<float>(), vb.as<float>(), sb.as<int64_t>(), n, width, width}),
            "AppendKv");
      DeviceBuffer qb = Upload(*backend, q), qi = Upload(*backend, batch.q_indptr),
                   ip = Upload(*backend, batch.indptr), ix = Upload(*backend, batch.indices),
                   ll = Upload(*backend, batch.last_len),
                   out = Poisoned(*backend, sizeof(float) * q.size());
      PagedAttentionParams p;
      p.out = out.as<float>();
      p.q = qb.as<float>();
      p.q_indptr = qi.as<int32_t>();
      p.cache = arena.view;
      p.blocks = {ip.as<int32_t>(), ix.as<int32_t>(), ll.as<int32_t>(),
                  static_cast<int32_t>(batch.last_len.size())};
      p.num_q_heads = q_heads;
      p.q_stride = p.out_stride = q_heads * s.head_dim;
      p.sm_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
      p.max_q_len = batch.max_q_len;
      p.max_kv_len = batch.max_kv_len;
      OrDie(backend->PagedAttention(p), "PagedAttention");
      outs.push_back(DownloadFloats(*backend, out.data(), q.size()));
    }
    EXPECT_TRUE(AllClose(outs[0], outs[1], 1e-4, 2e-5));
  }
}

TEST_F(Int8KvTest, RopeWithAppendStoresWhatRopeThenAppendStore) {
  const int heads = 8, head_dim = 128, q_heads = 32, block_size = 16, shift = 4, tokens = 37;
  const int stride = (q_heads + 2 * heads) * head_dim;  // fused qkv rows
  const std::vector<float> qkv = RandomFloats(size_t(tokens) * stride, 9, -2.0f, 2.0f);
  std::vector<int32_t> positions(tokens);
  std::vector<int64_t> slots(tokens);
  for (int t = 0; t < tokens; ++t) {
    positions[t] = 5 * t + 3;
    slots[t] = (11 * t + 2) % (int64_t{block_size} << shift);
  }
  std::vector<std::vector<uint8_t>> arenas;
  for (bool fused : {true, false}) {
    Int8Arena arena(gpu(), heads, block_size, head_dim, shift);
    DeviceBuffer rows = Upload(gpu(), qkv), pos = Upload(gpu(), positions),
                 sb = Upload(gpu(), slots);
    RopeParams p;
    p.q = rows.as<float>();
    p.k = p.q + q_heads * head_dim;
    p.positions = pos.as<int32_t>();
    p.num_tokens = tokens;
    p.num_q_heads = q_heads;
    p.num_kv_heads = heads;
    p.head_dim = head_dim;
    p.q_stride = p.k_stride = stride;
    p.append_kv = fused;
    p.cache = arena.view;
    p.v = p.k + heads * head_dim;
    p.v_stride = stride;
    p.slot_mapping = sb.as<int64_t>();
    OrDie(gpu().Rope(p), "Rope");
    if (!fused) {
      OrDie(gpu().AppendKv({arena.view, p.k, p.v, p.slot_mapping, tokens, stride, stride}),
            "AppendKv");
    }
    arenas.push_back(DownloadBytes(gpu(), arena.chunk.data(), arena.bytes));
  }
  EXPECT_TRUE(arenas[0] == arenas[1]);
}

}  // namespace
}  // namespace kvd::gpu_test
