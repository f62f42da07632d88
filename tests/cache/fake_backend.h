#ifndef KVD_TESTS_CACHE_FAKE_BACKEND_H_
#define KVD_TESTS_CACHE_FAKE_BACKEND_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace kvd {

// A host-memory Backend that implements only what the KV cache needs (memory and
// CopyBlocks) and counts what it does, so tests can check copies and leaks. Allocation
// can be made to fail after a number of calls, and CopyBlocks part way through a call; it
// can report a device of a given size (SimulateDevice) whose free memory is what its live
// buffers leave.
class FakeBackend final : public Backend {
 public:
  std::string_view name() const override { return "fake"; }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    if (fail_allocations_after_ >= 0 && num_allocations_ >= fail_allocations_after_) {
      return absl::ResourceExhaustedError("fake backend: out of memory");
    }
    ++num_allocations_;
    ++live_buffers_;
    live_bytes_ += static_cast<int64_t>(bytes);
    void* p = ::operator new(bytes == 0 ? 1 : bytes);
    std::memset(p, 0xAB, bytes);
    return DeviceBuffer(this, p, bytes);
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  std::optional<DeviceMemory> QueryDeviceMemory() const override {
    if (device_total_bytes_ < 0) return std::nullopt;
    return DeviceMemory{device_total_bytes_, device_total_bytes_ - live_bytes_};
  }
  DType weight_dtype() const override { return DType::kF32; }
  absl::StatusOr<DeviceBuffer> UploadWeights(const float*, size_t) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status Embedding(const EmbeddingParams&) override { return Unimplemented(); }
  absl::Status RmsNorm(const RmsNormParams&) override { return Unimplemented(); }
  absl::Status Matmul(const MatmulParams&) override { return Unimplemented(); }
  absl::Status Rope(const RopeParams&) override { return Unimplemented(); }
  absl::Status SiluMul(const SiluMulParams&) override { return Unimplemented(); }
  absl::Status AppendKv(const AppendKvParams&) override { return Unimplemented(); }
  absl::Status PagedAttention(const PagedAttentionParams&) override { return Unimplemented(); }
  absl::Status Sample(const SampleParams&) override { return Unimplemented(); }

  absl::Status CopyBlocks(const CopyBlocksParams& p) override {
    ++num_copy_calls_;
    num_copied_blocks_ += p.num_pairs;
    const int64_t mask = (int64_t{1} << p.chunk_shift) - 1;
    for (int32_t i = 0; i < p.num_pairs; ++i) {
      if (fail_copies_after_pairs_ >= 0 && i >= fail_copies_after_pairs_) {
        return absl::InternalError("fake backend: copy failed part way");
      }
      const int32_t s = p.src[i];
      const int32_t d = p.dst[i];
      for (int32_t r = 0; r < p.num_regions; ++r) {
        const char* from = static_cast<const char*>(p.chunks[s >> p.chunk_shift]) +
                           r * p.chunk_region_bytes + (s & mask) * p.block_bytes;
        char* to = static_cast<char*>(p.chunks[d >> p.chunk_shift]) + r * p.chunk_region_bytes +
                   (d & mask) * p.block_bytes;
        std::memcpy(to, from, p.block_bytes);
      }
    }
    return absl::OkStatus();
  }

  void FailAllocationsAfter(int64_t n) { fail_allocations_after_ = n; }
  // QueryDeviceMemory reports a device of total_bytes (< 0: none, the default).
  void SimulateDevice(int64_t total_bytes) { device_total_bytes_ = total_bytes; }
  // Every later CopyBlocks copies its first n pairs, then fails (n < 0: never).
  void FailCopiesAfterPairs(int32_t n) { fail_copies_after_pairs_ = n; }
  int64_t num_allocations() const { return num_allocations_; }
  int64_t live_buffers() const { return live_buffers_; }
  int64_t live_bytes() const { return live_bytes_; }
  int64_t num_copy_calls() const { return num_copy_calls_; }
  int64_t num_copied_blocks() const { return num_copied_blocks_; }

 protected:
  void Free(void* data, size_t bytes) override {
    --live_buffers_;
    live_bytes_ -= static_cast<int64_t>(bytes);
    ::operator delete(data);
  }

 private:
  static absl::Status Unimplemented() { return absl::UnimplementedError("fake backend"); }

  int64_t fail_allocations_after_ = -1;
  int64_t device_total_bytes_ = -1;
  int32_t fail_copies_after_pairs_ = -1;
  int64_t num_allocations_ = 0;
  int64_t live_buffers_ = 0;
  int64_t live_bytes_ = 0;
  int64_t num_copy_calls_ = 0;
  int64_t num_copied_blocks_ = 0;
};

}  // namespace kvd

#endif  // KVD_TESTS_CACHE_FAKE_BACKEND_H_
