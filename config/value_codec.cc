#include "config/value_codec.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "config/byte_size.h"
#include "config/duration.h"

namespace kvd {
namespace {

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

ValueCodec<double> NumberCodec() {
  return {[](std::string_view text) -> absl::StatusOr<double> {
            double value;
            if (!absl::SimpleAtod(AsAbsl(text), &value) || !std::isfinite(value)) {
              return absl::InvalidArgumentError("not a finite number");
            }
            return value;
          },
          [](const double& v) {
            // The fewest digits that read back exactly, laid out as printf's %g would: fixed
            // from 1e-4 up ("0.0001", not "1e-04"), as Prometheus' Go clients write bucket
            // bounds too, so that `le` labels match across exporters.
            char buffer[64];
            auto [end, ec] =
                std::to_chars(buffer, buffer + sizeof(buffer), v, std::chars_format::general);
            return ec == std::errc() ? std::string(buffer, end) : absl::StrCat(v);
          }};
}

ValueCodec<bool> BoolCodec() {
  return {[](std::string_view text) -> absl::StatusOr<bool> {
            for (std::string_view yes : {"true", "yes", "on", "1"}) {
              if (absl::EqualsIgnoreCase(AsAbsl(text), AsAbsl(yes))) return true;
            }
            for (std::string_view no : {"false", "no", "off", "0"}) {
              if (absl::EqualsIgnoreCase(AsAbsl(text), AsAbsl(no))) return false;
            }
            return absl::InvalidArgumentError("not a boolean");
          },
          [](const bool& v) { return std::string(v ? "true" : "false"); }};
}

size_t FindControlCharacter(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) return i;
  }
  return std::string_view::npos;
}

ValueCodec<std::string> StringCodec() {
  return {[](std::string_view text) -> absl::StatusOr<std::string> {
            if (const size_t at = FindControlCharacter(text); at != std::string_view::npos) {
              return absl::InvalidArgumentError(
                  absl::StrFormat("contains the control character 0x%02x at byte %d",
                                  static_cast<unsigned char>(text[at]), at));
            }
            return std::string(text);
          },
          [](const std::string& v) { return v; }};
}

ValueCodec<int64_t> ByteSizeCodec() { return {ParseByteSize, FormatByteSize}; }

ValueCodec<absl::Duration> DurationCodec() {
  return {ParseDuration, [](const absl::Duration& d) {
            return d >= absl::ZeroDuration() && d < absl::InfiniteDuration()
                       ? FormatDurationExact(d)
                       : absl::FormatDuration(d);
          }};
}

}  // namespace kvd
