// gpu_decode_sweep: decode attention split counts across the gpu_bench decode shapes, to
// pick DecodeMaxSplits' policy from measurements. A program, not a test; prints a table and never
// fails on a time.
//
// Two timings per configuration:
//   call  - one launch between two events, as gpu_bench and torch_peers.py time (includes
//           the host's launch latency, which dominates short contexts);
//   graph - a CUDA graph of kCalls launches, per launch: the kernel's own cost as the
//           engine's decode graphs see it, with back-to-back launches.
// Each shape runs over one copy of the KV cache, as gpu_bench and SDPA read it, for every
// launch-shape variant of the kernel (LaunchDecodeAttentionVariant) and split count;
// "auto" marks DecodeMaxSplits' choice for the default variant. Block tables are shuffled
// with block_size 16 as in gpu_bench ("shuf"); batches of 8 or more also run with the
// blocks in order ("seq") and with block_size 64, to separate paging costs from the
// kernel's.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/decode_attention.h"

namespace kvd {
namespace {

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int kCalls = 16;

#define SWEEP_CUDA(expr)                                                                    \
  do {                                                                                      \
    if (cudaError_t err = (expr); err != cudaSuccess) {                                     \
      std::fprintf(stderr, "%s: %s (line %d)\n", #expr, cudaGetErrorString(err), __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

template <typename Fn>
double MedianMs(cudaStream_t stream, Fn&& fn, int reps = 20) {
  for (int i = 0; i < 3; ++i) fn();
  SWEEP_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start, stream);
    fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename Fn>
double GraphMs(cudaStream_t stream, Fn&& record) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SWEEP_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  record();
  SWEEP_CUDA(cudaStreamEndCapture(stream, &graph));
  SWEEP_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = MedianMs(stream, [&] { cudaGraphLaunch(exec, stream); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms;
}

__global__ void EmptyKernel() {}

void* Alloc(size_t bytes) {
  void* p = nullptr;
  SWEEP_CUDA(cudaMalloc(&p, bytes));
  SWEEP_CUDA(cudaMemset(p, 0, bytes));
  return p;
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* p = static_cast<T*>(Alloc(v.size() * sizeof(T)));
  SWEEP_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

void Shape(cudaStream_t stream, int num_sms, int batch, int context, int copies, int kBlock,
           bool shuffled, double copy_gbps) {
  const int blocks_per_seq = (context + kBlock - 1) / kBlock;
  const int num_blocks = batch * blocks_per_seq * copies;
  int chunk_shift = 0;
  while ((1 << chunk_shift) < num_blocks) ++chunk_shift;
  const int64_t block_bytes = int64_t{kKvHeads} * kBlock * kHeadDim * 2;
  const int64_t region = block_bytes << chunk_shift;
  std::vector<void*> chunk_table = {Alloc(size_t(region) * 2)};
  void** d_table = Upload(chunk_table);

  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  if (shuffled) std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  std::vector<int32_t> indptr(batch + 1), last(batch, context - (blocks_per_seq - 1) * kBlock),
      q_indptr(batch + 1);
  for (int s = 0; s <= batch; ++s) {
    indptr[s] = s * blocks_per_seq;
    q_indptr[s] = s;
  }
  int32_t* d_indptr = Upload(indptr);
  int32_t* d_last = Upload(last);
  int32_t* d_q_indptr = Upload(q_indptr);
  std::vector<int32_t*> d_ids(copies);
  const int per_copy = batch * blocks_per_seq;
  for (int i = 0; i < copies; ++i) {
    d_ids[i] =
        Upload(std::vector<int32_t>(ids.begin() + i * per_copy, ids.begin() + (i + 1) * per_copy));
  }
  float* q = static_cast<float*>(Alloc(size_t(batch) * kQHeads * kHeadDim * 4));
  float* out = static_cast<float*>(Alloc(size_t(batch) * kQHeads * kHeadDim * 4));
  cuda::DecodeWorkspace ws;
  ws.partial_out =
      static_cast<float*>(Alloc(cuda::DecodePartialOutSize(batch, 128, kQHeads, kHeadDim) * 4));
  ws.partial_lse = static_cast<float*>(Alloc(cuda::DecodePartialLseSize(batch, 128, kQHeads) * 4));
  int32_t* arrivals = static_cast<int32_t*>(
      Alloc(cuda::DecodeArrivalCount(batch, kKvHeads, kQHeads / kKvHeads) * 4));
  ws.arrivals = arrivals;

  PagedAttentionParams p;
  p.out = out;
  p.q = q;
  p.q_indptr = d_q_indptr;
  p.cache.chunks = d_table;
  p.cache.num_chunks = 1;
  p.cache.chunk_shift = chunk_shift;
  p.cache.k_offset_bytes = 0;
  p.cache.v_offset_bytes = region;
  p.cache.block_bytes = block_bytes;
  p.cache.dtype = DType::kBF16;
  p.cache.num_kv_heads = kKvHeads;
  p.cache.block_size = kBlock;
  p.cache.head_dim = kHeadDim;
  p.blocks = {d_indptr, d_ids[0], d_last, batch};
  p.num_q_heads = kQHeads;
  p.q_stride = p.out_stride = kQHeads * kHeadDim;
  p.sm_scale = 1.0f / std::sqrt(float(kHeadDim));
  p.causal = true;

  const double bytes =
      double(batch) * context * kKvHeads * kHeadDim * 2 * 2 + 2.0 * batch * kQHeads * kHeadDim * 4;
  const int auto_splits = cuda::DecodeMaxSplits(batch, kKvHeads, kQHeads / kKvHeads, num_sms);
  const std::vector<int> splits = batch >= 32  ? std::vector<int>{1, 2, 4}
                                  : batch >= 8 ? std::vector<int>{1, 2, 4, 8}
                                               : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
  // KVD_SWEEP_ONLY=VARIANT,SPLITS runs just that pair (for a profiler).
  int only_variant = -1, only_splits = -1;
  if (const char* only = std::getenv("KVD_SWEEP_ONLY"); only != nullptr) {
    std::sscanf(only, "%d,%d", &only_variant, &only_splits);
  }
  for (int variant = 0; variant < cuda::kDecodeVariants; ++variant) {
    if (only_variant >= 0 && variant != only_variant) continue;
    // Short contexts: also the smallest split length in granules (DecodeWorkspace).
    for (const int min_granules : batch == 1 ? std::vector<int>{1, 2, 4} : std::vector<int>{4}) {
      ws.min_split_granules = min_granules;
      const char* name = "";
      for (const int n : splits) {
        if (only_splits >= 0 && n != only_splits) continue;
        ws.max_splits = n;
        auto launch = [&](int copy) {
          PagedAttentionParams c = p;
          c.blocks.indices = d_ids[copy];
          SWEEP_CUDA(cuda::LaunchDecodeAttentionVariant(c, ws, variant, stream, &name));
        };
        const double call_ms = MedianMs(stream, [&] { launch(0); });
        const double graph_ms = GraphMs(stream,
                                        [&] {
                                          for (int i = 0; i < kCalls; ++i) launch(i % copies);
                                        }) /
                                kCalls;
        std::printf(
            "decode %3d x %6d bs%-2d %-4s v%d g%d splits %3d%-5s call %8.4f ms %5.3f  graph %8.4f "
            "ms "
            "%5.3f  [%s]\n",
            batch, context, kBlock, shuffled ? "shuf" : "seq", variant, min_granules, n,
            variant == 0 && n == auto_splits ? " auto" : "", call_ms,
            bytes / (call_ms * 1e6) / copy_gbps, graph_ms, bytes / (graph_ms * 1e6) / copy_gbps,
            name);
        std::fflush(stdout);
      }
    }
  }
  SWEEP_CUDA(cudaStreamSynchronize(stream));
  for (void* ptr :
       {static_cast<void*>(d_table), chunk_table[0], static_cast<void*>(d_indptr),
        static_cast<void*>(d_last), static_cast<void*>(d_q_indptr), static_cast<void*>(q),
        static_cast<void*>(out), static_cast<void*>(ws.partial_out),
        static_cast<void*>(ws.partial_lse), static_cast<void*>(arrivals)}) {
    cudaFree(ptr);
  }
  for (int32_t* ptr : d_ids) cudaFree(ptr);
}

int Main() {
  if (CudaDeviceCount() == 0) {
    std::printf("gpu_decode_sweep: no CUDA device\n");
    return 0;
  }
  cudaStream_t stream;
  SWEEP_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int num_sms = 0;
  SWEEP_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t bytes = size_t{2} << 30;
  void* a = Alloc(bytes);
  void* b = Alloc(bytes);
  const double copy_ms =
      MedianMs(stream, [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream); });
  const double copy_gbps = 2.0 * bytes / (copy_ms * 1e6);
  cudaFree(a);
  cudaFree(b);
  std::printf("copy %.1f GB/s\n", copy_gbps);
  std::printf("empty kernel: call %.4f ms, graph of %d %.4f ms each\n",
              MedianMs(stream, [&] { EmptyKernel<<<1, 32, 0, stream>>>(); }), kCalls,
              GraphMs(stream, [&] {
                for (int i = 0; i < kCalls; ++i) EmptyKernel<<<1, 32, 0, stream>>>();
              }) / kCalls);
  // KVD_SWEEP_SHAPE=BATCHxCONTEXT runs one shape.
  int only_batch = -1, only_context = -1;
  if (const char* shape = std::getenv("KVD_SWEEP_SHAPE"); shape != nullptr) {
    std::sscanf(shape, "%dx%d", &only_batch, &only_context);
  }
  for (const auto& [batch, context] : std::vector<std::pair<int, int>>{{1, 512},
                                                                       {1, 4096},
                                                                       {1, 32768},
                                                                       {8, 4096},
                                                                       {32, 4096},
                                                                       {64, 4096},
                                                                       {128, 2048},
                                                                       {16, 16384},
                                                                       {4, 131072}}) {
    if (only_batch >= 0 && (batch != only_batch || context != only_context)) continue;
    Shape(stream, num_sms, batch, context, 1, 16, true, copy_gbps);
    if (batch >= 8 && only_batch < 0) {
      Shape(stream, num_sms, batch, context, 1, 16, false, copy_gbps);
      Shape(stream, num_sms, batch, context, 1, 64, true, copy_gbps);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvd

int main() { return kvd::Main(); }
