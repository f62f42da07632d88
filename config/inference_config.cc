#include "config/inference_config.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/byte_size.h"
#include "config/config_key.h"

namespace kvd {

absl::Status InferenceConfig::Validate() const {
  for (const ConfigKey& key : ConfigKeys()) {
    if (absl::Status status = key.check(*this); !status.ok()) return status;
  }
  const MemoryPoolConfig& pool = kv_cache.memory_pool;
  if (pool.initial_size_bytes > pool.max_size_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_config.memory_pool.initial_size: invalid value '",
                     FormatByteSize(pool.initial_size_bytes), "' (", pool.initial_size_bytes,
                     " bytes); allowed: at most kv_cache_config.memory_pool.max_size, which is '",
                     FormatByteSize(pool.max_size_bytes), "' (", pool.max_size_bytes, " bytes)",
                     pool.initial_size_bytes == MemoryPoolConfig{}.initial_size_bytes
                         ? " (initial_size is at its default: a max_size under it needs "
                           "initial_size set too)"
                         : ""));
  }
  if (kv_cache.max_batch_size > scheduler.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_config.max_batch_size: invalid value '", kv_cache.max_batch_size,
        "'; allowed: at most scheduler.max_num_batched_tokens, which is ",
        scheduler.max_num_batched_tokens, " (every sequence in a step needs a token)"));
  }
  const SlidingWindowConfig& window = kv_cache.sliding_window;
  if (window.window_tokens != 0 && window.sink_tokens >= window.window_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_config.sliding_window.sink_tokens: invalid value '", window.sink_tokens,
        "'; allowed: less than kv_cache_config.sliding_window.window_tokens, which is ",
        window.window_tokens));
  }
  return absl::OkStatus();
}

std::string QuantizationNames(absl::Span<const KvQuantization> quantizations) {
  if (quantizations.empty()) return "(nothing)";
  return absl::StrJoin(quantizations, ", ", [](std::string* out, KvQuantization q) {
    const std::string_view name = Name(q);
    out->append(name.data(), name.size());
  });
}

absl::Status CheckQuantizationSupported(const KvCacheConfig& config, absl::string_view device,
                                        absl::Span<const KvQuantization> supported,
                                        absl::string_view elsewhere) {
  if (std::find(supported.begin(), supported.end(), config.quantization) != supported.end()) {
    return absl::OkStatus();
  }
  const std::string_view name = Name(config.quantization);
  return absl::UnimplementedError(absl::StrCat(
      "kv_cache_config.quantization: '", absl::string_view(name.data(), name.size()),
      "' is valid but the ", device, " device cannot run it yet; supported on ", device, ": ",
      QuantizationNames(supported), elsewhere,
      ". kvd does not fall back to another type; set kv_cache_config.quantization to a "
      "supported one"));
}

}  // namespace kvd
