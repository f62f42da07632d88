// Micro-benchmark of the CPU backend's PagedAttention op (kernels/cpu_paged_attention.h) at
// Llama-3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128) over an f32 cache of
// 16-token blocks in shuffled order: decode steps (one query row a sequence) of 1 and 8
// sequences at contexts of 512 and 4096 keys, and one causal prefill of a 512-token prompt,
// on a 2-thread backend. A program, not a test: it prints a table and never fails on a time.
// Rates are query rows per wall-clock second (UseRealTime): the rows run on the pool's
// threads.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu_backend.h"
#include "kernels/params.h"

namespace kvd {
namespace {

constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBlockSize = 16;

// Args: sequences, context (keys a sequence has, its query rows included), query rows a
// sequence (1: a decode step; the context: a causal prefill of the whole prompt).
void BM_CpuPagedAttention(benchmark::State& state) {
  const int32_t num_seqs = static_cast<int32_t>(state.range(0));
  const int32_t context = static_cast<int32_t>(state.range(1));
  const int32_t q_len = static_cast<int32_t>(state.range(2));
  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int32_t num_blocks = num_seqs * blocks_per_seq;
  const int64_t block_floats = int64_t{kKvHeads} * kBlockSize * kHeadDim;

  // One chunk holding every block: the K region, then the V region.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> arena(2 * num_blocks * block_floats);
  for (float& x : arena) x = uniform(rng);
  void* chunk = arena.data();
  KvCacheView cache;
  cache.chunks = &chunk;
  cache.num_chunks = 1;
  cache.chunk_shift = static_cast<int32_t>(std::ceil(std::log2(std::max(2, num_blocks))));
  cache.k_offset_bytes = 0;
  cache.v_offset_bytes = num_blocks * block_floats * static_cast<int64_t>(sizeof(float));
  cache.block_bytes = block_floats * static_cast<int64_t>(sizeof(float));
  cache.dtype = DType::kF32;
  cache.num_kv_heads = kKvHeads;
  cache.block_size = kBlockSize;
  cache.head_dim = kHeadDim;

  std::vector<int32_t> block_ids(num_blocks);
  for (int32_t i = 0; i < num_blocks; ++i) block_ids[i] = i;
  std::shuffle(block_ids.begin(), block_ids.end(), rng);
  std::vector<int32_t> block_indptr(num_seqs + 1), q_indptr(num_seqs + 1);
  std::vector<int32_t> last_block_len(num_seqs, context - (blocks_per_seq - 1) * kBlockSize);
  for (int32_t s = 0; s <= num_seqs; ++s) {
    block_indptr[s] = s * blocks_per_seq;
    q_indptr[s] = s * q_len;
  }
  const int32_t width = kQHeads * kHeadDim;
  std::vector<float> q(static_cast<size_t>(num_seqs) * q_len * width);
  for (float& x : q) x = uniform(rng);
  std::vector<float> out(q.size());

  PagedAttentionParams p;
  p.out = out.data();
  p.q = q.data();
  p.q_indptr = q_indptr.data();
  p.cache = cache;
  p.blocks = {.indptr = block_indptr.data(),
              .indices = block_ids.data(),
              .last_block_len = last_block_len.data(),
              .num_seqs = num_seqs};
  p.num_q_heads = kQHeads;
  p.q_stride = width;
  p.out_stride = width;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.causal = true;
  CpuBackend backend(2);
  for (auto _ : state) {
    if (absl::Status status = backend.PagedAttention(p); !status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * num_seqs * q_len);
}
BENCHMARK(BM_CpuPagedAttention)
    ->ArgNames({"seqs", "context", "q_len"})
    ->Args({1, 512, 1})
    ->Args({1, 4096, 1})
    ->Args({8, 4096, 1})
    ->Args({1, 512, 512})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvd

BENCHMARK_MAIN();
