// Micro-benchmarks of the KV cache's engine-thread paths: block allocation and release,
// prefix matching, sequence admission with hits, and defragmentation moves with their
// step-boundary pauses. Programs, not tests: they print tables and never fail on a time.
// Each reports items/s; the defrag benchmark also reports its pause distribution. Rates are
// per second of CPU time of the benchmark thread (all the work runs on it), except the defrag
// benchmark's, per wall-clock second (UseRealTime) like its pause counters: a pause holds up
// the engine thread for its wall time, whatever share of it the thread spent on a CPU.

#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cache/block_pool.h"
#include "cache/clock.h"
#include "cache/eviction_policy.h"
#include "cache/kv_arena.h"
#include "cache/kv_cache_manager.h"
#include "cache/session_table.h"
#include "kernels/cpu_backend.h"
#include "kernels/params.h"

namespace kvd {
namespace {

std::unique_ptr<BlockPool> MakePool(int32_t chunk_shift, int32_t chunks) {
  return *BlockPool::Create({chunk_shift, chunks, chunks}, *MakeEvictionPolicy("lru", chunk_shift),
                            nullptr, nullptr);
}

// Allocate a batch of free blocks, then release them (a sequence's lifetime).
void BM_AllocateRelease(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  auto pool = MakePool(10, 64);  // 65,536 blocks
  std::vector<BlockId> got(batch);
  for (auto _ : state) {
    for (int32_t i = 0; i < batch; ++i) got[i] = *pool->Allocate();
    for (int32_t i = batch - 1; i >= 0; --i) pool->Release(got[i]);
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_AllocateRelease)->Arg(1)->Arg(64)->Arg(1024);

// Every allocation evicts the LRU cached block (the pool is full of cache).
void BM_AllocateEvict(benchmark::State& state) {
  auto pool = MakePool(10, 16);
  std::vector<BlockId> all;
  for (int32_t i = 0; i < pool->num_blocks(); ++i) {
    all.push_back(*pool->Allocate());
    pool->MarkCached(all.back());
  }
  for (BlockId b : all) pool->Release(b);
  for (auto _ : state) {
    const BlockId b = *pool->Allocate();
    pool->MarkCached(b);
    pool->Release(b);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AllocateEvict);

KvCacheOptions ManagerOptions() {
  KvCacheOptions o;
  o.block_size = 16;
  o.chunk_bytes = int64_t{64} << 20;
  o.initial_pool_bytes = int64_t{1} << 30;
  o.max_pool_bytes = int64_t{1} << 30;
  o.defrag_background_planning = false;
  return o;
}

// ProbePrefix of a prompt whose first `range(0)` tokens (all but the last) are cached.
void BM_PrefixMatch(benchmark::State& state) {
  const int32_t len = static_cast<int32_t>(state.range(0));
  FakeClock clock;
  auto m = *KvCacheManager::Create(ManagerOptions(), {2, 1, 16}, nullptr, &clock);
  std::vector<int32_t> prompt(len + 1);
  for (int32_t i = 0; i <= len; ++i) prompt[i] = (i * 7919) % 32000;
  (void)m->AddSequence(0, prompt);
  (void)m->Reserve(0, len + 1);
  m->MarkComputed(0, len + 1);
  for (auto _ : state) benchmark::DoNotOptimize(m->ProbePrefix(prompt));
  state.SetItemsProcessed(state.iterations() * len);  // tokens matched
  m->Free(0);
}
BENCHMARK(BM_PrefixMatch)->Arg(128)->Arg(2048)->Arg(16384);

// Admission with a 2,048-token cached prefix: AddSequence + Reserve the rest + Free.
void BM_AddSequenceWithHits(benchmark::State& state) {
  FakeClock clock;
  auto m = *KvCacheManager::Create(ManagerOptions(), {2, 1, 16}, nullptr, &clock);
  std::vector<int32_t> prompt(2048 + 100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i % 1000);
  (void)m->AddSequence(0, prompt);
  (void)m->Reserve(0, 2048);
  m->MarkComputed(0, 2048);
  m->Free(0);
  SeqId id = 1;
  for (auto _ : state) {
    const int32_t cached = *m->AddSequence(id, prompt);
    (void)m->Reserve(id, static_cast<int32_t>(prompt.size()) - cached);
    m->Free(id++);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AddSequenceWithHits);

// The room an admission check sees (NumObtainableBlocks: free, evictable, growth and the
// blocks only idle sessions pin) with range(0) blocks pinned by idle sessions of 16 blocks
// (256 tokens) each. The engine asks once per candidate it considers in a step.
void BM_ObtainableWithIdleSessions(benchmark::State& state) {
  const int32_t pinned = static_cast<int32_t>(state.range(0));
  FakeClock clock;
  KvCacheOptions o = ManagerOptions();
  o.max_pinned_fraction = 1.0;
  auto m = *KvCacheManager::Create(o, {2, 1, 16}, nullptr, &clock);
  std::vector<int32_t> prompt(257);
  for (SeqId id = 0; id < pinned / 16; ++id) {
    for (int32_t i = 0; i < 257; ++i) prompt[i] = static_cast<int32_t>(id * 257 + i);
    (void)m->AddSequence(id, prompt, absl::StrCat("session-", id));
    (void)m->Reserve(id, 257);
    m->MarkComputed(id, 256);
    m->Free(id);  // the session pins the 16 blocks of its 256 computed tokens
  }
  if (m->stats().pinned_blocks != pinned) {
    state.SkipWithError(
        absl::StrCat(m->stats().pinned_blocks, " blocks pinned, not ", pinned).c_str());
  }
  for (auto _ : state) benchmark::DoNotOptimize(m->NumObtainableBlocks());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ObtainableWithIdleSessions)->Arg(1024)->Arg(25600);

// One defragmentation step's remap of the pinned sessions (SessionTable::RemapBlocks) with
// range(0) idle sessions of 13 blocks each, all but the last in the chunks below, and 64
// blocks moved out of the top chunk: the work every step that moves blocks does for them.
void BM_SessionRemap(benchmark::State& state) {
  const int32_t sessions = static_cast<int32_t>(state.range(0));
  constexpr int32_t kChainBlocks = 13;
  constexpr int32_t kMoves = 64;
  FakeClock clock;
  SessionTable t(&clock, absl::Hours(1));
  const BlockId top = sessions * kChainBlocks;  // the top chunk's first block
  for (int32_t i = 0; i < sessions; ++i) {
    std::vector<BlockId> chain(kChainBlocks);
    for (int32_t j = 0; j < kChainBlocks; ++j) chain[j] = i * kChainBlocks + j;
    if (i == sessions - 1) chain.back() = top;  // one session holds a block up there
    const std::string id = absl::StrCat("session-", i);
    (void)t.Detach(id, (*t.Attach(id))->serial, std::move(chain),
                   std::vector<int32_t>(kChainBlocks * 16));
  }
  // Back and forth between two ranges of the top chunk, so that every step moves blocks.
  absl::flat_hash_map<BlockId, BlockId> out, back;
  for (BlockId b = 0; b < kMoves; ++b) {
    out[top + b] = top + kMoves + b;
    back[top + kMoves + b] = top + b;
  }
  bool forth = true;
  for (auto _ : state) {
    t.RemapBlocks(forth ? out : back);
    forth = !forth;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SessionRemap)->Arg(1000)->Arg(10000)->Arg(40000)->Unit(benchmark::kMicrosecond);

// A pool grown to 4 chunks by 64 sequences drains to 1 when 48 of them finish: the 16
// survivors' 256 blocks fill exactly one chunk, and defragmentation moves the 192 of them
// above chunk 0 down, range(0) moves per step, each block once (the planner fills chunk 0,
// the one the pool shrinks to, before the chunks that drain later). Block copies go through the
// CPU backend (f32, stories260K-sized and a 1B-class shape). Reports moves per wall-clock
// second over the Tick() calls that drain the pool (items_per_second: planning included) and
// over the pauses alone (pause_moves_per_s, from the pauses' own steady-clock times: copies,
// remapping and the chunks' releases); an iteration that does not end at one chunk is an
// error, not a figure.
void BM_DefragMoves(benchmark::State& state) {
  const int32_t moves_per_step = static_cast<int32_t>(state.range(0));
  const KvShape shape = state.range(1) == 0 ? KvShape{5, 4, 8} : KvShape{16, 8, 64};
  CpuBackend backend(1);
  FakeClock clock;
  KvCacheOptions o = ManagerOptions();
  const int64_t block_bytes =
      int64_t{2} * shape.num_layers * shape.num_kv_heads * shape.head_dim * 4 * o.block_size;
  constexpr int32_t kBlocksPerChunk = 256;
  o.chunk_bytes = block_bytes * kBlocksPerChunk;
  o.initial_pool_bytes = o.chunk_bytes;
  o.max_pool_bytes = 4 * o.chunk_bytes;
  // Only range(0) may bound a step: the byte cap and the pause budget (which would adapt
  // the moves per step to the measured copy cost) are set out of the way.
  o.defrag_max_moves_per_step = moves_per_step;
  o.defrag_max_bytes_per_step = block_bytes * moves_per_step;
  o.defrag_max_pause = absl::Seconds(10);
  // Shrinking from 2 chunks to 1 needs used <= low_water * 256 with 256 blocks in use.
  o.defrag_low_water = 1.0;
  // A chunk drains in one planning tick plus ceil(256 / range(0)) moving ticks; a chunk
  // still there after a few more has stalled.
  const int32_t ticks_per_chunk = (kBlocksPerChunk + moves_per_step - 1) / moves_per_step + 3;
  int64_t moves = 0;
  int64_t ticks = 0;
  DefragPauseStats pauses;
  DefragPauseQuantiles quantiles;
  for (auto _ : state) {
    state.PauseTiming();
    auto m = *KvCacheManager::Create(o, shape, &backend, &clock);
    std::vector<int32_t> prompt(256);
    for (SeqId id = 0; id < 64; ++id) {
      for (int32_t i = 0; i < 256; ++i) prompt[i] = static_cast<int32_t>(id * 1000 + i);
      (void)m->AddSequence(id, prompt);
      (void)m->Reserve(id, 255);
      m->MarkComputed(id, 255);
    }
    // In serving every block was written by prefill: write them here too, so the timed
    // copies do not pay first-touch page faults of the freshly mapped chunks.
    const KvArena* arena = m->arena();
    const KvCacheView view = m->LayerView(0);
    for (int32_t c = 0; c < view.num_chunks; ++c) {
      std::memset(view.chunks[c], 1, static_cast<size_t>(arena->chunk_bytes()));
    }
    for (SeqId id = 0; id < 64; ++id) {
      if (id % 4 != 3) m->Free(id);
    }
    state.ResumeTiming();
    int32_t chunks = arena->num_chunks();
    for (int32_t since_release = 0; chunks > 1 && since_release < ticks_per_chunk;) {
      m->Tick();
      ++ticks;
      ++since_release;
      if (arena->num_chunks() < chunks) {
        chunks = arena->num_chunks();
        since_release = 0;
      }
    }
    state.PauseTiming();
    const KvCacheStats st = m->stats();
    if (st.num_chunks != 1) {
      state.SkipWithError(absl::StrCat("defragmentation stalled at ", st.num_chunks,
                                       " chunks after ", st.defrag_moves, " moves")
                              .c_str());
      break;
    }
    moves += st.defrag_moves;
    pauses = st.defrag_pauses;
    quantiles = m->RecentDefragPauseQuantiles();
    m.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(moves);
  state.counters["block_KiB"] = static_cast<double>(block_bytes) / 1024;
  state.counters["moves"] = static_cast<double>(pauses.num_moves);  // per iteration
  // Moves over the time spent in pauses (copies, remapping and chunk releases: a pause is a
  // whole step that did either); items_per_second also counts the drain's planning.
  state.counters["pause_moves_per_s"] =
      pauses.total > absl::ZeroDuration()
          ? static_cast<double>(pauses.num_moves) / absl::ToDoubleSeconds(pauses.total)
          : 0;
  // Pauses that only returned a chunk count too (with no moves).
  state.counters["moves_per_pause"] =
      pauses.num_pauses > 0 ? static_cast<double>(pauses.num_moves) / pauses.num_pauses : 0;
  state.counters["ticks"] =
      state.iterations() > 0 ? static_cast<double>(ticks) / state.iterations() : 0;
  state.counters["pause_p50_us"] = absl::ToDoubleMicroseconds(quantiles.p50);
  state.counters["pause_p99_us"] = absl::ToDoubleMicroseconds(quantiles.p99);
  state.counters["pause_max_us"] = absl::ToDoubleMicroseconds(pauses.max);
}
BENCHMARK(BM_DefragMoves)
    ->Args({8, 0})
    ->Args({32, 0})
    ->Args({128, 0})
    ->Args({8, 1})
    ->Args({32, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvd

BENCHMARK_MAIN();
