#ifndef KVD_MODEL_STREAMING_DECODER_H_
#define KVD_MODEL_STREAMING_DECODER_H_

#include <cstdint>
#include <string>

#include "model/tokenizer.h"

namespace kvd {

// Turns one output token stream into text deltas that are always valid UTF-8 (so they can
// go straight into a protobuf `string`). Byte-fallback tokens may split a character over
// several tokens; the bytes of an unfinished character are held until the rest arrives.
//
// Invariant: when the decoded bytes of all pushed tokens form valid UTF-8, the
// concatenation of every Push() result and a final Flush() equals
// tokenizer.Decode(tokens, prev_token). Invalid bytes are replaced by U+FFFD, one per
// maximal ill-formed subsequence (the Unicode "substitution of maximal subparts" rule).
//
// Tracks the previous token itself, so the first piece after BOS loses its leading space.
// Not thread safe: one decoder per output stream. Does not own the tokenizer.
class StreamingDecoder {
 public:
  // prev_token is the last prompt token (BOS for an empty prompt).
  // REQUIRES: tokenizer is non-null and outlives this decoder.
  StreamingDecoder(const Tokenizer* tokenizer, int32_t prev_token);

  // Decodes token after the previous one and returns the text that became complete
  // (possibly empty). Ids outside the vocabulary decode to nothing (Tokenizer::DecodeToken).
  std::string Push(int32_t token);

  // Returns the held bytes of an unfinished character as U+FFFD (empty if none held) and
  // clears them. The decoder stays usable; the previous token is kept.
  std::string Flush();

  // Bytes of an unfinished character waiting for their continuation (0..3).
  size_t num_held_bytes() const { return held_.size(); }

 private:
  const Tokenizer* tokenizer_;
  int32_t prev_token_;
  std::string held_;  // a valid but incomplete UTF-8 prefix of one character
};

}  // namespace kvd

#endif  // KVD_MODEL_STREAMING_DECODER_H_
