#include "config/inference_config.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "config/config_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(InferenceConfigTest, DefaultsAreValidAndDocumentedValues) {
  const InferenceConfig config;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_EQ(config.model.device, DeviceKind::kAuto);
  EXPECT_EQ(config.server.grpc_address, "0.0.0.0:50051");
  EXPECT_EQ(config.server.metrics_address, "0.0.0.0:50052");  // next to gRPC's 50051
  EXPECT_EQ(config.server.drain_timeout, absl::Seconds(30));
  EXPECT_EQ(config.server.max_waiting_requests, 256);
  EXPECT_EQ(config.kv_cache.max_batch_size, 8);
  EXPECT_EQ(config.kv_cache.block_size, 16);
  EXPECT_EQ(config.kv_cache.quantization, KvQuantization::kNone);
  EXPECT_EQ(config.kv_cache.eviction_policy, EvictionPolicyKind::kLru);
  EXPECT_TRUE(config.kv_cache.enable_prefix_caching);
  EXPECT_EQ(config.kv_cache.session.idle_timeout, absl::Seconds(30));
  EXPECT_EQ(config.kv_cache.session.max_pinned_fraction, 0.5);
  EXPECT_EQ(config.kv_cache.defrag.max_pause, absl::Milliseconds(2));
  EXPECT_EQ(config.scheduler.max_num_batched_tokens, 2048);
  EXPECT_EQ(config.scheduler.admission_policy, AdmissionPolicyKind::kPredicted);
  EXPECT_EQ(config.scheduler.predictor_quantile, 0.9);
}

TEST(InferenceConfigTest, ValidateCatchesBadValuesSetInCode) {
  InferenceConfig config;
  config.kv_cache.block_size = 24;
  EXPECT_THAT(Message(config.Validate()), AllOf(HasSubstr("kv_cache_config.block_size"),
                                                HasSubstr("'24'"), HasSubstr("power of two")));

  config = InferenceConfig{};
  config.kv_cache.session.idle_timeout = absl::Seconds(-1);
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("kv_cache_config.session.idle_timeout"), HasSubstr("-1s")));

  config = InferenceConfig{};
  config.kv_cache.memory_pool.initial_size_bytes = -5;
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("kv_cache_config.memory_pool.initial_size"), HasSubstr("-5")));

  config = InferenceConfig{};
  config.kv_cache.quantization = static_cast<KvQuantization>(99);  // no such value
  EXPECT_THAT(Message(config.Validate()), HasSubstr("kv_cache_config.quantization"));

  config = InferenceConfig{};
  config.scheduler.predictor_quantile = -0.1;
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("scheduler.predictor_quantile"), HasSubstr("-0.1")));
}

TEST(InferenceConfigTest, ValidateChecksRulesBetweenKeys) {
  InferenceConfig config;
  config.kv_cache.memory_pool.initial_size_bytes = 2'000;
  config.kv_cache.memory_pool.max_size_bytes = 1'000;
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("kv_cache_config.memory_pool.initial_size"), HasSubstr("'2KB'"),
                    HasSubstr("'1KB'")));
  config.kv_cache.memory_pool.max_size_bytes = 2'000;
  EXPECT_TRUE(config.Validate().ok());  // equal is allowed
}

TEST(CheckQuantizationSupportedTest, RefusesClearlyWithoutFallback) {
  KvCacheConfig config;
  config.quantization = KvQuantization::kInt4;
  const std::vector<KvQuantization> supported = {KvQuantization::kNone, KvQuantization::kBF16};
  absl::Status status = CheckQuantizationSupported(config, "cuda", supported, " (on cpu: none)");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  // The device that cannot run it, not the build, is named: another device may.
  EXPECT_THAT(Message(status), AllOf(HasSubstr("kv_cache_config.quantization"), HasSubstr("'int4'"),
                                     HasSubstr("the cuda device cannot run it"),
                                     HasSubstr("supported on cuda: none, bf16 (on cpu: none)"),
                                     Not(HasSubstr("build"))));
  config.quantization = KvQuantization::kBF16;
  EXPECT_TRUE(CheckQuantizationSupported(config, "cuda", supported).ok());
  EXPECT_FALSE(CheckQuantizationSupported(config, "cpu", {}).ok());
}

// The sections containing `path`, outermost first: "a.b.c" -> {"a", "a.b"}.
std::vector<std::string> SectionsOf(const std::string& path) {
  std::vector<std::string> sections;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
    sections.push_back(path.substr(0, dot));
  }
  return sections;
}

TEST(ConfigKeysTest, EveryKeyIsUniqueAndSectionsAreContiguous) {
  std::set<std::string> closed;  // sections the table has left
  std::vector<std::string> previous;
  for (const ConfigKey& key : ConfigKeys()) {
    EXPECT_EQ(FindConfigKey(key.path), &key) << key.path;
    EXPECT_FALSE(IsConfigSection(key.path)) << key.path;
    EXPECT_FALSE(key.allowed.empty()) << key.path;
    EXPECT_FALSE(key.description.empty()) << key.path;
    const std::vector<std::string> sections = SectionsOf(key.path);
    for (const std::string& section : previous) {
      if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
        closed.insert(section);
      }
    }
    // DumpConfigYaml writes each section as one YAML map, so it may not be reopened.
    for (const std::string& section : sections) {
      EXPECT_EQ(closed.count(section), 0u) << key.path << " reopens " << section;
    }
    previous = sections;
  }
  EXPECT_TRUE(IsConfigSection("kv_cache_config"));
  EXPECT_TRUE(IsConfigSection("kv_cache_config.memory_pool"));
  EXPECT_FALSE(IsConfigSection("kv_cache"));
  EXPECT_FALSE(IsConfigSection("kv_cache_config.block_size"));
  EXPECT_EQ(NearestConfigSection("kv_cache_config.memory_pool.max"), "kv_cache_config.memory_pool");
  EXPECT_EQ(NearestConfigSection("kv_cache_config.memry_pool.max"), "kv_cache_config");
  EXPECT_EQ(NearestConfigSection("server.drain_timeout.x"), "server");
  EXPECT_EQ(NearestConfigSection("servr.drain_timeout"), "");
  EXPECT_EQ(NearestConfigSection("model"), "");
}

TEST(ConfigKeysTest, SuggestsTheClosestKnownKey) {
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.blok_size"), "kv_cache_config.block_size");
  EXPECT_EQ(SuggestConfigKey("kv_cache"), "kv_cache_config");
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.memory_pool.initial"),
            "kv_cache_config.memory_pool.initial_size");
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.grpc_address"), "server.grpc_address");
  EXPECT_EQ(SuggestConfigKey("tracing"), "");
}

// A key's misspelling is answered with a key, not a section it cannot be set as nor an
// unrelated key that happens to be spelled alike: a known name in the wrong section finds its
// section, a name cut short finds the one key of its section that it begins.
TEST(ConfigKeysTest, SuggestsKeysForKeysAndSectionsForSections) {
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.max_size", ConfigPathUse::kKey),
            "kv_cache_config.memory_pool.max_size");  // not kv_cache_config.block_size
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.memory_pool.max", ConfigPathUse::kKey),
            "kv_cache_config.memory_pool.max_size");  // not the section memory_pool
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.blok_size", ConfigPathUse::kKey),
            "kv_cache_config.block_size");
  // Begun by several keys' names: the closest spelling decides, or nothing does.
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.max", ConfigPathUse::kKey), "");
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.memry_pool", ConfigPathUse::kSection),
            "kv_cache_config.memory_pool");
  EXPECT_EQ(SuggestConfigKey("kv_cache_config.memry_pool", ConfigPathUse::kKey), "");
  EXPECT_EQ(SuggestConfigKey("kv_cache", ConfigPathUse::kSection), "kv_cache_config");
}

TEST(ConfigKeysTest, EveryDefaultPrintsAndReadsBack) {
  for (const ConfigKey& key : ConfigKeys()) {
    InferenceConfig config;
    const std::string text = key.get(config);
    ASSERT_TRUE(key.set(config, text).ok()) << key.path << " = " << text;
    EXPECT_EQ(config, InferenceConfig{}) << key.path;
    EXPECT_TRUE(key.check(config).ok()) << key.path;
  }
}

}  // namespace
}  // namespace kvd
