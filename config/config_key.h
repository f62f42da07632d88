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

// The nearest section that encloses `path` and exists ("" for the top level): for
// "servr.drain_timeout" "", for "server.drain_timeout.x" "server".
std::string_view NearestConfigSection(std::string_view path);

// How an unknown path was used: holding a value (a key), holding a map (a section), or
// either (not known).
enum class ConfigPathUse { kKey, kSection, kEither };

// The known path the unknown `path` most plausibly meant, or "" when none is close enough:
// with a key's use, first the key of the same last name in another section
// ("kv_cache_config.max_size": "kv_cache_config.memory_pool.max_size"), then the one key of the
// nearest existing section whose name the last name begins ("...memory_pool.max":
// "...memory_pool.max_size"); then, of the paths `use` allows (a section holds no value), the
// closest by edit distance, then a longer name at the same depth ("kv_cache": "kv_cache_config").
std::string SuggestConfigKey(std::string_view path, ConfigPathUse use = ConfigPathUse::kEither);

}  // namespace kvd

#endif  // KVD_CONFIG_CONFIG_KEY_H_
