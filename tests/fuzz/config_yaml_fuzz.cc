// Fuzz target: inference_config.yaml documents, `--set key=value` overrides and unknown key
// names, from any bytes.
//
// Invariants: nothing throws, crashes or hangs (yaml-cpp's exceptions stay inside the
// loader); no string value holds a control character; a document that loads dumps
// (DumpConfigYaml) to text that loads back to the same config when its strings are UTF-8
// (as DumpConfigYaml promises); an override either sets a value whose canonical text reads
// back to itself, or fails naming the key and leaves the config as it was; a suggestion
// for an unknown key is "" or a real key or section.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "config/config_key.h"
#include "config/config_loader.h"
#include "config/inference_config.h"
#include "config/value_codec.h"
#include "server/utf8.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvd::fuzz::Require;

void CheckRoundTrip(const kvd::InferenceConfig& config) {
  bool all_utf8 = true;
  for (const kvd::ConfigKey& key : kvd::ConfigKeys()) {
    if (key.type != "string") continue;
    const std::string value = key.get(config);
    Require(kvd::FindControlCharacter(value) == std::string::npos,
            "a string value holds a control character");
    all_utf8 = all_utf8 && kvd::IsValidUtf8(value);
  }
  if (!all_utf8) return;  // YAML text cannot carry it back
  const std::string dumped = kvd::DumpConfigYaml(config);
  const absl::StatusOr<kvd::InferenceConfig> reloaded = kvd::ParseConfigYaml(dumped);
  Require(reloaded.ok(), "a dumped config does not load");
  Require(*reloaded == config, "a dumped config loads as a different config");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::fuzz::InputReader input(data, size);
  const unsigned char mode = input.Byte();
  switch (mode % 3) {
    case 0: {
      const absl::StatusOr<kvd::InferenceConfig> config = kvd::ParseConfigYaml(input.Rest());
      if (config.ok()) {
        CheckRoundTrip(*config);
      } else {
        Require(config.status().code() == absl::StatusCode::kInvalidArgument,
                "a document's error is not InvalidArgument");
      }
      break;
    }
    case 1: {
      const std::vector<kvd::ConfigKey>& keys = kvd::ConfigKeys();
      const kvd::ConfigKey& key = keys[input.Byte() % keys.size()];
      const std::string_view value = input.Rest();
      kvd::InferenceConfig config;
      const absl::Status status = kvd::ApplyOverride(config, key.path, value);
      if (!status.ok()) {
        Require(config == kvd::InferenceConfig{}, "a failed override changed the config");
        Require(absl::StartsWith(status.message(), key.path), "the error does not name the key");
        break;
      }
      const std::string canonical = key.get(config);
      kvd::InferenceConfig again;
      Require(kvd::ApplyOverride(again, key.path, canonical).ok(), "canonical text refused");
      Require(again == config, "canonical text reads back as another value");
      if (config.Validate().ok()) CheckRoundTrip(config);
      break;
    }
    case 2: {
      const std::string_view path = input.Rest();
      const std::string suggestion = kvd::SuggestConfigKey(path);
      Require(suggestion.empty() || kvd::FindConfigKey(suggestion) != nullptr ||
                  kvd::IsConfigSection(suggestion),
              "a suggestion that is no key");
      break;
    }
  }
  return 0;
}
