#ifndef KVD_SERVER_UTF8_H_
#define KVD_SERVER_UTF8_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kvd {

// UTF-8 checks for what crosses the API: proto3 `string` fields must be UTF-8 both ways.
// Pure functions; thread safe.

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates, or code points
// above U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// `text` with each run of bytes that belong to no well-formed sequence replaced by one
// U+FFFD; valid text is returned unchanged.
std::string ToValidUtf8(absl::string_view text);

}  // namespace kvd

#endif  // KVD_SERVER_UTF8_H_
