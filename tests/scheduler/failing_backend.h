#ifndef KVD_TESTS_SCHEDULER_FAILING_BACKEND_H_
#define KVD_TESTS_SCHEDULER_FAILING_BACKEND_H_

// FailingBackend: the CPU reference backend, except that once FailOpsWith(status) is called
// every op and Synchronize return that status, as a device whose context a kernel fault has
// lost answers every call. Memory keeps working (buffers come from, and go back to, the
// CPU backend inside), so a model and a cache built on it are destroyed normally; only new
// allocations can be made to fail (FailAllocationsWith), as on a device whose memory is spent.
// Not thread safe, as every Backend.

#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"

namespace kvd::test {

class FailingBackend final : public Backend {
 public:
  void FailOpsWith(absl::Status failure) { failure_ = std::move(failure); }
  // Allocate returns `failure` from now on (OK: allocates again).
  void FailAllocationsWith(absl::Status failure) { allocation_failure_ = std::move(failure); }
  int64_t num_failed_allocations() const { return num_failed_allocations_; }

  std::string_view name() const override { return "failing-cpu"; }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    if (!allocation_failure_.ok()) {
      ++num_failed_allocations_;
      return allocation_failure_;
    }
    return inner_.Allocate(bytes);
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return inner_.CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return inner_.CopyToHost(dst, src, bytes);
  }
  absl::Status Synchronize() override { return failure_; }
  DType weight_dtype() const override { return inner_.weight_dtype(); }
  absl::StatusOr<DeviceBuffer> UploadWeights(const float* host, size_t count) override {
    return inner_.UploadWeights(host, count);
  }

  absl::Status Embedding(const EmbeddingParams& p) override {
    return Run(&CpuBackend::Embedding, p);
  }
  absl::Status RmsNorm(const RmsNormParams& p) override { return Run(&CpuBackend::RmsNorm, p); }
  absl::Status Matmul(const MatmulParams& p) override { return Run(&CpuBackend::Matmul, p); }
  absl::Status Rope(const RopeParams& p) override { return Run(&CpuBackend::Rope, p); }
  absl::Status SiluMul(const SiluMulParams& p) override { return Run(&CpuBackend::SiluMul, p); }
  absl::Status AppendKv(const AppendKvParams& p) override { return Run(&CpuBackend::AppendKv, p); }
  absl::Status PagedAttention(const PagedAttentionParams& p) override {
    return Run(&CpuBackend::PagedAttention, p);
  }
  absl::Status CopyBlocks(const CopyBlocksParams& p) override {
    return Run(&CpuBackend::CopyBlocks, p);
  }
  absl::Status Sample(const SampleParams& p) override { return Run(&CpuBackend::Sample, p); }

 protected:
  // Never called: every buffer is the inner backend's, and goes back to it.
  void Free(void*, size_t) override {}

 private:
  template <typename Params>
  absl::Status Run(absl::Status (CpuBackend::*op)(const Params&), const Params& p) {
    if (!failure_.ok()) return failure_;
    return (inner_.*op)(p);
  }

  CpuBackend inner_{1};
  absl::Status failure_;
  absl::Status allocation_failure_;
  int64_t num_failed_allocations_ = 0;
};

}  // namespace kvd::test

#endif  // KVD_TESTS_SCHEDULER_FAILING_BACKEND_H_
