#ifndef KVD_KERNELS_BACKEND_H_
#define KVD_KERNELS_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/params.h"

namespace kvd {

class Backend;

// Owning handle to backend memory; frees through its backend on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Counts `bytes` in backend->allocated_bytes() until the buffer is freed.
  DeviceBuffer(Backend* backend, void* data, size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void Reset();

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The seam between the model and the hardware: memory and the forward-pass primitives.
// Every op reads and writes backend memory only and takes the POD params of
// kernels/params.h. Ops run in issue order; on an asynchronous backend (CUDA) they are
// enqueued and Synchronize() waits for them. Not thread safe: one engine thread drives a
// backend. Errors (a launch failure, an unsupported dtype) come back as absl::Status; a
// failed call leaves the backend usable, except DataLoss, which says the backend is unusable
// from then on (a device fault lost the CUDA context): the engine stops on it and the daemon
// exits for its supervisor to restart it.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;

  // --- memory accounting: thread safe, unlike the rest (the engine reads the first two at
  // each step's end, a metrics scrape calls QueryDeviceMemory) ---
  // Bytes held in live DeviceBuffers this backend made: weights, KV arena chunks, activations.
  int64_t allocated_bytes() const { return allocated_bytes_.load(std::memory_order_relaxed); }
  // Bytes the backend holds for itself, outside any DeviceBuffer (the CUDA backend's op
  // scratch and cuBLASLt workspace; the CPU backend's host scratch is not counted).
  virtual int64_t workspace_bytes() const { return 0; }
  // The whole device's memory as its driver reports it (every process's use included), where
  // the backend runs on a device with memory of its own; nullopt on the CPU, or when the
  // driver cannot say (the error is not kept). Leaves the calling thread's current device as
  // it was.
  struct DeviceMemory {
    int64_t total_bytes = 0;
    int64_t free_bytes = 0;
  };
  virtual std::optional<DeviceMemory> QueryDeviceMemory() const { return std::nullopt; }

  // --- memory ---
  // Memory is uninitialized. On the CPU it is committed lazily by the OS as it is touched.
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Synchronize() = 0;
  // Storage type this backend wants weights in (fp32 on CPU, bf16 on CUDA).
  virtual DType weight_dtype() const = 0;
  // Uploads `count` fp32 host values as weight_dtype(), converting as needed.
  virtual absl::StatusOr<DeviceBuffer> UploadWeights(const float* host, size_t count) = 0;

  // --- ops ---
  // Every backend checks ValidateEmbedding and ValidateRmsNorm (below) where there are rows.
  virtual absl::Status Embedding(const EmbeddingParams& p) = 0;
  virtual absl::Status RmsNorm(const RmsNormParams& p) = 0;
  // Every backend checks ValidateMatmulPrologue (below) when there are rows.
  virtual absl::Status Matmul(const MatmulParams& p) = 0;
  // Every backend checks ValidateRope (below) before anything is written.
  virtual absl::Status Rope(const RopeParams& p) = 0;
  // Every backend checks ValidateSiluMul (below).
  virtual absl::Status SiluMul(const SiluMulParams& p) = 0;
  // Every backend checks the cache view, then ValidateAppendKvRows (below), when there are
  // tokens; num_tokens == 0 is a no-op, whatever the view.
  virtual absl::Status AppendKv(const AppendKvParams& p) = 0;
  // num_seqs == 0 is a no-op on every backend, whatever the view.
  virtual absl::Status PagedAttention(const PagedAttentionParams& p) = 0;
  // Whether PagedAttention reads PagedAttentionParams::q_bf16 for prefill rows over a bf16 KV
  // cache of this head_dim when given (so a model should have Rope write it), rather than
  // ignoring it.
  virtual bool ReadsBf16Q(int32_t /*head_dim*/) const { return false; }
  // Every backend checks ValidateCopyBlocks (below) when there are pairs.
  virtual absl::Status CopyBlocks(const CopyBlocksParams& p) = 0;
  // Samples one token per row (SampleParams). Greedy rows are exact on every backend;
  // sampled rows follow kernels/cpu_sampling.h, which the CPU backend runs exactly and a
  // device backend reproduces up to the rounding of its mass sums (it may pick a neighbour
  // of the reference token only when u * total lies within rounding of their boundary).
  virtual absl::Status Sample(const SampleParams& p) = 0;

 protected:
  friend class DeviceBuffer;
  virtual void Free(void* data, size_t bytes) = 0;

 private:
  std::atomic<int64_t> allocated_bytes_{0};  // DeviceBuffer counts itself in and out
};

// The backend-neutral checks of a Rope, none without tokens: num_tokens not negative,
// head_dim positive and even, num_q_heads and num_kv_heads not negative nor both 0, theta
// positive, a known style, positions given, q (k) given with q_stride (k_stride) of at least
// num_q_heads (num_kv_heads) * head_dim when there are such heads, q_bf16_stride as wide when
// q_bf16 is given, then ValidateRopeAppend. InvalidArgument naming "Rope" and the field
// otherwise. With append_kv each backend adds its checks of the cache view and the slots.
absl::Status ValidateRope(const RopeParams& p);

// The backend-neutral checks of a Rope with append_kv (none without it, or without tokens):
// the cache has the op's KV heads and head_dim, and k, v and slot_mapping are given with rows
// of at least num_kv_heads * head_dim. InvalidArgument naming "Rope: append_kv" otherwise.
// Each backend adds its own checks of the cache view and the slots.
absl::Status ValidateRopeAppend(const RopeParams& p);

// The AppendKv a Rope with append_kv stands for, run after the rotation: p's cache, rotated k
// rows, v rows and slots.
AppendKvParams RopeAppendParams(const RopeParams& p);

// For an int8 cache view (any other dtype: OK, nothing to check): its block's scales,
// num_kv_heads * block_size fp32 values at scale_offset_bytes (kernels/params.h), lie after
// the block's elements and inside block_bytes, and stay 4-byte aligned in every block
// (scale_offset_bytes, block_bytes and the region offsets multiples of 4). InvalidArgument
// naming `op` and scale_offset_bytes otherwise. REQUIRES: the view's sizes are positive.
absl::Status ValidateKvScales(absl::string_view op, const KvCacheView& view);

// The backend-neutral checks of an AppendKv, after the backend's own checks of the cache view
// (its KV dtypes differ): num_tokens not negative, and with tokens k, v and slot_mapping
// given with k_stride and v_stride of at least cache.num_kv_heads * cache.head_dim.
// InvalidArgument naming "AppendKv" and the field otherwise. The slots are each backend's to
// check where it can read them: every backend skips a token whose slot is kNoSlot; the CPU
// backend rejects any other negative slot or one outside the arena; the CUDA backend, whose
// slots are in device memory, skips a token with any negative slot
// (kernels/cuda/kv_cache_kernels.h) and cannot check the others.
absl::Status ValidateAppendKvRows(const AppendKvParams& p);

// The backend-neutral checks of a Matmul's input and prologue, for m > 0 and k > 0 (each
// backend checks the shape and the other pointers first): in given, a known prologue,
// in_stride 0 or at least k; kRmsNorm: norm_weight given, norm_eps not negative; kSiluMul:
// up given, up_stride 0 or at least k; no prologue fields set that the prologue does not
// read (a norm weight or up rows left over from another prologue would be ignored).
// InvalidArgument naming "Matmul" and the field otherwise. The norm's dtype is each
// backend's to check.
absl::Status ValidateMatmulPrologue(const MatmulParams& p);

// The op a Matmul's prologue stands for, writing its rows to `out` ([m][k]): a kRmsNorm's
// RmsNorm (whose params take in's rows as dense: a backend honours in_stride itself) and a
// kSiluMul's SiluMul (gate = in, rows in_stride apart).
RmsNormParams MatmulPrologueRmsNorm(const MatmulParams& p, float* out);
SiluMulParams MatmulPrologueSiluMul(const MatmulParams& p, float* out);

// The backend-neutral checks of an Embedding with tokens, after each backend's own checks of
// the table dtype and the sizes: out, table and token_ids given. InvalidArgument naming
// "Embedding" and the field otherwise. The ids are each backend's to check where it can read
// them.
absl::Status ValidateEmbedding(const EmbeddingParams& p);

// The backend-neutral checks of an RmsNorm with rows, after each backend's own checks of the
// weight dtype and the sizes: out, in and weight given. InvalidArgument naming "RmsNorm" and
// the field otherwise.
absl::Status ValidateRmsNorm(const RmsNormParams& p);

// The backend-neutral checks of a SiluMul whose num_rows > 0 and dim > 0 (each backend
// checks those first): out, gate and up are given, the strides are at least dim, and out
// overlaps an input only as that input itself with stride dim, so that each row is read
// before it is overwritten by the same row (any other overlap would make the result depend
// on the order the rows run in). InvalidArgument naming "SiluMul" and the field otherwise.
absl::Status ValidateSiluMul(const SiluMulParams& p);

// The backend-neutral checks of a PagedAttention with sequences, after the backend's own
// checks of num_seqs and of the cache view: out, q, q_indptr and the block table's indptr,
// indices and last_block_len given, num_q_heads a positive multiple of cache.num_kv_heads,
// q_stride and out_stride at least num_q_heads * head_dim, max_q_len and max_kv_len not
// negative. InvalidArgument naming "PagedAttention" and the field otherwise. The arrays'
// contents are each backend's to check where it can read them (the CUDA backend's are in
// device memory).
absl::Status ValidatePagedAttentionArgs(const PagedAttentionParams& p);

// The backend-neutral checks of a CopyBlocks with pairs: num_pairs not negative, chunks, src
// and dst given, num_regions and block_bytes positive, chunk_shift in [0, 30] and a region of
// a chunk holding its 1 << chunk_shift blocks. InvalidArgument naming "CopyBlocks" and the
// field otherwise. The block ids are each backend's to check where it can read them.
absl::Status ValidateCopyBlocks(const CopyBlocksParams& p);

}  // namespace kvd

#endif  // KVD_KERNELS_BACKEND_H_
