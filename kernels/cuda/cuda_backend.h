#ifndef KVD_KERNELS_CUDA_CUDA_BACKEND_H_
#define KVD_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/cuda/kv_row_map.h"
#include "kernels/cuda/random_fill.h"

namespace kvd {

class BlasGemm;

// Number of CUDA devices visible to this process: 0 when the driver finds no GPU, else the
// runtime's error when it cannot count them (no driver, or one older than this runtime:
// Unavailable, naming the runtime's reason). Thread safe.
absl::StatusOr<int> CountCudaDevices();

// As CountCudaDevices, with 0 for an error (never fails, never aborts).
int CudaDeviceCount();

// GPU `device_index`'s compute capability as major * 10 + minor (90 for an H100), or the
// runtime's error. The backend needs cuda::kMinComputeCapability (cuda_support.h).
absl::StatusOr<int> CudaComputeCapability(int device_index);

// CudaBackend runs the Backend ops on one GPU, in issue order on one non-blocking stream.
//
// Memory: Allocate is plain cudaMalloc (never managed), Free is cudaFree. Copies are
// cudaMemcpyAsync on the stream followed by a stream synchronization, so host buffers
// may be reused as soon as a copy returns. Ops are only enqueued: a kernel fault surfaces
// as an error from a later copy or Synchronize(), naming the CUDA error.
//
// Dtypes: weights are stored as bf16 (UploadWeights converts fp32 on the device);
// activations are fp32; the KV cache is bf16 or f32 (f32 lets tests compare tightly with
// the CPU reference). Matmul rounds its fp32 input to bf16 and multiplies bf16 x bf16 with
// fp32 accumulation: up to kMaxSkinnyRows rows (decode) in one memory-bound kernel
// (gemv_kernels.h) that rounds as it loads, larger inputs through a bf16 scratch buffer
// owned by the backend and cuBLASLt.
//
// Batch invariance: ops other than Matmul and PagedAttention compute each row the same way
// whatever the rest of the batch. Matmul's kernel follows the row count (the skinny kernel up
// to kMaxSkinnyRows rows, else cuBLASLt, whose algorithm may change with it): the same
// bf16 products, summed in another order. PagedAttention decides three things for the whole
// batch on the host, so a sequence's rows may differ, within the stated precision but not
// bit for bit, between batches (and devices):
//   - decode rows (one query row): a sequence's KV is cut into at most DecodeMaxSplits
//     ranges, a count from the batch's num_seqs and head counts (one wave of CTAs; the
//     max_kv_len promise only leaves out slices no context uses), merged in fp32; the split
//     count changes the order of the sums, not the precision;
//   - prefill rows over a bf16 cache: on Hopper with head_dim 128, always the kBf16 kernels
//     (Q and P rounded to bf16, errors ~1e-3), whatever the batch; elsewhere kSplit
//     (~1e-6 of fp32 math) when the batch's num_seqs * num_kv_heads * ceil(max_q_len *
//     group / 128) work items are fewer than two per multiprocessor, else kBf16, and kBf16
//     when max_q_len is 0 (no hint): the same rows can come out at either precision;
//   - prefill rows over an f32 cache: always the fp32 kernel.
// The CPU backend is batch invariant bit for bit (cpu_backend.h).
//
// Errors: a failed CUDA call is reported once, by the op that made it, and leaves no error
// for later ops to report (cuda_status.h); a sticky one (a kernel fault) fails every later
// call until the process ends.
//
// Every pointer in the params is device memory, including the KV chunk table
// (KvCacheView::chunks, CopyBlocksParams::chunks), block tables, q_indptr, positions and
// slot mappings. Chunk bases must be 16-byte aligned (Allocate's are 256-byte aligned).
// Some kernels read weights, block tables, sequence metadata and the chunk table before they
// wait for the op before them (launch.cuh): those must come from copies, UploadWeights or
// FillRandom (which return once written), never from a kernel op.
//
// Graphs: BeginCapture/EndCapture record the ops enqueued in between (on this thread) into
// a CUDA graph instead of running them; LaunchGraph replays it. A graph keeps every
// address and by-value parameter it was recorded with, including this backend's scratch
// buffers; scratch_epoch() changes whenever one of them moves, and a graph recorded under
// another epoch must not be launched. Host-side launch choices depend only on the shapes in
// the params (the decode split count on num_seqs and head counts; each sequence's actual
// split is planned on the device from its KV length), so a graph stays exact while the
// block tables and KV lengths it reads change between replays. The one exception is the
// decode kernel's TMA view (UpdatedKvRows), recorded by value: a graph recorded before the memory
// grew loads K/V outside its view with cp.async, slower but as exact.
//
// Ownership: owns its stream, BLAS handles and scratch buffers; buffers it hands out must
// be released (DeviceBuffer does it) before the backend is destroyed. Not thread safe: one
// engine thread drives a backend.
class CudaBackend final : public Backend {
 public:
  // An instantiated CUDA graph (cudaGraphExec_t). Move-only; destroys it.
  class Graph {
   public:
    Graph() = default;
    explicit Graph(cudaGraphExec_t exec) : exec_(exec) {}
    Graph(Graph&& other) noexcept : exec_(other.exec_) { other.exec_ = nullptr; }
    Graph& operator=(Graph&& other) noexcept;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph();
    cudaGraphExec_t exec() const { return exec_; }

   private:
    cudaGraphExec_t exec_ = nullptr;
  };

  // Makes `device_index` current on the calling thread and sets up the stream and handles.
  // Unavailable when there is no such device.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device_index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  int device_index() const { return device_index_; }
  int num_sms() const { return num_sms_; }
  // The stream every op is enqueued on (for timing with events and for graph capture).
  cudaStream_t stream() const { return stream_; }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;
  DType weight_dtype() const override { return DType::kBF16; }
  absl::StatusOr<DeviceBuffer> UploadWeights(const float* host, size_t count) override;
  // The op scratch buffers plus cuBLASLt's workspace (not the cuBLAS handle's own, which
  // the fallback GEMM uses). Thread safe.
  int64_t workspace_bytes() const override {
    return workspace_bytes_.load(std::memory_order_relaxed);
  }
  // cudaMemGetInfo on this backend's device. Thread safe; never call it on the engine thread
  // while it captures a graph (cudaSetDevice is not allowed there).
  std::optional<DeviceMemory> QueryDeviceMemory() const override;

  // REQUIRES for every op: the params' shapes are consistent and their pointers are device
  // memory of this backend. Unsupported dtypes or sizes return InvalidArgument or
  // Unimplemented without launching anything.
  absl::Status Embedding(const EmbeddingParams& p) override;
  absl::Status RmsNorm(const RmsNormParams& p) override;
  // REQUIRES: weight_dtype is kBF16. The prologue's kernel writes the input rows in bf16, for
  // the skinny kernel up to kMaxSkinnyRows rows (gemv_kernels.h) and for cuBLAS past them.
  absl::Status Matmul(const MatmulParams& p) override;
  absl::Status Rope(const RopeParams& p) override;
  absl::Status SiluMul(const SiluMulParams& p) override;
  absl::Status AppendKv(const AppendKvParams& p) override;
  // Decode rows (q_len 1) go to the split-KV decode kernel, longer chunks to the prefill
  // kernel; both are enqueued without a host round trip. Head sizes up to 32 (small
  // test models such as stories260K's 8) go to a simple, slow generic kernel
  // (generic_attention.h), and so does an int8 cache of those sizes or 64 or 128 (no fast
  // kernel reads int8 yet). REQUIRES: block_size a power of two, num_q_heads a multiple of
  // num_kv_heads.
  absl::Status PagedAttention(const PagedAttentionParams& p) override;
  // The Hopper prefill kernel (head_dim 128 on compute capability 9.0).
  bool ReadsBf16Q(int32_t head_dim) const override;
  absl::Status CopyBlocks(const CopyBlocksParams& p) override;
  // One kernel launch, a cluster of CTAs per row (sampling_kernels.h); no scratch, no host
  // round trip, capturable. Rows are device memory and are not validated on the host.
  absl::Status Sample(const SampleParams& p) override;

  // --- CUDA-only helpers for the engine tools (synthetic models and benchmarks), which
  // would otherwise move gigabytes through the host. ---
  // Writes RandomFillValue(fill, i) as `dtype` (kF32 or kBF16) to element i of `data` for
  // i < count, and returns once they are written: the values may be weights, which kernels
  // read before they wait for the op before them (launch.cuh), as after UploadWeights.
  // REQUIRES: data holds count elements of dtype on this device.
  absl::Status FillRandom(void* data, DType dtype, size_t count, const RandomFill& fill);

  // --- CUDA graphs ---
  // Starts recording the ops this thread enqueues (thread-local stream capture). Until
  // EndCapture, Allocate, UploadWeights, copies, FillRandom and Synchronize fail with
  // FailedPrecondition, and so does an op that would have to grow a scratch buffer: run the
  // same ops once uncaptured first. A buffer freed meanwhile is freed by EndCapture (cudaFree
  // would invalidate the capture). REQUIRES: no recorded op uses a buffer freed meanwhile.
  // REQUIRES: not capturing.
  absl::Status BeginCapture();
  // Ends the capture (call it also after a recorded op failed) and instantiates the graph.
  absl::StatusOr<Graph> EndCapture();
  // Enqueues the graph's ops. REQUIRES: not capturing; `graph` recorded on this backend
  // under the current scratch_epoch().
  absl::Status LaunchGraph(const Graph& graph);
  bool capturing() const { return capturing_; }
  uint64_t scratch_epoch() const { return scratch_epoch_; }

  // Per-op GPU time, for profiling (kvd bench --profile). While on, every op enqueued
  // outside a capture is bracketed by two CUDA events on the stream; TakeOpTimes() waits
  // for the device and returns, per op (Matmul by path: "Matmul skinny" / "Matmul cublas"),
  // the summed time between the events and the number of calls since the last take, in
  // first-seen order. Off by default. Inside a replayed graph nothing is timed.
  struct OpTime {
    std::string op;
    double ms = 0;
    int64_t calls = 0;
  };
  void SetOpTiming(bool on) { op_timing_ = on; }
  absl::StatusOr<std::vector<OpTime>> TakeOpTimes();

  // The TMA view (cuda::KvRowMap) of every buffer Allocate has returned so far, encoded
  // again here whenever that range has grown since the last call; null where none can be
  // made (then kernels copy every K/V row themselves). PagedAttention passes it to the
  // decode kernel.
  const cuda::KvRowMap* UpdatedKvRows();

 protected:
  void Free(void* data, size_t bytes) override;

 private:
  // A device buffer that only grows; reused across calls on the stream.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };

  CudaBackend(int device_index, int num_sms, cudaStream_t stream, std::unique_ptr<BlasGemm> gemm);
  // Makes this backend's device current on the calling thread.
  absl::Status Activate(absl::string_view op);
  // FailedPrecondition naming `op` while capturing (copies and waits cannot be recorded).
  absl::Status NotCapturing(absl::string_view op) const;
  absl::Status Grow(Scratch& scratch, size_t bytes, absl::string_view op);
  // Drops a scratch buffer (cudaFree waits for the device).
  void FreeScratch(Scratch& scratch);
  // Sets workspace_bytes_ from the scratch buffers' sizes now.
  void CountWorkspace();
  // Enqueues p's prologue into `out`, [m][k] bf16 (kNone: `in` converted).
  cudaError_t LaunchPrologue(const MatmulParams& p, void* out);
  // An event for OpTimer (reused from spare_events_), or null if none can be made.
  cudaEvent_t TakeEvent();

  // Brackets one op with events when op timing is on (see SetOpTiming).
  class OpTimer;
  struct PendingTiming {
    absl::string_view op;  // a string literal
    cudaEvent_t start;
    cudaEvent_t stop;
  };

  const int device_index_;
  const int num_sms_;
  const bool hopper_prefill_;  // cuda::HopperPrefillSupported() for this device
  cudaStream_t stream_;
  std::unique_ptr<BlasGemm> gemm_;
  Scratch matmul_input_;     // Matmul's input in bf16 (its prologue's rows)
  Scratch attention_;        // decode split partials and the prefill tile plan
  Scratch decode_arrivals_;  // decode merge counters, kept zero between launches
  bool capturing_ = false;
  std::vector<void*> frees_after_capture_;  // Free()d while capturing
  bool op_timing_ = false;
  std::vector<PendingTiming> pending_timings_;
  std::vector<cudaEvent_t> spare_events_;
  uint64_t scratch_epoch_ = 0;  // bumped by every Grow that reallocates
  std::atomic<int64_t> workspace_bytes_{0};  // CountWorkspace
  // [lowest, highest) address of any buffer from Allocate, and the view encoded for it.
  uintptr_t allocated_lo_ = UINTPTR_MAX;
  uintptr_t allocated_hi_ = 0;
  cuda::KvRowMap kv_rows_;
  uintptr_t kv_rows_lo_ = 0;
  uintptr_t kv_rows_hi_ = 0;
};

}  // namespace kvd

#endif  // KVD_KERNELS_CUDA_CUDA_BACKEND_H_
