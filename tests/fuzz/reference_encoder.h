#ifndef KVD_TESTS_FUZZ_REFERENCE_ENCODER_H_
#define KVD_TESTS_FUZZ_REFERENCE_ENCODER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace kvd::fuzz {

// llama2.c's run.c encoder, quadratic as it is written there: the oracle for
// Tokenizer::Encode, whose heap of merge candidates must give the same tokens. Bytes are
// grouped as run.c does (a new group at each byte that is not a continuation byte, or once
// four bytes are in), each group looked up as a piece or spelled as byte tokens; then the
// best-scoring pair (> -1e10, leftmost on ties) merges until none does. Where Encode's
// contract (tokenizer.h) departs from run.c this follows the contract: BOS never merges, a
// NUL byte is encoded (run.c stops at it), and without a " " piece the dummy prefix is the
// byte token <0x20> (run.c would push id -1).
inline std::vector<int32_t> RunCEncode(const Tokenizer& tokenizer, std::string_view text,
                                       bool add_bos) {
  std::vector<int32_t> tokens;
  if (add_bos) tokens.push_back(Tokenizer::kBosId);
  const size_t first = tokens.size();
  auto push_group = [&](const std::string& group) {
    const int32_t id = tokenizer.PieceToId(group);
    if (id >= 0) {
      tokens.push_back(id);
      return;
    }
    for (char c : group) tokens.push_back(Tokenizer::kFirstByteId + static_cast<uint8_t>(c));
  };
  if (!text.empty()) push_group(" ");
  std::string group;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<uint8_t>(text[i]) & 0xC0) != 0x80) group.clear();
    group += text[i];
    const bool continues =
        i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80;
    if (continues && group.size() < 4) continue;
    push_group(group);
    group.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_at = 0;
    for (size_t i = first; i + 1 < tokens.size(); ++i) {
      std::string pair(tokenizer.piece(tokens[i]));
      pair += tokenizer.piece(tokens[i + 1]);
      const int32_t id = tokenizer.PieceToId(pair);
      if (id >= 0 && tokenizer.score(id) > best_score) {
        best_score = tokenizer.score(id);
        best_id = id;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_at] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  return tokens;
}

}  // namespace kvd::fuzz

#endif  // KVD_TESTS_FUZZ_REFERENCE_ENCODER_H_
