#include "model/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <queue>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/regular_file.h"

namespace kvd {
namespace {

constexpr int32_t kNumBytePieces = 256;
// run.c only merges pairs whose score beats its initial best_score of -1e10.
constexpr float kMinMergeScore = -1e10f;

// Reads a little-endian 4-byte value at offset. REQUIRES: offset + 4 <= data.size().
template <typename T>
T ReadLe32(const std::string& data, size_t offset) {
  static_assert(sizeof(T) == 4);
  uint32_t bits = 0;
  for (int i = 3; i >= 0; --i) {
    bits = (bits << 8) | static_cast<uint8_t>(data[offset + i]);
  }
  T value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Parses "<0xXX>" (two hex digits, either case) into the byte, or returns -1.
int ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

bool IsContinuationByte(char c) { return (static_cast<uint8_t>(c) & 0xC0) == 0x80; }

// One symbol of the sequence being merged: a token id in a doubly linked list over the
// initial positions (index order == text order, and a merge keeps the left index).
struct Symbol {
  int32_t id;
  int32_t prev;  // -1 at the front
  int32_t next;  // -1 at the back
  bool alive;
};

// A candidate merge of symbols left and its successor right. It is stale (skipped) once
// either side has been merged into something else, which the ids detect.
struct MergeCandidate {
  float score;
  int32_t left;
  int32_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
};

// Heap order: highest score first; on equal scores the leftmost pair, as run.c's rescan.
struct MergeAfter {
  bool operator()(const MergeCandidate& a, const MergeCandidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadLlama2c(const std::string& path,
                                                                  int32_t expected_vocab_size) {
  const std::string what = absl::StrFormat("tokenizer file '%s'", path);
  const absl::StatusOr<int64_t> size = RegularFileSize(path, what);
  if (!size.ok()) return size.status();
  if (*size > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes, more than a tokenizer's limit of %d", what, *size, kMaxFileBytes));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return CannotOpen(what, errno);
  std::string data(static_cast<size_t>(*size), '\0');
  if (!in.read(data.data(), *size)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: read error after %d bytes", what, in.gcount()));
  }
  auto corrupt = [&path](size_t offset, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer file '%s': at offset %d: %s", path, offset, what));
  };

  if (data.size() < 4) {
    return corrupt(0, absl::StrFormat("truncated: need 4 bytes for max_token_length, file has %d",
                                      data.size()));
  }
  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());
  tokenizer->max_token_length_ = ReadLe32<int32_t>(data, 0);
  if (tokenizer->max_token_length_ <= 0) {
    return corrupt(
        0, absl::StrFormat("max_token_length %d must be positive", tokenizer->max_token_length_));
  }
  size_t offset = 4;
  // An entry takes at least 8 bytes, so a 256 MB file could name 33 million empty pieces:
  // entries past the expected vocabulary are checked and counted (for the error), never
  // stored, so that refusing such a file costs no more memory than the file.
  size_t num_entries = 0;
  for (; offset < data.size(); ++num_entries) {
    const size_t token = num_entries;
    if (data.size() - offset < 8) {
      return corrupt(offset, absl::StrFormat("truncated entry for token %d: need 8 bytes for "
                                             "score and length, %d left",
                                             token, data.size() - offset));
    }
    const float score = ReadLe32<float>(data, offset);
    const int32_t num_bytes = ReadLe32<int32_t>(data, offset + 4);
    if (std::isnan(score))
      return corrupt(offset, absl::StrFormat("token %d has a NaN score", token));
    if (num_bytes < 0 || num_bytes > tokenizer->max_token_length_) {
      return corrupt(offset + 4,
                     absl::StrFormat("token %d has length %d, allowed 0..max_token_length (%d)",
                                     token, num_bytes, tokenizer->max_token_length_));
    }
    offset += 8;
    if (data.size() - offset < static_cast<size_t>(num_bytes)) {
      return corrupt(offset, absl::StrFormat("truncated piece of token %d: need %d bytes, %d left",
                                             token, num_bytes, data.size() - offset));
    }
    if (expected_vocab_size < 0 || token < static_cast<size_t>(expected_vocab_size)) {
      tokenizer->longest_piece_ = std::max(tokenizer->longest_piece_, num_bytes);
      tokenizer->pieces_.push_back(data.substr(offset, num_bytes));
      tokenizer->scores_.push_back(score);
    }
    offset += num_bytes;
  }

  if (expected_vocab_size >= 0 && num_entries != static_cast<size_t>(expected_vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer file '%s': has %d tokens but the model expects %d", path,
                        num_entries, expected_vocab_size));
  }
  const int32_t vocab_size = tokenizer->vocab_size();
  if (vocab_size < kFirstByteId + kNumBytePieces) {
    return corrupt(offset, absl::StrFormat("only %d tokens; a llama2.c vocabulary needs at "
                                           "least %d (<unk>, BOS, EOS and 256 byte pieces)",
                                           vocab_size, kFirstByteId + kNumBytePieces));
  }
  if (absl::Status s = tokenizer->Index(what); !s.ok()) return s;
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocabulary(
    std::vector<std::string> pieces, std::vector<float> scores, std::string_view source) {
  if (pieces.size() != scores.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d pieces but %d scores", source, pieces.size(), scores.size()));
  }
  if (pieces.size() < static_cast<size_t>(kFirstByteId + kNumBytePieces)) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: only %d tokens; a llama2.c vocabulary needs at least %d (<unk>, BOS, EOS and 256 "
        "byte pieces)",
        source, pieces.size(), kFirstByteId + kNumBytePieces));
  }
  if (pieces.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d tokens", source, pieces.size()));
  }
  // A vocabulary laid out otherwise is a tokenizer kvd does not read, not a corrupt one.
  for (int32_t id = kFirstByteId; id < kFirstByteId + kNumBytePieces; ++id) {
    if (ParseBytePiece(pieces[id]) != id - kFirstByteId) {
      return absl::UnimplementedError(absl::StrFormat(
          "%s: token %d is '%s', not the byte piece <0x%02X> kvd's tokenizer has there", source, id,
          pieces[id], id - kFirstByteId));
    }
  }
  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (std::isnan(scores[id])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: token %d has a NaN score", source, id));
    }
    tokenizer->longest_piece_ =
        std::max(tokenizer->longest_piece_, static_cast<int32_t>(pieces[id].size()));
  }
  tokenizer->max_token_length_ = std::max(tokenizer->longest_piece_, 1);
  tokenizer->pieces_ = std::move(pieces);
  tokenizer->scores_ = std::move(scores);
  if (absl::Status s = tokenizer->Index(source); !s.ok()) return s;
  return tokenizer;
}

absl::Status Tokenizer::Index(std::string_view source) {
  const int32_t vocab_size = this->vocab_size();
  byte_of_.assign(vocab_size, -1);
  for (int32_t id = 0; id < vocab_size; ++id) {
    const int byte = ParseBytePiece(pieces_[id]);
    if (id >= kFirstByteId && id < kFirstByteId + kNumBytePieces && byte != id - kFirstByteId) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: token %d is '%s' but must be the byte piece <0x%02X>", source, id,
                          pieces_[id], id - kFirstByteId));
    }
    byte_of_[id] = static_cast<int16_t>(byte);
    id_of_.emplace(pieces_[id], id);  // keeps the first (lowest) id
  }
  return absl::OkStatus();
}

int32_t Tokenizer::PieceToId(std::string_view text) const {
  auto it = id_of_.find(text);
  return it == id_of_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size() + 1);
  auto append = [&symbols](int32_t id) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, true});
    if (index > 0) symbols[index - 1].next = index;
  };
  auto append_bytes = [&](std::string_view bytes) {
    for (char c : bytes) append(kFirstByteId + static_cast<uint8_t>(c));
  };

  if (!text.empty()) {
    const int32_t space = PieceToId(" ");
    if (space >= 0) {
      append(space);
    } else {
      append_bytes(" ");
    }
  }
  // Group a byte with the continuation bytes that follow it (at most 4 bytes in all).
  for (size_t start = 0; start < text.size();) {
    size_t end = start + 1;
    while (end < text.size() && end - start < 4 && IsContinuationByte(text[end])) ++end;
    const std::string_view code_point = text.substr(start, end - start);
    const int32_t id = PieceToId(code_point);
    if (id >= 0) {
      append(id);
    } else {
      append_bytes(code_point);
    }
    start = end;
  }

  std::priority_queue<MergeCandidate, std::vector<MergeCandidate>, MergeAfter> heap;
  std::string pair;
  pair.reserve(2 * static_cast<size_t>(longest_piece_));
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    pair.assign(pieces_[symbols[left].id]);
    pair.append(pieces_[symbols[right].id]);
    const int32_t merged = PieceToId(pair);
    if (merged < 0 || !(scores_[merged] > kMinMergeScore)) return;
    heap.push({scores_[merged], left, right, symbols[left].id, symbols[right].id, merged});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  while (!heap.empty()) {
    const MergeCandidate top = heap.top();
    heap.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (!left.alive || !right.alive || left.next != top.right || left.id != top.left_id ||
        right.id != top.right_id) {
      continue;  // stale
    }
    left.id = top.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.alive = false;
    consider(left.prev);
    consider(top.left);
  }

  std::vector<int32_t> tokens;
  tokens.reserve(symbols.size() + 1);
  if (add_bos) tokens.push_back(kBosId);
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    tokens.push_back(symbols[i].id);
  }
  return tokens;
}

int64_t Tokenizer::MinEncodedTokens(int64_t text_bytes, bool add_bos) const {
  // A byte token's piece ("<0x41>") is longer than the one byte it covers, so by induction
  // over merges a token never covers more bytes than its piece has.
  const int64_t covered = text_bytes > 0 ? text_bytes + 1 : 0;  // + the dummy prefix " "
  const int64_t widest = std::max<int64_t>(longest_piece_, 1);
  return (add_bos ? 1 : 0) + (covered + widest - 1) / widest;
}

std::string Tokenizer::DecodeToken(int32_t prev_token, int32_t token) const {
  if (token < 0 || token >= vocab_size()) return std::string();
  if (byte_of_[token] >= 0) return std::string(1, static_cast<char>(byte_of_[token]));
  std::string_view text = pieces_[token];
  if (prev_token == kBosId && !text.empty() && text.front() == ' ') text.remove_prefix(1);
  return std::string(text);
}

std::string Tokenizer::Decode(absl::Span<const int32_t> tokens, int32_t prev_token) const {
  std::string text;
  for (int32_t token : tokens) {
    text += DecodeToken(prev_token, token);
    prev_token = token;
  }
  return text;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FindBesideModel(const std::string& model_path,
                                                                      int32_t vocab_size) {
  std::filesystem::path dir = std::filesystem::path(model_path).parent_path();
  if (dir.empty()) dir = ".";  // a bare file name: the working directory
  std::vector<std::string> tried;
  for (const char* name : {"tok512.bin", "tokenizer.bin"}) {
    const std::string path = (dir / name).string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec) && !ec) continue;  // an error: LoadLlama2c names it
    auto tokenizer = LoadLlama2c(path, vocab_size);
    if (tokenizer.ok()) return tokenizer;
    tried.push_back(absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return absl::NotFoundError(
      absl::StrCat("no tokenizer with ", vocab_size,
                   " tokens is beside the model (tried tok512.bin and tokenizer.bin in '",
                   dir.string(), "'", tried.empty() ? "" : ": ", absl::StrJoin(tried, "; "), ")"));
}

}  // namespace kvd
