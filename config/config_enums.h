#ifndef KVD_CONFIG_CONFIG_ENUMS_H_
#define KVD_CONFIG_CONFIG_ENUMS_H_

#include <array>
#include <optional>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace kvd {

// The closed sets of names InferenceConfig accepts. Each enum has Name() (the canonical,
// lower-case spelling used in YAML, flags and errors) and AllValues<E>() (documentation
// order); ParseEnum<E>() is the case-insensitive inverse of Name().

// Where the model runs. kAuto: CUDA where the GPU can run the model (kAutoPicksCuda in
// tools/device.h), else CPU.
enum class DeviceKind { kAuto, kCpu, kCuda };

// Storage type of the KV cache. kNone keeps the backend's compute type (fp32 on the CPU
// reference backend, bf16 on CUDA). Whether a build can run one is decided by the engine.
enum class KvQuantization { kNone, kBF16, kFP16, kFP8, kInt8, kInt4 };

// Which cached (refcount 0) block is evicted first (cache/eviction_policy.h): the least
// recently released, or that of the highest chunk holding one (keeps the cache in low chunks,
// so that defragmentation can return the top ones without losing hits).
enum class EvictionPolicyKind { kLru, kChunkLru };

// How the scheduler sizes a waiting request's KV need (DESIGN.md "Admission").
enum class AdmissionPolicyKind { kPredicted, kReserveMax, kOptimistic };

std::string_view Name(DeviceKind v);
std::string_view Name(KvQuantization v);
std::string_view Name(EvictionPolicyKind v);
std::string_view Name(AdmissionPolicyKind v);

template <typename E>
constexpr auto AllValues();
template <>
constexpr auto AllValues<DeviceKind>() {
  return std::array{DeviceKind::kAuto, DeviceKind::kCpu, DeviceKind::kCuda};
}
template <>
constexpr auto AllValues<KvQuantization>() {
  return std::array{KvQuantization::kNone, KvQuantization::kBF16, KvQuantization::kFP16,
                    KvQuantization::kFP8,  KvQuantization::kInt8, KvQuantization::kInt4};
}
template <>
constexpr auto AllValues<EvictionPolicyKind>() {
  return std::array{EvictionPolicyKind::kLru, EvictionPolicyKind::kChunkLru};
}
template <>
constexpr auto AllValues<AdmissionPolicyKind>() {
  return std::array{AdmissionPolicyKind::kPredicted, AdmissionPolicyKind::kReserveMax,
                    AdmissionPolicyKind::kOptimistic};
}

// The value whose Name() equals `text` ignoring ASCII case, or nullopt.
template <typename E>
std::optional<E> ParseEnum(std::string_view text) {
  for (E value : AllValues<E>()) {
    const std::string_view name = Name(value);
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               absl::string_view(text.data(), text.size()))) {
      return value;
    }
  }
  return std::nullopt;
}

}  // namespace kvd

#endif  // KVD_CONFIG_CONFIG_ENUMS_H_
