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
  EXPECT_EQ(*ResolveDevice("cpu"), Device::kCpu);
  const auto cuda = ResolveDevice("cuda");
  if (cuda.ok()) GTEST_SKIP() << "a GPU is visible: cuda resolves";
  EXPECT_THAT(cuda.status().message(), HasSubstr("'cuda'"));
  EXPECT_THAT(cuda.status().message(), Not(HasSubstr("--device")));
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
