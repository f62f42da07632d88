#include "server/serve_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/device.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModel[] = KVD_SHARED_DIR "/models/stories260K.bin";

struct Result {
  int code;
  std::string out;
  std::string err;
};

// Runs `kvd serve` with args that make it stop before listening.
Result Serve(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunServeCommand(args, out, err);
  return {code, out.str(), err.str()};
}

std::string WriteConfig(const std::string& name, const std::string& yaml) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path) << yaml;
  return path;
}

TEST(ServeCommandTest, HelpListsTheFlags) {
  const Result r = Serve({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--config", "--model", "--device", "--grpc-address", "--metrics-address",
                           "--cuda-graphs", "--set"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
}

TEST(ServeCommandTest, UnknownFlagIsAUsageError) {
  const Result r = Serve({"--modle", kModel});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--modle"));
}

TEST(ServeCommandTest, MissingConfigFileNamesIt) {
  const Result r = Serve({"--config", "/nonexistent/kvd.yaml"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/kvd.yaml"));
}

TEST(ServeCommandTest, BadConfigFileNamesTheKey) {
  const std::string path = WriteConfig("bad_block.yaml", "kv_cache_config:\n  block_size: 3\n");
  const Result r = Serve({"--config", path, "--model", kModel});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kv_cache_config.block_size"));
  EXPECT_EQ(r.out, "");  // nothing was started
}

// The file and the overrides are validated together, once: a file that only an override
// completes is fine (here: initial_size above the default max_size, max_size on the command
// line), so startup gets as far as the model.
TEST(ServeCommandTest, OverridesCompleteTheFileBeforeValidation) {
  const std::string path = WriteConfig("needs_override.yaml",
                                       "kv_cache_config:\n"
                                       "  memory_pool:\n"
                                       "    initial_size: 16GiB\n");
  const Result r = Serve({"--config", path, "--set", "kv_cache_config.memory_pool.max_size=32GiB",
                          "--model", "/nonexistent/model.bin", "--metrics-address", ""});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/model.bin"));
  EXPECT_THAT(r.err, Not(HasSubstr("initial_size")));
}

TEST(ServeCommandTest, PoolSmallerThanOneBlockNamesMaxSize) {
  const Result r = Serve({"--model", kModel, "--grpc-address", "127.0.0.1:0", "--metrics-address",
                          "", "--set", "kv_cache_config.memory_pool.initial_size=0", "--set",
                          "kv_cache_config.memory_pool.max_size=1B"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kv_cache_config.memory_pool.max_size: 1B is smaller than one KV "
                               "block"));
  EXPECT_THAT(r.err, HasSubstr("allowed: at least"));
  EXPECT_EQ(r.out, "");
}

TEST(ServeCommandTest, HelpSaysWhatASecondSignalDoes) {
  EXPECT_THAT(Serve({"--help"}).out, HasSubstr("a second SIGTERM/SIGINT"));
}

TEST(ServeCommandTest, BadOverrideNamesTheKey) {
  const Result r = Serve({"--model", kModel, "--set", "scheduler.admission_policy=fifo"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("scheduler.admission_policy"));
  EXPECT_THAT(r.err, HasSubstr("fifo"));
}

TEST(ServeCommandTest, UnsupportedQuantizationIsRefusedNotReplaced) {
  // The seeds' example: it loads and validates, but this build cannot run int8 KV.
  const std::string path = WriteConfig("seed_int8.yaml",
                                       "kv_cache_config:\n"
                                       "  max_batch_size: 8\n"
                                       "  max_seq_length: 4096\n"
                                       "  quantization: int8\n"
                                       "  memory_pool:\n"
                                       "    initial_size: 16GB\n"
                                       "    max_size: 32GB\n"
                                       "  eviction_policy: lru\n");
  const Result r = Serve({"--config", path, "--model", kModel});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kv_cache_config.quantization"));
  EXPECT_THAT(r.err, HasSubstr("int8"));
}

TEST(ServeCommandTest, MissingModelNamesThePath) {
  const Result r = Serve({"--model", "/nonexistent/model.bin", "--grpc-address", "127.0.0.1:0",
                          "--metrics-address", ""});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/model.bin"));
}

TEST(ServeCommandTest, UnknownDeviceNamesTheKeyAndTheValue) {
  const Result r = Serve({"--model", kModel, "--device", "tpu"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("model.device"));
  EXPECT_THAT(r.err, HasSubstr("tpu"));
  EXPECT_EQ(r.out, "");
}

TEST(ServeCommandTest, CudaWithoutAGpuIsRefusedNamingTheKey) {
  if (ResolveDevice("cuda").ok()) GTEST_SKIP() << "a GPU is visible: cuda would start";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--model", kModel, "--device", "cuda"},
        std::vector<std::string>{"--model", kModel, "--set", "model.device=cuda"}}) {
    const Result r = Serve(args);
    EXPECT_EQ(r.code, 1);
    EXPECT_THAT(r.err, HasSubstr("model.device"));
    EXPECT_THAT(r.err, HasSubstr("cuda"));
    EXPECT_EQ(r.out, "");
  }
}

TEST(ServeCommandTest, CpuRunsOnlyItsNativeKvDtype) {
  // bf16 is a valid name, and what CUDA stores, but the CPU reference stores fp32 only.
  const Result r =
      Serve({"--model", kModel, "--device", "cpu", "--set", "kv_cache_config.quantization=bf16"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kv_cache_config.quantization"));
  EXPECT_THAT(r.err, HasSubstr("bf16"));
}

TEST(ServeCommandTest, CudaGraphsTakesOnOrOff) {
  const Result r = Serve({"--model", kModel, "--cuda-graphs", "maybe"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--cuda-graphs"));
  EXPECT_THAT(r.err, HasSubstr("maybe"));
}

}  // namespace
}  // namespace kvd
