#include "tests/gpu/gpu_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"

namespace kvd::gpu_test {

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float x;
  std::memcpy(&x, &wide, sizeof(x));
  return x;
}

float RoundBf16(float x) { return Bf16ToFloat(Bf16Bits(x)); }

std::vector<float> RoundBf16(std::vector<float> v) {
  for (float& x : v) x = RoundBf16(x);
  return v;
}

void OrDie(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    ADD_FAILURE() << what << ": " << s;
    std::abort();
  }
}

DeviceBuffer Upload(Backend& b, const void* data, size_t bytes) {
  DeviceBuffer buffer = OrDie(b.Allocate(bytes), "Allocate");
  if (data != nullptr) {
    OrDie(b.CopyToDevice(buffer.data(), data, bytes), "CopyToDevice");
  } else {
    const std::vector<uint8_t> poison(bytes, kPoisonByte);
    OrDie(b.CopyToDevice(buffer.data(), poison.data(), bytes), "CopyToDevice");
  }
  return buffer;
}

DeviceBuffer Poisoned(Backend& b, size_t bytes) { return Upload(b, nullptr, bytes); }

std::vector<uint8_t> DownloadBytes(Backend& b, const void* src, size_t bytes) {
  OrDie(b.Synchronize(), "Synchronize");
  std::vector<uint8_t> out(bytes);
  OrDie(b.CopyToHost(out.data(), src, bytes), "CopyToHost");
  return out;
}

std::vector<float> DownloadFloats(Backend& b, const void* src, size_t count) {
  std::vector<float> out(count);
  const std::vector<uint8_t> bytes = DownloadBytes(b, src, count * sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

::testing::AssertionResult FailedWith(const absl::Status& s, absl::StatusCode code,
                                      const std::string& prefix, const std::string& text) {
  if (s.code() != code) {
    return ::testing::AssertionFailure()
           << "want " << absl::StatusCodeToString(code) << ", got " << s;
  }
  if (!absl::StartsWith(s.message(), prefix) || !absl::StrContains(s.message(), text)) {
    return ::testing::AssertionFailure() << "message should start with \"" << prefix
                                         << "\" and contain \"" << text << "\": " << s;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                    const std::vector<float>& expected, double rtol, double atol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  size_t violations = 0;
  size_t worst = 0;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double e = expected[i];
    const double allowed = atol + rtol * std::abs(e);
    const double ratio = std::isnan(a) || std::isnan(e) ? INFINITY : std::abs(a - e) / allowed;
    if (ratio > 1.0) ++violations;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (violations == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << violations << " of " << actual.size() << " elements differ; worst [" << worst
         << "]: actual " << actual[worst] << " expected " << expected[worst] << " (error "
         << std::abs(double{actual[worst]} - double{expected[worst]}) << ", allowed "
         << atol + rtol * std::abs(double{expected[worst]}) << ")";
}

void GpuVsCpuTest::SetUp() {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = CudaBackend::Create(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  gpu_ = *std::move(gpu);
  cpu_ = std::make_unique<CpuBackend>(
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace kvd::gpu_test
