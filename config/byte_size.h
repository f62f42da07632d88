#ifndef KVD_CONFIG_BYTE_SIZE_H_
#define KVD_CONFIG_BYTE_SIZE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvd {

// Parses a byte size as written in inference_config.yaml or on the command line.
//
// Accepted: a non-negative decimal number with an optional fraction, optional spaces, and an
// optional case-insensitive unit: B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB
// (powers of 1024). No unit means bytes. "16GB" is 16,000,000,000 bytes, "1.5KiB" is 1536.
// The result must be a whole number of bytes that fits in int64_t.
// Returns InvalidArgument with the reason (not the key; callers add it) otherwise.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

// The shortest exact spelling of `bytes` that ParseByteSize reads back to the same value,
// e.g. 16000000000 -> "16GB", 1073741824 -> "1GiB", 1000 -> "1KB", 123 -> "123B".
// REQUIRES: bytes >= 0.
std::string FormatByteSize(int64_t bytes);

}  // namespace kvd

#endif  // KVD_CONFIG_BYTE_SIZE_H_
