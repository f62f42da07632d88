#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/blas_gemm.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cuda_support.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/gemv_kernels.h"
#include "kernels/cuda/generic_attention.h"
#include "kernels/cuda/kv_cache_kernels.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/prefill_attention_mma.h"
#include "kernels/cuda/random_fill_kernels.h"
#include "kernels/cuda/sampling_kernels.h"
#include "kernels/status_macros.h"

namespace kvd {
namespace {

// fp32 values staged on the device per UploadWeights round (64 MiB).
constexpr size_t kUploadChunkFloats = size_t{16} << 20;
// Persistent prefill CTAs per multiprocessor.
constexpr int kPrefillCtasPerSm = 4;
// Most rows of a cuBLAS product whose algorithm is chosen by timing (BlasGemm::TuneUpTo).
constexpr int kTunedGemmRows = 64;

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

bool IsStorageDtype(DType t) { return t == DType::kF32 || t == DType::kBF16; }

size_t ElementBytes(DType t) { return static_cast<size_t>(DTypeBits(t) / 8); }

size_t AlignUp(size_t x, size_t alignment) { return (x + alignment - 1) / alignment * alignment; }

absl::Status Unsupported(absl::string_view op, absl::string_view what, DType t) {
  return absl::UnimplementedError(absl::StrCat(op, ": ", what, " ", std::string(DTypeName(t)),
                                               " is not supported (f32, bf16)"));
}

absl::Status Invalid(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

// The shape complaint of the row-wise ops (RmsNorm, SiluMul).
std::string RowsShape(int32_t num_rows, int32_t dim) {
  return absl::StrCat("num_rows ", num_rows, ", dim ", dim, ": num_rows must be >= 0, dim > 0");
}

// The bf16 copy of Q (RopeParams, PagedAttentionParams), when given, must hold whole rows.
absl::Status ValidateQBf16(absl::string_view op, const void* q_bf16, int32_t q_bf16_stride,
                           int32_t num_q_heads, int32_t head_dim) {
  if (q_bf16 == nullptr || q_bf16_stride >= int64_t{num_q_heads} * head_dim) {
    return absl::OkStatus();
  }
  return Invalid(op, absl::StrCat("q_bf16_stride ", q_bf16_stride, " < num_q_heads (", num_q_heads,
                                  ") * head_dim (", head_dim, ")"));
}

// The KV view checks shared by AppendKv, Rope (append_kv) and PagedAttention: the storage
// dtypes, and int8 with its scales.
absl::Status ValidateCacheView(absl::string_view op, const KvCacheView& c) {
  if (!IsStorageDtype(c.dtype) && c.dtype != DType::kInt8) {
    return absl::UnimplementedError(absl::StrCat(op, ": KV dtype ", std::string(DTypeName(c.dtype)),
                                                 " is not supported (f32, bf16, int8)"));
  }
  if (c.chunks == nullptr || c.num_chunks <= 0) {
    return Invalid(op, absl::StrCat("empty chunk table (num_chunks ", c.num_chunks, ")"));
  }
  if (c.num_kv_heads <= 0 || c.head_dim <= 0 || c.block_size <= 0) {
    return Invalid(op, absl::StrCat("num_kv_heads ", c.num_kv_heads, ", head_dim ", c.head_dim,
                                    ", block_size ", c.block_size, ": each must be positive"));
  }
  if (c.chunk_shift < 0 || c.chunk_shift > 30) {
    return Invalid(op, absl::StrCat("chunk_shift ", c.chunk_shift, " outside [0, 30]"));
  }
  int64_t needed = 0;  // overflow-checked: the three are any positive int32 here
  if (__builtin_mul_overflow(int64_t{c.num_kv_heads}, int64_t{c.block_size}, &needed) ||
      __builtin_mul_overflow(needed, int64_t{c.head_dim}, &needed) ||
      __builtin_mul_overflow(needed, static_cast<int64_t>(ElementBytes(c.dtype)), &needed)) {
    return Invalid(op,
                   absl::StrCat("num_kv_heads ", c.num_kv_heads, " * block_size ", c.block_size,
                                " * head_dim ", c.head_dim, " * element bytes overflows int64"));
  }
  if (c.block_bytes < needed) {
    return Invalid(op, absl::StrCat("block_bytes ", c.block_bytes, " < ", needed));
  }
  if (c.k_offset_bytes < 0 || c.v_offset_bytes < 0) {
    return Invalid(op, absl::StrCat("negative region offset (k_offset_bytes ", c.k_offset_bytes,
                                    ", v_offset_bytes ", c.v_offset_bytes, ")"));
  }
  return ValidateKvScales(op, c);
}

}  // namespace

absl::StatusOr<int> CountCudaDevices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice) {
    cudaGetLastError();  // not sticky: later calls start clean
    return 0;
  }
  if (absl::Status s = CudaStatus(err, "cudaGetDeviceCount"); !s.ok()) {
    return absl::UnavailableError(s.message());
  }
  return count;
}

absl::StatusOr<int> CudaComputeCapability(int device_index) {
  int major = 0;
  int minor = 0;
  KVD_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index),
      "compute capability");
  KVD_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index),
      "compute capability");
  return major * 10 + minor;
}

int CudaDeviceCount() {
  absl::StatusOr<int> count = CountCudaDevices();
  return count.ok() ? *count : 0;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device_index) {
  const int count = CudaDeviceCount();
  if (device_index < 0 || device_index >= count) {
    return absl::UnavailableError(
        absl::StrCat("CudaBackend: device ", device_index, " requested, ", count, " visible"));
  }
  absl::StatusOr<int> capability = CudaComputeCapability(device_index);
  if (!capability.ok()) return capability.status();
  if (*capability < cuda::kMinComputeCapability) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CudaBackend: GPU ", device_index, " ", cuda::ComputeCapabilityShortfall(*capability)));
  }
  KVD_RETURN_IF_CUDA_ERROR(cudaSetDevice(device_index), "CudaBackend: cudaSetDevice");
  int num_sms = 0;
  KVD_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device_index),
      "CudaBackend: multiprocessor count");
  cudaStream_t stream = nullptr;
  KVD_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                           "CudaBackend: cudaStreamCreate");
  absl::StatusOr<std::unique_ptr<BlasGemm>> gemm = BlasGemm::Create(stream);
  if (!gemm.ok()) {
    cudaStreamDestroy(stream);
    return gemm.status();
  }
  // Decode batches past the skinny kernel's rows, up to 64, run the fastest of cuBLASLt's
  // candidates over large weights, timed on first use of each shape (for Llama-3-8B about
  // 12 ms per row count: gate-up, down and the classifier).
  (*gemm)->TuneUpTo(kTunedGemmRows);
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(device_index, num_sms, stream, *std::move(gemm)));
}

CudaBackend::CudaBackend(int device_index, int num_sms, cudaStream_t stream,
                         std::unique_ptr<BlasGemm> gemm)
    : device_index_(device_index),
      num_sms_(num_sms),
      hopper_prefill_(cuda::HopperPrefillSupported()),
      stream_(stream),
      gemm_(std::move(gemm)) {
  CountWorkspace();
}

void CudaBackend::CountWorkspace() {
  const size_t scratch = matmul_input_.bytes + attention_.bytes + decode_arrivals_.bytes;
  workspace_bytes_.store(static_cast<int64_t>(scratch + BlasGemm::kWorkspaceBytes),
                         std::memory_order_relaxed);
}

void CudaBackend::FreeScratch(Scratch& scratch) {
  cudaFree(scratch.data);
  scratch = Scratch{};
  CountWorkspace();
}

std::optional<Backend::DeviceMemory> CudaBackend::QueryDeviceMemory() const {
  int caller_device = -1;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const bool ok = cudaGetDevice(&caller_device) == cudaSuccess &&
                  cudaSetDevice(device_index_) == cudaSuccess &&
                  cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  if (caller_device >= 0 && caller_device != device_index_) cudaSetDevice(caller_device);
  if (!ok) {
    // A lost context is reported by the engine's next op; leave no error for a launcher on
    // this thread to take as its own (cuda_status.h).
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return DeviceMemory{static_cast<int64_t>(total_bytes), static_cast<int64_t>(free_bytes)};
}

CudaBackend::~CudaBackend() {
  // Teardown cannot report errors; a fault already surfaced through an earlier call.
  cudaSetDevice(device_index_);
  if (capturing_) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  cudaStreamSynchronize(stream_);
  gemm_.reset();
  cudaFree(matmul_input_.data);
  cudaFree(attention_.data);
  cudaFree(decode_arrivals_.data);
  for (void* data : frees_after_capture_) cudaFree(data);
  for (const PendingTiming& t : pending_timings_)
    spare_events_.insert(spare_events_.end(), {t.start, t.stop});
  for (cudaEvent_t e : spare_events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::NotCapturing(absl::string_view op) const {
  if (!capturing_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(op, " is not allowed while a graph is being captured"));
}

absl::Status CudaBackend::Activate(absl::string_view op) {
  // A capture is thread-local and began with this device current; leave it alone.
  if (capturing_) return absl::OkStatus();
  return CudaStatus(cudaSetDevice(device_index_), op);
}

absl::Status CudaBackend::Grow(Scratch& scratch, size_t bytes, absl::string_view op) {
  if (scratch.bytes >= bytes) return absl::OkStatus();
  if (capturing_) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": scratch must grow to ", bytes,
                     " bytes during a graph capture; run the ops once uncaptured first"));
  }
  ++scratch_epoch_;
  // cudaFree waits for the device, so kernels still reading the old buffer finish first.
  KVD_RETURN_IF_CUDA_ERROR(cudaFree(scratch.data), op);
  scratch = Scratch{};
  CountWorkspace();
  // Powers of two: batches of nearby sizes (a decode graph's padded bucket and the same
  // step uncaptured) then share one buffer instead of moving it, and recorded graphs with it.
  size_t grown = size_t{1} << 20;
  while (grown < bytes) grown *= 2;
  KVD_RETURN_IF_CUDA_ERROR(cudaMalloc(&scratch.data, grown), op);
  scratch.bytes = grown;
  CountWorkspace();
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> CudaBackend::Allocate(size_t bytes) {
  if (absl::Status s = NotCapturing("Allocate"); !s.ok()) return s;  // cudaMalloc would end it
  if (absl::Status s = Activate("Allocate"); !s.ok()) return s;
  if (bytes == 0) return DeviceBuffer();
  void* data = nullptr;
  KVD_RETURN_IF_CUDA_ERROR(cudaMalloc(&data, bytes), absl::StrCat("Allocate(", bytes, ")"));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  allocated_lo_ = std::min(allocated_lo_, begin);
  allocated_hi_ = std::max(allocated_hi_, begin + bytes);
  return DeviceBuffer(this, data, bytes);
}

const cuda::KvRowMap* CudaBackend::UpdatedKvRows() {
  if (allocated_hi_ == 0) return nullptr;
  if (kv_rows_lo_ != allocated_lo_ || kv_rows_hi_ != allocated_hi_) {
    // cudaMalloc's buffers are 256-byte aligned, as the view's base must be. On failure
    // the view is left empty (num_rows 0).
    cuda::MakeKvRowMap(allocated_lo_, allocated_hi_, kv_rows_);
    kv_rows_lo_ = allocated_lo_;
    kv_rows_hi_ = allocated_hi_;
  }
  return kv_rows_.num_rows > 0 ? &kv_rows_ : nullptr;
}

void CudaBackend::Free(void* data, size_t /*bytes*/) {
  // Free cannot report errors (DeviceBuffer's destructor); cudaFree of a pointer from
  // Allocate only fails after an earlier fault, which ops have already reported. Nor may it
  // leave one for the next launcher to report as its own (cuda_status.h). While capturing, a
  // cudaFree would invalidate the capture: EndCapture frees the buffer.
  if (capturing_) {
    frees_after_capture_.push_back(data);
    return;
  }
  cudaSetDevice(device_index_);
  if (cudaFree(data) != cudaSuccess) cudaGetLastError();
}

absl::Status CudaBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (absl::Status s = NotCapturing("CopyToDevice"); !s.ok()) return s;
  if (absl::Status s = Activate("CopyToDevice"); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  KVD_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                           "CopyToDevice");
  KVD_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "CopyToDevice: synchronize");
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (absl::Status s = NotCapturing("CopyToHost"); !s.ok()) return s;
  if (absl::Status s = Activate("CopyToHost"); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  KVD_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                           "CopyToHost");
  KVD_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "CopyToHost: synchronize");
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize() {
  if (absl::Status s = NotCapturing("Synchronize"); !s.ok()) return s;
  if (absl::Status s = Activate("Synchronize"); !s.ok()) return s;
  KVD_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "Synchronize");
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> CudaBackend::UploadWeights(const float* host, size_t count) {
  if (absl::Status s = NotCapturing("UploadWeights"); !s.ok()) return s;
  absl::StatusOr<DeviceBuffer> weights = Allocate(count * 2);
  if (!weights.ok() || count == 0) return weights;
  absl::StatusOr<DeviceBuffer> staging = Allocate(std::min(count, kUploadChunkFloats) * 4);
  if (!staging.ok()) return staging.status();
  for (size_t begin = 0; begin < count; begin += kUploadChunkFloats) {
    const size_t n = std::min(kUploadChunkFloats, count - begin);
    KVD_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(staging->data(), host + begin, n * 4, cudaMemcpyHostToDevice, stream_),
        "UploadWeights: copy");
    KVD_RETURN_IF_CUDA_ERROR(
        cuda::LaunchF32ToBf16(weights->as<char>() + begin * 2, staging->as<float>(),
                              static_cast<int64_t>(n), stream_),
        "UploadWeights: convert");
  }
  // The staging buffer is freed on return: the conversions must be done with it.
  KVD_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "UploadWeights: synchronize");
  return weights;
}

class CudaBackend::OpTimer {
 public:
  OpTimer(CudaBackend* backend, absl::string_view op)
      : backend_(backend->op_timing_ && !backend->capturing_ ? backend : nullptr) {
    if (backend_ == nullptr) return;
    timing_.op = op;
    timing_.start = backend_->TakeEvent();
    timing_.stop = backend_->TakeEvent();
    // Timing is best effort: a failed record leaves no error for the op to report.
    if (timing_.start != nullptr &&
        cudaEventRecord(timing_.start, backend_->stream_) != cudaSuccess) {
      cudaGetLastError();
    }
  }
  ~OpTimer() {
    if (backend_ == nullptr) return;
    if (timing_.stop != nullptr &&
        cudaEventRecord(timing_.stop, backend_->stream_) != cudaSuccess) {
      cudaGetLastError();
    }
    backend_->pending_timings_.push_back(timing_);
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  CudaBackend* backend_;
  PendingTiming timing_;
};

cudaEvent_t CudaBackend::TakeEvent() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  if (cudaEventCreate(&event) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return event;
}

absl::StatusOr<std::vector<CudaBackend::OpTime>> CudaBackend::TakeOpTimes() {
  KVD_RETURN_IF_ERROR(Synchronize());
  std::vector<OpTime> times;
  for (const PendingTiming& t : pending_timings_) {
    float ms = 0;
    if (t.start != nullptr && t.stop != nullptr &&
        cudaEventElapsedTime(&ms, t.start, t.stop) != cudaSuccess) {
      cudaGetLastError();  // an event that was not recorded: the op counts 0 ms
      ms = 0;
    }
    auto it =
        std::find_if(times.begin(), times.end(), [&](const OpTime& x) { return x.op == t.op; });
    if (it == times.end()) it = times.insert(times.end(), OpTime{std::string(t.op)});
    it->ms += ms;
    ++it->calls;
    for (cudaEvent_t e : {t.start, t.stop}) {
      if (e != nullptr) spare_events_.push_back(e);
    }
  }
  pending_timings_.clear();
  return times;
}

absl::Status CudaBackend::Embedding(const EmbeddingParams& p) {
  constexpr absl::string_view kOp = "Embedding";
  if (!IsStorageDtype(p.table_dtype)) return Unsupported(kOp, "table dtype", p.table_dtype);
  if (p.num_tokens < 0 || p.dim <= 0 || p.vocab_size <= 0) {
    return Invalid(kOp, absl::StrCat("num_tokens ", p.num_tokens, ", dim ", p.dim, ", vocab_size ",
                                     p.vocab_size, ": num_tokens must be >= 0, the others > 0"));
  }
  if (p.num_tokens > 0) KVD_RETURN_IF_ERROR(ValidateEmbedding(p));
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  return CudaStatus(cuda::LaunchEmbedding(p, stream_), kOp);
}

absl::Status CudaBackend::RmsNorm(const RmsNormParams& p) {
  constexpr absl::string_view kOp = "RmsNorm";
  if (!IsStorageDtype(p.weight_dtype)) return Unsupported(kOp, "weight dtype", p.weight_dtype);
  if (p.num_rows < 0 || p.dim <= 0) return Invalid(kOp, RowsShape(p.num_rows, p.dim));
  if (p.num_rows > 0) KVD_RETURN_IF_ERROR(ValidateRmsNorm(p));
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  return CudaStatus(cuda::LaunchRmsNorm(p, stream_), kOp);
}

absl::Status CudaBackend::Matmul(const MatmulParams& p) {
  constexpr absl::string_view kOp = "Matmul";
  if (p.weight_dtype != DType::kBF16) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": weight dtype ",
                                                 std::string(DTypeName(p.weight_dtype)),
                                                 " (the CUDA backend stores bf16)"));
  }
  if (p.m < 0 || p.n <= 0 || p.k <= 0) {
    return Invalid(
        kOp, absl::StrCat("m ", p.m, ", n ", p.n, ", k ", p.k, ": m must be >= 0, n and k > 0"));
  }
  if (p.m == 0) return absl::OkStatus();
  KVD_RETURN_IF_ERROR(ValidateMatmulPrologue(p));
  if (p.prologue == MatmulPrologue::kRmsNorm && !IsStorageDtype(p.norm_dtype)) {
    return Unsupported(kOp, "norm dtype", p.norm_dtype);
  }
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  const int64_t input_count = int64_t{p.m} * p.k;
  const bool skinny = p.m <= cuda::kMaxSkinnyRows;
  // Decode batches without a prologue: the skinny kernel reads the fp32 rows, rounding them to
  // bf16 as it loads them (strided rows go to cuBLAS).
  const bool dense = p.in_stride == 0 || p.in_stride == p.k;
  if (skinny && p.prologue == MatmulPrologue::kNone && dense &&
      cuda::SkinnyGemmSupports(p.out, p.in, p.weight, p.m, p.n, p.k)) {
    OpTimer timer(this, "Matmul skinny");
    return CudaStatus(
        cuda::LaunchSkinnyGemm(p.out, p.in, p.weight, p.m, p.n, p.k, p.accumulate, stream_),
        "Matmul: skinny gemm");
  }
  // Every other product reads bf16 rows, which the prologue's kernel (or a plain conversion)
  // writes: the skinny kernel for decode batches with a prologue, cuBLAS past them or where the
  // skinny kernel cannot. (The prologue computed inside the skinny kernel, as it loads the
  // input, measured slower: H200, kvd bench 1 x 512 uncaptured, its matmuls 5.92 ms a step
  // against 4.37 for the two kernels; the prologue's loads want registers that the weight loads
  // in flight hold. The prologue's bf16 rows against fp32 ones that the skinny kernel rounds as
  // it loads them, both read through the non-coherent path, H200, kvd bench graphs on,
  // three rounds alternating builds: 8 x 1k 4.465-4.472 ms a step against 4.679-4.714; 1 x 512
  // 4.130-4.147 against 4.113-4.136, 1 x 4k 4.273-4.277 against 4.262-4.289. The plain loads
  // that replaced that path cost 1.4-2.2%: gemv_kernels.cu.)
  // Each timer covers the prologue's kernel too.
  KVD_RETURN_IF_ERROR(Grow(matmul_input_, static_cast<size_t>(input_count) * 2, kOp));
  void* rows = matmul_input_.data;
  const bool skinny_rows = skinny && p.prologue != MatmulPrologue::kNone &&
                           cuda::SkinnyGemmSupportsBf16Input(p.out, rows, p.weight, p.m, p.n, p.k);
  OpTimer timer(this, skinny_rows ? "Matmul skinny" : "Matmul cublas");
  KVD_RETURN_IF_CUDA_ERROR(LaunchPrologue(p, rows), "Matmul: input rows to bf16");
  if (skinny_rows) {
    return CudaStatus(cuda::LaunchSkinnyGemmBf16Input(p.out, rows, p.weight, p.m, p.n, p.k,
                                                      p.accumulate, stream_),
                      "Matmul: skinny gemm");
  }
  return gemm_->Run(p.out, rows, p.weight, p.m, p.n, p.k, p.accumulate);
}

cudaError_t CudaBackend::LaunchPrologue(const MatmulParams& p, void* out) {
  const int64_t in_stride = p.in_stride == 0 ? p.k : p.in_stride;
  switch (p.prologue) {
    case MatmulPrologue::kNone:
      return cuda::LaunchF32ToBf16Rows(out, p.in, p.m, p.k, in_stride, stream_);
    case MatmulPrologue::kRmsNorm: {
      // The params' fp32 `out` is not written: the bf16 rows go to `out` here.
      const RmsNormParams norm = MatmulPrologueRmsNorm(p, nullptr);
      return cuda::LaunchRmsNormToBf16(norm, in_stride, out, stream_);
    }
    case MatmulPrologue::kSiluMul: {
      const SiluMulParams silu = MatmulPrologueSiluMul(p, nullptr);
      return cuda::LaunchSiluMulToBf16(silu, out, stream_);
    }
  }
  return cudaErrorInvalidValue;
}

absl::Status CudaBackend::Rope(const RopeParams& p) {
  constexpr absl::string_view kOp = "Rope";
  KVD_RETURN_IF_ERROR(ValidateRope(p));
  if (p.append_kv && p.num_tokens > 0) {
    if (absl::Status s = ValidateCacheView(kOp, p.cache); !s.ok()) return s;
  }
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  if (p.append_kv && p.cache.dtype == DType::kInt8) {
    // The rotation, then the int8 append of the rotated k rows (no fused int8 kernel yet).
    RopeParams rope = p;
    rope.append_kv = false;
    KVD_RETURN_IF_ERROR(CudaStatus(cuda::LaunchRope(rope, stream_), kOp));
    return CudaStatus(cuda::LaunchAppendKv(RopeAppendParams(p), stream_), kOp);
  }
  return CudaStatus(cuda::LaunchRope(p, stream_), kOp);
}

bool CudaBackend::ReadsBf16Q(int32_t head_dim) const {
  return head_dim == cuda::kHopperPrefillHeadDim && hopper_prefill_;
}

absl::Status CudaBackend::SiluMul(const SiluMulParams& p) {
  constexpr absl::string_view kOp = "SiluMul";
  if (p.num_rows < 0 || p.dim <= 0) return Invalid(kOp, RowsShape(p.num_rows, p.dim));
  if (p.num_rows > 0) {
    KVD_RETURN_IF_ERROR(ValidateSiluMul(p));
  }
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  return CudaStatus(cuda::LaunchSiluMul(p, stream_), kOp);
}

absl::Status CudaBackend::AppendKv(const AppendKvParams& p) {
  constexpr absl::string_view kOp = "AppendKv";
  if (p.num_tokens == 0) return absl::OkStatus();  // whatever the view, as on every backend
  if (absl::Status s = ValidateCacheView(kOp, p.cache); !s.ok()) return s;
  KVD_RETURN_IF_ERROR(ValidateAppendKvRows(p));
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  return CudaStatus(cuda::LaunchAppendKv(p, stream_), kOp);
}

absl::Status CudaBackend::PagedAttention(const PagedAttentionParams& p) {
  constexpr absl::string_view kOp = "PagedAttention";
  const KvCacheView& c = p.cache;
  if (p.blocks.num_seqs < 0) {
    return Invalid(kOp, absl::StrCat("negative num_seqs ", p.blocks.num_seqs));
  }
  if (p.blocks.num_seqs == 0) return absl::OkStatus();  // whatever the view, as on every backend
  if (absl::Status s = ValidateCacheView(kOp, c); !s.ok()) return s;
  // Head sizes without a fast kernel (small test models) take the simple generic kernel.
  if (!cuda::HasAttentionKernel(c.head_dim)) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": head_dim ", c.head_dim,
                                                 " (fast kernels exist for 64 and 128, the "
                                                 "generic one up to ",
                                                 cuda::kGenericAttentionMaxHeadDim, ")"));
  }
  const bool fast_head_dim = c.head_dim == 64 || c.head_dim == 128;
  if (!IsPowerOfTwo(c.block_size)) {
    return Invalid(kOp, absl::StrCat("block_size ", c.block_size, " is not a power of two"));
  }
  if (c.k_offset_bytes % 16 != 0 || c.v_offset_bytes % 16 != 0 || c.block_bytes % 16 != 0) {
    return Invalid(kOp, absl::StrCat("k_offset_bytes ", c.k_offset_bytes, ", v_offset_bytes ",
                                     c.v_offset_bytes, ", block_bytes ", c.block_bytes,
                                     ": each must be a multiple of 16"));
  }
  // Null arrays, heads, strides, max_q_len: as the CPU backend refuses them, before a launch
  // that would fault on them (and lose the context) or, without query rows, pass.
  KVD_RETURN_IF_ERROR(ValidatePagedAttentionArgs(p));
  KVD_RETURN_IF_ERROR(ValidateQBf16(kOp, p.q_bf16, p.q_bf16_stride, p.num_q_heads, c.head_dim));
  if (p.blocks.num_seqs > 65535) {
    return Invalid(kOp, absl::StrCat("num_seqs ", p.blocks.num_seqs, " > 65535"));
  }
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  // An int8 cache has no fast kernel yet: the generic one reads it (correct, not fast).
  if (!fast_head_dim || c.dtype == DType::kInt8) {
    return CudaStatus(cuda::LaunchGenericAttention(p, stream_), "PagedAttention: generic kernel");
  }

  // Workspace: [tile_indptr (num_seqs + 1 ints)] [partial lse] [partial out], 256-aligned.
  const int num_seqs = p.blocks.num_seqs;
  const int group = p.num_q_heads / c.num_kv_heads;
  const cuda::DecodeSlices slices = cuda::DecodeLaunchSlices(p, num_sms_);
  const int max_splits = slices.max_splits;
  const size_t indptr_bytes = AlignUp(sizeof(int32_t) * (num_seqs + 1), 256);
  const size_t lse_bytes =
      AlignUp(sizeof(float) * cuda::DecodePartialLseSize(num_seqs, max_splits, p.num_q_heads), 256);
  const size_t out_bytes =
      sizeof(float) * cuda::DecodePartialOutSize(num_seqs, max_splits, p.num_q_heads, c.head_dim);
  const size_t total_bytes = indptr_bytes + (max_splits > 1 ? lse_bytes + out_bytes : 0);
  if (absl::Status s = Grow(attention_, total_bytes, kOp); !s.ok()) return s;
  char* base = static_cast<char*>(attention_.data);
  cuda::DecodeWorkspace ws;
  ws.max_splits = max_splits;
  ws.tail_splits = slices.tail_splits;
  if (max_splits > 1) {
    ws.partial_lse = reinterpret_cast<float*>(base + indptr_bytes);
    ws.partial_out = reinterpret_cast<float*>(base + indptr_bytes + lse_bytes);
    // Merge counters, one a (sequence, KV head subgroup): zero when (re)allocated, and every
    // launch leaves them zero.
    const size_t counter_bytes =
        sizeof(int32_t) * cuda::DecodeArrivalCount(num_seqs, c.num_kv_heads, group);
    if (decode_arrivals_.bytes < counter_bytes) {
      KVD_RETURN_IF_ERROR(Grow(decode_arrivals_, counter_bytes, kOp));
      if (const cudaError_t err =
              cudaMemsetAsync(decode_arrivals_.data, 0, decode_arrivals_.bytes, stream_);
          err != cudaSuccess) {
        // Not zeroed: drop the buffer, so that the next call allocates and zeroes it anew.
        FreeScratch(decode_arrivals_);
        return CudaStatus(err, "PagedAttention: zero merge counters");
      }
    }
    ws.arrivals = static_cast<int32_t*>(decode_arrivals_.data);
  }
  // The TMA view at every batch size (H200, with boxes against cp.async: 1 x 32k decode
  // attention 0.63-0.66 of copy bandwidth per call against 0.56-0.59, kvd bench steps at
  // batch 1 1-2% shorter; large batches 5-10% faster).
  KVD_RETURN_IF_CUDA_ERROR(cuda::LaunchDecodeAttention(p, ws, stream_, UpdatedKvRows()),
                           "PagedAttention: decode kernel");
  if (p.max_q_len == 1) return absl::OkStatus();  // pure decode: no prefill rows
  // bf16 KV prefill runs the tensor cores; f32 KV keeps the fp32 kernel. On Hopper with
  // head_dim 128 the wgmma kernel (128 packed rows per item, Q and P rounded to bf16 as
  // FlashAttention does), whatever the batch. Elsewhere the wide mma.sync kernel (same items
  // and numerics) unless the hint shows too few items to fill the device, e.g. the engine's
  // 512-token chunks: then the 64-row kernel, which makes twice the items and keeps
  // fp32-close numerics. H200, gpu_bench, a 512-token chunk over a 4k prefix: wgmma 0.11 ms,
  // 64-row 0.20 ms, wide 0.30 ms.
  const int wide_rows = cuda::MmaPrefillTileRows(cuda::MmaPrecision::kBf16);
  const int64_t wide_items = p.max_q_len > 0
                                 ? int64_t{num_seqs} * c.num_kv_heads *
                                       ((int64_t{p.max_q_len} * group + wide_rows - 1) / wide_rows)
                                 : INT64_MAX;
  const bool wgmma = hopper_prefill_ && c.head_dim == cuda::kHopperPrefillHeadDim;
  const cuda::MmaPrecision precision = !wgmma && wide_items < int64_t{2} * num_sms_
                                           ? cuda::MmaPrecision::kSplit
                                           : cuda::MmaPrecision::kBf16;
  KVD_RETURN_IF_CUDA_ERROR(
      cuda::LaunchPrefillAttention(p, reinterpret_cast<int32_t*>(base),
                                   num_sms_ * kPrefillCtasPerSm, stream_, precision),
      "PagedAttention: prefill kernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyBlocks(const CopyBlocksParams& p) {
  constexpr absl::string_view kOp = "CopyBlocks";
  if (p.num_pairs == 0) return absl::OkStatus();  // negative: ValidateCopyBlocks
  if (p.num_regions > 65535) {
    return Invalid(kOp, absl::StrCat("num_regions ", p.num_regions, " > 65535"));
  }
  KVD_RETURN_IF_ERROR(ValidateCopyBlocks(p));
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  return CudaStatus(cuda::LaunchCopyBlocks(p, stream_), kOp);
}

absl::Status CudaBackend::Sample(const SampleParams& p) {
  constexpr absl::string_view kOp = "Sample";
  if (p.num_rows < 0) return Invalid(kOp, absl::StrCat("negative num_rows ", p.num_rows));
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.vocab_size <= 0) {
    return Invalid(kOp, absl::StrCat("vocab_size ", p.vocab_size, " must be positive"));
  }
  if (p.row_stride < p.vocab_size) {
    return Invalid(kOp, absl::StrCat("row_stride ", p.row_stride, " < vocab_size ", p.vocab_size));
  }
  if (p.logits == nullptr || p.rows == nullptr || p.out_tokens == nullptr) {
    return Invalid(kOp, "null logits, rows or out_tokens");
  }
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  OpTimer timer(this, kOp);
  return CudaStatus(cuda::LaunchSample(p, stream_), kOp);
}

absl::Status CudaBackend::FillRandom(void* data, DType dtype, size_t count,
                                     const RandomFill& fill) {
  constexpr absl::string_view kOp = "FillRandom";
  if (!IsStorageDtype(dtype)) return Unsupported(kOp, "dtype", dtype);
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) return Invalid(kOp, "null destination");
  if (absl::Status s = NotCapturing(kOp); !s.ok()) return s;  // it synchronizes
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  KVD_RETURN_IF_CUDA_ERROR(
      cuda::LaunchRandomFill(data, dtype, static_cast<int64_t>(count), fill, stream_), kOp);
  // Done before the next op can read them as weights (see the header).
  return CudaStatus(cudaStreamSynchronize(stream_), kOp);
}

CudaBackend::Graph& CudaBackend::Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = other.exec_;
    other.exec_ = nullptr;
  }
  return *this;
}

CudaBackend::Graph::~Graph() {
  // Teardown cannot report errors; a destroyed context already reported through an op.
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

absl::Status CudaBackend::BeginCapture() {
  constexpr absl::string_view kOp = "BeginCapture";
  if (capturing_) return absl::FailedPreconditionError("BeginCapture: already capturing");
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  KVD_RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), kOp);
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<CudaBackend::Graph> CudaBackend::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("EndCapture: not capturing");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  std::vector<void*> frees;
  frees.swap(frees_after_capture_);
  for (void* data : frees) Free(data, 0);
  if (end != cudaSuccess || graph == nullptr) {
    // An op failed or did something capture forbids: the capture is invalidated. The
    // stream is out of capture mode either way; clear the non-sticky error.
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return CudaStatus(end != cudaSuccess ? end : cudaErrorStreamCaptureInvalidated,
                      "EndCapture: the capture failed");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  KVD_RETURN_IF_CUDA_ERROR(instantiated, "EndCapture: cudaGraphInstantiate");
  return Graph(exec);
}

absl::Status CudaBackend::LaunchGraph(const Graph& graph) {
  constexpr absl::string_view kOp = "LaunchGraph";
  if (absl::Status s = NotCapturing(kOp); !s.ok()) return s;
  if (graph.exec() == nullptr) return Invalid(kOp, "empty graph");
  if (absl::Status s = Activate(kOp); !s.ok()) return s;
  KVD_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graph.exec(), stream_), kOp);
  return absl::OkStatus();
}

}  // namespace kvd
