#include "config/config_enums.h"

namespace kvd {

std::string_view Name(DeviceKind v) {
  switch (v) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

std::string_view Name(KvQuantization v) {
  switch (v) {
    case KvQuantization::kNone:
      return "none";
    case KvQuantization::kBF16:
      return "bf16";
    case KvQuantization::kFP16:
      return "fp16";
    case KvQuantization::kFP8:
      return "fp8";
    case KvQuantization::kInt8:
      return "int8";
    case KvQuantization::kInt4:
      return "int4";
  }
  return "?";
}

std::string_view Name(EvictionPolicyKind v) {
  switch (v) {
    case EvictionPolicyKind::kLru:
      return "lru";
    case EvictionPolicyKind::kChunkLru:
      return "chunk_lru";
  }
  return "?";
}

std::string_view Name(AdmissionPolicyKind v) {
  switch (v) {
    case AdmissionPolicyKind::kPredicted:
      return "predicted";
    case AdmissionPolicyKind::kReserveMax:
      return "reserve_max";
    case AdmissionPolicyKind::kOptimistic:
      return "optimistic";
  }
  return "?";
}

}  // namespace kvd
