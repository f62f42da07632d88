#include "tests/model/gguf_vocab.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace kvd::test {
namespace {

// GGUF metadata value types (the GGUF specification's gguf_metadata_value_type).
enum GgufType : uint32_t {
  kUint8 = 0,
  kInt8,
  kUint16,
  kInt16,
  kUint32,
  kInt32,
  kFloat32,
  kBool,
  kString,
  kArray,
  kUint64,
  kInt64,
  kFloat64
};

// Little-endian values from the front of `data` on, each read advancing the offset; false
// (and the offset where the read began) when the data ends first.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  template <typename T>
  bool Read(T* value) {
    if (data_.size() - offset_ < sizeof(T)) return false;
    std::memcpy(value, data_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool ReadString(std::string* s) {
    uint64_t n = 0;
    if (!Read(&n) || data_.size() - offset_ < n) return false;
    s->assign(data_.substr(offset_, n));
    offset_ += n;
    return true;
  }
  // Skips one value of `type` (an array's elements too).
  bool Skip(uint32_t type) {
    static constexpr size_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == kString) {
      std::string ignored;
      return ReadString(&ignored);
    }
    if (type == kArray) {
      uint32_t element = 0;
      uint64_t count = 0;
      if (!Read(&element) || !Read(&count)) return false;
      for (uint64_t i = 0; i < count; ++i) {
        if (!Skip(element)) return false;
      }
      return true;
    }
    if (type > kFloat64) return false;
    if (data_.size() - offset_ < kSize[type]) return false;
    offset_ += kSize[type];
    return true;
  }
  size_t offset() const { return offset_; }

 private:
  std::string_view data_;
  size_t offset_ = 0;
};

}  // namespace

absl::StatusOr<std::string> GgufVocabAsLlama2cTokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  const std::string data = contents.str();
  Reader r(data);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": at offset ", r.offset(), ": ", what));
  };
  uint32_t magic = 0, version = 0;
  uint64_t num_tensors = 0, num_kv = 0;
  if (!r.Read(&magic) || std::memcmp(&magic, "GGUF", 4) != 0) return bad("not GGUF");
  if (!r.Read(&version) || (version != 2 && version != 3)) return bad("not GGUF version 2 or 3");
  if (!r.Read(&num_tensors) || !r.Read(&num_kv)) return bad("truncated header");
  std::vector<std::string> tokens;
  std::vector<float> scores;
  for (uint64_t i = 0; i < num_kv; ++i) {
    std::string key;
    uint32_t type = 0;
    if (!r.ReadString(&key) || !r.Read(&type)) return bad("truncated metadata key");
    const bool is_tokens = key == "tokenizer.ggml.tokens";
    const bool is_scores = key == "tokenizer.ggml.scores";
    if (!is_tokens && !is_scores) {
      if (!r.Skip(type)) return bad(absl::StrCat("bad value of ", key));
      continue;
    }
    uint32_t element = 0;
    uint64_t count = 0;
    if (type != kArray || !r.Read(&element) || !r.Read(&count) ||
        element != (is_tokens ? kString : kFloat32)) {
      return bad(absl::StrCat(key, " is not an array of ", is_tokens ? "strings" : "float32"));
    }
    for (uint64_t j = 0; j < count; ++j) {
      if (is_tokens) {
        if (!r.ReadString(&tokens.emplace_back())) return bad("truncated token");
      } else if (!r.Read(&scores.emplace_back())) {
        return bad("truncated score");
      }
    }
  }
  if (tokens.empty() || tokens.size() != scores.size()) {
    return bad(absl::StrCat(tokens.size(), " tokens and ", scores.size(), " scores"));
  }
  std::vector<std::string> pieces;
  int32_t max_length = 0;
  for (size_t id = 0; id < tokens.size(); ++id) {
    std::string piece = id == 1   ? "\n<s>\n"
                        : id == 2 ? "\n</s>\n"
                                  : absl::StrReplaceAll(tokens[id], {{"\xE2\x96\x81", " "}});
    max_length = std::max(max_length, static_cast<int32_t>(piece.size()));
    pieces.push_back(std::move(piece));
  }
  std::string out;
  auto put = [&out](const void* p) { out.append(static_cast<const char*>(p), 4); };
  put(&max_length);
  for (size_t id = 0; id < pieces.size(); ++id) {
    const int32_t length = static_cast<int32_t>(pieces[id].size());
    put(&scores[id]);
    put(&length);
    out += pieces[id];
  }
  return out;
}

}  // namespace kvd::test
