#include "config/config_key.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "config/config_enums.h"
#include "config/value_codec.h"

namespace kvd {
namespace {

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The value as an error quotes it: escaped (\r, \x01) when it holds a control character, which
// printed raw would garble the message on a terminal or cut it short at a NUL.
absl::Status BadValue(const std::string& path, std::string_view text, std::string_view why,
                      const std::string& allowed) {
  const std::string quoted = FindControlCharacter(text) == std::string_view::npos
                                 ? std::string(text)
                                 : absl::CHexEscape(AsAbsl(text));
  std::string message = absl::StrCat(path, ": invalid value '", quoted, "'");
  if (!why.empty()) absl::StrAppend(&message, " (", AsAbsl(why), ")");
  absl::StrAppend(&message, "; allowed: ", allowed);
  return absl::InvalidArgumentError(message);
}

template <typename E>
std::string EnumAllowed() {
  std::vector<std::string> names;
  for (E value : AllValues<E>()) names.emplace_back(Name(value));
  return absl::StrCat("one of ", absl::StrJoin(names, ", "));
}

// Builds the key. `access` is a generic lambda `(auto& config) -> auto&` that selects the
// field, so the same selector serves the mutable (set) and const (get, check) paths.
template <typename T, typename Access>
ConfigKey MakeKey(std::string path, std::string type, std::string allowed, std::string description,
                  Access access, ValueCodec<T> codec, std::function<bool(const T&)> ok) {
  ConfigKey key{
      std::move(path), std::move(type), std::move(allowed), std::move(description), nullptr,
      nullptr,         nullptr};
  key.set = [path = key.path, allowed = key.allowed, access, codec, ok](
                InferenceConfig& config, std::string_view text) -> absl::Status {
    absl::StatusOr<T> value = codec.parse(text);
    if (!value.ok()) {
      const absl::string_view why = value.status().message();
      return BadValue(path, text, std::string_view(why.data(), why.size()), allowed);
    }
    if (!ok(*value)) return BadValue(path, text, "", allowed);
    access(config) = *std::move(value);
    return absl::OkStatus();
  };
  key.get = [access, codec](const InferenceConfig& config) { return codec.format(access(config)); };
  key.check = [path = key.path, allowed = key.allowed, access, codec,
               ok](const InferenceConfig& config) -> absl::Status {
    if (ok(access(config))) return absl::OkStatus();
    return BadValue(path, codec.format(access(config)), "", allowed);
  };
  return key;
}

template <typename Access>
ConfigKey IntKey(std::string path, std::string description, Access access, int64_t min,
                 int64_t max) {
  using Int = std::remove_cvref_t<decltype(access(std::declval<InferenceConfig&>()))>;
  return MakeKey<Int>(std::move(path), "integer",
                      absl::StrCat("an integer in [", min, ", ", max, "]"), std::move(description),
                      access, IntegerCodec<Int>(), [min, max](const Int& v) {
                        return static_cast<int64_t>(v) >= min && static_cast<int64_t>(v) <= max;
                      });
}

template <typename Access>
ConfigKey ByteSizeKey(std::string path, std::string description, Access access, bool allow_zero) {
  return MakeKey<int64_t>(
      std::move(path), "byte size",
      absl::StrCat("a byte size ", allow_zero ? ">= 0" : "> 0",
                   " (a number with an optional unit: B; KB, MB, GB, TB = powers of 1000; "
                   "KiB, MiB, GiB, TiB = powers of 1024)"),
      std::move(description), access, ByteSizeCodec(),
      [allow_zero](const int64_t& v) { return allow_zero ? v >= 0 : v > 0; });
}

template <typename Access>
ConfigKey DurationKey(std::string path, std::string description, Access access, bool allow_zero) {
  return MakeKey<absl::Duration>(
      std::move(path), "duration",
      absl::StrCat("a duration ", allow_zero ? ">= 0" : "> 0",
                   " (a number with an optional unit ns, us, ms, s, m, h; no unit = seconds)"),
      std::move(description), access, DurationCodec(), [allow_zero](const absl::Duration& d) {
        return d < absl::InfiniteDuration() &&
               (allow_zero ? d >= absl::ZeroDuration() : d > absl::ZeroDuration());
      });
}

template <typename Access>
ConfigKey FractionKey(std::string path, std::string description, Access access) {
  return MakeKey<double>(std::move(path), "number", "a number in [0, 1]", std::move(description),
                         access, NumberCodec(),
                         [](const double& v) { return v >= 0.0 && v <= 1.0; });
}

template <typename Access>
ConfigKey BoolKey(std::string path, std::string description, Access access) {
  return MakeKey<bool>(std::move(path), "bool", "true or false (also yes/no, on/off, 1/0)",
                       std::move(description), access, BoolCodec(),
                       [](const bool&) { return true; });
}

template <typename E, typename Access>
ConfigKey EnumKey(std::string path, std::string description, Access access) {
  return MakeKey<E>(std::move(path), "enum", EnumAllowed<E>(), std::move(description), access,
                    EnumCodec<E>(), [](const E& v) {
                      const auto all = AllValues<E>();
                      return std::find(all.begin(), all.end(), v) != all.end();
                    });
}

template <typename Access>
ConfigKey StringKey(std::string path, std::string allowed, std::string description, Access access,
                    std::function<bool(const std::string&)> ok) {
  // Validate() refuses control characters in a config built in code too, as the codec does.
  return MakeKey<std::string>(std::move(path), "string", std::move(allowed), std::move(description),
                              access, StringCodec(), [ok = std::move(ok)](const std::string& v) {
                                return FindControlCharacter(v) == std::string::npos && ok(v);
                              });
}

// "host:port" (host may be a bracketed IPv6 literal, port 0-65535) or "unix:/path".
bool IsListenAddress(std::string_view address) {
  if (address.starts_with("unix:")) return address.size() > 5;
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  if (host.find_first_of(" \t") != std::string_view::npos) return false;
  if (host.find(':') != std::string_view::npos && !(host.front() == '[' && host.back() == ']')) {
    return false;  // an IPv6 literal needs brackets
  }
  if (port.empty() || port.size() > 5) return false;
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  return value <= 65535;
}

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

constexpr int64_t kMaxTokens = int64_t{1} << 20;

std::vector<ConfigKey> BuildKeys() {
  std::vector<ConfigKey> keys;
  // model
  keys.push_back(StringKey(
      "model.path", "any path without control characters, or empty",
      "Model to serve: a GGUF file (llama architecture; F32, F16, BF16 or Q8_0 tensors), a "
      "Hugging Face directory (Llama or Mistral, safetensors), a llama2.c .bin checkpoint or "
      "synthetic:<preset>; empty = the default model, stories260K.bin from ../shared/models, "
      "else $KVD_MODEL_CACHE (default ~/.cache/kvd)",
      [](auto& c) -> auto& { return c.model.path; }, [](const std::string&) { return true; }));
  keys.push_back(StringKey(
      "model.tokenizer", "any path without control characters, or empty",
      "Tokenizer file: a llama2.c tokenizer.bin, a GGUF file (its vocabulary) or a "
      "SentencePiece .model; empty = the model's own (a GGUF model's, a Hugging Face "
      "directory's tokenizer.model), or tok512.bin or tokenizer.bin beside a llama2.c "
      "checkpoint",
      [](auto& c) -> auto& { return c.model.tokenizer; }, [](const std::string&) { return true; }));
  keys.push_back(EnumKey<DeviceKind>(
      "model.device", "Where to run: auto = CUDA when a GPU and a CUDA build are present, else CPU",
      [](auto& c) -> auto& { return c.model.device; }));
  keys.push_back(MakeKey<uint64_t>(
      "model.seed", "integer", "an integer in [0, 18446744073709551615]",
      "Sampling seed for requests that set none; also seeds synthetic weights",
      [](auto& c) -> auto& { return c.model.seed; }, IntegerCodec<uint64_t>(),
      [](const uint64_t&) { return true; }));
  // server
  keys.push_back(StringKey(
      "server.grpc_address", "host:port (port 0-65535, 0 = any free) or unix:/path",
      "gRPC listen address", [](auto& c) -> auto& { return c.server.grpc_address; },
      [](const std::string& a) { return IsListenAddress(a); }));
  keys.push_back(StringKey(
      "server.metrics_address", "host:port (port 0-65535, 0 = any free), unix:/path, or empty",
      "Prometheus /metrics listen address; empty = no metrics listener",
      [](auto& c) -> auto& { return c.server.metrics_address; },
      [](const std::string& a) { return a.empty() || IsListenAddress(a); }));
  keys.push_back(DurationKey(
      "server.drain_timeout",
      "On SIGTERM, how long in-flight requests may finish before they are "
      "cancelled",
      [](auto& c) -> auto& { return c.server.drain_timeout; }, true));
  keys.push_back(IntKey(
      "server.max_waiting_requests",
      "Requests queued for admission; beyond it Generate fails "
      "RESOURCE_EXHAUSTED",
      [](auto& c) -> auto& { return c.server.max_waiting_requests; }, 1, 1000000));
  keys.push_back(IntKey(
      "server.max_concurrent_calls",
      "gRPC calls handled at once, streams included; beyond it a call fails "
      "RESOURCE_EXHAUSTED; 0 = max_batch_size + max_waiting_requests + 64",
      [](auto& c) -> auto& { return c.server.max_concurrent_calls; }, 0, 1000000));
  keys.push_back(IntKey(
      "server.num_threads",
      "CPU backend worker threads; 0 = the CPUs the process may use (affinity, cgroup limit)",
      [](auto& c) -> auto& { return c.server.num_threads; }, 0, 1024));
  // kv_cache_config
  keys.push_back(IntKey(
      "kv_cache_config.max_batch_size", "Most sequences in one engine step",
      [](auto& c) -> auto& { return c.kv_cache.max_batch_size; }, 1, 4096));
  keys.push_back(IntKey(
      "kv_cache_config.max_seq_length",
      "Most tokens (prompt + output) of one sequence; longer requests are "
      "refused",
      [](auto& c) -> auto& { return c.kv_cache.max_seq_length; }, 1, kMaxTokens));
  keys.push_back(MakeKey<int32_t>(
      "kv_cache_config.block_size", "integer", "a power of two in [1, 256]", "Tokens per KV block",
      [](auto& c) -> auto& { return c.kv_cache.block_size; }, IntegerCodec<int32_t>(),
      [](const int32_t& v) { return IsPowerOfTwo(v) && v <= 256; }));
  keys.push_back(EnumKey<KvQuantization>(
      "kv_cache_config.quantization",
      "KV storage type; none = the backend's compute type. A build that cannot run the chosen "
      "type refuses to start",
      [](auto& c) -> auto& { return c.kv_cache.quantization; }));
  keys.push_back(ByteSizeKey(
      "kv_cache_config.memory_pool.initial_size",
      "KV arena reserved at startup (committed lazily on the CPU backend)",
      [](auto& c) -> auto& { return c.kv_cache.memory_pool.initial_size_bytes; }, true));
  keys.push_back(ByteSizeKey(
      "kv_cache_config.memory_pool.max_size",
      "Most the KV arena may grow to; must be >= initial_size",
      [](auto& c) -> auto& { return c.kv_cache.memory_pool.max_size_bytes; }, false));
  keys.push_back(ByteSizeKey(
      "kv_cache_config.memory_pool.device_headroom",
      "Device memory the KV arena leaves free for the engine's buffers: a chunk that would "
      "leave less is not added (a growth failure); 0 = none; no effect on the CPU backend",
      [](auto& c) -> auto& { return c.kv_cache.memory_pool.device_headroom_bytes; }, true));
  keys.push_back(DurationKey(
      "kv_cache_config.memory_pool.growth_retry_interval",
      "After a failed growth (device or host memory out, or the headroom reached) the arena "
      "adds no chunk until one is released, or until this long has passed, when it tries one "
      "chunk again; 0 = only once a chunk is released",
      [](auto& c) -> auto& { return c.kv_cache.memory_pool.growth_retry_interval; }, true));
  keys.push_back(EnumKey<EvictionPolicyKind>(
      "kv_cache_config.eviction_policy",
      "Which cached, unreferenced block is evicted first (only lru exists for now)",
      [](auto& c) -> auto& { return c.kv_cache.eviction_policy; }));
  keys.push_back(BoolKey(
      "kv_cache_config.enable_prefix_caching",
      "Share full blocks of identical prompt prefixes across requests",
      [](auto& c) -> auto& { return c.kv_cache.enable_prefix_caching; }));
  keys.push_back(DurationKey(
      "kv_cache_config.session.idle_timeout",
      "A session's pinned blocks become ordinary cached blocks after this "
      "long without a turn",
      [](auto& c) -> auto& { return c.kv_cache.session.idle_timeout; }, true));
  keys.push_back(FractionKey(
      "kv_cache_config.session.max_pinned_fraction",
      "Most of the pool that session pins may hold (oldest unpinned first; a running request "
      "that needs the blocks unpins the oldest sessions below it too)",
      [](auto& c) -> auto& { return c.kv_cache.session.max_pinned_fraction; }));
  keys.push_back(BoolKey(
      "kv_cache_config.defrag.enabled",
      "Compact live blocks downward so empty top chunks can be returned",
      [](auto& c) -> auto& { return c.kv_cache.defrag.enabled; }));
  keys.push_back(DurationKey(
      "kv_cache_config.defrag.interval", "Least time between two defragmentation steps",
      [](auto& c) -> auto& { return c.kv_cache.defrag.interval; }, false));
  keys.push_back(DurationKey(
      "kv_cache_config.defrag.max_pause",
      "Time budget of one defragmentation step's block copies between engine steps",
      [](auto& c) -> auto& { return c.kv_cache.defrag.max_pause; }, false));
  keys.push_back(IntKey(
      "kv_cache_config.defrag.max_moves_per_step", "Most block moves in one defragmentation step",
      [](auto& c) -> auto& { return c.kv_cache.defrag.max_moves_per_step; }, 1, kMaxTokens));
  keys.push_back(IntKey(
      "kv_cache_config.sliding_window.window_tokens",
      "Reserved (kvd serve accepts only 0 for now): keep only the last this-many tokens "
      "(plus sinks); 0 = full attention",
      [](auto& c) -> auto& { return c.kv_cache.sliding_window.window_tokens; }, 0, kMaxTokens));
  keys.push_back(IntKey(
      "kv_cache_config.sliding_window.sink_tokens",
      "First tokens kept forever when the window is on; must be < "
      "window_tokens",
      [](auto& c) -> auto& { return c.kv_cache.sliding_window.sink_tokens; }, 0, kMaxTokens));
  // scheduler
  keys.push_back(IntKey(
      "scheduler.max_num_batched_tokens",
      "Most tokens (prefill + decode) in one engine step; >= max_batch_size",
      [](auto& c) -> auto& { return c.scheduler.max_num_batched_tokens; }, 1, kMaxTokens));
  keys.push_back(EnumKey<AdmissionPolicyKind>(
      "scheduler.admission_policy",
      "Blocks a waiting request must find free: prompt + predicted output (predicted), prompt + "
      "max_tokens (reserve_max), prompt only (optimistic)",
      [](auto& c) -> auto& { return c.scheduler.admission_policy; }));
  keys.push_back(FractionKey(
      "scheduler.predictor_quantile",
      "Quantile of observed output lengths used as the predicted length",
      [](auto& c) -> auto& { return c.scheduler.predictor_quantile; }));
  keys.push_back(IntKey(
      "scheduler.prefill_chunk_tokens",
      "Most prompt tokens of one sequence per step (capped by "
      "max_num_batched_tokens)",
      [](auto& c) -> auto& { return c.scheduler.prefill_chunk_tokens; }, 1, kMaxTokens));
  return keys;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// True when `path` lies inside `section` (a proper prefix ending at a dot).
bool IsUnder(std::string_view path, std::string_view section) {
  return path.size() > section.size() && path.starts_with(section) && path[section.size()] == '.';
}

std::string_view LastComponent(std::string_view path) {
  const size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

}  // namespace

const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey>* const keys = new std::vector<ConfigKey>(BuildKeys());
  return *keys;
}

const ConfigKey* FindConfigKey(std::string_view path) {
  for (const ConfigKey& key : ConfigKeys()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

bool IsConfigSection(std::string_view path) {
  if (path.empty()) return false;
  for (const ConfigKey& key : ConfigKeys()) {
    if (IsUnder(key.path, path)) return true;
  }
  return false;
}

std::string_view NearestConfigSection(std::string_view path) {
  std::string_view section = path;
  do {
    const size_t dot = section.rfind('.');
    section = dot == std::string_view::npos ? std::string_view() : section.substr(0, dot);
  } while (!section.empty() && !IsConfigSection(section));
  return section;
}

std::string SuggestConfigKey(std::string_view path, ConfigPathUse use) {
  const bool keys = use != ConfigPathUse::kSection;
  const std::string_view last = LastComponent(path);
  if (keys && !last.empty()) {
    // A known key placed in the wrong section, e.g. "kv_cache_config.grpc_address".
    for (const ConfigKey& key : ConfigKeys()) {
      if (LastComponent(key.path) == last) return key.path;
    }
    // A name cut short inside a section that exists, e.g. "kv_cache_config.memory_pool.max":
    // the nearest such section's one key whose name begins with it, if just one does.
    if (const std::string_view section = NearestConfigSection(path); !section.empty()) {
      const ConfigKey* only = nullptr;
      int matches = 0;
      for (const ConfigKey& key : ConfigKeys()) {
        if (IsUnder(key.path, section) && LastComponent(key.path).starts_with(last)) {
          only = &key;
          ++matches;
        }
      }
      if (matches == 1) return only->path;
    }
  }
  // Candidates: the keys and the sections, as `use` allows.
  std::vector<std::string_view> candidates;
  for (const ConfigKey& key : ConfigKeys()) {
    std::string_view p = key.path;
    if (keys) candidates.push_back(p);
    if (use == ConfigPathUse::kKey) continue;
    for (size_t dot = p.find('.'); dot != std::string_view::npos; dot = p.find('.', dot + 1)) {
      candidates.push_back(p.substr(0, dot));
    }
  }
  std::string_view best;
  size_t best_distance = std::max<size_t>(2, path.size() / 4);  // plausible-typo threshold
  for (std::string_view candidate : candidates) {
    const size_t d = EditDistance(path, candidate);
    if (d <= best_distance && (best.empty() || d < best_distance)) {
      best = candidate;
      best_distance = d;
    }
  }
  if (!best.empty()) return std::string(best);
  // A truncated name at the same depth, e.g. "kv_cache" for "kv_cache_config", if only one
  // path (candidates repeat sections) begins so.
  const auto depth = [](std::string_view p) { return std::count(p.begin(), p.end(), '.'); };
  std::string_view truncated;
  for (std::string_view candidate : candidates) {
    if (path.empty() || !candidate.starts_with(path) || depth(candidate) != depth(path)) continue;
    if (!truncated.empty() && truncated != candidate) return "";
    truncated = candidate;
  }
  return std::string(truncated);
}

}  // namespace kvd
