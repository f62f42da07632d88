// The KV cache over the real CPU backend (kernels/cpu_backend.h): its arena memory and
// its CopyBlocks serve fork copies and defragmentation moves byte for byte, an int8
// cache's scales included.

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "tests/cache/kv_test_util.h"

namespace kvd {
namespace {

using testing_util::CountBadKv;
using testing_util::Iota;
using testing_util::Step;
using testing_util::TinyOptions;
using testing_util::TinyShape;

TEST(CpuBackendCacheTest, ForkAndDefragmentationPreserveKvBytes) {
  CpuBackend backend(1);
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.defrag_low_water = 0.75;
  o.defrag_max_bytes_per_step = 256;  // one 256-byte block per step
  auto m = *KvCacheManager::Create(o, TinyShape(), &backend, &clock);
  for (SeqId id = 0; id < 8; ++id) {
    ASSERT_TRUE(m->AddSequence(id, Iota(7, 100 * static_cast<int32_t>(id))).ok());
    ASSERT_TRUE(Step(*m, id, 7));
  }
  ASSERT_EQ(m->stats().num_chunks, 4);
  for (SeqId id = 0; id < 7; ++id) m->Free(id);
  ASSERT_TRUE(m->Fork(7, 8).ok());
  EXPECT_EQ(CountBadKv(*m, 8), 0);
  int32_t ticks = 0;
  int64_t moves = 0;
  while (m->stats().num_chunks > 1 && ticks < 50) {
    m->Tick();
    ++ticks;
    ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
    ASSERT_EQ(CountBadKv(*m, 7), 0);
    ASSERT_EQ(CountBadKv(*m, 8), 0);
    ASSERT_LE(m->stats().defrag_moves - moves, 1) << "the byte cap: one block per step";
    moves = m->stats().defrag_moves;
  }
  const KvCacheStats st = m->stats();
  EXPECT_EQ(st.num_chunks, 1);
  EXPECT_GT(st.defrag_moves, 0);
  EXPECT_EQ(st.defrag_pauses.num_moves, st.defrag_moves);
  // A pause per step that moved a block, and per step that only returned a chunk.
  EXPECT_GE(st.defrag_pauses.num_pauses, st.defrag_moves);
  EXPECT_LE(st.defrag_pauses.num_pauses, st.defrag_moves + st.chunks_released);
}

// Every byte of a sequence's blocks, all regions, in block-table order.
std::vector<char> SequenceBytes(const KvCacheManager& m, SeqId id) {
  const KvArena& arena = *m.arena();
  const int64_t bytes = arena.layout().region_block_bytes();
  std::vector<char> out;
  for (int32_t block : m.BlockIds(id)) {
    for (int32_t r = 0; r < arena.layout().num_regions(); ++r) {
      const char* p = static_cast<const char*>(arena.BlockAddress(block, r));
      out.insert(out.end(), p, p + bytes);
    }
  }
  return out;
}

// An int8 block carries its scales in its slot (cache/kv_layout.h), so a fork's copy and
// defragmentation's moves carry them too: each sequence's blocks read the same bytes after.
TEST(CpuBackendCacheTest, Int8BlocksMoveWithTheirScales) {
  CpuBackend backend(1);
  FakeClock clock;
  KvCacheOptions o = TinyOptions(1, 4);
  o.kv_dtype = DType::kInt8;
  const KvLayout layout = *KvLayout::Create(TinyShape(), DType::kInt8, o.block_size);
  ASSERT_GT(layout.region_block_scale_bytes(), 0);
  o.chunk_bytes = 4 * layout.block_bytes();
  o.initial_pool_bytes = o.chunk_bytes;
  o.max_pool_bytes = 4 * o.chunk_bytes;
  o.defrag_low_water = 0.75;
  o.defrag_max_bytes_per_step = layout.block_bytes();  // one block per step
  auto m = *KvCacheManager::Create(o, TinyShape(), &backend, &clock);
  const int32_t width = TinyShape().num_kv_heads * TinyShape().head_dim;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (SeqId id = 0; id < 8; ++id) {
    ASSERT_TRUE(m->AddSequence(id, Iota(7, 100 * static_cast<int32_t>(id))).ok());
    ASSERT_TRUE(m->Reserve(id, 7));
    std::vector<float> k(7 * width), v(7 * width);
    std::vector<int64_t> slots;
    for (int32_t p = 0; p < 7; ++p) slots.push_back(m->SlotOf(id, p));
    for (int32_t l = 0; l < layout.num_layers(); ++l) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      ASSERT_TRUE(backend
                      .AppendKv({m->arena()->LayerView(l), k.data(), v.data(), slots.data(), 7,
                                 width, width})
                      .ok());
    }
    m->MarkComputed(id, 7);
  }
  ASSERT_EQ(m->stats().num_chunks, 4);
  const std::vector<char> kept = SequenceBytes(*m, 7);
  for (SeqId id = 0; id < 7; ++id) m->Free(id);
  ASSERT_TRUE(m->Fork(7, 8).ok());
  EXPECT_EQ(SequenceBytes(*m, 8), kept);
  for (int32_t ticks = 0; m->stats().num_chunks > 1 && ticks < 50; ++ticks) {
    m->Tick();
    ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
    ASSERT_EQ(SequenceBytes(*m, 7), kept);
    ASSERT_EQ(SequenceBytes(*m, 8), kept);
  }
  EXPECT_EQ(m->stats().num_chunks, 1);
  EXPECT_GT(m->stats().defrag_moves, 0);
}

}  // namespace
}  // namespace kvd
