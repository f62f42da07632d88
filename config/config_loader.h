#ifndef KVD_CONFIG_CONFIG_LOADER_H_
#define KVD_CONFIG_CONFIG_LOADER_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "config/inference_config.h"

namespace kvd {

// Reading and writing inference_config.yaml, and command-line overrides. Every key goes
// through the one table in config_key.h, so the file and the flags parse and check a value
// the same way. Errors are InvalidArgument (NotFound for a missing file) and name the key
// path, the offending value and what is allowed; an unknown key is an error that names it and
// suggests the closest known key. No exception leaves these functions. Thread compatible.

// Parses a whole config document. Keys that are absent keep their defaults; an empty document
// gives InferenceConfig{}. The result has passed Validate(). YAML syntax errors report the
// line and column (1-based); a key's error reports the key's line.
absl::StatusOr<InferenceConfig> ParseConfigYaml(std::string_view yaml);

// ParseConfigYaml on the contents of the file at `path`; errors are prefixed with the path.
// A directory is InvalidArgument naming it, not an empty document (a pipe is read as a file).
absl::StatusOr<InferenceConfig> LoadConfigFile(const std::string& path);

// Sets one key from its text form, e.g. ("kv_cache_config.block_size", "32"), with the same
// parsing and per-key check as the YAML path. Does not run the checks between keys (such as
// initial_size <= max_size): call config.Validate() after the last override. On error the
// config is unchanged.
absl::Status ApplyOverride(InferenceConfig& config, std::string_view dotted_key,
                           std::string_view value);

// Applies each "dotted.key=value" in order (as given to `kvd serve --set`), then Validate().
// Stops at the first error.
absl::Status ApplyOverrides(InferenceConfig& config, absl::Span<const std::string> assignments);

// The configuration `kvd serve` runs: the defaults, then the file at `path` (none: defaults
// only), then each override in order, then Validate() once on the result. The file alone need
// not pass Validate(): an override may complete it (a file's initial_size above the default
// max_size, with max_size set on the command line). Errors as LoadConfigFile (per-key checks,
// prefixed with the path) and ApplyOverrides; a failed Validate() names the keys only, since
// the file and the overrides made the value together.
absl::StatusOr<InferenceConfig> LoadConfig(const std::optional<std::string>& path,
                                           absl::Span<const std::string> overrides);

// The whole config as YAML, every key present, in the README's order, values in their
// canonical spelling (e.g. 16GB, 30s). ParseConfigYaml(DumpConfigYaml(c)) == c for any c
// that passes Validate() and whose strings are UTF-8. YAML is Unicode text: bytes that are
// not UTF-8 (a path may hold them, and a config file passes them through as they are) may
// come out as U+FFFD.
std::string DumpConfigYaml(const InferenceConfig& config);

}  // namespace kvd

#endif  // KVD_CONFIG_CONFIG_LOADER_H_
