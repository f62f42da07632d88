// CudaBackend's graph capture (cuda_backend.h, "CUDA graphs"): while a capture records, the
// calls it cannot hold (copies, waits, FillRandom, growing a scratch buffer, a second
// BeginCapture, LaunchGraph) fail with FailedPrecondition naming the call and change nothing;
// the ops around them are still recorded, and run only when the graph is launched.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gemv_kernels.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using CaptureTest = GpuVsCpuTest;

::testing::AssertionResult Refused(const absl::Status& s, const std::string& names) {
  if (s.code() != absl::StatusCode::kFailedPrecondition) {
    return ::testing::AssertionFailure() << "want FailedPrecondition, got " << s;
  }
  if (!absl::StrContains(s.message(), names)) {
    return ::testing::AssertionFailure() << "message does not name " << names << ": " << s;
  }
  return ::testing::AssertionSuccess();
}

TEST_F(CaptureTest, RefusedCallsChangeNothingAndTheRecordedOpsRunOnLaunch) {
  // The op to record: SiLU-mul of 4 rows.
  const int rows = 4;
  const int dim = 256;
  const std::vector<float> gate_up = RandomFloats(size_t(rows) * 2 * dim, 7, -4, 4);
  DeviceBuffer gpu_in = Upload(gpu(), gate_up);
  DeviceBuffer gpu_out = Poisoned(gpu(), size_t(rows) * dim * 4);
  SiluMulParams silu;
  silu.num_rows = rows;
  silu.dim = dim;
  silu.gate_stride = 2 * dim;
  silu.up_stride = 2 * dim;
  silu.out = gpu_out.as<float>();
  silu.gate = gpu_in.as<float>();
  silu.up = gpu_in.as<float>() + dim;

  // A Matmul past the skinny kernel's rows: cuBLAS, through a bf16 input scratch this new
  // backend has never grown.
  const int m = cuda::kMaxSkinnyRows + 8;
  const int n = 64;
  const int k = 128;
  DeviceBuffer weight = OrDie(
      gpu().UploadWeights(RandomFloats(size_t(n) * k, 8).data(), size_t(n) * k), "UploadWeights");
  DeviceBuffer mm_in = Upload(gpu(), RandomFloats(size_t(m) * k, 9));
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

  ASSERT_TRUE(gpu().BeginCapture().ok());
  EXPECT_TRUE(gpu().capturing());
  EXPECT_TRUE(Refused(gpu().BeginCapture(), "BeginCapture"));
  EXPECT_TRUE(Refused(gpu().CopyToDevice(target.data(), zeros.data(), 64), "CopyToDevice"));
  EXPECT_TRUE(Refused(gpu().CopyToHost(host.data(), target.data(), 64), "CopyToHost"));
  EXPECT_TRUE(Refused(gpu().Synchronize(), "Synchronize"));
  EXPECT_TRUE(Refused(gpu().FillRandom(target.data(), DType::kF32, 16,
                                       RandomFill{.key = RandomFillKey(1, 2), .scale = 1.0f}),
                      "FillRandom"));
  EXPECT_TRUE(Refused(gpu().Matmul(mm), "Matmul: scratch must grow"));
  EXPECT_TRUE(Refused(gpu().LaunchGraph(CudaBackend::Graph()), "LaunchGraph"));
  const absl::Status recorded = gpu().SiluMul(silu);
  absl::StatusOr<CudaBackend::Graph> graph = gpu().EndCapture();
  ASSERT_TRUE(recorded.ok()) << recorded;
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(gpu().capturing());
  EXPECT_TRUE(Refused(gpu().EndCapture().status(), "EndCapture"));

  // Nothing ran yet: the refused copy and fill wrote nothing, the host buffer is as it was,
  // and the recorded op waits for the launch.
  EXPECT_EQ(DownloadBytes(gpu(), target.data(), 64), untouched);
  EXPECT_EQ(host, std::vector<uint8_t>(64, 0xab));
  EXPECT_EQ(DownloadBytes(gpu(), gpu_out.data(), gpu_out.bytes()), poisoned_out);

  ASSERT_TRUE(gpu().LaunchGraph(*graph).ok());
  DeviceBuffer cpu_in = Upload(cpu(), gate_up);
  DeviceBuffer cpu_out = Poisoned(cpu(), size_t(rows) * dim * 4);
  silu.out = cpu_out.as<float>();
  silu.gate = cpu_in.as<float>();
  silu.up = cpu_in.as<float>() + dim;
  ASSERT_TRUE(cpu().SiluMul(silu).ok());
  EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), size_t(rows) * dim),
                       DownloadFloats(cpu(), cpu_out.data(), size_t(rows) * dim), 1e-6, 1e-7));

  // Outside a capture the refused calls work again; the Matmul grows its scratch and runs.
  const absl::Status grown = gpu().Matmul(mm);
  EXPECT_TRUE(grown.ok()) << grown;
  EXPECT_TRUE(gpu().CopyToDevice(target.data(), zeros.data(), 64).ok());
  EXPECT_EQ(DownloadBytes(gpu(), target.data(), 64), zeros);
}

}  // namespace
}  // namespace kvd::gpu_test
