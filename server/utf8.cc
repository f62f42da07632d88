#include "server/utf8.h"

#include <cstdint>

namespace kvd {

namespace {

// Length of the well-formed UTF-8 sequence that starts at s[i] (1..4), or 0 when the
// bytes there do not form one.
size_t SequenceLength(const unsigned char* s, size_t n, size_t i) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;  // a continuation byte, an overlong lead (C0, C1) or beyond U+10FFFF (F5..FF)
  }
  if (i + len > n) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((s[i + k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i + k] & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;  // surrogates
  return len;
}

}  // namespace

bool IsValidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t len = SequenceLength(s, text.size(), i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string ToValidUtf8(absl::string_view text) {
  if (IsValidUtf8(text)) return std::string(text);
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  std::string out;
  bool in_bad_run = false;
  for (size_t i = 0; i < text.size();) {
    const size_t len = SequenceLength(s, text.size(), i);
    if (len == 0) {
      if (!in_bad_run) out += "\xEF\xBF\xBD";
      in_bad_run = true;
      ++i;
    } else {
      out.append(text.data() + i, len);
      in_bad_run = false;
      i += len;
    }
  }
  return out;
}

}  // namespace kvd
