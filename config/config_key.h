#ifndef KVD_CONFIG_CONFIG_KEY_H_
#define KVD_CONFIG_CONFIG_KEY_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "config/inference_config.h"

namespace kvd {

// One key of inference_config.yaml: its dotted path, documentation, and the single
// definition of how its text is parsed, checked, stored and printed. The YAML loader, the
// command-line overrides, InferenceConfig::Validate(), DumpConfigYaml() and the README test
// all go through this table, so a key's rule exists exactly once.
struct ConfigKey {
  std::string path;         // e.g. "kv_cache_config.memory_pool.initial_size"
  std::string type;         // "integer", "byte size", "duration", "bool", "string", ...
  std::string allowed;      // what values are accepted, as errors and the README say it
  std::string description;  // one line, for the README

  // Parses `text`, checks it against `allowed` and stores it. On failure leaves the config
  // unchanged and returns InvalidArgument "<path>: invalid value '<text>' (<why>); allowed:
  // <allowed>".
  std::function<absl::Status(InferenceConfig&, std::string_view text)> set;

  // The value's canonical text; `set` reads it back to the same value.
  std::function<std::string(const InferenceConfig&)> get;

  // Checks the stored value against `allowed` (used by Validate() for configs built in
  // code); the error names the path, the value and what is allowed.
  std::function<absl::Status(const InferenceConfig&)> check;
};

// Every key, in documentation order (grouped by section). Built once; never changes.
const std::vector<ConfigKey>& ConfigKeys();

// The key whose path is `path` exactly, or nullptr.
const ConfigKey* FindConfigKey(std::string_view path);

// True when `path` names a section (a proper prefix of some key, e.g. "kv_cache_config" or
// "kv_cache_config.memory_pool"), not a key.
bool IsConfigSection(std::string_view path);

// The known key or section path closest to the unknown `path` by edit distance, or "" when
// nothing is close enough to be a plausible typo.
std::string SuggestConfigKey(std::string_view path);

}  // namespace kvd

#endif  // KVD_CONFIG_CONFIG_KEY_H_
