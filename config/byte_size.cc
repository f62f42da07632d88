#include "config/byte_size.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "config/quantity.h"

namespace kvd {
namespace {

struct ByteUnit {
  std::string_view name;  // canonical spelling, as FormatByteSize writes it
  int64_t bytes;
};

constexpr int64_t kKi = 1024;
constexpr int64_t kK = 1000;

// Largest first within each family, so FormatByteSize finds the shortest spelling.
constexpr std::array<ByteUnit, 9> kByteUnits = {{
    {"TiB", kKi* kKi* kKi* kKi},
    {"GiB", kKi* kKi* kKi},
    {"MiB", kKi* kKi},
    {"KiB", kKi},
    {"TB", kK* kK* kK* kK},
    {"GB", kK* kK* kK},
    {"MB", kK* kK},
    {"KB", kK},
    {"B", 1},
}};

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  absl::StatusOr<Quantity> q = SplitQuantity(text);
  if (!q.ok()) return q.status();
  int64_t multiplier = 1;
  if (!q->unit.empty()) {
    const ByteUnit* unit = nullptr;
    for (const ByteUnit& u : kByteUnits) {
      if (absl::EqualsIgnoreCase(absl::string_view(u.name.data(), u.name.size()),
                                 absl::string_view(q->unit.data(), q->unit.size())))
        unit = &u;
    }
    if (unit == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown unit '", std::string(q->unit),
                       "'; known units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"));
    }
    multiplier = unit->bytes;
  }
  bool exact = true;
  std::optional<int64_t> bytes = ScaleQuantity(*q, multiplier, &exact);
  if (!bytes.has_value()) return absl::InvalidArgumentError("too large");
  if (!exact) return absl::InvalidArgumentError("not a whole number of bytes");
  return *bytes;
}

std::string FormatByteSize(int64_t bytes) {
  std::string best = absl::StrCat(bytes, "B");
  if (bytes == 0) return best;
  for (const ByteUnit& u : kByteUnits) {
    if (bytes % u.bytes != 0) continue;
    std::string candidate = absl::StrCat(bytes / u.bytes, std::string(u.name));
    if (candidate.size() < best.size()) best = std::move(candidate);
  }
  return best;
}

}  // namespace kvd
