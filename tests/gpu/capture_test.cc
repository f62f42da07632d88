// CudaBackend's graph capture (cuda_backend.h, "CUDA graphs"): while a capture records, the
// calls it cannot hold (allocations, copies, waits, FillRandom, growing a scratch buffer, a
// second BeginCapture, LaunchGraph) fail with FailedPrecondition naming the call and change
// nothing; the ops before and after them are still recorded, and run only when the graph is
// launched. A buffer freed during the capture is freed after it.

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gemv_kernels.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using CaptureTest = GpuVsCpuTest;

// A call refused during a capture: FailedPrecondition, naming the call.
::testing::AssertionResult Refused(const absl::Status& s, const std::string& name) {
  return FailedWith(s, absl::StatusCode::kFailedPrecondition, "", name);
}

// SiLU-mul of rows [first, first + count) of `gate_up` ([rows][2 * dim], gate then up) into
// the same rows of `out` ([rows][dim]).
SiluMulParams SiluRows(float* out, const float* gate_up, int dim, int first, int count) {
  return SiluMulParams{.out = out + int64_t{first} * dim,
                       .gate = gate_up + int64_t{first} * 2 * dim,
                       .up = gate_up + int64_t{first} * 2 * dim + dim,
                       .num_rows = count,
                       .dim = dim,
                       .gate_stride = 2 * dim,
                       .up_stride = 2 * dim};
}

TEST_F(CaptureTest, RefusedCallsChangeNothingAndTheRecordedOpsRunOnLaunch) {
  // The ops to record: SiLU-mul of rows 0-1 before the refused calls, of rows 2-3 after.
  const int rows = 4;
  const int dim = 256;
  const std::vector<float> gate_up = RandomFloats(size_t(rows) * 2 * dim, 7, -4, 4);
  DeviceBuffer gpu_in = Upload(gpu(), gate_up);
  DeviceBuffer gpu_out = Poisoned(gpu(), size_t(rows) * dim * 4);

  // A Matmul past the skinny kernel's rows: cuBLAS, through a bf16 input scratch this new
  // backend has never grown. Inputs are bf16 values, as the GPU rounds them, so the CPU
  // multiplies the same numbers.
  const int m = cuda::kMaxSkinnyRows + 8;
  const int n = 64;
  const int k = 128;
  const std::vector<float> mm_weight = RoundBf16(RandomFloats(size_t(n) * k, 8));
  const std::vector<float> mm_input = RoundBf16(RandomFloats(size_t(m) * k, 9));
  DeviceBuffer weight =
      OrDie(gpu().UploadWeights(mm_weight.data(), mm_weight.size()), "UploadWeights");
  DeviceBuffer mm_in = Upload(gpu(), mm_input);
  DeviceBuffer mm_out = Poisoned(gpu(), size_t(m) * n * 4);
  const MatmulParams mm{.out = mm_out.as<float>(),
                        .in = mm_in.as<float>(),
                        .weight = weight.data(),
                        .weight_dtype = DType::kBF16,
                        .m = m,
                        .n = n,
                        .k = k};

  // What the refused copy and fill would have overwritten.
  DeviceBuffer target = Poisoned(gpu(), 64);
  const std::vector<uint8_t> untouched = DownloadBytes(gpu(), target.data(), 64);
  const std::vector<uint8_t> poisoned_out = DownloadBytes(gpu(), gpu_out.data(), gpu_out.bytes());
  const std::vector<uint8_t> zeros(64, 0);
  std::vector<uint8_t> host(64, 0xab);
  const uint64_t epoch = gpu().scratch_epoch();
  // Freed while capturing: cudaFree there would invalidate the capture; EndCapture frees it.
  DeviceBuffer freed_in_capture = Poisoned(gpu(), 4096);

  ASSERT_TRUE(gpu().BeginCapture().ok());
  EXPECT_TRUE(gpu().capturing());
  const absl::Status recorded_before =
      gpu().SiluMul(SiluRows(gpu_out.as<float>(), gpu_in.as<float>(), dim, 0, 2));
  EXPECT_TRUE(Refused(gpu().BeginCapture(), "BeginCapture"));
  EXPECT_TRUE(Refused(gpu().CopyToDevice(target.data(), zeros.data(), 64), "CopyToDevice"));
  EXPECT_TRUE(Refused(gpu().CopyToHost(host.data(), target.data(), 64), "CopyToHost"));
  EXPECT_TRUE(Refused(gpu().Synchronize(), "Synchronize"));
  EXPECT_TRUE(Refused(gpu().FillRandom(target.data(), DType::kF32, 16,
                                       RandomFill{.key = RandomFillKey(1, 2), .scale = 1.0f}),
                      "FillRandom"));
  EXPECT_TRUE(Refused(gpu().Matmul(mm), "Matmul: scratch must grow"));
  EXPECT_TRUE(Refused(gpu().LaunchGraph(CudaBackend::Graph()), "LaunchGraph"));
  EXPECT_TRUE(Refused(gpu().Allocate(4096).status(), "Allocate"));
  EXPECT_TRUE(Refused(gpu().UploadWeights(mm_weight.data(), 16).status(), "UploadWeights"));
  { DeviceBuffer gone = std::move(freed_in_capture); }
  const absl::Status recorded_after =
      gpu().SiluMul(SiluRows(gpu_out.as<float>(), gpu_in.as<float>(), dim, 2, 2));
  absl::StatusOr<CudaBackend::Graph> graph = gpu().EndCapture();
  ASSERT_TRUE(recorded_before.ok()) << recorded_before;
  ASSERT_TRUE(recorded_after.ok()) << recorded_after;
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(gpu().capturing());
  EXPECT_TRUE(Refused(gpu().EndCapture().status(), "EndCapture"));

  // Nothing ran yet: the refused copy and fill wrote nothing, the host buffer and the
  // scratch buffers are as they were, and the recorded ops wait for the launch.
  EXPECT_EQ(DownloadBytes(gpu(), target.data(), 64), untouched);
  EXPECT_EQ(host, std::vector<uint8_t>(64, 0xab));
  EXPECT_EQ(gpu().scratch_epoch(), epoch);
  EXPECT_EQ(DownloadBytes(gpu(), gpu_out.data(), gpu_out.bytes()), poisoned_out);

  ASSERT_TRUE(gpu().LaunchGraph(*graph).ok());
  DeviceBuffer cpu_in = Upload(cpu(), gate_up);
  DeviceBuffer cpu_out = Poisoned(cpu(), size_t(rows) * dim * 4);
  ASSERT_TRUE(cpu().SiluMul(SiluRows(cpu_out.as<float>(), cpu_in.as<float>(), dim, 0, rows)).ok());
  EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), size_t(rows) * dim),
                       DownloadFloats(cpu(), cpu_out.data(), size_t(rows) * dim), 1e-6, 1e-7));

  // Outside a capture the refused calls work again: the Matmul grows its scratch and
  // computes what the CPU does (summation order apart: see matmul_test.cc).
  const absl::Status grown = gpu().Matmul(mm);
  ASSERT_TRUE(grown.ok()) << grown;
  EXPECT_NE(gpu().scratch_epoch(), epoch);
  DeviceBuffer cpu_w = Upload(cpu(), mm_weight);
  DeviceBuffer cpu_mm_in = Upload(cpu(), mm_input);
  DeviceBuffer cpu_mm_out = Poisoned(cpu(), size_t(m) * n * 4);
  ASSERT_TRUE(cpu()
                  .Matmul(MatmulParams{.out = cpu_mm_out.as<float>(),
                                       .in = cpu_mm_in.as<float>(),
                                       .weight = cpu_w.data(),
                                       .weight_dtype = DType::kF32,
                                       .m = m,
                                       .n = n,
                                       .k = k})
                  .ok());
  EXPECT_TRUE(AllClose(DownloadFloats(gpu(), mm_out.data(), size_t(m) * n),
                       DownloadFloats(cpu(), cpu_mm_out.data(), size_t(m) * n), 1e-4,
                       3e-4 * std::sqrt(double(k))));
  EXPECT_TRUE(gpu().CopyToDevice(target.data(), zeros.data(), 64).ok());
  EXPECT_EQ(DownloadBytes(gpu(), target.data(), 64), zeros);
}

}  // namespace
}  // namespace kvd::gpu_test
