// What CudaBackend says of its memory (kvd_memory_bytes, kvd_device_memory_bytes): the bytes
// of its live buffers, the workspace it keeps for itself, and the device's own free and total
// memory, which any thread may ask for.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/blas_gemm.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using MemoryAccountingTest = GpuVsCpuTest;

TEST_F(MemoryAccountingTest, LiveBuffersAreCountedUntilFreed) {
  const int64_t before = gpu().allocated_bytes();
  absl::StatusOr<DeviceBuffer> a = gpu().Allocate(size_t{3} << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<float> host(1000, 0.5f);
  absl::StatusOr<DeviceBuffer> w = gpu().UploadWeights(host.data(), host.size());
  ASSERT_TRUE(w.ok()) << w.status();
  // The weights in bf16; the upload's staging buffer is gone again.
  EXPECT_EQ(gpu().allocated_bytes(), before + (int64_t{3} << 20) + 2000);
  a->Reset();
  w->Reset();
  EXPECT_EQ(gpu().allocated_bytes(), before);
}

TEST_F(MemoryAccountingTest, WorkspaceIsCublasLtsThenGrowsWithTheOpsScratch) {
  EXPECT_EQ(gpu().workspace_bytes(), static_cast<int64_t>(BlasGemm::kWorkspaceBytes));
  // Rows past the skinny kernel: cuBLAS, after the input is converted to bf16 in scratch.
  const int m = 32, n = 64, k = 64;
  const std::vector<float> weights = RandomFloats(size_t{n} * k, 1);
  absl::StatusOr<DeviceBuffer> w = gpu().UploadWeights(weights.data(), weights.size());
  ASSERT_TRUE(w.ok()) << w.status();
  DeviceBuffer in = Upload(gpu(), RandomFloats(size_t{m} * k, 2));
  DeviceBuffer out = Poisoned(gpu(), sizeof(float) * m * n);
  const int64_t allocated = gpu().allocated_bytes();
  ASSERT_TRUE(gpu()
                  .Matmul({.out = out.as<float>(),
                           .in = in.as<float>(),
                           .weight = w->data(),
                           .weight_dtype = DType::kBF16,
                           .m = m,
                           .n = n,
                           .k = k})
                  .ok());
  ASSERT_TRUE(gpu().Synchronize().ok());
  EXPECT_GE(gpu().workspace_bytes(),
            static_cast<int64_t>(BlasGemm::kWorkspaceBytes) + (int64_t{1} << 20));
  EXPECT_EQ(gpu().allocated_bytes(), allocated);  // scratch is not a DeviceBuffer
}

TEST_F(MemoryAccountingTest, DeviceMemoryIsTheDriversFromAnyThread) {
  const std::optional<Backend::DeviceMemory> now = gpu().QueryDeviceMemory();
  ASSERT_TRUE(now.has_value());
  EXPECT_GT(now->total_bytes, int64_t{1} << 30);
  EXPECT_GT(now->free_bytes, 0);
  EXPECT_LE(now->free_bytes, now->total_bytes);
  // A 1 GiB buffer shows in free memory (other processes may move it too, but not by that
  // much in the time of this test on a machine lent to it).
  absl::StatusOr<DeviceBuffer> gib = gpu().Allocate(size_t{1} << 30);
  ASSERT_TRUE(gib.ok()) << gib.status();
  std::optional<Backend::DeviceMemory> from_thread;
  std::thread([&] { from_thread = gpu().QueryDeviceMemory(); }).join();
  ASSERT_TRUE(from_thread.has_value());
  EXPECT_EQ(from_thread->total_bytes, now->total_bytes);
  EXPECT_LE(from_thread->free_bytes, now->free_bytes - (int64_t{1} << 30) + (int64_t{64} << 20));
}

}  // namespace
}  // namespace kvd::gpu_test
