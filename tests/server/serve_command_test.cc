#include "server/serve_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/daemon.h"
#include "tools/device.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModel[] = KVD_SHARED_DIR "/models/stories260K.bin";

struct Result {
  int code;
  std::string out;
  std::string err;
};

// Runs `kvd serve` with args that make it stop before listening. Unless args set them, the
// daemon would listen on a free local port without metrics: a regression that lets it start
// then hangs the test (it serves until a signal), but never takes a public port.
Result Serve(std::vector<std::string> args) {
  auto has = [&](const std::string& flag) {
    return std::any_of(args.begin(), args.end(), [&](const std::string& a) {
      return a == flag || a.starts_with(flag + "=");
    });
  };
  if (!has("--help") && !has("--grpc-address")) {
    args.insert(args.end(), {"--grpc-address", "127.0.0.1:0"});
  }
  if (!has("--help") && !has("--metrics-address")) {
    args.insert(args.end(), {"--metrics-address", ""});
  }
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

TEST(ServeCommandTest, HelpSaysWhichSignalsDrainAndWhatASecondOneDoes) {
  const std::string help = Serve({"--help"}).out;
  EXPECT_THAT(help, HasSubstr("SIGTERM, SIGINT and SIGHUP drain (SIGHUP reloads nothing, and "
                              "under nohup\nstays ignored)"));
  EXPECT_THAT(help, HasSubstr("a second signal during the drain ends it at once"));
}

TEST(ServeCommandTest, BadOverrideNamesTheKey) {
  const Result r = Serve({"--model", kModel, "--set", "scheduler.admission_policy=fifo"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("scheduler.admission_policy"));
  EXPECT_THAT(r.err, HasSubstr("fifo"));
}

TEST(ServeCommandTest, UnsupportedQuantizationIsRefusedNotReplaced) {
  // The seeds' example with int4: it loads and validates, but this build cannot run int4 KV.
  const std::string path = WriteConfig("seed_int4.yaml",
                                       "kv_cache_config:\n"
                                       "  max_batch_size: 8\n"
                                       "  max_seq_length: 4096\n"
                                       "  quantization: int4\n"
                                       "  memory_pool:\n"
                                       "    initial_size: 16GB\n"
                                       "    max_size: 32GB\n"
                                       "  eviction_policy: lru\n");
  const Result r = Serve({"--config", path, "--model", kModel});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kv_cache_config.quantization"));
  EXPECT_THAT(r.err, HasSubstr("'int4'"));
  EXPECT_THAT(r.err, HasSubstr("none, int8"));  // what the CPU runs
}

TEST(ServeCommandTest, MissingModelNamesThePath) {
  const Result r = Serve({"--model", "/nonexistent/model.bin", "--grpc-address", "127.0.0.1:0",
                          "--metrics-address", ""});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/model.bin"));
}

// A key flag's bad value is a usage error (2) naming the flag the user typed, as any other
// flag's; the same value from --set or the file is a config error (1) naming the key.
TEST(ServeCommandTest, BadKeyFlagValuesAreUsageErrorsNamingTheFlag) {
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--device", "tpu"},
                                                        {"--grpc-address", "localhost"},
                                                        {"--metrics-address", "0.0.0.0:70000"}}) {
    const Result r = Serve({"--model", kModel, flag, value});
    EXPECT_EQ(r.code, 2) << flag << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("kvd serve: ", flag, ": ")));
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("'", value, "'")));
    EXPECT_THAT(r.err, HasSubstr("usage: kvd serve"));
    EXPECT_EQ(r.out, "");
  }
  const Result set = Serve({"--model", kModel, "--set", "model.device=tpu"});
  EXPECT_EQ(set.code, 1);
  EXPECT_THAT(set.err, HasSubstr("model.device: invalid value 'tpu'"));
  EXPECT_THAT(set.err, Not(HasSubstr("--device")));
}

// --set repeats (both spellings), in order: the last value of a key wins.
TEST(ServeCommandTest, SetRepeatsAndAppliesInOrder) {
  const Result r = Serve({"--model", kModel, "--set", "kv_cache_config.memory_pool.initial_size=0",
                          "--set", "kv_cache_config.memory_pool.max_size=1B",
                          "--set=kv_cache_config.memory_pool.max_size=2B"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kv_cache_config.memory_pool.max_size: 2B is smaller than one KV "
                               "block"));
}

// The error names what the user set: the flag, or the config key.
TEST(ServeCommandTest, CudaWithoutAGpuIsRefusedNamingTheFlagOrKey) {
  if (ResolveDevice("cuda").ok()) GTEST_SKIP() << "a GPU is visible: cuda would start";
  for (const auto& [args, named] :
       {std::pair{std::vector<std::string>{"--model", kModel, "--device", "cuda"}, "--device: "},
        std::pair{std::vector<std::string>{"--model", kModel, "--set", "model.device=cuda"},
                  "model.device: "}}) {
    const Result r = Serve(args);
    EXPECT_EQ(r.code, 1);
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(named, "'cuda'")));
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

// Sets an environment variable and the working directory for one test, then restores both.
class ScopedEnvAndCwd {
 public:
  ScopedEnvAndCwd(const char* name, const std::string& value, const std::filesystem::path& cwd)
      : name_(name), old_cwd_(std::filesystem::current_path()) {
    if (const char* old = std::getenv(name); old != nullptr) old_value_ = old;
    setenv(name, value.c_str(), 1);
    std::filesystem::current_path(cwd);
  }
  ~ScopedEnvAndCwd() {
    std::filesystem::current_path(old_cwd_);
    if (old_value_.has_value()) {
      setenv(name_, old_value_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::filesystem::path old_cwd_;
  std::optional<std::string> old_value_;
};

// The container image keeps the model in /opt/kvd/models and runs with WORKDIR / and no home
// folder; a mounted --config replaces its CMD, --model included. KVD_MODEL_CACHE (as for
// scripts/fetch-model) names the folder, so an empty model.path still finds the model.
TEST(DefaultModelPathTest, LooksInKvdModelCache) {
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / "kvd_default_model";
  std::filesystem::remove_all(root);
  const std::filesystem::path cache = root / "cache";
  const std::filesystem::path cwd = root / "cwd";  // no ../shared/models beside it
  std::filesystem::create_directories(cache);
  std::filesystem::create_directories(cwd);
  const std::string model = (cache / "stories260K.bin").string();
  ScopedEnvAndCwd scoped("KVD_MODEL_CACHE", cache.string(), cwd);

  // Not there yet: the error lists the folder.
  absl::StatusOr<std::string> path = DefaultModelPath();
  EXPECT_EQ(path.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(path.status().message(), AllOf(HasSubstr(model), HasSubstr("KVD_MODEL_CACHE")));
  Result r = Serve({"--grpc-address", "127.0.0.1:0", "--metrics-address", ""});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(model));

  std::filesystem::create_symlink(kModel, model);
  path = DefaultModelPath();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, model);
  // `kvd serve` without a model loads it from there, then looks for its tokenizer beside it
  // (absent here, so startup stops before listening).
  r = Serve({"--grpc-address", "127.0.0.1:0", "--metrics-address", ""});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("model.tokenizer"), HasSubstr(cache.string())));
  EXPECT_EQ(r.out, "");
  std::filesystem::remove_all(root);
}

// The tokenizer and the pool are checked before the weights load (which takes minutes for a
// large checkpoint): a checkpoint whose weights would fail to load (a NaN) and that has no
// tokenizer beside it fails naming the tokenizer, and an impossible pool names the pool.
TEST(ServeCommandTest, CheapChecksComeBeforeTheWeightsLoad) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "kvd_cheap_checks_first";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "stories260K.bin").string();
  std::filesystem::copy_file(kModel, model);
  {
    std::fstream file(model, std::ios::in | std::ios::out | std::ios::binary);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    file.seekp(7 * 4);  // the first weight, after the v0 header's seven int32s
    file.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
  }
  Result r = Serve({"--model", model, "--device", "cpu", "--metrics-address", ""});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("model.tokenizer"));
  EXPECT_THAT(r.err, Not(HasSubstr("nan")));

  std::filesystem::copy_file(std::filesystem::path(kModel).parent_path() / "tok512.bin",
                             dir / "tok512.bin");
  r = Serve({"--model", model, "--device", "cpu", "--metrics-address", "", "--set",
             "kv_cache_config.memory_pool.initial_size=0", "--set",
             "kv_cache_config.memory_pool.max_size=1KiB"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              HasSubstr("kv_cache_config.memory_pool.max_size: 1KiB is smaller than one KV block"));

  r = Serve({"--model", model, "--device", "cpu", "--metrics-address", ""});  // now the NaN
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("token_embedding[0] is nan"), HasSubstr(model)));
  std::filesystem::remove_all(dir);
}

TEST(ServeCommandTest, CudaGraphsTakesOnOrOff) {
  const Result r = Serve({"--model", kModel, "--cuda-graphs", "maybe"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--cuda-graphs"));
  EXPECT_THAT(r.err, HasSubstr("maybe"));
}

}  // namespace
}  // namespace kvd
