// decode_bench.h: the measurement behind `kvd bench`.

#include "tools/decode_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache/clock.h"
#include "kernels/status_macros.h"
#include "tools/device.h"
#include "tools/engine_setup.h"
#include "tools/random_model.h"
#if defined(KVD_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_status.h"
#endif

namespace kvd {
namespace {

using SteadyClock = std::chrono::steady_clock;

double Ms(SteadyClock::time_point start, SteadyClock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

}  // namespace

absl::StatusOr<std::vector<DecodeBenchCase>> ParseDecodeBenchCases(const std::string& text) {
  std::vector<DecodeBenchCase> cases;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, 'x');
    DecodeBenchCase c;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &c.batch) ||
        !absl::SimpleAtoi(parts[1], &c.context) || c.batch < 1 || c.context < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cases: '", item, "' is not BATCHxCONTEXT (e.g. 64x4096)"));
    }
    cases.push_back(c);
  }
  if (cases.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cases: '", text, "' names no case; want comma-separated BATCHxCONTEXT (e.g. 64x4096)"));
  }
  return cases;
}

absl::StatusOr<double> MeasureCopyBandwidth([[maybe_unused]] Backend* backend) {
#if defined(KVD_HAVE_CUDA)
  if (auto* cuda = dynamic_cast<CudaBackend*>(backend)) {
    const size_t bytes = size_t{2} << 30;
    auto a = backend->Allocate(bytes);
    auto b = backend->Allocate(bytes);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    // Every call checked: a failed copy or event must be an error, not a time of 0 (an
    // infinite bandwidth, and every roofline of the run 0 ms).
    cudaEvent_t start = nullptr, stop = nullptr;
    std::vector<float> times;
    const absl::Status timed = [&]() -> absl::Status {
      KVD_RETURN_IF_CUDA_ERROR(cudaEventCreate(&start), "copy bandwidth: cudaEventCreate");
      KVD_RETURN_IF_CUDA_ERROR(cudaEventCreate(&stop), "copy bandwidth: cudaEventCreate");
      for (int i = 0; i < 11; ++i) {
        KVD_RETURN_IF_CUDA_ERROR(cudaEventRecord(start, cuda->stream()),
                                 "copy bandwidth: cudaEventRecord");
        KVD_RETURN_IF_CUDA_ERROR(
            cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, cuda->stream()),
            "copy bandwidth: cudaMemcpyAsync");
        KVD_RETURN_IF_CUDA_ERROR(cudaEventRecord(stop, cuda->stream()),
                                 "copy bandwidth: cudaEventRecord");
        KVD_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(stop),
                                 "copy bandwidth: cudaEventSynchronize");
        float ms = 0;
        KVD_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, start, stop),
                                 "copy bandwidth: cudaEventElapsedTime");
        if (i > 0) times.push_back(ms);  // the first copy warms up
      }
      return absl::OkStatus();
    }();
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (!timed.ok()) return timed;
    if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
    std::sort(times.begin(), times.end());
    const double median_ms = times[times.size() / 2];
    if (!(median_ms > 0)) {
      return absl::InternalError(
          absl::StrCat("copy bandwidth: 2 GiB copies timed at ", median_ms, " ms"));
    }
    return 2.0 * bytes / (median_ms * 1e6);
  }
#endif
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    const auto start = SteadyClock::now();
    std::memcpy(b.data(), a.data(), bytes);
    times.push_back(Ms(start, SteadyClock::now()));
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  std::sort(times.begin(), times.end());
  return 2.0 * bytes / (times[times.size() / 2] * 1e6);
}

absl::StatusOr<DecodeBenchResult> RunDecodeBenchCase(const DecodeBenchCase& c, bool graphs,
                                                     const DecodeBenchOptions& options,
                                                     LlamaModel* model, Backend* backend) {
  const int32_t block_size = options.block_size;
  const int32_t warmup = options.warmup;
  const int32_t steps = options.steps;
  const uint64_t seed = options.seed;
  const bool profile = options.profile;
  const ModelSpec& spec = model->spec();
  // Fresh graphs per case: the cache (and so every KV view) is new.
  model->SetDecodeGraphs(graphs ? MakeOpGraphRecorder(backend) : nullptr, c.batch);
  const DecodeGraphStats stats_before = model->decode_graph_stats();
  // int64: the sum of the int32 flags need not fit an int32.
  const int64_t total_steps = int64_t{warmup} + steps + (profile && !graphs ? steps : 0);
  // Each step computes the KV of one position (its sampled token is fed back by the next).
  if (c.context + total_steps > spec.max_context_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("context + warm-up + steps exceeds the model's ",
                                                   spec.max_context_tokens, " tokens"));
  }
  RealClock clock;
  auto cache = CreateCache(spec, backend, &clock,
                           {.block_size = block_size,
                            .num_sequences = c.batch,
                            .tokens_per_sequence = static_cast<int32_t>(c.context + total_steps),
                            .kv_dtype = DefaultKvDtype(*backend),
                            .enable_prefix_caching = false});
  if (!cache.ok()) return cache.status();
  KvCacheManager& kv = **cache;

  // Random K/V everywhere (what a prefill would have written, as far as bandwidth goes).
  const KvArena& arena = *kv.arena();
  const DType kv_dtype = kv.layout().dtype();
  const size_t elem_bytes = static_cast<size_t>(DTypeBits(kv_dtype) / 8);
  for (int32_t chunk = 0; chunk < arena.num_chunks(); ++chunk) {
    void* base = arena.BlockAddress(chunk << arena.chunk_shift(), 0);
    const RandomFill fill{.key = RandomFillKey(seed + 1, static_cast<uint64_t>(chunk)),
                          .scale = 1.0f};
    if (absl::Status s = FillRandom(backend, base, kv_dtype,
                                    static_cast<size_t>(arena.chunk_bytes()) / elem_bytes, fill);
        !s.ok()) {
      return s;
    }
  }

  // Each sequence: a distinct pseudo-random "prompt" of `context` tokens, marked computed.
  std::vector<int32_t> next(c.batch);
  for (int32_t i = 0; i < c.batch; ++i) {
    std::vector<int32_t> prompt(c.context);
    const RandomFill ids{.key = RandomFillKey(seed + 2, static_cast<uint64_t>(i))};
    for (int32_t p = 0; p < c.context; ++p) {
      const float u = 0.5f * (RandomFillValue(ids, p) + 1.0f);  // [0, 1)
      prompt[p] = std::min(spec.vocab_size - 1, static_cast<int32_t>(u * spec.vocab_size));
    }
    auto computed = kv.AddSequence(i, prompt);
    if (!computed.ok()) return computed.status();
    if (!kv.Reserve(i, c.context - *computed)) {
      return absl::ResourceExhaustedError("KV pool too small for the prompt");
    }
    kv.MarkComputed(i, c.context - *computed);
    next[i] = prompt.back();
  }

  std::vector<KvCacheView> views(spec.num_layers);
  for (int32_t l = 0; l < spec.num_layers; ++l) views[l] = kv.LayerView(l);
  // Greedy rows for Backend::Sample, which runs on the device (only the ids come back), as
  // the engine samples.
  const std::vector<SamplingRow> greedy(c.batch, SamplingRow{.temperature = 0.0f});
  const size_t rows_bytes = greedy.size() * sizeof(SamplingRow);
  auto sample_io = backend->Allocate(rows_bytes + greedy.size() * sizeof(int32_t));
  if (!sample_io.ok()) return sample_io.status();
  if (absl::Status s = backend->CopyToDevice(sample_io->data(), greedy.data(), rows_bytes);
      !s.ok()) {
    return s;
  }
  int32_t* device_ids = reinterpret_cast<int32_t*>(sample_io->as<char>() + rows_bytes);
  const float* last_logits = nullptr;
  // One greedy decode step of every sequence.
  auto step = [&]() -> absl::Status {
    ForwardBatch batch;
    for (int32_t i = 0; i < c.batch; ++i) {
      kv.AppendTokens(i, {next[i]});
      if (!kv.Reserve(i, 1)) return absl::ResourceExhaustedError("KV pool too small");
      batch.AddSequence({next[i]}, kv.NumComputed(i), kv.BlockIds(i), block_size,
                        /*want_logits=*/true);
    }
    auto logits = model->ForwardToDevice(batch, views);
    if (!logits.ok()) return logits.status();
    KVD_RETURN_IF_ERROR(backend->Sample({.logits = *logits,
                                         .row_stride = spec.vocab_size,
                                         .num_rows = c.batch,
                                         .vocab_size = spec.vocab_size,
                                         .rows = sample_io->as<const SamplingRow>(),
                                         .out_tokens = device_ids}));
    KVD_RETURN_IF_ERROR(
        backend->CopyToHost(next.data(), device_ids, next.size() * sizeof(int32_t)));
    for (int32_t i = 0; i < c.batch; ++i) kv.MarkComputed(i, 1);
    last_logits = *logits;
    return absl::OkStatus();
  };
  // A step that records a graph runs uncaptured and then records: not what the other steps
  // measure, so it is kept apart (by the graph counters, which say what each step did).
  DecodeBenchResult r;
  std::vector<double> step_ms;
  double recorded_total_ms = 0;
  for (int32_t i = 0; i < warmup + steps; ++i) {
    const DecodeGraphStats before = model->decode_graph_stats();
    const auto start = SteadyClock::now();
    KVD_RETURN_IF_ERROR(step());
    const double ms = Ms(start, SteadyClock::now());
    if (i < warmup) continue;
    if (model->decode_graph_stats().captures != before.captures) {
      ++r.recorded_steps;
      recorded_total_ms += ms;
      continue;
    }
    if (model->decode_graph_stats().replays != before.replays) ++r.replayed_steps;
    step_ms.push_back(ms);
  }
  if (step_ms.empty()) {
    return absl::InternalError(
        absl::StrCat("all ", steps, " timed steps recorded a decode graph; none measured"));
  }
  if (r.recorded_steps > 0) r.recorded_step_ms = recorded_total_ms / r.recorded_steps;
#if defined(KVD_HAVE_CUDA)
  if (auto* cuda = dynamic_cast<CudaBackend*>(backend); profile && !graphs && cuda != nullptr) {
    cuda->SetOpTiming(true);
    const auto start = SteadyClock::now();
    for (int32_t i = 0; i < steps; ++i) KVD_RETURN_IF_ERROR(step());
    r.profiled_step_ms = Ms(start, SteadyClock::now()) / steps;
    auto times = cuda->TakeOpTimes();
    cuda->SetOpTiming(false);
    if (!times.ok()) return times.status();
    for (const CudaBackend::OpTime& t : *times) {
      r.op_ms.emplace_back(absl::StrCat(t.op, " x", t.calls / steps), t.ms / steps);
    }
  }
#endif

  r.shape = c;
  r.graphs = graphs;
  r.graph_stats.captures = model->decode_graph_stats().captures - stats_before.captures;
  r.graph_stats.replays = model->decode_graph_stats().replays - stats_before.replays;
  r.graph_stats.capture_failures =
      model->decode_graph_stats().capture_failures - stats_before.capture_failures;
  r.graph_stats.last_failure = model->decode_graph_stats().last_failure;
  model->SetDecodeGraphs(nullptr, 0);
  // Self-check: the last step's first logit row is finite and every id is in range.
  std::vector<float> row(spec.vocab_size);
  if (absl::Status s = backend->CopyToHost(row.data(), last_logits, row.size() * sizeof(float));
      !s.ok()) {
    return s;
  }
  for (float x : row) r.finite = r.finite && std::isfinite(x);
  for (int32_t id : next) r.finite = r.finite && id >= 0 && id < spec.vocab_size;

  double total = 0;
  for (double ms : step_ms) total += ms;
  r.step_ms = total / step_ms.size();
  r.min_step_ms = step_ms.empty() ? 0 : *std::min_element(step_ms.begin(), step_ms.end());
  const double kv_bytes_per_token =
      static_cast<double>(kv.layout().block_bytes()) / kv.layout().block_size();
  const double mean_kv_len = c.context + warmup + 0.5 * (steps + 1);
  r.kv_gb = kv_bytes_per_token * mean_kv_len * c.batch / 1e9;
  r.roofline_ms = (options.weight_bytes + r.kv_gb * 1e9) / (options.copy_gbps * 1e6);
  return r;
}

}  // namespace kvd
