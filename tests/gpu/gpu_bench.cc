// gpu_bench: CUDA backend kernels against the machine's own ceilings, measured in the same
// run. A program, not a test: it prints a table (and JSON lines to $OUT/gpu_bench.json when
// OUT is set) and never fails on a time.
//
// Shapes follow ../shared/peers/torch_peers.py (Llama-3-8B heads: 32 query heads, 8 KV
// heads, head_dim 128, bf16 KV, block_size 16) so rows can be set beside its figures.
//
// Modes: `gpu_bench` runs everything below; `gpu_bench gemv` only the copy ceiling and the
// decode matmuls; `gpu_bench sweep` only the copy ceiling and the decode attention sweep;
// `gpu_bench prefill` only the ceilings (copy, 8192^3 GEMM) and the prefill attention rows;
// `gpu_bench decode` only the copy ceiling, the launch floor, the read reference and the decode
// attention rows; `gpu_bench paired` the prefill rows' calls one at a time on request (PairedMain),
// for paired_prefill.py. `gpu_bench --help` lists them and the environment variables that narrow or
// lengthen them (KVD_BENCH_RUNS below, KVD_SWEEP_* at DecodeSweep); an unknown or extra
// argument or a malformed variable is a usage error (exit 2), refused before any CUDA call.
// Rows timed call by call between events (Bench::TimeMs: the ceilings, matmul, attention,
// sampling, the references and every graph replay) are the median of 20 calls, or of
// KVD_BENCH_RUNS (e.g. enough to sample the clocks). The skinny-GEMM rows (batches of about
// 5 ms of back-to-back calls, median of 5) and the host rows (200 calls by the CPU clock)
// keep their own counts. Decode attention rows rotate through copies of their KV so that no
// call finds the last ones' bytes in L2 (DecodeAttention), as the skinny-GEMM rows rotate
// weight copies.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/blas_gemm.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/gemv_kernels.h"
#include "kernels/cuda/prefill_attention.h"
#include "tests/gpu/stream_hold.h"
#include "tests/gpu/stream_read.h"

namespace kvd {
namespace {

#define BENCH_CHECK(expr)                                                               \
  do {                                                                                  \
    if (auto s = (expr); !s.ok()) {                                                     \
      std::fprintf(stderr, "%s failed: %s\n", #expr, std::string(s.message()).c_str()); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

template <typename T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(v);
}

void CudaCheck(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// A pair of CUDA events that times work enqueued on a stream: Ms(stream, fn) records one,
// runs fn (which enqueues the work), records the other, waits for it and returns the
// milliseconds between them. Every call is checked: a failed event would read as 0 ms, an
// infinite rate.
class EventTimer {
 public:
  EventTimer() {
    CudaCheck(cudaEventCreate(&start_), "cudaEventCreate");
    CudaCheck(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // `enqueued` runs after the second event is enqueued, before the wait for it.
  template <typename Fn, typename Enqueued = void (*)()>
  double Ms(
      cudaStream_t stream, Fn&& fn, Enqueued&& enqueued = [] {}) {
    CudaCheck(cudaEventRecord(start_, stream), "cudaEventRecord");
    fn();
    CudaCheck(cudaEventRecord(stop_, stream), "cudaEventRecord");
    enqueued();
    CudaCheck(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    CudaCheck(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t start_;
  cudaEvent_t stop_;
};

class Bench {
 public:
  // Rows also go to $OUT/gpu_bench.json where OUT is set, unless !json (which leaves an
  // existing file alone). REQUIRES: timed_runs >= 1, trace_launches >= 0.
  Bench(CudaBackend& gpu, int timed_runs, int trace_launches, bool json = true)
      : gpu_(gpu), timed_runs_(timed_runs), trace_launches_(trace_launches) {
    CudaCheck(hold_.Init(), "stream hold");
    const char* out = std::getenv("OUT");
    if (json && out != nullptr) {
      json_ = std::fopen((std::string(out) + "/gpu_bench.json").c_str(), "w");
    }
  }
  ~Bench() {
    if (json_ != nullptr) std::fclose(json_);
  }

  // Median milliseconds of `fn` over timed_runs_ runs (20, or KVD_BENCH_RUNS) after 3
  // warm-ups, on the backend stream.
  template <typename Fn>
  double TimeMs(Fn&& fn) {
    EventTimer timer;
    return MedianOfRuns(fn, [&] { return timer.Ms(gpu_.stream(), fn); });
  }

  // As TimeMs, but each timed run enqueued behind a StreamHold and its events timing the
  // device alone: from the device's start of the work to its end, without the host's
  // enqueueing of it (stream_hold.h). -1 (with a note) when a hold timed out.
  template <typename Fn>
  double TimeHeldMs(Fn&& fn) {
    EventTimer timer;
    return MedianOfRuns(fn, [&]() -> double {
      CudaCheck(hold_.Hold(gpu_.stream(), kHoldTimeoutMs), "stream hold");
      const double ms = timer.Ms(gpu_.stream(), fn, [&] { hold_.Release(); });
      if (!hold_.TimedOut()) return ms;
      std::printf(
          "  (stream hold timed out: the host took over %.0f ms to enqueue a call, or the call "
          "waited on the stream itself; no GPU time row)\n",
          kHoldTimeoutMs);
      return -1;
    });
  }

  // `extra_json`: more fields for the JSON line (`"key": value, ...`); the name stays the
  // same from run to run (compare_peers.py looks rows up by it).
  void Row(const std::string& name, double ms, double gbps, double tflops, double ratio,
           const char* ratio_of, const std::string& extra_json = "") {
    std::printf("%-44s %9.4f ms %9.1f GB/s %8.1f TFLOP/s %6.3f of %s\n", name.c_str(), ms, gbps,
                tflops, ratio, ratio_of);
    if (json_ != nullptr) {
      std::fprintf(json_,
                   "{\"name\": \"%s\", \"ms\": %.4f, \"GB/s\": %.1f, \"TFLOP/s\": %.1f, "
                   "\"ratio\": %.4f, \"ratio_of\": \"%s\"%s%s}\n",
                   name.c_str(), ms, gbps, tflops, ratio, ratio_of, extra_json.empty() ? "" : ", ",
                   extra_json.c_str());
    }
    std::fflush(stdout);
  }

  CudaBackend& gpu() { return gpu_; }
  int trace_launches() const { return trace_launches_; }

 private:
  static constexpr double kHoldTimeoutMs = 200;

  // Three warm-up calls of `fn`, then the median of timed_runs_ values of `timed_run`, or -1
  // as soon as one is negative.
  template <typename Fn, typename TimedRun>
  double MedianOfRuns(Fn&& fn, TimedRun&& timed_run) {
    for (int i = 0; i < 3; ++i) fn();
    BENCH_CHECK(gpu_.Synchronize());
    std::vector<double> times;
    for (int i = 0; i < timed_runs_; ++i) {
      times.push_back(timed_run());
      if (times.back() < 0) return -1;
    }
    BENCH_CHECK(gpu_.Synchronize());
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  CudaBackend& gpu_;
  StreamHold hold_;
  FILE* json_ = nullptr;
  const int timed_runs_;  // 20, or KVD_BENCH_RUNS: e.g. long enough to sample clocks and power
  const int trace_launches_;  // 0, or KVD_DECODE_TRACE: traced launches a decode shape
};

double CopyBandwidth(Bench& bench) {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer a = Must(bench.gpu().Allocate(bytes));
  DeviceBuffer b = Must(bench.gpu().Allocate(bytes));
  const double ms = bench.TimeMs([&] {
    CudaCheck(
        cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, bench.gpu().stream()),
        "copy");
  });
  const double gbps = 2.0 * bytes / (ms * 1e6);  // read + write
  bench.Row("copy d2d 2 GiB (ceiling)", ms, gbps, 0, 1.0, "copy");
  return gbps;
}

// The GEMM ceiling: cuBLASLt alone on bf16 operands (fp32 out), the rate a prefill attention
// kernel's tensor cores are held against. Not the backend's Matmul, which first rounds its
// fp32 input to bf16: a pass over the input (at 8192^3, roughly 0.1 ms at the copy rate beside
// 1.4 ms of GEMM) that the ceiling must not carry.
double GemmCeiling(Bench& bench, int m, int n, int k) {
  std::unique_ptr<BlasGemm> blas = Must(BlasGemm::Create(bench.gpu().stream()));
  DeviceBuffer weight = Must(bench.gpu().Allocate(size_t(n) * k * 2));
  DeviceBuffer in = Must(bench.gpu().Allocate(size_t(m) * k * 2));
  DeviceBuffer out = Must(bench.gpu().Allocate(size_t(m) * n * 4));
  // Random operands, as a model's: a GEMM's power and clocks depend on the data.
  BENCH_CHECK(
      bench.gpu().FillRandom(weight.data(), DType::kBF16, size_t(n) * k, RandomFill{4, 1, 0}));
  BENCH_CHECK(bench.gpu().FillRandom(in.data(), DType::kBF16, size_t(m) * k, RandomFill{5, 1, 0}));
  const double ms = bench.TimeMs(
      [&] { BENCH_CHECK(blas->Run(out.as<float>(), in.data(), weight.data(), m, n, k, false)); });
  const double tflops = 2.0 * m * n * k / (ms * 1e9);
  const double gbps = (2.0 * n * k + 2.0 * m * k + 4.0 * m * n) / (ms * 1e6);
  bench.Row(absl::StrCat("gemm bf16 m", m, " n", n, " k", k, " [cuBLASLt] (ceiling)"), ms, gbps,
            tflops, 1.0, "gemm");
  return tflops;
}

double GemmRate(Bench& bench, int m, int n, int k, double copy_gbps, double peak_tflops) {
  std::vector<float> host_w(size_t(n) * k);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float& x : host_w) x = dist(rng);
  DeviceBuffer w = Must(bench.gpu().UploadWeights(host_w.data(), host_w.size()));
  DeviceBuffer in = Must(bench.gpu().Allocate(size_t(m) * k * 4));
  DeviceBuffer out = Must(bench.gpu().Allocate(size_t(m) * n * 4));
  // Random input, as a model's activations: a GEMM's power and clocks depend on the data.
  BENCH_CHECK(bench.gpu().FillRandom(in.data(), DType::kF32, size_t(m) * k, RandomFill{5, 1, 0}));
  MatmulParams p;
  p.out = out.as<float>();
  p.in = in.as<float>();
  p.weight = w.data();
  p.weight_dtype = DType::kBF16;
  p.m = m;
  p.n = n;
  p.k = k;
  const double ms = bench.TimeMs([&] { BENCH_CHECK(bench.gpu().Matmul(p)); });
  const double tflops = 2.0 * m * n * k / (ms * 1e9);
  const double gbps = (2.0 * n * k + 4.0 * m * k + 4.0 * m * n) / (ms * 1e6);
  // The backend's Matmul as the model calls it (fp32 in and out, bf16 weights): the skinny
  // kernel for decode rows, else the input rounded to bf16 and then cuBLASLt, both timed.
  const bool skinny =
      m <= cuda::kMaxSkinnyRows && cuda::SkinnyGemmSupports(p.out, p.in, p.weight, p.m, p.n, p.k);
  const std::string name =
      absl::StrCat("matmul m", m, " n", n, " k", k,
                   skinny ? " [Matmul: skinny]" : " [Matmul: f32->bf16 + cuBLASLt]");
  // Against the GEMM ceiling where it is given, else (decode rows) the copy rate.
  if (peak_tflops > 0) {
    bench.Row(name, ms, gbps, tflops, tflops / peak_tflops, "gemm");
  } else {
    bench.Row(name, ms, gbps, tflops, gbps / copy_gbps, "copy");
  }
  return tflops;
}

// The host's milliseconds per call of `fn`, by the CPU clock over calls enqueued back to back
// (the stream drained before and after).
template <typename Fn>
double HostMsPerCall(Bench& bench, Fn&& fn) {
  constexpr int kCalls = 200;
  BENCH_CHECK(bench.gpu().Synchronize());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) fn();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      kCalls;
  BENCH_CHECK(bench.gpu().Synchronize());
  return ms;
}

// A CUDA graph captured from one call of `fn` (which must have run before, so that it
// allocates nothing), or null (with a note) when capture fails.
template <typename Fn>
cudaGraph_t CaptureGraph(Bench& bench, Fn&& fn) {
  cudaStream_t stream = bench.gpu().stream();
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    std::printf("  (graph capture unavailable)\n");
    return nullptr;
  }
  const absl::Status status = fn();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!status.ok() || end != cudaSuccess) {
    std::printf("  (graph capture failed: %s / %s)\n", std::string(status.message()).c_str(),
                cudaGetErrorString(end));
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return nullptr;
  }
  return graph;
}

// Median milliseconds of replaying CUDA graphs captured from `fn(g)` for g in
// [0, num_graphs) (each call must have run before, so that it allocates nothing), one
// after another in turn, or -1 (with a note) when a capture fails. Rotating graphs that
// read different copies of their data keeps each replay from finding the last one's bytes
// in L2, as the per-call rows rotate their inputs.
template <typename Fn>
double RotatingGraphTimeMs(Bench& bench, int num_graphs, Fn&& fn) {
  std::vector<cudaGraph_t> graphs;
  std::vector<cudaGraphExec_t> execs;
  auto release = [&] {
    for (cudaGraphExec_t exec : execs) cudaGraphExecDestroy(exec);
    for (cudaGraph_t graph : graphs) cudaGraphDestroy(graph);
  };
  for (int g = 0; g < num_graphs; ++g) {
    cudaGraph_t graph = CaptureGraph(bench, [&] { return fn(g); });
    if (graph == nullptr) {
      release();
      return -1;
    }
    graphs.push_back(graph);
    cudaGraphExec_t exec = nullptr;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      std::printf("  (graph instantiation failed)\n");
      cudaGetLastError();
      release();
      return -1;
    }
    execs.push_back(exec);
  }
  int next = 0;
  const double ms = bench.TimeMs([&] {
    CudaCheck(cudaGraphLaunch(execs[next++ % num_graphs], bench.gpu().stream()), "graph launch");
  });
  release();
  return ms;
}

// Median milliseconds of replaying a CUDA graph captured from one call of `fn` (which must
// have run before, so that it allocates nothing), or -1 (with a note) when capture fails.
template <typename Fn>
double GraphTimeMs(Bench& bench, Fn&& fn) {
  return RotatingGraphTimeMs(bench, 1, [&](int) { return fn(); });
}

// Median milliseconds per call of a CUDA graph captured from one call of `fn(0)` (which must
// be one kernel launch, and have run before), replayed after setting its kernel node's
// parameters anew each time: call i to those captured from `fn(i % num_sets)` (the same
// kernel on another copy of its data; with one set, the captured values themselves). -1
// (with a note) when a capture fails or a graph is not one kernel of the same function.
// Prints the host's share (HostMsPerCall).
template <typename Fn>
double GraphRelaunchTimeMs(Bench& bench, int num_sets, Fn&& fn) {
  cudaStream_t stream = bench.gpu().stream();
  std::vector<cudaGraph_t> graphs;  // kept: the parameters point into them
  std::vector<cudaKernelNodeParams> params(num_sets);
  cudaGraphNode_t node = nullptr;  // graphs[0]'s kernel
  cudaGraphExec_t exec = nullptr;
  auto release = [&] {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    for (cudaGraph_t graph : graphs) cudaGraphDestroy(graph);
  };
  for (int i = 0; i < num_sets; ++i) {
    cudaGraph_t graph = CaptureGraph(bench, [&] { return fn(i); });
    if (graph == nullptr) {
      release();
      return -1;
    }
    graphs.push_back(graph);
    size_t num_nodes = 0;
    cudaGraphNode_t set_node = nullptr;
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    const bool one_kernel =
        cudaGraphGetNodes(graph, nullptr, &num_nodes) == cudaSuccess && num_nodes == 1 &&
        cudaGraphGetNodes(graph, &set_node, &num_nodes) == cudaSuccess &&
        cudaGraphNodeGetType(set_node, &type) == cudaSuccess && type == cudaGraphNodeTypeKernel &&
        cudaGraphKernelNodeGetParams(set_node, &params[i]) == cudaSuccess &&
        params[i].func == params[0].func;
    if (!one_kernel) {
      std::printf("  (graph of one kernel unavailable: %zu nodes)\n", num_nodes);
      cudaGetLastError();
      release();
      return -1;
    }
    if (i == 0) node = set_node;
  }
  if (cudaGraphInstantiate(&exec, graphs[0], 0) != cudaSuccess) {
    std::printf("  (graph instantiation failed)\n");
    cudaGetLastError();
    exec = nullptr;
    release();
    return -1;
  }
  int next = 0;
  auto call = [&] {
    CudaCheck(cudaGraphExecKernelNodeSetParams(exec, node, &params[next++ % num_sets]),
              "set kernel node params");
    CudaCheck(cudaGraphLaunch(exec, stream), "graph launch");
  };
  const double ms = bench.TimeMs(call);
  std::printf("  (host: parameters set and graph launched in %.2f us a call)\n",
              HostMsPerCall(bench, call) * 1e3);
  release();
  return ms;
}

// Milliseconds per call of `fn(rep)`, timed over `reps` back-to-back calls between two events
// (median of 5 such batches, after one warm-up batch): launch gaps count, as they do between
// the matmuls of a decode step.
template <typename Fn>
double TimePerCallMs(Bench& bench, int reps, Fn&& fn) {
  EventTimer timer;
  std::vector<double> times;
  for (int batch = 0; batch < 6; ++batch) {
    const double ms = timer.Ms(bench.gpu().stream(), [&] {
      for (int rep = 0; rep < reps; ++rep) fn(rep);
    });
    if (batch > 0) times.push_back(ms / reps);
  }
  BENCH_CHECK(bench.gpu().Synchronize());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Bytes a decode row cycles through at least: 4 x the H200's L2 (50 MB), so that no call
// finds much of the previous calls' data there (the skinny-GEMM rows rotate weight copies
// for the same reason).
constexpr double kRotateBytes = 4 * 50e6;
constexpr int kMaxRotationSets = 128;  // bounds the memory: 1 x 512's 2 MB of KV gives 96

// Copies of `bytes` of data that calls rotate through: enough for kRotateBytes, at least 1.
int RotationSets(double bytes) {
  return std::clamp(static_cast<int>(std::ceil(kRotateBytes / bytes)), 1, kMaxRotationSets);
}

// The copy reference: a device copy moving `bytes` (half read, half written), timed per call,
// in row `name` against the 2 GiB copy, and on the device alone (Bench::TimeHeldMs) in row
// `held_name`; consecutive calls copy the next of `copies` slices
// (RotationSets, as the attention rows rotate KV). A reference, not a bound: its host path
// is lighter than an op's, and a kernel that mostly reads can pass it (the largest decode
// shapes do). The buffers come from cudaMalloc, not the backend, so that its KV view stays
// as the attention rows had it.
void CopyReference(Bench& bench, size_t bytes, const std::string& name,
                   const std::string& held_name, double copy_gbps, int copies) {
  const size_t half = (bytes / 2) & ~size_t{255};
  void* src = nullptr;
  void* dst = nullptr;
  CudaCheck(cudaMalloc(&src, half * copies), "copy source");
  CudaCheck(cudaMalloc(&dst, half * copies), "copy destination");
  CudaCheck(cudaMemsetAsync(src, 0x5a, half * copies, bench.gpu().stream()), "copy source fill");
  int next = 0;
  auto copy = [&] {
    const size_t offset = half * (next++ % copies);
    CudaCheck(cudaMemcpyAsync(static_cast<char*>(dst) + offset, static_cast<char*>(src) + offset,
                              half, cudaMemcpyDeviceToDevice, bench.gpu().stream()),
              "copy");
  };
  const double ms = bench.TimeMs(copy);
  const double held_ms = bench.TimeHeldMs(copy);
  cudaFree(src);
  cudaFree(dst);
  const std::string sets = absl::StrCat("\"sets\": ", copies);
  const double gbps = 2.0 * half / (ms * 1e6);
  bench.Row(name, ms, gbps, 0, gbps / copy_gbps, "copy", sets);
  if (held_ms > 0) {
    const double held_gbps = 2.0 * half / (held_ms * 1e6);
    bench.Row(held_name, held_ms, held_gbps, 0, held_gbps / copy_gbps, "copy", sets);
  }
}

// The read reference: `bytes` read by LaunchStreamRead under each of its launch shapes,
// timed per call (and, given a `graph_name`, replayed from one-launch graphs, and given a
// `held_name`, per call on the device alone: Bench::TimeHeldMs), the fastest shape's time in
// row `name` (and `graph_name`, `held_name`) against the 2 GiB copy; consecutive calls
// (and graphs) read the next of `copies` slices (RotationSets). A reference, not a bound:
// one plain kernel's best of four shapes, launched with a lighter host path than an op's.
// The buffer comes from cudaMalloc, not the backend, so that its KV view stays as the
// attention rows had it.
void ReadReference(Bench& bench, size_t bytes, const std::string& name,
                   const std::string& graph_name, const std::string& held_name, double copy_gbps,
                   int copies) {
  bytes &= ~size_t{255};
  void* src = nullptr;
  void* sink_bytes = nullptr;
  CudaCheck(cudaMalloc(&src, bytes * copies), "read source");
  CudaCheck(cudaMalloc(&sink_bytes, sizeof(unsigned)), "read sink");
  unsigned* sink = static_cast<unsigned*>(sink_bytes);
  CudaCheck(cudaMemsetAsync(src, 0x5a, bytes * copies, bench.gpu().stream()), "read source fill");
  double best_call = -1;
  double best_graph = -1;
  double best_held = -1;
  std::string shapes;
  for (const StreamReadShape shape : kStreamReadShapes) {
    auto launch = [&](int copy) {
      return LaunchStreamRead(static_cast<char*>(src) + bytes * copy, bytes, sink, shape,
                              bench.gpu().num_sms(), bench.gpu().stream());
    };
    int next = 0;
    const double call_ms = bench.TimeMs([&] { CudaCheck(launch(next++ % copies), "stream read"); });
    absl::StrAppend(&shapes, shapes.empty() ? "" : ", ", shape.threads, "x", shape.ctas_per_sm,
                    ": ", absl::SixDigits(call_ms * 1e3));
    if (best_call < 0 || call_ms < best_call) best_call = call_ms;
    if (!graph_name.empty()) {
      const double graph_ms = RotatingGraphTimeMs(bench, copies, [&](int copy) {
        const cudaError_t err = launch(copy);
        return err == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(err));
      });
      absl::StrAppend(&shapes, " / ", absl::SixDigits(graph_ms * 1e3));
      if (graph_ms > 0 && (best_graph < 0 || graph_ms < best_graph)) best_graph = graph_ms;
    }
    if (!held_name.empty()) {
      const double held_ms =
          bench.TimeHeldMs([&] { CudaCheck(launch(next++ % copies), "stream read"); });
      absl::StrAppend(&shapes, " / ", absl::SixDigits(held_ms * 1e3));
      if (held_ms > 0 && (best_held < 0 || held_ms < best_held)) best_held = held_ms;
    }
  }
  cudaFree(src);
  cudaFree(sink_bytes);
  std::printf("  read us by shape (threads x CTAs/SM: per call%s%s): %s\n",
              graph_name.empty() ? "" : " / graph", held_name.empty() ? "" : " / GPU time",
              shapes.c_str());
  const std::string sets = absl::StrCat("\"sets\": ", copies);
  const double gbps = bytes / (best_call * 1e6);
  bench.Row(name, best_call, gbps, 0, gbps / copy_gbps, "copy", sets);
  if (best_graph > 0) {
    const double graph_gbps = bytes / (best_graph * 1e6);
    bench.Row(graph_name, best_graph, graph_gbps, 0, graph_gbps / copy_gbps, "copy", sets);
  }
  if (best_held > 0) {
    const double held_gbps = bytes / (best_held * 1e6);
    bench.Row(held_name, best_held, held_gbps, 0, held_gbps / copy_gbps, "copy", sets);
  }
}

// Decode matmuls of Llama-3-8B: the skinny GEMM kernel (m <= 8 rows) against the current
// Matmul path (input to bf16, then cuBLASLt; the only one for 16 and 64 rows, as batch-64
// decode steps run them), both as GB/s of weight read and its ratio to the copy ceiling.
// Consecutive calls cycle through enough weight copies (>= 256 MiB in all, >= 2) that L2
// (50 MB) never holds the next call's weight.
void SkinnyGemmRates(Bench& bench, double copy_gbps) {
  struct Shape {
    const char* name;
    int n;
    int k;
  };
  constexpr int kMaxK = 14336;
  constexpr int kMaxN = 128256;
  cudaStream_t stream = bench.gpu().stream();
  std::unique_ptr<BlasGemm> blas = Must(BlasGemm::Create(stream));
  // Up to 64 rows: the engine's batch-64 decode steps run these products on cuBLAS.
  constexpr int kMaxM = 64;
  DeviceBuffer in = Must(bench.gpu().Allocate(size_t{kMaxM} * kMaxK * 4));
  DeviceBuffer in_bf16 = Must(bench.gpu().Allocate(size_t{kMaxM} * kMaxK * 2));
  DeviceBuffer out = Must(bench.gpu().Allocate(size_t{kMaxM} * kMaxN * 4));
  BENCH_CHECK(
      bench.gpu().FillRandom(in.data(), DType::kF32, size_t{kMaxM} * kMaxK, RandomFill{7, 1, 0}));
  for (const Shape& shape :
       {Shape{"qkv", 6144, 4096}, Shape{"o", 4096, 4096}, Shape{"gate_up", 28672, 4096},
        Shape{"down", 4096, 14336}, Shape{"lm_head", 128256, 4096}}) {
    const size_t weight_bytes = size_t(shape.n) * shape.k * 2;
    const int copies = std::max<int>(2, ((size_t{256} << 20) + weight_bytes - 1) / weight_bytes);
    DeviceBuffer weights = Must(bench.gpu().Allocate(weight_bytes * copies));
    BENCH_CHECK(bench.gpu().FillRandom(weights.data(), DType::kBF16, weight_bytes / 2 * copies,
                                       RandomFill{11, 1, 0}));
    auto weight = [&](int rep) {
      return static_cast<const char*>(weights.data()) + (rep % copies) * weight_bytes;
    };
    // About 5 ms of weight traffic per timed batch, a whole number of rounds of the copies.
    const double call_ms_at_copy = weight_bytes / (copy_gbps * 1e6);
    const int rounds = std::max(1, static_cast<int>(5.0 / (call_ms_at_copy * copies)));
    const int reps = rounds * copies;
    for (const int m : {1, 2, 4, 8, 16, 64}) {
      // The skinny kernel takes up to kMaxSkinnyRows rows; past that only cuBLAS runs.
      const bool skinny = m <= cuda::kMaxSkinnyRows;
      const double skinny_ms = !skinny ? -1 : TimePerCallMs(bench, reps, [&](int rep) {
        CudaCheck(cuda::LaunchSkinnyGemm(out.as<float>(), in.as<float>(), weight(rep), m, shape.n,
                                         shape.k, false, stream),
                  "LaunchSkinnyGemm");
      });
      const double blas_ms = TimePerCallMs(bench, reps, [&](int rep) {
        CudaCheck(
            cuda::LaunchF32ToBf16(in_bf16.data(), in.as<float>(), int64_t{m} * shape.k, stream),
            "LaunchF32ToBf16");
        BENCH_CHECK(
            blas->Run(out.as<float>(), in_bf16.data(), weight(rep), m, shape.n, shape.k, false));
      });
      // The cuBLAS path's calls for one graph: the input's conversion to bf16 (as Matmul does
      // it) unless `convert` is false, then the product.
      auto blas_calls = [&](bool convert) {
        for (int rep = 0; rep < reps; ++rep) {
          if (cudaError_t err = convert ? cuda::LaunchF32ToBf16(in_bf16.data(), in.as<float>(),
                                                                int64_t{m} * shape.k, stream)
                                        : cudaSuccess;
              err != cudaSuccess) {
            return absl::InternalError(cudaGetErrorString(err));
          }
          if (absl::Status status = blas->Run(out.as<float>(), in_bf16.data(), weight(rep), m,
                                              shape.n, shape.k, false);
              !status.ok()) {
            return status;
          }
        }
        return absl::OkStatus();
      };
      // The same calls replayed from one CUDA graph, as the engine runs decode steps.
      double skinny_graph_ms = -1;
      double blas_graph_ms = -1;
      if (skinny && (m == 1 || m == 8)) {
        skinny_graph_ms = GraphTimeMs(bench, [&] {
          for (int rep = 0; rep < reps; ++rep) {
            if (cudaError_t err =
                    cuda::LaunchSkinnyGemm(out.as<float>(), in.as<float>(), weight(rep), m, shape.n,
                                           shape.k, false, stream);
                err != cudaSuccess) {
              return absl::InternalError(cudaGetErrorString(err));
            }
          }
          return absl::OkStatus();
        });
      }
      if (m == 1 || m == 8 || m == 64) {
        blas_graph_ms = GraphTimeMs(bench, [&] { return blas_calls(/*convert=*/true); });
      }
      // m = 1 and 8 in each launch shape (the launcher picks one by m and n).
      if (m == 1 || m == 8) {
        using cuda::SkinnyGemmShape;
        for (const auto& [launch_shape, label] :
             {std::pair{SkinnyGemmShape::kOneTile, "tiles1"},
              std::pair{SkinnyGemmShape::kOneTileThreeCtas, "tiles1x3"},
              std::pair{SkinnyGemmShape::kTwoTiles, "tiles2"},
              std::pair{SkinnyGemmShape::kFourTiles, "tiles4"}}) {
          const double graph_ms = GraphTimeMs(bench, [&] {
            for (int rep = 0; rep < reps; ++rep) {
              if (cudaError_t err =
                      cuda::LaunchSkinnyGemmShape(launch_shape, out.as<float>(), in.as<float>(),
                                                  weight(rep), m, shape.n, shape.k, false, stream);
                  err != cudaSuccess) {
                return absl::InternalError(cudaGetErrorString(err));
              }
            }
            return absl::OkStatus();
          });
          if (graph_ms <= 0) continue;  // capture failed (noted above): no row, as elsewhere
          const double ms = graph_ms / reps;
          const double gbps = weight_bytes / (ms * 1e6);
          const bool chosen = cuda::ChooseSkinnyGemmShape(m, shape.n) == launch_shape;
          bench.Row(
              absl::StrCat("gemv ", label, chosen ? " chosen" : "", " graph ", shape.name, " m", m),
              ms, gbps, 0, gbps / copy_gbps, "copy");
        }
      }
      const double tflop = 2.0 * m * shape.n * shape.k / 1e12;
      const std::string name = absl::StrCat(shape.name, " m", m, " n", shape.n, " k", shape.k);
      for (const auto& [path, ms] :
           std::vector<std::pair<std::string, double>>{{"skinny", skinny_ms},
                                                       {"cublas", blas_ms},
                                                       {"skinny graph", skinny_graph_ms / reps},
                                                       {"cublas graph", blas_graph_ms / reps}}) {
        if (ms <= 0) continue;
        const double gbps = weight_bytes / (ms * 1e6);
        bench.Row(absl::StrCat("gemv ", path, " ", name), ms, gbps, tflop / (ms * 1e-3),
                  gbps / copy_gbps, "copy");
      }
      // 64 rows under each of the cuBLASLt heuristic's first eight algorithms
      // (BlasGemm::UseHeuristicRank), from a graph, without the conversion: how far its first
      // choice is from the best it offers.
      if (m == 64) {
        for (int rank = 0; rank < 8; ++rank) {
          blas->UseHeuristicRank(rank);
          BENCH_CHECK(blas->Run(out.as<float>(), in_bf16.data(), weight(0), m, shape.n, shape.k,
                                false));  // makes the plan, outside the capture
          if (blas->heuristic_results() <= rank) break;
          const double graph_ms = GraphTimeMs(bench, [&] { return blas_calls(/*convert=*/false); });
          if (graph_ms <= 0) continue;
          const double ms = graph_ms / reps;
          const double gbps = weight_bytes / (ms * 1e6);
          bench.Row(absl::StrCat("gemv cublas rank ", rank, " graph ", name), ms, gbps,
                    tflop / (ms * 1e-3), gbps / copy_gbps, "copy");
        }
        blas->UseHeuristicRank(0);
      }
      // The engine's choice past the skinny kernel (BlasGemm::TuneUpTo): the fastest of the
      // first candidates, timed when the plan is made.
      if (m == 16 || m == 64) {
        blas->TuneUpTo(m);
        BENCH_CHECK(blas->Run(out.as<float>(), in_bf16.data(), weight(0), m, shape.n, shape.k,
                              false));  // makes (and times) the plan, outside the capture
        const int rank = blas->last_plan_rank();
        const double graph_ms = GraphTimeMs(bench, [&] { return blas_calls(/*convert=*/false); });
        if (graph_ms > 0) {
          const double ms = graph_ms / reps;
          const double gbps = weight_bytes / (ms * 1e6);
          bench.Row(absl::StrCat("gemv cublas tuned (rank ", rank, ") graph ", name), ms, gbps,
                    tflop / (ms * 1e-3), gbps / copy_gbps, "copy");
        }
        blas->TuneUpTo(0);
        blas->UseHeuristicRank(0);  // drops the tuned plan
      }
    }
  }
}

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
// RandomFill's uniform values on [-s, s) have variance s^2 / 3: this scale gives 1.
constexpr float kUnitVarianceScale = 1.7320508f;
// Decode attention shapes (batch x context), as torch_peers.py measures SDPA.
constexpr std::pair<int, int> kDecodeShapes[] = {{1, 4096},  {1, 32768},  {8, 4096},   {32, 4096},
                                                 {64, 4096}, {128, 2048}, {16, 16384}, {4, 131072}};

// Causal prefill attention shapes (batch, new rows, context). Those whose rows are the whole
// context are torch_peers.py's SDPA prefill shapes, and PairedMain's.
constexpr std::tuple<int, int, int> kPrefillShapes[] = {
    {1, 4096, 4096}, {1, 16384, 16384}, {1, 512, 4096}, {8, 2048, 2048}};

// Runs launch(0), launch(1), ... back to back for 50 ms, then waits for them: before a
// shape's first timed row, as its setup (filling the KV copies) has left the GPU idle and the
// first row otherwise runs slow (H200, 8 x 4k decode per call: 0.658-0.671
// of copy, then 0.709-0.711 for the same kernel one row later). Before the decode attention
// rows too (H100, `gpu_bench decode`, two rounds alternating with a build without it, per
// call: 1 x 4k 0.314-0.329 against 0.287-0.302, 8 x 4k 0.826-0.858 against 0.815-0.837,
// other shapes and the rows after the first unchanged).
template <typename Fn>
void WarmUp(Bench& bench, Fn&& launch) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
    launch(i);
    if (i % 64 == 63) BENCH_CHECK(bench.gpu().Synchronize());  // a bounded queue
  }
  BENCH_CHECK(bench.gpu().Synchronize());
}

// One layer's paged bf16 KV cache (random values, as is Q) for `batch` sequences of
// `context` keys with q_len new query rows each, and the PagedAttentionParams over it, with
// the max_q_len and max_kv_len promises the model gives. Blocks are handed out shuffled (a
// fragmented pool) unless `shuffled` is false. `set` picks the random values (copies that calls
// rotate through get different ones). The params point into the buffers held here.
struct AttentionSetup {
  DeviceBuffer chunk, table, ids, indptr, last, q_indptr, q, q_bf16, out;
  PagedAttentionParams p;
  double bytes = 0;  // KV read plus q (as fp32) and out, per call
};

AttentionSetup MakeAttention(Bench& bench, int batch, int context, int q_len, int block_size,
                             bool shuffled, int set = 0) {
  AttentionSetup a;
  const int blocks_per_seq = (context + block_size - 1) / block_size;
  const int num_blocks = batch * blocks_per_seq;
  int chunk_shift = 0;
  while ((1 << chunk_shift) < num_blocks) ++chunk_shift;
  const int64_t block_bytes = int64_t{kKvHeads} * block_size * kHeadDim * 2;
  const int64_t region = block_bytes << chunk_shift;
  a.chunk = Must(bench.gpu().Allocate(size_t(region) * 2));
  // Random K, V and Q (uniform, unit variance, as torch_peers.py's randn): the kernels'
  // work depends on the data (how often the running maximum grows).
  BENCH_CHECK(bench.gpu().FillRandom(a.chunk.data(), DType::kBF16, a.chunk.bytes() / 2,
                                     RandomFill{21 + 100u * set, kUnitVarianceScale, 0}));
  void* table_host[1] = {a.chunk.data()};
  a.table = Must(bench.gpu().Allocate(sizeof(table_host)));
  BENCH_CHECK(bench.gpu().CopyToDevice(a.table.data(), table_host, sizeof(table_host)));

  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  if (shuffled) std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  std::vector<int32_t> indptr(batch + 1), last(batch), q_indptr(batch + 1);
  for (int s = 0; s <= batch; ++s) {
    indptr[s] = s * blocks_per_seq;
    q_indptr[s] = s * q_len;
  }
  for (int s = 0; s < batch; ++s) last[s] = context - (blocks_per_seq - 1) * block_size;
  auto upload = [&](const std::vector<int32_t>& v) {
    DeviceBuffer b = Must(bench.gpu().Allocate(v.size() * 4));
    BENCH_CHECK(bench.gpu().CopyToDevice(b.data(), v.data(), v.size() * 4));
    return b;
  };
  a.ids = upload(ids);
  a.indptr = upload(indptr);
  a.last = upload(last);
  a.q_indptr = upload(q_indptr);
  const size_t rows = size_t(batch) * q_len;
  a.q = Must(bench.gpu().Allocate(rows * kQHeads * kHeadDim * 4));
  a.out = Must(bench.gpu().Allocate(rows * kQHeads * kHeadDim * 4));
  BENCH_CHECK(bench.gpu().FillRandom(a.q.data(), DType::kF32, a.q.bytes() / 4,
                                     RandomFill{22 + 100u * set, kUnitVarianceScale, 0}));
  if (q_len > 1) {  // prefills also get a bf16 Q (random like q), as the model's RoPE gives them
    a.q_bf16 = Must(bench.gpu().Allocate(rows * kQHeads * kHeadDim * 2));
    BENCH_CHECK(bench.gpu().FillRandom(a.q_bf16.data(), DType::kBF16, a.q_bf16.bytes() / 2,
                                       RandomFill{22, kUnitVarianceScale, 0}));
  }

  PagedAttentionParams& p = a.p;
  p.out = a.out.as<float>();
  p.q = a.q.as<float>();
  p.q_bf16 = a.q_bf16.data();
  p.q_bf16_stride = kQHeads * kHeadDim;
  p.q_indptr = a.q_indptr.as<int32_t>();
  p.cache.chunks = a.table.as<void*>();
  p.cache.num_chunks = 1;
  p.cache.chunk_shift = chunk_shift;
  p.cache.k_offset_bytes = 0;
  p.cache.v_offset_bytes = region;
  p.cache.block_bytes = block_bytes;
  p.cache.dtype = DType::kBF16;
  p.cache.num_kv_heads = kKvHeads;
  p.cache.block_size = block_size;
  p.cache.head_dim = kHeadDim;
  p.blocks = {a.indptr.as<int32_t>(), a.ids.as<int32_t>(), a.last.as<int32_t>(), batch};
  p.num_q_heads = kQHeads;
  p.q_stride = p.out_stride = kQHeads * kHeadDim;
  p.sm_scale = 1.0f / std::sqrt(float(kHeadDim));
  p.causal = true;
  p.max_q_len = q_len;
  p.max_kv_len = context;
  a.bytes =
      double(batch) * context * kKvHeads * kHeadDim * 2 * 2 + 2.0 * rows * kQHeads * kHeadDim * 4;
  return a;
}

// The per-call floor of the decode rows below: the backend's smallest op (SiLU-mul of one
// element, launched as every op of a decode step is), timed as they are. No call of an op
// takes less: the host's launch and the device's start of the kernel are in it. Then the same
// from graphs, and an empty kernel launched bare.
void LaunchFloor(Bench& bench) {
  DeviceBuffer buffer = Must(bench.gpu().Allocate(256));
  SiluMulParams p;
  p.out = buffer.as<float>();
  p.gate = p.out + 16;
  p.up = p.out + 32;
  p.num_rows = 1;
  p.dim = 1;
  p.gate_stride = 1;
  p.up_stride = 1;
  const double ms = bench.TimeMs([&] { BENCH_CHECK(bench.gpu().SiluMul(p)); });
  // A time with no rate: nothing to set it against but the per-call rows that follow.
  bench.Row("launch floor (SiLU-mul of one element)", ms, 0, 0, 0, "none");
  // The same op replayed from a one-kernel graph, then from that graph with its kernel's
  // parameters set anew before each replay: the floor without the op's host checks and
  // through a graph launch in place of a direct one.
  const double graph_ms = GraphTimeMs(bench, [&] { return bench.gpu().SiluMul(p); });
  if (graph_ms > 0) bench.Row("launch floor (graph)", graph_ms, 0, 0, 0, "none");
  const double relaunch_ms =
      GraphRelaunchTimeMs(bench, 1, [&](int) { return bench.gpu().SiluMul(p); });
  if (relaunch_ms > 0) bench.Row("launch floor (graph, params set)", relaunch_ms, 0, 0, 0, "none");
  // A kernel with nothing to do (the read reference over no bytes, one CTA of 128 threads per
  // multiprocessor), launched directly with no op around it: the share of every per-call row
  // that belongs to the driver and the device, whatever the kernel.
  unsigned* sink = buffer.as<unsigned>() + 48;
  const double empty_ms = bench.TimeMs([&] {
    CudaCheck(LaunchStreamRead(buffer.data(), 0, sink, StreamReadShape{128, 1},
                               bench.gpu().num_sms(), bench.gpu().stream()),
              "empty kernel");
  });
  bench.Row("launch floor (empty kernel)", empty_ms, 0, 0, 0, "none");
  // The same kernel timed on the device alone (Bench::TimeHeldMs): the device's share of the
  // floor, which a call pays however fast its host enqueues it.
  const double empty_held_ms = bench.TimeHeldMs([&] {
    CudaCheck(LaunchStreamRead(buffer.data(), 0, sink, StreamReadShape{128, 1},
                               bench.gpu().num_sms(), bench.gpu().stream()),
              "empty kernel");
  });
  if (empty_held_ms > 0) {
    bench.Row("launch floor (empty kernel, GPU time)", empty_held_ms, 0, 0, 0, "none");
  }
}

// A decode attention workspace for `batch` sequences of the bench's heads in up to
// `max_splits` splits, owning its buffers (the merge counters zeroed, as launches leave them).
struct OwnedDecodeWorkspace {
  DeviceBuffer partial_out, partial_lse, arrivals;
  cuda::DecodeWorkspace ws;
};

OwnedDecodeWorkspace MakeDecodeWorkspace(Bench& bench, int batch, int max_splits) {
  OwnedDecodeWorkspace owned;
  owned.partial_out = Must(
      bench.gpu().Allocate(cuda::DecodePartialOutSize(batch, max_splits, kQHeads, kHeadDim) * 4));
  owned.partial_lse =
      Must(bench.gpu().Allocate(cuda::DecodePartialLseSize(batch, max_splits, kQHeads) * 4));
  owned.arrivals =
      Must(bench.gpu().Allocate(cuda::DecodeArrivalCount(batch, kKvHeads, kQHeads / kKvHeads) * 4));
  CudaCheck(cudaMemsetAsync(owned.arrivals.data(), 0, owned.arrivals.bytes(), bench.gpu().stream()),
            "zero merge counters");
  owned.ws.max_splits = max_splits;
  owned.ws.partial_out = owned.partial_out.as<float>();
  owned.ws.partial_lse = owned.partial_lse.as<float>();
  owned.ws.arrivals = owned.arrivals.as<int32_t>();
  return owned;
}

// With KVD_DECODE_TRACE=N: the decode kernel launched as the backend launches it (its split
// count and TMA view, with a workspace of its own) from a one-launch graph, N times, on the
// KV copies in turn, each launch's CTAs traced (DecodeWorkspace::trace). Prints when each
// point of the CTAs' timelines (DecodeTracePoint) came, in microseconds after the launch's
// first CTA started: the earliest, median and latest CTA, each the median over the launches;
// where contexts are split, the median over the launches of the longest merge (from the
// merging CTA's arrival to its end); and when each multiprocessor's CTAs were done with their
// keys (medians over the launches), with how alike the odd and even launches are in that.
void TraceDecode(Bench& bench, const std::vector<AttentionSetup>& sets, int batch,
                 const std::string& shape_name) {
  constexpr int kGroup = kQHeads / kKvHeads;
  cudaStream_t stream = bench.gpu().stream();
  const cuda::DecodeSlices slices = cuda::DecodeLaunchSlices(sets[0].p, bench.gpu().num_sms());
  OwnedDecodeWorkspace owned = MakeDecodeWorkspace(bench, batch, slices.max_splits);
  cuda::DecodeWorkspace& ws = owned.ws;
  ws.tail_splits = slices.tail_splits;  // as the backend launches it
  const int64_t count = cuda::DecodeTraceCount(batch, kKvHeads, kGroup, ws.max_splits);
  DeviceBuffer trace = Must(bench.gpu().Allocate(count * sizeof(cuda::DecodeTraceRecord)));
  ws.trace = static_cast<cuda::DecodeTraceRecord*>(trace.data());
  std::vector<cuda::DecodeTraceRecord> records(count);
  // [point][earliest, median, latest]: one value a launch; then the longest merge a launch.
  std::vector<std::vector<double>> at(cuda::kDecodeTracePoints * 3);
  std::vector<double> merges;
  // Per multiprocessor, over the even and the odd launches: when its CTAs' keys were done;
  // and how many CTAs it ran, launch by launch.
  const int num_sms = bench.gpu().num_sms();
  std::vector<std::vector<double>> sm_even(num_sms), sm_odd(num_sms);
  std::vector<std::vector<int>> ctas_of_sm(num_sms);
  // Once outside a capture first (the traced kernel's first launch sets its shared memory).
  CudaCheck(cuda::LaunchDecodeAttention(sets[0].p, ws, stream, bench.gpu().UpdatedKvRows()),
            "traced decode attention");
  BENCH_CHECK(bench.gpu().Synchronize());
  for (int launch = 0; launch < bench.trace_launches(); ++launch) {
    const PagedAttentionParams& p = sets[launch % sets.size()].p;
    cudaGraph_t graph = CaptureGraph(bench, [&] {
      const cudaError_t err =
          cuda::LaunchDecodeAttention(p, ws, stream, bench.gpu().UpdatedKvRows());
      return err == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(err));
    });
    if (graph == nullptr) return;
    cudaGraphExec_t exec = nullptr;
    CudaCheck(cudaGraphInstantiate(&exec, graph, 0), "trace graph instantiate");
    CudaCheck(cudaGraphLaunch(exec, stream), "trace graph launch");
    BENCH_CHECK(bench.gpu().Synchronize());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    BENCH_CHECK(
        bench.gpu().CopyToHost(records.data(), trace.data(), records.size() * sizeof(records[0])));
    uint64_t origin = std::numeric_limits<uint64_t>::max();
    for (const auto& r : records) origin = std::min(origin, r.ns[cuda::kTraceEntry]);
    // Per multiprocessor: when its last CTA's keys were done, and how many CTAs it ran.
    std::vector<double> sm_done(num_sms, 0.0);
    std::vector<int> sm_ctas(num_sms, 0);
    for (const auto& r : records) {
      if (r.ns[cuda::kTraceKeysDone] == 0 || r.sm >= static_cast<uint32_t>(num_sms)) continue;
      sm_done[r.sm] = std::max(sm_done[r.sm], (r.ns[cuda::kTraceKeysDone] - origin) * 1e-3);
      ++sm_ctas[r.sm];
    }
    for (int sm = 0; sm < num_sms; ++sm) {
      if (sm_ctas[sm] == 0) continue;
      (launch % 2 == 0 ? sm_even : sm_odd)[sm].push_back(sm_done[sm]);
      ctas_of_sm[sm].push_back(sm_ctas[sm]);
    }
    double merge = 0;
    for (int point = 0; point < cuda::kDecodeTracePoints; ++point) {
      std::vector<double> us;
      for (const auto& r : records) {
        if (r.ns[point] != 0) us.push_back((r.ns[point] - origin) * 1e-3);
        if (point == 0 && r.merged) {
          merge = std::max(merge, (r.ns[cuda::kTraceEnd] - r.ns[cuda::kTraceArrived]) * 1e-3);
        }
      }
      if (us.empty()) continue;
      std::sort(us.begin(), us.end());
      at[3 * point].push_back(us.front());
      at[3 * point + 1].push_back(us[us.size() / 2]);
      at[3 * point + 2].push_back(us.back());
    }
    merges.push_back(merge);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  static constexpr const char* kPointNames[cuda::kDecodeTracePoints] = {
      "start", "planned", "first K/V", "keys done", "combined", "partial stored", "arrived", "end"};
  std::string line;
  for (int point = 1; point < cuda::kDecodeTracePoints; ++point) {
    if (at[3 * point].empty()) continue;
    absl::StrAppend(&line, line.empty() ? "" : ", ", kPointNames[point], " ",
                    absl::StrFormat("%.2f/%.2f/%.2f", median(at[3 * point]),
                                    median(at[3 * point + 1]), median(at[3 * point + 2])));
  }
  // Whether the multiprocessors that finish late are the same from launch to launch: the
  // correlation of their medians over the even and the odd launches (near 1: a property of the
  // multiprocessor, not of the launch); and the spread of those medians, with the medians of
  // the multiprocessors that ran one CTA and two.
  std::vector<double> even, odd, all_sms;
  std::vector<int> sm_ids;  // of all_sms' entries
  std::vector<double> by_ctas[3];
  for (int sm = 0; sm < num_sms; ++sm) {
    if (sm_even[sm].empty() || sm_odd[sm].empty()) continue;
    even.push_back(median(sm_even[sm]));
    odd.push_back(median(sm_odd[sm]));
    std::vector<double> both = sm_even[sm];
    both.insert(both.end(), sm_odd[sm].begin(), sm_odd[sm].end());
    all_sms.push_back(median(both));
    sm_ids.push_back(sm);
    std::vector<double> counts(ctas_of_sm[sm].begin(), ctas_of_sm[sm].end());
    const int ctas = static_cast<int>(median(counts));
    if (ctas >= 1 && ctas <= 2) by_ctas[ctas].push_back(all_sms.back());
  }
  std::string sm_text;
  if (even.size() >= 2) {
    const double n = static_cast<double>(even.size());
    const double mean_even = std::accumulate(even.begin(), even.end(), 0.0) / n;
    const double mean_odd = std::accumulate(odd.begin(), odd.end(), 0.0) / n;
    double cov = 0, var_even = 0, var_odd = 0;
    for (size_t i = 0; i < even.size(); ++i) {
      cov += (even[i] - mean_even) * (odd[i] - mean_odd);
      var_even += (even[i] - mean_even) * (even[i] - mean_even);
      var_odd += (odd[i] - mean_odd) * (odd[i] - mean_odd);
    }
    const double r = var_even > 0 && var_odd > 0 ? cov / std::sqrt(var_even * var_odd) : 0.0;
    std::vector<double> sorted = all_sms;
    std::sort(sorted.begin(), sorted.end());
    // The slowest multiprocessors by id, to look for a pattern (a GPC's SMs).
    std::vector<std::pair<double, int>> slowest;
    for (size_t i = 0; i < all_sms.size(); ++i) slowest.emplace_back(all_sms[i], sm_ids[i]);
    std::sort(slowest.rbegin(), slowest.rend());
    std::string ids;
    for (size_t i = 0; i < std::min<size_t>(12, slowest.size()); ++i) {
      absl::StrAppend(&ids, i == 0 ? "" : " ", slowest[i].second);
    }
    sm_text = absl::StrFormat(
        "; keys done per SM (median over launches) %.2f/%.2f/%.2f us "
        "(fastest/median/slowest SM), odd vs even launches r = %.2f",
        sorted.front(), sorted[sorted.size() / 2], sorted.back(), r);
    for (const int ctas : {1, 2}) {  // multi-wave grids run more a multiprocessor: none
      if (by_ctas[ctas].empty()) continue;
      absl::StrAppend(
          &sm_text, absl::StrFormat(", SMs with %s CTA%s %.2f (%d SMs)", ctas == 1 ? "one" : "two",
                                    ctas == 1 ? "" : "s", median(by_ctas[ctas]),
                                    static_cast<int>(by_ctas[ctas].size())));
    }
    absl::StrAppend(&sm_text, ", slowest SMs ", ids);
  }
  const double merge = median(merges);  // 0: no CTA merged
  const std::string merge_text = merge > 0 ? absl::StrFormat("; merge %.2f us", merge) : "";
  std::printf(
      "  (trace %s: %lld CTAs in %d split slices, %d launches from graphs; us after the "
      "first CTA's start, earliest/median/latest CTA: %s%s%s)\n",
      shape_name.c_str(), static_cast<long long>(count), ws.max_splits, bench.trace_launches(),
      line.c_str(), merge_text.c_str(), sm_text.c_str());
}

// One layer of decode attention (one query row a sequence) for `batch` sequences of
// `context` keys. Every row here (per call, graph, graph with parameters set, host, and the
// copy and read references) rotates through RotationSets(KV bytes) copies of the KV cache
// (each with its own random values, block table, Q and out; slices of as many bytes for the
// references), call after call and graph after graph, so that at least kRotateBytes pass
// between two reads of the same bytes and L2 cannot serve a shape whose KV fits in it. Each
// row's JSON says how many copies ("sets").
void DecodeAttention(Bench& bench, int batch, int context, double copy_gbps) {
  const double kv_bytes = double(batch) * context * kKvHeads * kHeadDim * 2 * 2;
  const int num_sets = RotationSets(kv_bytes);
  std::vector<AttentionSetup> sets;
  for (int i = 0; i < num_sets; ++i) {
    sets.push_back(MakeAttention(bench, batch, context, 1, 16, /*shuffled=*/true, i));
  }
  const std::string shape_name = absl::StrCat("decode attention ", batch, " x ", context);
  const std::string extra = absl::StrCat("\"sets\": ", num_sets);
  std::printf("  (%s: %d KV copies, %.0f MB cycled, every row below)\n", shape_name.c_str(),
              num_sets, num_sets * kv_bytes / 1e6);
  const double bytes = sets[0].bytes;  // KV plus q and out, per call
  auto call = [&](int i) { return bench.gpu().PagedAttention(sets[i % num_sets].p); };
  WarmUp(bench, [&](int i) { BENCH_CHECK(call(i)); });
  int next = 0;
  const double ms = bench.TimeMs([&] { BENCH_CHECK(call(next++)); });
  const double gbps = bytes / (ms * 1e6);
  bench.Row(shape_name, ms, gbps, 0, gbps / copy_gbps, "copy", extra);
  // The same calls timed on the device alone (Bench::TimeHeldMs): from the device's start of
  // the kernel to its end, as kernel benchmarks that queue the call behind other work time it
  // (NVBench's blocking kernel; Triton's do_bench behind its cache flush). The per-call row
  // above also counts the host's enqueueing, where it takes longer than that start.
  const double held_ms = bench.TimeHeldMs([&] { BENCH_CHECK(call(next++)); });
  if (held_ms > 0) {
    const double held_gbps = bytes / (held_ms * 1e6);
    bench.Row(shape_name + " (GPU time)", held_ms, held_gbps, 0, held_gbps / copy_gbps, "copy",
              extra);
  }
  // The same calls replayed from CUDA graphs (one a copy, in turn), as the engine runs decode
  // steps: no host launch overhead, so short contexts show the kernels' own time.
  const double graph_ms = RotatingGraphTimeMs(bench, num_sets, call);
  if (graph_ms > 0) {
    const double graph_gbps = bytes / (graph_ms * 1e6);
    bench.Row(shape_name + " (graph)", graph_ms, graph_gbps, 0, graph_gbps / copy_gbps, "copy",
              extra);
  }
  // kBackToBack calls back to back in one graph, per call (graphs replayed in turn, each copy
  // reused only after all the others, as DecodeSweep does): as a decode step's graph runs the
  // layers' attention, one kernel's start overlapping the previous kernel's end (launch.cuh),
  // with no graph launch between.
  constexpr int kBackToBack = 16;
  const int num_graphs = num_sets / std::gcd(num_sets, kBackToBack);
  const double back_to_back_ms = RotatingGraphTimeMs(bench, num_graphs, [&](int g) {
    for (int i = 0; i < kBackToBack; ++i) {
      if (absl::Status s = call(g * kBackToBack + i); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  if (back_to_back_ms > 0) {
    const double per_call_ms = back_to_back_ms / kBackToBack;
    const double b2b_gbps = bytes / (per_call_ms * 1e6);
    bench.Row(absl::StrCat(shape_name, " (graph of ", kBackToBack, ")"), per_call_ms, b2b_gbps, 0,
              b2b_gbps / copy_gbps, "copy", extra);
  }
  // One graph with the kernel's parameters set anew before each replay (to the next copy's):
  // the kernel through a graph launch in place of a direct one. A caller launching every call
  // so would still pay the op's host checks and the parameters' making.
  const double relaunch_ms = GraphRelaunchTimeMs(bench, num_sets, call);
  if (relaunch_ms > 0) {
    const double relaunch_gbps = bytes / (relaunch_ms * 1e6);
    bench.Row(shape_name + " (graph, params set)", relaunch_ms, relaunch_gbps, 0,
              relaunch_gbps / copy_gbps, "copy", extra);
  }
  // What the simplest memory op and a plain read reach at this size (CopyReference,
  // ReadReference): no block table, no math and no merge.
  CopyReference(bench, static_cast<size_t>(bytes), shape_name + " (copy of its bytes)",
                shape_name + " (copy of its bytes, GPU time)", copy_gbps, num_sets);
  ReadReference(bench, static_cast<size_t>(bytes), shape_name + " (read of its bytes)",
                shape_name + " (read of its bytes, graph)",
                shape_name + " (read of its bytes, GPU time)", copy_gbps, num_sets);
  // The host's share of a call (checks, workspace, launch), by the CPU clock over calls
  // enqueued back to back. A call between events pays it where it exceeds the time the GPU
  // takes to start the kernel. Its ratio is to the attention row's time per call.
  const double host_ms = HostMsPerCall(bench, [&] { BENCH_CHECK(call(next++)); });
  bench.Row(shape_name + " (host)", host_ms, 0, 0, host_ms / ms, "call", extra);
  if (bench.trace_launches() > 0) TraceDecode(bench, sets, batch, shape_name);
}

// One layer of attention for `batch` sequences of `context` keys, q_len query rows each:
// DecodeAttention for one row, else a causal prefill of the last q_len positions (one KV
// copy: the rows are bound by the tensor cores, not by memory).
void Attention(Bench& bench, int batch, int context, int q_len, double copy_gbps,
               double gemm_tflops) {
  if (q_len == 1) {
    DecodeAttention(bench, batch, context, copy_gbps);
    return;
  }
  const AttentionSetup a = MakeAttention(bench, batch, context, q_len, 16, /*shuffled=*/true);
  const PagedAttentionParams& p = a.p;
  const double ms = bench.TimeMs([&] { BENCH_CHECK(bench.gpu().PagedAttention(p)); });
  // A prefill through the backend reads Q's bf16 copy where the backend can.
  const double q_saved =
      bench.gpu().ReadsBf16Q(kHeadDim) ? 2.0 * batch * q_len * kQHeads * kHeadDim : 0.0;
  const double gbps = (a.bytes - q_saved) / (ms * 1e6);
  // Causal: the chunk's rows see on average (context - q_len/2) keys.
  const double flops = 4.0 * batch * q_len * (context - q_len / 2.0) * kQHeads * kHeadDim;
  const double tflops = flops / (ms * 1e9);
  bench.Row(absl::StrCat("prefill attention ", batch, " x ", q_len, " / ", context), ms, gbps,
            tflops, tflops / gemm_tflops, "gemm");
  // The backend's kernel reading fp32 Q, and the split-QP and mma.sync kernels, launched
  // directly for comparison with the row above (the backend's pick: on Hopper at head_dim
  // 128, the wgmma kernel reading the bf16 Q).
  DeviceBuffer tile_indptr = Must(bench.gpu().Allocate(size_t(batch + 1) * 4));
  auto direct_row = [&](const char* label, cuda::MmaPrecision precision, bool allow_wgmma,
                        bool bf16_q = true) {
    PagedAttentionParams direct = p;
    if (!bf16_q) direct.q_bf16 = nullptr;
    const double direct_ms = bench.TimeMs([&] {
      CudaCheck(
          cuda::LaunchPrefillAttention(direct, tile_indptr.as<int32_t>(), bench.gpu().num_sms() * 4,
                                       bench.gpu().stream(), precision, allow_wgmma),
          "LaunchPrefillAttention");
    });
    const double direct_tflops = flops / (direct_ms * 1e9);
    bench.Row(absl::StrCat("prefill attention ", batch, " x ", q_len, " / ", context, " ", label),
              direct_ms, a.bytes / (direct_ms * 1e6), direct_tflops, direct_tflops / gemm_tflops,
              "gemm");
  };
  // The backend's kernel reading Q in fp32 (what it does when no bf16 copy is given).
  direct_row("fp32 Q", cuda::MmaPrecision::kBf16, /*allow_wgmma=*/true, /*bf16_q=*/false);
  // The 64-row kernel with Q and P split into bf16 pairs (two MMAs each instead of one,
  // fp32-close results).
  direct_row("split QP", cuda::MmaPrecision::kSplit, /*allow_wgmma=*/true);
  // The mma.sync kernel the backend runs where the Hopper (wgmma) one cannot.
  direct_row("mma.sync", cuda::MmaPrecision::kBf16, /*allow_wgmma=*/false);
}

// What the KVD_SWEEP_* variables narrow `gpu_bench sweep` to (ParseArgs reads and checks
// them); -1: every value.
struct SweepOptions {
  int only_batch = -1, only_context = -1;   // KVD_SWEEP_SHAPE=BATCHxCONTEXT
  int only_variant = -1, only_splits = -1;  // KVD_SWEEP_ONLY=VARIANT[,SPLITS]
  bool layouts = false;                     // KVD_SWEEP_LAYOUTS=1
  int tails = 0;                            // KVD_SWEEP_TAILS=1|2
};

// `gpu_bench sweep`: decode attention under every launch-shape variant of the kernel
// (LaunchDecodeAttentionVariant), split count and, for one sequence, smallest split, to set
// DecodeMaxSplits' policy from measurements ("s" is the grid's main split slices, "tT/D" T
// tail slices beside them a D-th as long, DecodeWorkspace::tail_splits; the plan may use
// fewer, see PlanSplits). Two rows each: one call between events (as
// above), and kSweepCalls launches back to back in one graph, per launch (as decode graphs
// run it). Both rotate through KV copies as the decode attention rows do (DecodeAttention):
// call after call, and launch after launch across the graphs, each copy reused only after all
// the others. "auto" marks what the backend would launch. KVD_SWEEP_SHAPE=64x4096 and
// KVD_SWEEP_ONLY=variant,splits narrow it (e.g. to run under ncu); KVD_SWEEP_LAYOUTS=1 keeps
// the in-order and 64-token-block layouts for that shape.
void DecodeSweep(Bench& bench, const SweepOptions& options, int batch, int context, int block_size,
                 bool shuffled, double copy_gbps) {
  constexpr int kSweepCalls = 16;
  const double kv_bytes = double(batch) * context * kKvHeads * kHeadDim * 2 * 2;
  const int num_sets = RotationSets(kv_bytes);
  std::vector<AttentionSetup> sets;
  for (int i = 0; i < num_sets; ++i) {
    sets.push_back(MakeAttention(bench, batch, context, 1, block_size, shuffled, i));
  }
  const AttentionSetup& a = sets[0];
  // Graph g launches copies g * kSweepCalls + i (mod num_sets), and the graphs, replayed in
  // turn, launch a whole number of rounds of the copies (num_graphs * kSweepCalls is their
  // least common multiple with num_sets): each copy comes back only after all the others,
  // across graph boundaries too, as in the per-call row. (One graph of 16 launches over 12
  // copies would launch 0..11, 0..3, then 0 again after only 4 others.)
  const int num_graphs = num_sets / std::gcd(num_sets, kSweepCalls);
  std::printf("  (sweep %d x %d: %d KV copies, %.0f MB cycled, in %d graphs of %d launches)\n",
              batch, context, num_sets, num_sets * kv_bytes / 1e6, num_graphs, kSweepCalls);
  constexpr int kMaxSplits = 128;
  OwnedDecodeWorkspace owned = MakeDecodeWorkspace(bench, batch, kMaxSplits);
  cuda::DecodeWorkspace& ws = owned.ws;  // max_splits set per row below
  const cuda::DecodeWorkspace auto_ws;  // the defaults LaunchDecodeAttention runs with
  const cuda::DecodeSlices auto_slices = cuda::DecodeLaunchSlices(a.p, bench.gpu().num_sms());
  const int auto_tails = auto_slices.tail_splits;
  const int auto_splits = auto_slices.max_splits - auto_tails;
  // The backend's kernel: variant 0 with the backend's TMA view.
  constexpr int auto_variant = 0;
  std::vector<int> splits = batch >= 32  ? std::vector<int>{1, 2, 4}
                            : batch >= 8 ? std::vector<int>{1, 2, 4, 8}
                                         : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
  if (std::find(splits.begin(), splits.end(), auto_splits) == splits.end()) {
    splits.insert(std::upper_bound(splits.begin(), splits.end(), auto_splits), auto_splits);
  }
  // The split counts depend on the shape and the GPU, so ParseArgs cannot check this one.
  if (options.only_splits >= 0 &&
      std::find(splits.begin(), splits.end(), options.only_splits) == splits.end()) {
    std::printf("  (KVD_SWEEP_ONLY: no row; this shape sweeps splits %s, not %d)\n",
                absl::StrJoin(splits, ", ").c_str(), options.only_splits);
  }
  {
    cuda::DecodeWorkspace warm = ws;
    warm.max_splits = auto_splits + auto_tails;
    warm.tail_splits = auto_tails;
    const char* name = "";
    WarmUp(bench, [&](int i) {
      CudaCheck(cuda::LaunchDecodeAttentionVariant(sets[i % num_sets].p, warm, auto_variant,
                                                   bench.gpu().UpdatedKvRows(),
                                                   bench.gpu().stream(), &name),
                "decode warm-up");
    });
  }
  for (int variant = 0; variant < cuda::kDecodeVariants; ++variant) {
    if (options.only_variant >= 0 && variant != options.only_variant) continue;
    for (const int min_granules : batch == 1 ? std::vector<int>{1, 2, 4} : std::vector<int>{1}) {
      ws.min_split_granules = min_granules;
      for (const int n : splits) {
        if (options.only_splits >= 0 && n != options.only_splits) continue;
        // (tail splits, divisor) beside the n main slices: none; the backend's, for its split
        // count; and with KVD_SWEEP_TAILS, for the backend's kernel, half, as many and twice
        // as many tails as mains, a half, quarter or eighth as long.
        std::vector<std::pair<int, int>> tails = {{0, auto_ws.tail_divisor}};
        if (variant == auto_variant && n == auto_splits && auto_tails > 0) {
          tails.emplace_back(auto_tails, auto_ws.tail_divisor);
        }
        if (variant == auto_variant && options.tails > 0) {
          for (const int t : {n / 2, n, 2 * n}) {
            for (const int divisor : {2, 4, 8}) {
              if (t >= 1 && n + t <= kMaxSplits &&
                  std::find(tails.begin(), tails.end(), std::pair(t, divisor)) == tails.end()) {
                tails.emplace_back(t, divisor);
              }
            }
          }
        }
        for (const auto& [tail, divisor] : tails) {
          ws.max_splits = n + tail;
          ws.tail_splits = tail;
          ws.tail_divisor = divisor;
          ws.tail_min_keys = options.tails == 2 ? 0 : auto_ws.tail_min_keys;
          const char* name = "";
          auto launch = [&](int set) {
            return cuda::LaunchDecodeAttentionVariant(sets[set % num_sets].p, ws, variant,
                                                      bench.gpu().UpdatedKvRows(),
                                                      bench.gpu().stream(), &name);
          };
          int next = 0;
          const double call_ms = bench.TimeMs([&] { CudaCheck(launch(next++), "decode variant"); });
          const double graph_ms =
              RotatingGraphTimeMs(bench, num_graphs,
                                  [&](int g) {
                                    for (int i = 0; i < kSweepCalls; ++i) {
                                      if (cudaError_t err = launch(g * kSweepCalls + i);
                                          err != cudaSuccess) {
                                        return absl::InternalError(cudaGetErrorString(err));
                                      }
                                    }
                                    return absl::OkStatus();
                                  }) /
              kSweepCalls;
          const bool is_auto = variant == auto_variant && n == auto_splits &&
                               min_granules == auto_ws.min_split_granules && tail == auto_tails &&
                               (tail == 0 || (divisor == auto_ws.tail_divisor &&
                                              ws.tail_min_keys == auto_ws.tail_min_keys));
          const std::string label =
              absl::StrCat("sweep ", batch, " x ", context, " bs", block_size,
                           shuffled ? "" : " in order", " v", variant, " g", min_granules, " s", n,
                           tail > 0 ? absl::StrCat(" t", tail, "/", divisor) : "",
                           is_auto ? " auto" : "", " [", name, "]");
          bench.Row(label, call_ms, a.bytes / (call_ms * 1e6), 0,
                    a.bytes / (call_ms * 1e6) / copy_gbps, "copy");
          if (graph_ms > 0) {
            bench.Row(label + " graph", graph_ms, a.bytes / (graph_ms * 1e6), 0,
                      a.bytes / (graph_ms * 1e6) / copy_gbps, "copy");
          }
        }
      }
    }
  }
}

// The sweep's shapes (batch x context): 1 x 512, then the decode attention rows' shapes.
std::vector<std::pair<int, int>> SweepShapes() {
  std::vector<std::pair<int, int>> shapes = {{1, 512}};
  shapes.insert(shapes.end(), std::begin(kDecodeShapes), std::end(kDecodeShapes));
  return shapes;
}

int SweepMain(Bench& bench, const SweepOptions& options, double copy_gbps) {
  for (const auto& [batch, context] : SweepShapes()) {
    if (options.only_batch >= 0 &&
        (batch != options.only_batch || context != options.only_context)) {
      continue;
    }
    DecodeSweep(bench, options, batch, context, 16, /*shuffled=*/true, copy_gbps);
    // Paging costs apart from the kernel's: blocks in order, and 64-token blocks (with a
    // KVD_SWEEP_SHAPE too when KVD_SWEEP_LAYOUTS=1).
    if (batch >= 8 && (options.only_batch < 0 || options.layouts)) {
      DecodeSweep(bench, options, batch, context, 16, /*shuffled=*/false, copy_gbps);
      DecodeSweep(bench, options, batch, context, 64, /*shuffled=*/true, copy_gbps);
    }
  }
  return 0;
}

// Sample over rows x 128256 (Llama 3's vocabulary): ms per call (and microseconds, in the
// JSON's "us"), and the one pass of logits it must read as GB/s against the copy ceiling (it
// makes several passes, mostly from L2).
void Sampling(Bench& bench, int rows, const SamplingRow& options, const char* label,
              double copy_gbps) {
  constexpr int kVocab = 128256;
  std::vector<float> host(size_t(rows) * kVocab);
  std::mt19937 rng(rows);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& x : host) x = normal(rng);
  std::vector<SamplingRow> row_options(rows, options);
  for (int r = 0; r < rows; ++r) row_options[r].u = float(r) / rows;
  DeviceBuffer logits = Must(bench.gpu().Allocate(host.size() * 4));
  DeviceBuffer options_buffer = Must(bench.gpu().Allocate(rows * sizeof(SamplingRow)));
  DeviceBuffer tokens = Must(bench.gpu().Allocate(rows * sizeof(int32_t)));
  BENCH_CHECK(bench.gpu().CopyToDevice(logits.data(), host.data(), host.size() * 4));
  BENCH_CHECK(bench.gpu().CopyToDevice(options_buffer.data(), row_options.data(),
                                       rows * sizeof(SamplingRow)));
  SampleParams p;
  p.logits = logits.as<float>();
  p.row_stride = kVocab;
  p.num_rows = rows;
  p.vocab_size = kVocab;
  p.rows = options_buffer.as<SamplingRow>();
  p.out_tokens = tokens.as<int32_t>();
  const double ms = bench.TimeMs([&] { BENCH_CHECK(bench.gpu().Sample(p)); });
  const double gbps = double(rows) * kVocab * 4 / (ms * 1e6);
  bench.Row(absl::StrCat("sample ", rows, " x ", kVocab, " ", label), ms, gbps, 0, gbps / copy_gbps,
            "copy", absl::StrCat("\"us\": ", std::lround(ms * 1e3)));
}

// `gpu_bench paired`: the prefill rows' calls (the backend's PagedAttention, as their first
// row) one at a time on request, for paired_prefill.py, which alternates them with SDPA's calls
// in its own process, so that the two sides of a pair run at the same clocks. (The GPU's
// clock, under its power cap, differs from process to process by more than the gap the
// prefill target measures: session notes in prefill_attention_sm90a.cu.) A line protocol:
// for each shape of kPrefillShapes whose rows are its whole context, "shape BATCH ROWS
// CONTEXT" out; then each "call" line in is answered "ms X" (one call between events,
// waited for; the first of a shape is no warm-up, the caller warms up), and "next" goes on
// to the next shape, after the last one printing "done" and returning 0. End of input
// returns 0 as well; any other line returns 2, saying why on stderr. Nothing else goes to
// stdout.
int PairedMain(Bench& bench) {
  EventTimer timer;
  for (const auto& [batch, q_len, context] : kPrefillShapes) {
    if (q_len != context) continue;
    const AttentionSetup a = MakeAttention(bench, batch, context, q_len, 16, /*shuffled=*/true);
    std::printf("shape %d %d %d\n", batch, q_len, context);
    std::fflush(stdout);
    for (std::string line; std::getline(std::cin, line) && line != "next";) {
      if (line != "call") {
        std::fprintf(stderr, "gpu_bench paired: unexpected line '%s' (want call or next)\n",
                     line.c_str());
        return 2;
      }
      const double ms =
          timer.Ms(bench.gpu().stream(), [&] { BENCH_CHECK(bench.gpu().PagedAttention(a.p)); });
      std::printf("ms %.5f\n", ms);
      std::fflush(stdout);
    }
    if (!std::cin) return 0;  // the caller went away
  }
  std::printf("done\n");
  std::fflush(stdout);
  return 0;
}

constexpr char kUsage[] =
    "usage: gpu_bench [gemv|sweep|prefill|decode|paired]\n"
    "\n"
    "CUDA backend kernels against the machine's own ceilings, measured in the same run. No\n"
    "mode: every row; gemv: the copy ceiling and the decode matmuls; sweep: the copy ceiling\n"
    "and the decode attention sweep; prefill: the ceilings (copy, 8192^3 GEMM) and the prefill\n"
    "attention rows; decode: the copy ceiling, the launch floor, the read reference and the\n"
    "decode attention rows; paired: the prefill attention calls one at a time on request, a\n"
    "line protocol on stdin and stdout for paired_prefill.py. Exits 0 without a GPU (saying\n"
    "so), 2 on a usage error (below), 1 when a CUDA call fails; never on a time.\n"
    "\n"
    "environment (a malformed value is a usage error):\n"
    "  OUT=DIR                also write the rows as JSON lines to DIR/gpu_bench.json\n"
    "  KVD_BENCH_RUNS=N       calls per event-timed row, median taken; N >= 1 (default 20)\n"
    "  KVD_DECODE_TRACE=N     decode attention rows: also N traced launches a shape, printing\n"
    "                         when the CTAs reached each point of their timelines; 1..1000\n"
    "  KVD_SWEEP_SHAPE=BxC    sweep: only batch B x context C, one of the sweep's shapes\n"
    "  KVD_SWEEP_ONLY=V[,S]   sweep: only launch variant V [and split count S]\n"
    "  KVD_SWEEP_LAYOUTS=1    sweep: with KVD_SWEEP_SHAPE, the in-order and 64-token-block\n"
    "                         layouts too\n"
    "  KVD_SWEEP_TAILS=1|2    sweep: also the backend's kernel with other tail splits beside\n"
    "                         each split count (row label tTAILS/DIVISOR; DecodeWorkspace),\n"
    "                         used by contexts long enough (1) or by every context (2)\n";

struct Args {
  bool help = false;  // --help or -h given: print kUsage, run nothing
  std::string mode;   // empty: every row
  int timed_runs = 20;
  int trace_launches = 0;  // KVD_DECODE_TRACE
  SweepOptions sweep;
};

// An environment variable's value as an int in [min, max], when set.
absl::StatusOr<std::optional<int>> EnvInt(const char* name, int min, int max) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", text, "' is not an integer in [", min, ", ", max, "]"));
  }
  return value;
}

// The mode and the environment, checked before any CUDA call (so that a typo is refused at
// once, on any machine): an unknown or extra argument and a malformed variable are errors
// naming them.
absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      args.help = true;
      return args;
    }
  }
  if (argc > 2) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", argv[2], "'"));
  }
  args.mode = argc > 1 ? argv[1] : "";
  if (!args.mode.empty() && args.mode != "gemv" && args.mode != "sweep" && args.mode != "prefill" &&
      args.mode != "decode" && args.mode != "paired") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown mode '", args.mode, "'; allowed: gemv, sweep, prefill, decode, paired, or none"));
  }
  auto runs = EnvInt("KVD_BENCH_RUNS", 1, std::numeric_limits<int>::max());
  if (!runs.ok()) return runs.status();
  args.timed_runs = runs->value_or(args.timed_runs);
  auto trace = EnvInt("KVD_DECODE_TRACE", 1, 1000);
  if (!trace.ok()) return trace.status();
  args.trace_launches = trace->value_or(0);
  if (args.mode != "sweep") return args;  // the KVD_SWEEP_* variables apply to it alone

  SweepOptions& sweep = args.sweep;
  if (const char* shape = std::getenv("KVD_SWEEP_SHAPE"); shape != nullptr) {
    std::vector<std::string> shapes;
    bool found = false;
    for (const auto& [batch, context] : SweepShapes()) {
      shapes.push_back(absl::StrCat(batch, "x", context));
      if (shapes.back() == shape) {
        found = true;
        sweep.only_batch = batch;
        sweep.only_context = context;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("KVD_SWEEP_SHAPE='", shape,
                       "' is none of the sweep's shapes: ", absl::StrJoin(shapes, ", ")));
    }
  }
  if (const char* only = std::getenv("KVD_SWEEP_ONLY"); only != nullptr) {
    const std::vector<std::string> parts = absl::StrSplit(only, ',');
    const bool ok = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &sweep.only_variant) &&
                    sweep.only_variant >= 0 && sweep.only_variant < cuda::kDecodeVariants &&
                    (parts.size() == 1 ||
                     (absl::SimpleAtoi(parts[1], &sweep.only_splits) && sweep.only_splits >= 1));
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("KVD_SWEEP_ONLY='", only, "' is not VARIANT[,SPLITS] with VARIANT in [0, ",
                       cuda::kDecodeVariants - 1, "] and SPLITS >= 1"));
    }
  }
  if (const char* layouts = std::getenv("KVD_SWEEP_LAYOUTS"); layouts != nullptr) {
    if (std::string(layouts) != "0" && std::string(layouts) != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("KVD_SWEEP_LAYOUTS='", layouts, "' is not 0 or 1"));
    }
    sweep.layouts = std::string(layouts) == "1";
  }
  if (const char* tails = std::getenv("KVD_SWEEP_TAILS"); tails != nullptr) {
    if (!absl::SimpleAtoi(tails, &sweep.tails) || sweep.tails < 0 || sweep.tails > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("KVD_SWEEP_TAILS='", tails, "' is not 0, 1 or 2"));
    }
  }
  return args;
}

int Main(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n\n%s", std::string(args.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  if (args->help) {
    std::printf("%s", kUsage);
    return 0;
  }
  const std::string& mode = args->mode;
  FILE* info = mode == "paired" ? stderr : stdout;  // paired mode's stdout is its protocol
  if (CudaDeviceCount() == 0) {
    std::fprintf(info, "gpu_bench: no CUDA device\n");
    return 0;
  }
  std::unique_ptr<CudaBackend> gpu = Must(CudaBackend::Create(0));
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::fprintf(info, "device %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
               prop.totalGlobalMem / double(1 << 30));
  Bench bench(*gpu, args->timed_runs, args->trace_launches, /*json=*/mode != "paired");
  if (mode == "paired") return PairedMain(bench);
  const double copy = CopyBandwidth(bench);
  if (mode == "sweep") return SweepMain(bench, args->sweep, copy);
  if (mode == "decode") {  // decode attention rows only
    LaunchFloor(bench);
    ReadReference(bench, size_t{2} << 30, "read 2 GiB (reference)", "", "", copy, 1);
    for (const auto& [batch, context] : kDecodeShapes) Attention(bench, batch, context, 1, copy, 0);
    return 0;
  }
  if (mode != "prefill") SkinnyGemmRates(bench, copy);
  if (mode == "gemv") return 0;
  const double gemm = GemmCeiling(bench, 8192, 8192, 8192);
  GemmRate(bench, 8192, 8192, 8192, copy, gemm);  // the backend's Matmul, as the model calls it
  if (mode != "prefill") {
    GemmRate(bench, 1, 14336, 4096, copy, 0);
    GemmRate(bench, 16, 14336, 4096, copy, 0);
    GemmRate(bench, 512, 4096, 4096, copy, gemm);
    LaunchFloor(bench);
    ReadReference(bench, size_t{2} << 30, "read 2 GiB (reference)", "", "", copy, 1);
    for (const auto& [batch, context] : kDecodeShapes) {
      Attention(bench, batch, context, 1, copy, gemm);
    }
  }
  for (const auto& [batch, q_len, context] : kPrefillShapes) {
    Attention(bench, batch, context, q_len, copy, gemm);
  }
  if (mode == "prefill") return 0;
  const SamplingRow typical{.temperature = 0.7f, .top_k = 50, .top_p = 0.9f};
  for (int rows : {1, 8, 64}) Sampling(bench, rows, typical, "k50 p0.9 T0.7", copy);
  Sampling(bench, 64, SamplingRow{.temperature = 1.0f}, "T1 no filters", copy);
  Sampling(bench, 64, SamplingRow{.temperature = 0.0f}, "greedy", copy);
  return 0;
}

}  // namespace
}  // namespace kvd

int main(int argc, char** argv) { return kvd::Main(argc, argv); }
