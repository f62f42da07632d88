#ifndef KVD_TESTS_GPU_GPU_TEST_UTIL_H_
#define KVD_TESTS_GPU_GPU_TEST_UTIL_H_

// Shared scaffolding of the GPU tests: every CUDA op runs beside the CPU reference backend
// on the same seeded random inputs, with outputs poisoned beforehand, and the results are
// compared element by element.
//
// Inputs that the CUDA backend stores narrower (bf16 weights, bf16 KV) are rounded to bf16
// before either backend sees them, so both compute on identical values and the only
// difference left is the order of fp32 accumulation (and libm vs CUDA math ulps).

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace kvd::gpu_test {

// Byte every output buffer is filled with before an op: 0xFFFF is a NaN as bf16 and
// 0xFFFFFFFF a NaN as fp32, so anything an op fails to write shows up.
constexpr uint8_t kPoisonByte = 0xFF;

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// bf16 bits -> float, and a float rounded as __float2bfloat16_rn (kvd::Bf16Bits, dtype.h).
float Bf16ToFloat(uint16_t bits);
float RoundBf16(float x);
std::vector<float> RoundBf16(std::vector<float> v);

// The value of `or_die` or, on error, a message and abort: for test infrastructure
// (allocation, copies), never for the op under test.
template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    ADD_FAILURE() << what << ": " << v.status();
    std::abort();
  }
  return *std::move(v);
}
void OrDie(const absl::Status& s, const char* what);

// A buffer of `bytes` on `b` holding `data` (or kPoisonByte when data is null).
DeviceBuffer Upload(Backend& b, const void* data, size_t bytes);
template <typename T>
DeviceBuffer Upload(Backend& b, const std::vector<T>& v) {
  return Upload(b, v.data(), v.size() * sizeof(T));
}
DeviceBuffer Poisoned(Backend& b, size_t bytes);

// `bytes` of backend memory at `src`, after the backend finished its queued work.
std::vector<uint8_t> DownloadBytes(Backend& b, const void* src, size_t bytes);
std::vector<float> DownloadFloats(Backend& b, const void* src, size_t count);

// Checks |actual[i] - expected[i]| <= atol + rtol * |expected[i]| for all i (NaN fails),
// naming the worst element and the number of violations.
::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                    const std::vector<float>& expected, double rtol, double atol);

// Checks that `s` failed with `code` and that its message starts with `prefix` and contains
// `text`.
::testing::AssertionResult FailedWith(const absl::Status& s, absl::StatusCode code,
                                      const std::string& prefix, const std::string& text);

// Fixture for every GPU test: a CudaBackend on device 0 and the CPU reference. Skips when
// the machine has no GPU, so the binary can also be run (and pass vacuously) elsewhere.
class GpuVsCpuTest : public ::testing::Test {
 protected:
  void SetUp() override;

  CudaBackend& gpu() { return *gpu_; }
  CpuBackend& cpu() { return *cpu_; }

 private:
  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<CpuBackend> cpu_;
};

}  // namespace kvd::gpu_test

#endif  // KVD_TESTS_GPU_GPU_TEST_UTIL_H_
