#include "model/streaming_decoder.h"

#include <string_view>

namespace kvd {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence that lead byte b starts, or 0 if b cannot start one.
int SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether b may follow lead at position k (1-based) of a well-formed sequence. The second
// byte has narrower ranges after E0, ED, F0 and F4 (no overlongs, surrogates or > U+10FFFF).
bool ValidContinuation(uint8_t lead, int k, uint8_t b) {
  if (k == 1) {
    switch (lead) {
      case 0xE0:
        return b >= 0xA0 && b <= 0xBF;
      case 0xED:
        return b >= 0x80 && b <= 0x9F;
      case 0xF0:
        return b >= 0x90 && b <= 0xBF;
      case 0xF4:
        return b >= 0x80 && b <= 0x8F;
      default:
        break;
    }
  }
  return b >= 0x80 && b <= 0xBF;
}

// Appends the well-formed part of bytes to out, invalid parts as U+FFFD, and returns how
// many bytes were consumed; the rest is a valid but incomplete prefix of one character.
size_t AppendValidUtf8(std::string_view bytes, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t lead = static_cast<uint8_t>(bytes[i]);
    const int length = SequenceLength(lead);
    if (length == 0) {
      out->append(kReplacementCharacter);
      ++i;
      continue;
    }
    int k = 1;
    while (k < length && i + k < bytes.size() &&
           ValidContinuation(lead, k, static_cast<uint8_t>(bytes[i + k]))) {
      ++k;
    }
    if (k == length) {
      out->append(bytes.substr(i, length));
    } else if (i + k == bytes.size()) {
      return i;  // incomplete so far: wait for more bytes
    } else {
      out->append(kReplacementCharacter);  // maximal subpart bytes[i, i + k)
    }
    i += k;
  }
  return i;
}

}  // namespace

StreamingDecoder::StreamingDecoder(const Tokenizer* tokenizer, int32_t prev_token)
    : tokenizer_(tokenizer), prev_token_(prev_token) {}

std::string StreamingDecoder::Push(int32_t token) {
  held_ += tokenizer_->DecodeToken(prev_token_, token);
  prev_token_ = token;
  std::string out;
  held_.erase(0, AppendValidUtf8(held_, &out));
  return out;
}

std::string StreamingDecoder::Flush() {
  if (held_.empty()) return std::string();
  held_.clear();
  return std::string(kReplacementCharacter);
}

}  // namespace kvd
