#include "config/config_loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// The issue's example, verbatim.
constexpr char kSeedsExample[] = R"(kv_cache_config:
  max_batch_size: 8
  max_seq_length: 4096
  quantization: int8
  memory_pool:
    initial_size: 16GB
    max_size: 32GB
  eviction_policy: lru
)";

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(ParseConfigYamlTest, SeedsExampleLoadsWithExactValues) {
  absl::StatusOr<InferenceConfig> config = ParseConfigYaml(kSeedsExample);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kv_cache.max_batch_size, 8);
  EXPECT_EQ(config->kv_cache.max_seq_length, 4096);
  EXPECT_EQ(config->kv_cache.quantization, KvQuantization::kInt8);
  EXPECT_EQ(config->kv_cache.memory_pool.initial_size_bytes, 16'000'000'000);
  EXPECT_EQ(config->kv_cache.memory_pool.max_size_bytes, 32'000'000'000);
  EXPECT_EQ(config->kv_cache.eviction_policy, EvictionPolicyKind::kLru);
  // Everything it does not mention keeps its default.
  InferenceConfig expected;
  expected.kv_cache.quantization = KvQuantization::kInt8;
  expected.kv_cache.memory_pool.initial_size_bytes = 16'000'000'000;
  expected.kv_cache.memory_pool.max_size_bytes = 32'000'000'000;
  EXPECT_EQ(*config, expected);
}

TEST(ParseConfigYamlTest, EmptyDocumentsGiveValidDefaults) {
  for (const char* yaml : {"", "\n", "# only a comment\n", "---\n", "kv_cache_config:\n"}) {
    absl::StatusOr<InferenceConfig> config = ParseConfigYaml(yaml);
    ASSERT_TRUE(config.ok()) << "'" << yaml << "': " << config.status();
    EXPECT_EQ(*config, InferenceConfig{}) << yaml;
  }
  EXPECT_TRUE(InferenceConfig{}.Validate().ok());
}

TEST(ParseConfigYamlTest, ReadsEverySection) {
  absl::StatusOr<InferenceConfig> config = ParseConfigYaml(R"(
model:
  path: /models/llama.gguf
  device: CUDA
  seed: 7
server:
  grpc_address: "[::]:8000"
  metrics_address: ""
  drain_timeout: 1.5s
  num_threads: 4
kv_cache_config:
  block_size: 32
  enable_prefix_caching: off
  session:
    idle_timeout: 2m
    max_pinned_fraction: 0.25
  defrag:
    max_pause: 500us
scheduler:
  admission_policy: reserve_max
  predictor_quantile: 0.95
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model.path, "/models/llama.gguf");
  EXPECT_EQ(config->model.device, DeviceKind::kCuda);
  EXPECT_EQ(config->model.seed, 7u);
  EXPECT_EQ(config->server.grpc_address, "[::]:8000");
  EXPECT_EQ(config->server.metrics_address, "");
  EXPECT_EQ(config->server.drain_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(config->server.num_threads, 4);
  EXPECT_EQ(config->kv_cache.block_size, 32);
  EXPECT_FALSE(config->kv_cache.enable_prefix_caching);
  EXPECT_EQ(config->kv_cache.session.idle_timeout, absl::Minutes(2));
  EXPECT_EQ(config->kv_cache.session.max_pinned_fraction, 0.25);
  EXPECT_EQ(config->kv_cache.defrag.max_pause, absl::Microseconds(500));
  EXPECT_EQ(config->scheduler.admission_policy, AdmissionPolicyKind::kReserveMax);
  EXPECT_EQ(config->scheduler.predictor_quantile, 0.95);
}

struct BadCase {
  const char* name;
  const char* yaml;
  std::vector<const char*> expected;  // substrings the error must contain
};

class BadConfigTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadConfigTest, FailsNamingTheKeyAndTheValue) {
  absl::StatusOr<InferenceConfig> config = ParseConfigYaml(GetParam().yaml);
  ASSERT_FALSE(config.ok()) << GetParam().yaml;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : GetParam().expected) {
    EXPECT_THAT(Message(config.status()), HasSubstr(part));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadConfigTest,
    ::testing::Values(
        BadCase{"UnknownTopLevelKey",
                "kv_cache:\n  block_size: 16\n",
                {"line 1", "unknown key 'kv_cache'", "did you mean 'kv_cache_config'",
                 "model, server, kv_cache_config, scheduler"}},
        BadCase{"UnknownNestedKey",
                "kv_cache_config:\n  blok_size: 16\n",
                {"line 2", "unknown key 'kv_cache_config.blok_size'",
                 "did you mean 'kv_cache_config.block_size'"}},
        BadCase{"KeyInTheWrongSection",
                "kv_cache_config:\n  grpc_address: x:1\n",
                {"kv_cache_config.grpc_address", "did you mean 'server.grpc_address'"}},
        BadCase{"UnknownDeepKey",
                "kv_cache_config:\n  memory_pool:\n    initial: 1GB\n",
                {"line 3", "kv_cache_config.memory_pool.initial'", "initial_size, max_size"}},
        BadCase{"KnownKeyNameMissingItsSection",
                "kv_cache_config:\n  max_size: 1GiB\n",
                {"line 2", "did you mean 'kv_cache_config.memory_pool.max_size'"}},
        BadCase{"KeyNameCutShort",
                "kv_cache_config:\n  memory_pool:\n    max: 1GiB\n",
                {"line 3", "did you mean 'kv_cache_config.memory_pool.max_size'"}},
        BadCase{"MisspeltSectionHoldingAMap",
                "kv_cache_config:\n  memry_pool:\n    max_size: 1GiB\n",
                {"line 2", "did you mean 'kv_cache_config.memory_pool'"}},
        BadCase{"KeyWithoutAName",
                "kv_cache_config:\n  : 16\n",
                {"line 2", "a key must be a plain name, got nothing (blank, ~ or null)",
                 "allowed keys in 'kv_cache_config': max_batch_size, "}},
        BadCase{"BlockSizeZero",
                "kv_cache_config:\n  block_size: 0\n",
                {"kv_cache_config.block_size", "'0'", "power of two in [1, 256]"}},
        BadCase{"BlockSizeNotPowerOfTwo",
                "kv_cache_config:\n  block_size: 3\n",
                {"kv_cache_config.block_size", "'3'", "power of two"}},
        BadCase{"BlockSizeTooLarge",
                "kv_cache_config:\n  block_size: 1024\n",
                {"kv_cache_config.block_size", "'1024'", "[1, 256]"}},
        BadCase{"NegativeSize",
                "kv_cache_config:\n  memory_pool:\n    max_size: -1GB\n",
                {"line 3", "kv_cache_config.memory_pool.max_size", "'-1GB'", "negative", "KiB"}},
        BadCase{"UnknownSizeUnit",
                "kv_cache_config:\n  memory_pool:\n    initial_size: 16XB\n",
                {"kv_cache_config.memory_pool.initial_size", "'16XB'", "unknown unit", "GiB"}},
        BadCase{"InitialAboveMax",
                "kv_cache_config:\n  memory_pool:\n    initial_size: 32GB\n    max_size: 16GB\n",
                {"kv_cache_config.memory_pool.initial_size", "'32GB'",
                 "at most kv_cache_config.memory_pool.max_size", "'16GB'"}},
        BadCase{
            "UnknownQuantization",
            "kv_cache_config:\n  quantization: int3\n",
            {"kv_cache_config.quantization", "'int3'", "one of none, bf16, fp16, fp8, int8, int4"}},
        BadCase{"UnknownEvictionPolicy",
                "kv_cache_config:\n  eviction_policy: fifo\n",
                {"kv_cache_config.eviction_policy", "'fifo'", "one of lru, chunk_lru"}},
        BadCase{"NegativeIdleTimeout",
                "kv_cache_config:\n  session:\n    idle_timeout: -1s\n",
                {"kv_cache_config.session.idle_timeout", "'-1s'", "duration >= 0"}},
        BadCase{"PinnedFractionAboveOne",
                "kv_cache_config:\n  session:\n    max_pinned_fraction: 1.5\n",
                {"kv_cache_config.session.max_pinned_fraction", "'1.5'", "[0, 1]"}},
        BadCase{"ZeroMaxPause",
                "kv_cache_config:\n  defrag:\n    max_pause: 0ms\n",
                {"kv_cache_config.defrag.max_pause", "'0ms'", "duration > 0"}},
        BadCase{
            "AdmissionPolicyTypo",
            "scheduler:\n  admission_policy: predicetd\n",
            {"scheduler.admission_policy", "'predicetd'", "predicted, reserve_max, optimistic"}},
        BadCase{"MapWhereNumberExpected",
                "kv_cache_config:\n  max_batch_size:\n    a: 1\n",
                {"line 2", "kv_cache_config.max_batch_size", "a map", "integer"}},
        BadCase{"ListWhereSectionExpected",
                "scheduler: [1, 2]\n",
                {"'scheduler' must be a map", "a list"}},
        BadCase{"NotAnInteger",
                "scheduler:\n  max_num_batched_tokens: lots\n",
                {"scheduler.max_num_batched_tokens", "'lots'", "integer"}},
        BadCase{"IntegerOverflow",
                "kv_cache_config:\n  max_seq_length: 99999999999\n",
                {"kv_cache_config.max_seq_length", "'99999999999'"}},
        BadCase{"BadBool",
                "kv_cache_config:\n  enable_prefix_caching: maybe\n",
                {"kv_cache_config.enable_prefix_caching", "'maybe'", "true or false"}},
        BadCase{"BadAddress",
                "server:\n  grpc_address: localhost\n",
                {"server.grpc_address", "'localhost'", "host:port"}},
        BadCase{"BadPort",
                "server:\n  metrics_address: 0.0.0.0:70000\n",
                {"server.metrics_address", "'0.0.0.0:70000'", "0-65535"}},
        BadCase{"EmptyValueForNumber",
                "kv_cache_config:\n  max_batch_size:\n",
                {"line 2", "kv_cache_config.max_batch_size: no value"}},
        // A template's unset variable: not metrics off, nor the default model, unnoticed.
        BadCase{"BlankString",
                "server:\n  metrics_address:\n",
                {"line 2", "server.metrics_address: no value (blank, ~ or null)",
                 "(an empty string is written \"\")"}},
        BadCase{"TildeString", "model:\n  path: ~\n", {"model.path: no value"}},

        BadCase{"DuplicateKey",
                "kv_cache_config:\n  block_size: 16\n  block_size: 32\n",
                {"line 3", "duplicate key 'kv_cache_config.block_size'"}},
        BadCase{"BadYamlSyntax",
                "kv_cache_config:\n  max_batch_size: 8\n   bad: [1, 2\n",
                {"invalid YAML at line 3"}},
        BadCase{
            "UnclosedQuote", "model:\n  path: \"abc\" junk\n", {"invalid YAML at line", "column"}},
        BadCase{"TwoDocuments",
                "model:\n  seed: 1\n---\nmodel:\n  seed: 2\n",
                {"one YAML document", "found 2"}},
        BadCase{"ScalarDocument", "just a string\n", {"the document must be a map"}},
        // yaml-cpp 0.7's LoadAll loops forever, allocating, on a document that starts so.
        BadCase{"StrayComma", ",\n", {"invalid YAML at line 1, column 1"}},
        BadCase{"StrayCommaInSecondDocument",
                "model:\n  seed: 1\n---\n  ,\n",
                {"invalid YAML at line 4, column 3"}},
        BadCase{"BatchAboveTokenBudget",
                "kv_cache_config:\n  max_batch_size: 64\nscheduler:\n  max_num_batched_tokens: "
                "32\n",
                {"kv_cache_config.max_batch_size", "'64'", "scheduler.max_num_batched_tokens"}},
        BadCase{"SinksFillTheWindow",
                "kv_cache_config:\n  sliding_window:\n    window_tokens: 4\n    sink_tokens: 4\n",
                {"kv_cache_config.sliding_window.sink_tokens", "'4'", "less than"}}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(LoadConfigFileTest, MissingFileIsNotFoundAndNamesThePath) {
  absl::StatusOr<InferenceConfig> config = LoadConfigFile("/nonexistent/kvd.yaml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()), HasSubstr("/nonexistent/kvd.yaml"));
}

// A directory reads as an empty document through an ifstream, which would silently be the
// defaults: `--config /etc/kvd` (the ConfigMap's mount point, not the file in it).
TEST(LoadConfigFileTest, DirectoryIsInvalidArgumentAndNamesThePath) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/kvd_config_dir");
  std::filesystem::create_directories(dir);
  for (const absl::Status& status : {LoadConfigFile(dir).status(), LoadConfig(dir, {}).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(Message(status), AllOf(HasSubstr(dir), HasSubstr("is a directory")));
  }
  std::filesystem::remove(dir);
}

// Only a directory is refused: a pipe (`--config <(envsubst < kvd.yaml)`) reads as a file.
TEST(LoadConfigFileTest, APipeIsReadLikeAFile) {
  const std::string fifo = absl::StrCat(::testing::TempDir(), "/kvd_config_fifo_", getpid());
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::thread writer([&fifo] { std::ofstream(fifo) << "kv_cache_config:\n  block_size: 32\n"; });
  const absl::StatusOr<InferenceConfig> config = LoadConfigFile(fifo);
  writer.join();
  std::filesystem::remove(fifo);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kv_cache.block_size, 32);
}

TEST(ApplyOverrideTest, ChangesOnlyTheNamedKey) {
  InferenceConfig config;
  ASSERT_TRUE(ApplyOverride(config, "kv_cache_config.block_size", "32").ok());
  ASSERT_TRUE(ApplyOverride(config, "kv_cache_config.memory_pool.max_size", "64GiB").ok());
  ASSERT_TRUE(ApplyOverride(config, "server.drain_timeout", "5").ok());
  ASSERT_TRUE(ApplyOverride(config, "model.path", "synthetic:llama3-8b").ok());
  InferenceConfig expected;
  expected.kv_cache.block_size = 32;
  expected.kv_cache.memory_pool.max_size_bytes = int64_t{64} << 30;
  expected.server.drain_timeout = absl::Seconds(5);
  expected.model.path = "synthetic:llama3-8b";
  EXPECT_EQ(config, expected);
}

TEST(ApplyOverrideTest, RejectsUnknownKeysSectionsAndBadValuesLeavingConfigUnchanged) {
  InferenceConfig config;
  absl::Status status = ApplyOverride(config, "kv_cache_config.blocksize", "32");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), AllOf(HasSubstr("unknown key 'kv_cache_config.blocksize'"),
                                     HasSubstr("did you mean 'kv_cache_config.block_size'")));
  status = ApplyOverride(config, "kv_cache_config.memory_pool", "1GB");
  EXPECT_THAT(Message(status), AllOf(HasSubstr("is a section"), HasSubstr("initial_size")));
  status = ApplyOverride(config, "kv_cache_config.block_size", "48");
  EXPECT_THAT(Message(status), AllOf(HasSubstr("kv_cache_config.block_size"), HasSubstr("'48'"),
                                     HasSubstr("power of two")));
  status = ApplyOverride(config, "kv_cache_config.quantization", "int3");
  EXPECT_THAT(Message(status), AllOf(HasSubstr("'int3'"), HasSubstr("int4")));
  // Under a section that does not exist, or under a key, the allowed names are those of the
  // nearest section that does (they were once an empty list).
  status = ApplyOverride(config, "servr.drain_timeout", "1s");
  EXPECT_THAT(Message(status), AllOf(HasSubstr("did you mean 'server.drain_timeout'"),
                                     HasSubstr("allowed sections: model, server, ")));
  status = ApplyOverride(config, "server.drain_timeout.x", "1s");
  EXPECT_THAT(Message(status), HasSubstr("allowed keys in 'server': grpc_address, "));
  EXPECT_EQ(config, InferenceConfig{});
}

TEST(ApplyOverridesTest, AppliesInOrderThenValidatesTheWhole) {
  InferenceConfig config;
  const std::vector<std::string> ok = {"kv_cache_config.memory_pool.initial_size=16GB",
                                       "kv_cache_config.memory_pool.max_size=32GB",
                                       "scheduler.admission_policy=optimistic"};
  ASSERT_TRUE(ApplyOverrides(config, ok).ok());
  EXPECT_EQ(config.kv_cache.memory_pool.initial_size_bytes, 16'000'000'000);
  EXPECT_EQ(config.scheduler.admission_policy, AdmissionPolicyKind::kOptimistic);

  InferenceConfig other;
  const std::vector<std::string> inverted = {"kv_cache_config.memory_pool.initial_size=64GiB"};
  EXPECT_THAT(Message(ApplyOverrides(other, inverted)),
              HasSubstr("at most kv_cache_config.memory_pool.max_size"));
  EXPECT_THAT(Message(ApplyOverrides(other, inverted)), Not(HasSubstr("default")));
  // Lowering max_size alone under initial_size's default: the error says why initial_size is
  // named.
  InferenceConfig smaller;
  const std::vector<std::string> max_only = {"kv_cache_config.memory_pool.max_size=512MiB"};
  EXPECT_THAT(Message(ApplyOverrides(smaller, max_only)),
              AllOf(HasSubstr("kv_cache_config.memory_pool.initial_size: invalid value '1GiB'"),
                    HasSubstr("'512MiB'"), HasSubstr("initial_size is at its default")));
  const std::vector<std::string> no_equals = {"kv_cache_config.block_size"};
  EXPECT_THAT(Message(ApplyOverrides(other, no_equals)), HasSubstr("dotted.key=value"));
}

TEST(ApplyOverrideTest, OverridesWinOverTheFile) {
  absl::StatusOr<InferenceConfig> config = ParseConfigYaml(kSeedsExample);
  ASSERT_TRUE(config.ok());
  const std::vector<std::string> flags = {"kv_cache_config.quantization=bf16",
                                          "kv_cache_config.max_batch_size=4"};
  ASSERT_TRUE(ApplyOverrides(*config, flags).ok());
  EXPECT_EQ(config->kv_cache.quantization, KvQuantization::kBF16);
  EXPECT_EQ(config->kv_cache.max_batch_size, 4);
  EXPECT_EQ(config->kv_cache.memory_pool.max_size_bytes, 32'000'000'000);
}

// config/README.md: file, then overrides, then Validate() once on the result.
TEST(LoadConfigTest, ValidatesTheFileAndTheOverridesTogether) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/load_config_test.yaml");
  std::ofstream(path) << "kv_cache_config:\n  memory_pool:\n    initial_size: 16GiB\n";
  // Alone the file is invalid (16GiB above the default max_size of 8GiB)...
  EXPECT_THAT(Message(LoadConfigFile(path).status()), HasSubstr("initial_size"));
  // ...which the override repairs.
  const std::vector<std::string> bigger = {"kv_cache_config.memory_pool.max_size=32GiB"};
  absl::StatusOr<InferenceConfig> config = LoadConfig(path, bigger);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kv_cache.memory_pool.initial_size_bytes, int64_t{16} << 30);
  EXPECT_EQ(config->kv_cache.memory_pool.max_size_bytes, int64_t{32} << 30);

  // The other way round: a valid file that an override breaks fails, naming the keys.
  const std::vector<std::string> smaller = {"kv_cache_config.memory_pool.max_size=32GiB",
                                            "kv_cache_config.memory_pool.initial_size=64GiB"};
  EXPECT_THAT(Message(LoadConfig(path, smaller).status()),
              HasSubstr("at most kv_cache_config.memory_pool.max_size"));
  // No file: defaults and overrides; file errors keep naming the file.
  ASSERT_TRUE(LoadConfig(std::nullopt, {}).ok());
  EXPECT_EQ(*LoadConfig(std::nullopt, {}), InferenceConfig{});
  EXPECT_EQ(LoadConfig("/nonexistent/kvd.yaml", {}).status().code(), absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

// config/README.md: an IPv6 address must be quoted in YAML, where `[` starts a list.
TEST(ParseConfigYamlTest, IPv6AddressesAreQuoted) {
  absl::StatusOr<InferenceConfig> config =
      ParseConfigYaml("server:\n  grpc_address: \"[::]:50051\"\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server.grpc_address, "[::]:50051");
  EXPECT_FALSE(ParseConfigYaml("server:\n  grpc_address: [::]:50051\n").ok());
}

TEST(DumpConfigYamlTest, RoundTripsThroughParse) {
  InferenceConfig changed;
  changed.model.path = "/models/a b/model.gguf";
  changed.model.tokenizer = "tok: with colon #and hash";
  changed.model.device = DeviceKind::kCpu;
  changed.model.seed = 18446744073709551615u;
  changed.server.metrics_address = "";
  changed.server.drain_timeout = absl::Milliseconds(1500);
  changed.kv_cache.block_size = 256;
  changed.kv_cache.quantization = KvQuantization::kFP8;
  changed.kv_cache.memory_pool.initial_size_bytes = 16'000'000'000;
  changed.kv_cache.memory_pool.max_size_bytes = (int64_t{32} << 30) + 1;
  changed.kv_cache.enable_prefix_caching = false;
  changed.kv_cache.session.max_pinned_fraction = 0.1 + 0.2;  // not exactly 0.3
  changed.kv_cache.defrag.interval = absl::Nanoseconds(1234567);
  changed.kv_cache.sliding_window.window_tokens = 1024;
  changed.scheduler.predictor_quantile = 1.0 / 3.0;
  changed.scheduler.admission_policy = AdmissionPolicyKind::kReserveMax;
  ASSERT_TRUE(changed.Validate().ok()) << changed.Validate();

  for (const InferenceConfig& config : {InferenceConfig{}, changed}) {
    const std::string yaml = DumpConfigYaml(config);
    absl::StatusOr<InferenceConfig> parsed = ParseConfigYaml(yaml);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << yaml;
    EXPECT_EQ(*parsed, config) << yaml;
  }
}

// Every string key is a path or an address. A NUL would cut it short where the OS reads it
// ("a\0b" opens "a"); a CR (a script with Windows line ends) or a tab would name another
// file than the one meant. Refused from YAML, from an override and in a config built in code.
TEST(ConfigStringKeyTest, AControlCharacterIsRefusedWhereverItComesFrom) {
  const absl::StatusOr<InferenceConfig> parsed =
      ParseConfigYaml("model:\n  path: \"/models/a\\0b.bin\"\n");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(Message(parsed.status()),
              AllOf(HasSubstr("model.path: invalid value"),
                    HasSubstr("contains the control character 0x00 at byte 9")));

  InferenceConfig config;
  const absl::Status set = ApplyOverride(config, "server.grpc_address", "unix:/run/kvd.sock\r");
  // The value is shown escaped: a raw CR would send the terminal's cursor back over the line.
  EXPECT_THAT(Message(set),
              AllOf(HasSubstr("server.grpc_address: invalid value 'unix:/run/kvd.sock\\r'"),
                    HasSubstr("control character 0x0d at byte 18")));
  EXPECT_EQ(Message(set).find('\r'), std::string::npos);
  EXPECT_EQ(config, InferenceConfig{});

  config.model.tokenizer = "tok\t.bin";
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("model.tokenizer: invalid value 'tok\\t.bin'"),
                    HasSubstr("without control characters")));
  config.model.tokenizer = "tok\x7f.bin";
  EXPECT_THAT(Message(config.Validate()), HasSubstr("model.tokenizer"));
}

// Strings round trip when they are UTF-8, spaces at either end included. Bytes that are
// not UTF-8, which a path may hold, load from a file as they are, but need not come back
// through DumpConfigYaml: YAML is Unicode text (yaml-cpp writes U+FFFD in quoted strings).
TEST(DumpConfigYamlTest, RoundTripsUtf8StringsAndLoadsOtherBytesAsTheyAre) {
  InferenceConfig config;
  config.model.path = " /leading space/caf\xC3\xA9 \xE2\x98\x83.bin ";
  ASSERT_TRUE(config.Validate().ok());
  absl::StatusOr<InferenceConfig> parsed = ParseConfigYaml(DumpConfigYaml(config));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model.path, config.model.path);

  parsed = ParseConfigYaml("model:\n  path: /models/caf\xE9.bin\n");  // Latin-1
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model.path, "/models/caf\xE9.bin");
}

TEST(DumpConfigYamlTest, UsesCanonicalSpellings) {
  absl::StatusOr<InferenceConfig> config = ParseConfigYaml(kSeedsExample);
  ASSERT_TRUE(config.ok());
  const std::string yaml = DumpConfigYaml(*config);
  EXPECT_THAT(yaml, AllOf(HasSubstr("kv_cache_config:\n"), HasSubstr("initial_size: 16GB\n"),
                          HasSubstr("max_size: 32GB\n"), HasSubstr("quantization: int8\n"),
                          HasSubstr("idle_timeout: 30s\n"), HasSubstr("max_pause: 2ms\n")));
}

}  // namespace
}  // namespace kvd
