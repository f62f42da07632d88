// Micro-benchmark of the CPU backend's Sample op (kernels/cpu_sampling.h): rows of a
// Llama-2 or Llama-3 sized vocabulary with the usual filters (top_k 50, top_p 0.9,
// temperature 0.8), one row or a batch of 8 on a 2-thread backend, with and without one
// logit masked to -FLT_MAX (as a grammar or a banned token would). A program, not a test: it
// prints a table and never fails on a time. Rates are rows per wall-clock second
// (UseRealTime): the rows run on the pool's threads.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu_backend.h"
#include "kernels/params.h"

namespace kvd {
namespace {

// Args: vocabulary, rows, masked (0/1).
void BM_CpuSample(benchmark::State& state) {
  const int32_t vocab = static_cast<int32_t>(state.range(0));
  const int32_t rows = static_cast<int32_t>(state.range(1));
  const bool masked = state.range(2) != 0;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab) * rows);
  for (float& x : logits) x = normal(rng);
  if (masked) {
    for (int32_t r = 0; r < rows; ++r) {
      logits[static_cast<size_t>(r) * vocab + rng() % vocab] = -std::numeric_limits<float>::max();
    }
  }
  std::vector<SamplingRow> sampling(rows);
  std::vector<int32_t> tokens(rows);
  CpuBackend backend(2);
  const SampleParams p{.logits = logits.data(),
                       .row_stride = vocab,
                       .num_rows = rows,
                       .vocab_size = vocab,
                       .rows = sampling.data(),
                       .out_tokens = tokens.data()};
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (auto _ : state) {
    for (SamplingRow& s : sampling) {
      s = {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .u = uniform(rng) * 0.999f};
    }
    if (absl::Status status = backend.Sample(p); !status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(tokens.data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}
BENCHMARK(BM_CpuSample)
    ->ArgNames({"vocab", "rows", "masked"})
    ->ArgsProduct({{32000, 128256}, {1, 8}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvd

BENCHMARK_MAIN();
