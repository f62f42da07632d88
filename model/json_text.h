#ifndef KVD_MODEL_JSON_TEXT_H_
#define KVD_MODEL_JSON_TEXT_H_

// Helpers for the JSON files model loaders read (config.json, safetensors headers), which
// come from anywhere: nesting is checked before parsing, since printing or copying a parsed
// value recurses once per level; and a value an error message shows is cut short.

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvd {

// Far deeper than any real file's nesting.
inline constexpr int kMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in JSON text (strings skipped).
inline int JsonDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// A value as an error message shows it: its JSON, cut to 80 characters.
inline std::string ShownJson(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 77), "...");
  return text;
}

}  // namespace kvd

#endif  // KVD_MODEL_JSON_TEXT_H_
