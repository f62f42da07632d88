#ifndef KVD_KERNELS_CPU_BACKEND_H_
#define KVD_KERNELS_CPU_BACKEND_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvd {

// The exact fp32 reference backend: host memory, synchronous ops, parallel on an owned
// ThreadPool.
//
// Compute is fp32 only, and so is storage but for int8 KV: weight_dtype() is kF32, and an
// op handed weights, an embedding table or a KV cache of any other dtype (a KV cache: other
// than f32 or int8) returns Unimplemented naming the op and the dtype. An int8 KV cache is
// stored quantized and read back dequantized (kernels/kv_quant.h), the rest in fp32. Invalid
// params (null pointers, non-positive sizes, head counts that do not divide, block ids
// outside the arena or in a released chunk, token ids outside the vocabulary) return
// InvalidArgument naming the op and the field, before anything is written.
//
// Determinism: every output element is computed by the same code in the same summation
// order however the work is split, so results are bitwise identical for any num_threads
// and a row's result does not depend on the other rows of its batch.
//
// Memory: Allocate returns 64-byte aligned, uninitialized host memory. Sizes of at least
// kMmapThresholdBytes are anonymous private mmaps, so the OS commits their pages only when
// first touched (the KV pool reserves its arena up front and relies on this).
//
// Thread safety: like every Backend, driven by one thread; ops themselves fan out to the
// pool. Ownership: buffers must be freed (DeviceBuffer does it) before the backend dies.
class CpuBackend final : public Backend {
 public:
  static constexpr size_t kMmapThresholdBytes = size_t{1} << 20;

  // num_threads <= 1 runs every op on the calling thread.
  explicit CpuBackend(int num_threads);
  ~CpuBackend() override = default;

  std::string_view name() const override { return "cpu"; }
  int num_threads() const { return pool_.num_threads(); }

  // bytes == 0 gives an empty buffer. ResourceExhausted when the OS refuses.
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  // memcpy; InvalidArgument for a null pointer with bytes > 0.
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  // Ops complete before they return, so there is nothing to wait for.
  absl::Status Synchronize() override { return absl::OkStatus(); }
  DType weight_dtype() const override { return DType::kF32; }
  absl::StatusOr<DeviceBuffer> UploadWeights(const float* host, size_t count) override;

  absl::Status Embedding(const EmbeddingParams& p) override;
  absl::Status RmsNorm(const RmsNormParams& p) override;
  absl::Status Matmul(const MatmulParams& p) override;
  absl::Status Rope(const RopeParams& p) override;
  absl::Status SiluMul(const SiluMulParams& p) override;
  absl::Status AppendKv(const AppendKvParams& p) override;
  absl::Status PagedAttention(const PagedAttentionParams& p) override;
  absl::Status CopyBlocks(const CopyBlocksParams& p) override;
  // The reference procedure of kernels/cpu_sampling.h, rows in parallel.
  absl::Status Sample(const SampleParams& p) override;

 protected:
  void Free(void* data, size_t bytes) override;

 private:
  ThreadPool pool_;
};

}  // namespace kvd

#endif  // KVD_KERNELS_CPU_BACKEND_H_
