// The KV cache over the real CPU backend (kernels/cpu_backend.h): its arena memory and
// its CopyBlocks serve fork copies and defragmentation moves byte for byte.

#include <memory>

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

}  // namespace
}  // namespace kvd
