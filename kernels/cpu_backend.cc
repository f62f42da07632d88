#include "kernels/cpu_backend.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_elementwise.h"
#include "kernels/cpu_kv_ops.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_paged_attention.h"
#include "kernels/cpu_sampling.h"
#include "kernels/status_macros.h"

namespace kvd {
namespace {

constexpr size_t kAlignment = 64;

absl::Status CheckCopy(absl::string_view op, void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", dst == nullptr ? "dst" : "src", " is null for ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  void* data = nullptr;
  if (bytes >= kMmapThresholdBytes) {
    data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                -1, 0);
    if (data == MAP_FAILED) data = nullptr;
  } else {
    // aligned_alloc wants a multiple of the alignment.
    data = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  }
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CpuBackend::Allocate: cannot allocate ", bytes, " bytes"));
  }
  return DeviceBuffer(this, data, bytes);
}

void CpuBackend::Free(void* data, size_t bytes) {
  if (bytes >= kMmapThresholdBytes) {
    munmap(data, bytes);
  } else {
    std::free(data);
  }
}

absl::Status CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (absl::Status s = CheckCopy("CopyToDevice", dst, src, bytes); !s.ok()) return s;
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (absl::Status s = CheckCopy("CopyToHost", dst, src, bytes); !s.ok()) return s;
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> CpuBackend::UploadWeights(const float* host, size_t count) {
  if (count > 0 && host == nullptr) {
    return absl::InvalidArgumentError("UploadWeights: host is null");
  }
  absl::StatusOr<DeviceBuffer> buffer = Allocate(count * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  if (count > 0) std::memcpy(buffer->data(), host, count * sizeof(float));
  return buffer;
}

absl::Status CpuBackend::Embedding(const EmbeddingParams& p) { return CpuEmbedding(p, pool_); }
absl::Status CpuBackend::RmsNorm(const RmsNormParams& p) { return CpuRmsNorm(p, pool_); }
absl::Status CpuBackend::Matmul(const MatmulParams& p) { return CpuMatmul(p, pool_); }
absl::Status CpuBackend::Rope(const RopeParams& p) {
  if (!p.append_kv) return CpuRope(p, pool_);
  // Rope, then AppendKv of the rotated k and v; the append's params are checked before the
  // rotation writes anything.
  const AppendKvParams append = RopeAppendParams(p);
  KVD_RETURN_IF_ERROR(ValidateRope(p));
  KVD_RETURN_IF_ERROR(ValidateAppendKv(append));
  KVD_RETURN_IF_ERROR(CpuRope(p, pool_));
  return CpuAppendKv(append, pool_);
}
absl::Status CpuBackend::SiluMul(const SiluMulParams& p) { return CpuSiluMul(p, pool_); }
absl::Status CpuBackend::AppendKv(const AppendKvParams& p) { return CpuAppendKv(p, pool_); }
absl::Status CpuBackend::PagedAttention(const PagedAttentionParams& p) {
  return CpuPagedAttention(p, pool_);
}
absl::Status CpuBackend::CopyBlocks(const CopyBlocksParams& p) { return CpuCopyBlocks(p, pool_); }
absl::Status CpuBackend::Sample(const SampleParams& p) { return CpuSample(p, pool_); }

}  // namespace kvd
