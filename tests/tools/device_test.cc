// A device name's errors name the value; the command names where it came from (the
// --device flag or the config's model.device), never a flag the user did not type.

#include "tools/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/tools/run_kvd.h"

#if defined(KVD_HAVE_CUDA)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace kvd {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kModel = std::string(KVD_SHARED_DIR) + "/models/stories260K.bin";

TEST(ResolveDeviceTest, ErrorsNameTheValueAndNoSource) {
  EXPECT_EQ(ResolveDevice("tpu").status().message(), "'tpu' is not one of cpu, cuda, auto");
  EXPECT_EQ(ResolveDevice("cpu")->device, Device::kCpu);
  const auto cuda = ResolveDevice("cuda");
  if (cuda.ok()) GTEST_SKIP() << "a GPU is visible: cuda resolves";
  EXPECT_THAT(cuda.status().message(), HasSubstr("'cuda'"));
  EXPECT_THAT(cuda.status().message(), Not(HasSubstr("--device")));
}

// "auto" is cuda only where cuda would run: built with CUDA, a GPU visible, of compute
// capability 9.0 or newer, and the cuBLAS libraries loading; otherwise the CPU, saying why
// when a GPU is visible (a machine with a driver but no cuBLAS, or an older GPU, serves on
// the CPU instead of failing to start). "cuda" refuses each of those with its reason.
TEST(ChooseDeviceTest, AutoIsCudaOnlyWhereCudaWouldRun) {
  const CudaProbe ready{true, 1, absl::OkStatus(), 90};
  for (const char* name : {"auto", "AUTO", "cuda", "Cuda"}) {
    const auto choice = ChooseDevice(name, ready);
    ASSERT_TRUE(choice.ok()) << name << ": " << choice.status();
    EXPECT_EQ(choice->device, Device::kCuda) << name;
    EXPECT_EQ(choice->fallback_reason, "") << name;
  }
  EXPECT_EQ(ChooseDevice("cpu", ready)->device, Device::kCpu);

  const CudaProbe not_built{false, 0, absl::OkStatus()};
  EXPECT_EQ(ChooseDevice("auto", not_built)->device, Device::kCpu);
  EXPECT_EQ(ChooseDevice("auto", not_built)->fallback_reason, "");
  EXPECT_EQ(ChooseDevice("cuda", not_built).status().code(), absl::StatusCode::kFailedPrecondition);

  const CudaProbe no_gpu{true, 0, absl::OkStatus()};
  EXPECT_EQ(ChooseDevice("auto", no_gpu)->device, Device::kCpu);
  EXPECT_EQ(ChooseDevice("auto", no_gpu)->fallback_reason, "");
  EXPECT_EQ(ChooseDevice("cuda", no_gpu).status().message(),
            "'cuda': no CUDA device is visible (no GPU or no driver)");
  const CudaProbe no_driver{true, absl::UnavailableError("cudaGetDeviceCount: no driver"),
                            absl::OkStatus()};
  EXPECT_EQ(ChooseDevice("auto", no_driver)->device, Device::kCpu);
  EXPECT_EQ(ChooseDevice("cuda", no_driver).status().message(),
            "'cuda': no CUDA device is visible (no GPU or no driver): cudaGetDeviceCount: no "
            "driver");

  const CudaProbe no_cublas{true, 2, absl::UnavailableError("cannot load libcublasLt.so.13"), 90};
  const auto fallback = ChooseDevice("auto", no_cublas);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(fallback->device, Device::kCpu);
  EXPECT_EQ(fallback->fallback_reason,
            "a GPU is visible but the CUDA backend cannot run: cannot load libcublasLt.so.13");
  const auto cuda = ChooseDevice("cuda", no_cublas);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cuda.status().message(), "'cuda': cannot load libcublasLt.so.13");

  // An A100 (8.0): no kernel image for it. A newer GPU than Hopper runs the PTX.
  const CudaProbe ampere{true, 1, absl::OkStatus(), 80};
  const auto old_gpu = ChooseDevice("auto", ampere);
  ASSERT_TRUE(old_gpu.ok()) << old_gpu.status();
  EXPECT_EQ(old_gpu->device, Device::kCpu);
  EXPECT_EQ(old_gpu->fallback_reason,
            "a GPU is visible but the CUDA backend cannot run: GPU 0 has compute capability 8.0; "
            "kvd's CUDA kernels need 9.0 (Hopper) or newer");
  EXPECT_EQ(ChooseDevice("cuda", ampere).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ChooseDevice("cuda", ampere).status().message(),
            "'cuda': GPU 0 has compute capability 8.0; kvd's CUDA kernels need 9.0 (Hopper) or "
            "newer");
  const CudaProbe blackwell{true, 1, absl::OkStatus(), 100};
  EXPECT_EQ(ChooseDevice("auto", blackwell)->device, Device::kCuda);
  const CudaProbe unreadable{true, 1, absl::OkStatus(),
                             absl::UnavailableError("compute capability: unknown error")};
  EXPECT_EQ(ChooseDevice("auto", unreadable)->device, Device::kCpu);
  EXPECT_THAT(ChooseDevice("cuda", unreadable).status().message(),
              HasSubstr("compute capability could not be read: compute capability: unknown"));

  EXPECT_EQ(ChooseDevice("gpu", ready).status().message(), "'gpu' is not one of cpu, cuda, auto");
}

// The device must also run the model: the CUDA backend has attention kernels for head_dim 64
// and 128 and up to 32 (stories260K's 8), not for e.g. stories15M's 48. There "auto" runs on
// the CPU, saying why, and "cuda" refuses, rather than start and fail every request.
TEST(FitDeviceToModelTest, AutoFallsBackAndCudaRefusesAHeadDimWithoutAKernel) {
  const CudaProbe ready{true, 1, absl::OkStatus(), 90};
  const DeviceChoice automatic = *ChooseDevice("auto", ready);
  const DeviceChoice cuda = *ChooseDevice("cuda", ready);
  EXPECT_TRUE(automatic.automatic);
  EXPECT_FALSE(cuda.automatic);
  for (int head_dim : {8, 32, 64, 128}) {
    EXPECT_EQ(FitDeviceToModel(automatic, head_dim)->device, Device::kCuda) << head_dim;
    EXPECT_EQ(FitDeviceToModel(cuda, head_dim)->device, Device::kCuda) << head_dim;
  }
  const auto fallback = FitDeviceToModel(automatic, 48);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(fallback->device, Device::kCpu);
  EXPECT_EQ(fallback->fallback_reason,
            "the model's head_dim 48 has no CUDA attention kernel (64 and 128, or up to 32)");
  const auto refused = FitDeviceToModel(cuda, 96);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "'cuda': the model's head_dim 96 has no CUDA attention kernel (64 and 128, or up to "
            "32); the CPU backend runs it");
  // The CPU runs any head_dim.
  const DeviceChoice cpu = *ChooseDevice("cpu", ready);
  EXPECT_EQ(FitDeviceToModel(cpu, 48)->device, Device::kCpu);
  EXPECT_EQ(FitDeviceToModel(cpu, 48)->fallback_reason, "");
}

#if defined(KVD_HAVE_CUDA)
// Where the runtime could not count devices (no driver, or one too old for this runtime),
// --device cuda says why, in the runtime's words.
TEST(ResolveDeviceTest, CudaGivesTheRuntimesReasonForNoDevice) {
  const absl::StatusOr<int> count = CountCudaDevices();
  if (count.ok() && *count > 0) GTEST_SKIP() << "a GPU is visible: cuda resolves";
  const auto cuda = ResolveDevice("cuda");
  ASSERT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable) << cuda.status();
  const std::string message(cuda.status().message());
  if (count.ok()) {
    EXPECT_THAT(message, EndsWith("(no GPU or no driver)"));
  } else {
    EXPECT_THAT(message, HasSubstr(": cudaGetDeviceCount: "));
    EXPECT_THAT(message, HasSubstr(std::string(count.status().message())));
  }
}
#endif

TEST(KvdDeviceTest, GenerateNamesTheFlag) {
  if (ResolveDevice("cuda").ok()) GTEST_SKIP() << "a GPU is visible: cuda would run";
  const KvdResult r = RunKvd("generate --model " + kModel + " --prompt hi --device cuda");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("kvd generate: --device: 'cuda': "));
}

TEST(KvdDeviceTest, ServeWithTheConfigKeyNamesTheKeyNotTheFlag) {
  if (ResolveDevice("cuda").ok()) GTEST_SKIP() << "a GPU is visible: cuda would start";
  char dir_template[] = "/tmp/kvd_device_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string config = std::string(dir_template) + "/kvd.yaml";
  std::ofstream(config) << "model:\n  device: cuda\n";
  // Local addresses: if the check regressed, the daemon would serve (and the test hang) on a
  // free local port, not on the default public ones.
  const KvdResult r = RunKvd("serve --model " + kModel + " --config " + config +
                             " --grpc-address 127.0.0.1:0 --metrics-address ''");
  std::remove(config.c_str());
  rmdir(dir_template);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("kvd serve: model.device: 'cuda': "));
  EXPECT_THAT(r.out, Not(HasSubstr("--device")));
}

}  // namespace
}  // namespace kvd
