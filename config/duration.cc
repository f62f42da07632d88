#include "config/duration.h"

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "config/quantity.h"

namespace kvd {
namespace {

struct DurationUnit {
  std::string_view name;
  int64_t nanos;
};

// Largest first, so FormatDurationExact picks the largest unit that divides exactly.
constexpr std::array<DurationUnit, 6> kDurationUnits = {{
    {"h", int64_t{3600} * 1000 * 1000 * 1000},
    {"m", int64_t{60} * 1000 * 1000 * 1000},
    {"s", int64_t{1000} * 1000 * 1000},
    {"ms", int64_t{1000} * 1000},
    {"us", int64_t{1000}},
    {"ns", int64_t{1}},
}};

}  // namespace

absl::StatusOr<absl::Duration> ParseDuration(std::string_view text) {
  absl::StatusOr<Quantity> q = SplitQuantity(text);
  if (!q.ok()) return q.status();
  int64_t nanos_per_unit = absl::ToInt64Nanoseconds(absl::Seconds(1));
  if (!q->unit.empty()) {
    const DurationUnit* unit = nullptr;
    for (const DurationUnit& u : kDurationUnits) {
      if (u.name == q->unit) unit = &u;
    }
    if (unit == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown unit '", std::string(q->unit),
                                                     "'; known units: ns, us, ms, s, m, h"));
    }
    nanos_per_unit = unit->nanos;
  }
  bool exact = true;  // sub-nanosecond digits are dropped silently, as documented
  std::optional<int64_t> nanos = ScaleQuantity(*q, nanos_per_unit, &exact);
  if (!nanos.has_value()) return absl::InvalidArgumentError("too long");
  return absl::Nanoseconds(*nanos);
}

std::string FormatDurationExact(absl::Duration d) {
  const int64_t nanos = absl::ToInt64Nanoseconds(d);
  if (nanos == 0) return "0s";
  for (const DurationUnit& u : kDurationUnits) {
    if (nanos % u.nanos == 0) return absl::StrCat(nanos / u.nanos, std::string(u.name));
  }
  return absl::StrCat(nanos, "ns");  // unreachable: ns divides everything
}

}  // namespace kvd
