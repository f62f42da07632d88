#ifndef KVD_CONFIG_QUANTITY_H_
#define KVD_CONFIG_QUANTITY_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvd {

// A non-negative decimal number with an optional unit, split but not interpreted:
// " 1.5 GiB" -> {whole "1", fraction "5", unit "GiB"}. The shared front end of ParseByteSize
// and ParseDuration. The views point into the parsed text.
struct Quantity {
  std::string_view whole;     // decimal digits before the point; may be empty (".5")
  std::string_view fraction;  // decimal digits after the point; may be empty
  std::string_view unit;      // ASCII letters after optional spaces; may be empty
};

// Splits `text` (surrounding whitespace ignored). Returns InvalidArgument with the reason
// when there is no digit, a sign, or anything other than letters after the number.
absl::StatusOr<Quantity> SplitQuantity(std::string_view text);

// Returns q's number times `multiplier`, truncated toward zero, or nullopt when it does not
// fit in int64_t. *exact is set to whether nothing was truncated.
// REQUIRES: multiplier >= 1; q came from SplitQuantity.
std::optional<int64_t> ScaleQuantity(const Quantity& q, int64_t multiplier, bool* exact);

}  // namespace kvd

#endif  // KVD_CONFIG_QUANTITY_H_
