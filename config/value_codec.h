#ifndef KVD_CONFIG_VALUE_CODEC_H_
#define KVD_CONFIG_VALUE_CODEC_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "config/config_enums.h"

namespace kvd {

// How one value type of the config is read from and written to text. `parse` returns
// InvalidArgument with the reason only (callers add the key and what is allowed); `format`
// writes the canonical text, which `parse` reads back to the same value. Codecs are
// stateless values; copies are independent and safe to share between threads.
template <typename T>
struct ValueCodec {
  std::function<absl::StatusOr<T>(std::string_view)> parse;
  std::function<std::string(const T&)> format;
};

// Decimal integers of type Int (surrounding whitespace allowed); out-of-range text fails.
template <typename Int>
ValueCodec<Int> IntegerCodec() {
  return {[](std::string_view text) -> absl::StatusOr<Int> {
            Int value;
            if (!absl::SimpleAtoi(absl::string_view(text.data(), text.size()), &value)) {
              return absl::InvalidArgumentError("not an integer in range");
            }
            return value;
          },
          [](const Int& v) { return absl::StrCat(v); }};
}

// Finite doubles; printed in the shortest form that reads back exactly.
ValueCodec<double> NumberCodec();

// true/yes/on/1 and false/no/off/0, any case; printed as true/false.
ValueCodec<bool> BoolCodec();

// Any text without control characters (0x00-0x1F, 0x7F), verbatim. Every string key is a
// path or an address: a NUL (YAML's "\0") would cut it short where the OS reads it, and a CR
// (a script with Windows line ends), a tab or another control character is far likelier a
// mistake than part of a name, and would name another file than the one meant.
ValueCodec<std::string> StringCodec();

// Where the first control character (0x00-0x1F or 0x7F) of `text` is, or npos.
size_t FindControlCharacter(std::string_view text);

// ParseByteSize / FormatByteSize.
ValueCodec<int64_t> ByteSizeCodec();

// ParseDuration / FormatDurationExact (values Validate() would refuse, negative or infinite,
// print in absl's notation so error messages still show them).
ValueCodec<absl::Duration> DurationCodec();

// ParseEnum<E> / Name.
template <typename E>
ValueCodec<E> EnumCodec() {
  return {[](std::string_view text) -> absl::StatusOr<E> {
            std::optional<E> value = ParseEnum<E>(text);
            if (!value.has_value()) return absl::InvalidArgumentError("unknown name");
            return *value;
          },
          [](const E& v) { return std::string(Name(v)); }};
}

}  // namespace kvd

#endif  // KVD_CONFIG_VALUE_CODEC_H_
