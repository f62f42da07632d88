// Fuzz target: the API's UTF-8 checks (server/utf8.h) on any bytes.
//
// Invariants: ToValidUtf8 returns valid UTF-8, returns valid text unchanged, keeps every
// well-formed character of its input in order and replaces each run of other bytes by one
// U+FFFD; IsValidUtf8 agrees with a decoder written here from the Unicode definition
// (Table 3-7, well-formed byte sequences).

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "server/utf8.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvd::fuzz::Require;

// Bytes in the well-formed sequence at text[i], or 0: Table 3-7's rows, byte ranges only.
size_t WellFormedAt(absl::string_view text, size_t i) {
  struct Row {
    unsigned char lo[4], hi[4];
    size_t n;
  };
  static constexpr Row kRows[] = {
      {{0x00}, {0x7F}, 1},
      {{0xC2, 0x80}, {0xDF, 0xBF}, 2},
      {{0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}, 3},
      {{0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}, 3},
      {{0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}, 3},
      {{0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}, 3},
      {{0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}, 4},
      {{0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}, 4},
      {{0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}, 4},
  };
  for (const Row& row : kRows) {
    if (i + row.n > text.size()) continue;
    bool match = true;
    for (size_t k = 0; k < row.n && match; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      match = b >= row.lo[k] && b <= row.hi[k];
    }
    if (match) return row.n;
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  std::string expected;  // ToValidUtf8 by the reference
  bool valid = true;
  bool in_bad_run = false;
  for (size_t i = 0; i < text.size();) {
    const size_t n = WellFormedAt(text, i);
    if (n == 0) {
      if (!in_bad_run) expected += "\xEF\xBF\xBD";
      valid = false;
      in_bad_run = true;
      ++i;
    } else {
      expected.append(text.data() + i, n);
      in_bad_run = false;
      i += n;
    }
  }
  Require(kvd::IsValidUtf8(text) == valid, "IsValidUtf8 disagrees with Table 3-7");
  const std::string repaired = kvd::ToValidUtf8(text);
  Require(repaired == expected, "ToValidUtf8 differs from the reference");
  Require(kvd::IsValidUtf8(repaired), "ToValidUtf8 returned invalid UTF-8");
  return 0;
}
