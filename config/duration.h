#ifndef KVD_CONFIG_DURATION_H_
#define KVD_CONFIG_DURATION_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvd {

// Parses a duration as written in inference_config.yaml or on the command line.
//
// Accepted: a non-negative decimal number with an optional fraction, optional spaces, and an
// optional unit: ns, us, ms, s, m (minutes), h. Units are lower case ("2M" is refused rather
// than guessed). A plain number is seconds: "30" == "30s". Examples: "250ms", "1.5s", "2m",
// "1h". Fractions below one nanosecond are truncated. Infinite and negative durations are
// refused. Returns InvalidArgument with the reason (not the key; callers add it) otherwise.
absl::StatusOr<absl::Duration> ParseDuration(std::string_view text);

// The exact spelling of `d` in the largest unit that divides it, e.g. 30s, 2ms, 90s -> "90s",
// 120s -> "2m", 1500ms -> "1500ms". ParseDuration(FormatDurationExact(d)) == d.
// REQUIRES: d is finite and >= 0.
std::string FormatDurationExact(absl::Duration d);

}  // namespace kvd

#endif  // KVD_CONFIG_DURATION_H_
