#include "model/sentencepiece_model.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "model/regular_file.h"

namespace kvd {

namespace {

// sentencepiece_model.proto's numbers.
constexpr uint32_t kModelPieces = 1;       // ModelProto.pieces
constexpr uint32_t kModelTrainerSpec = 2;  // ModelProto.trainer_spec
constexpr uint32_t kPiecePiece = 1;        // SentencePiece.piece
constexpr uint32_t kPieceScore = 2;        // SentencePiece.score
constexpr uint32_t kPieceType = 3;         // SentencePiece.type
constexpr uint32_t kModelNormalizerSpec = 3;  // ModelProto.normalizer_spec
constexpr uint32_t kTrainerModelType = 3;  // TrainerSpec.model_type
constexpr uint32_t kTrainerWhitespaceAsSuffix = 24;   // TrainerSpec.treat_whitespace_as_suffix
constexpr uint32_t kNormalizerName = 1;               // NormalizerSpec.name
constexpr uint32_t kNormalizerCharsmap = 2;           // NormalizerSpec.precompiled_charsmap
constexpr uint32_t kNormalizerDummyPrefix = 3;        // NormalizerSpec.add_dummy_prefix
constexpr uint32_t kNormalizerRemoveWhitespaces = 4;  // NormalizerSpec.remove_extra_whitespaces
constexpr uint64_t kModelTypeUnigram = 1;  // the default
constexpr uint64_t kModelTypeBpe = 2;
constexpr uint64_t kPieceTypeNormal = 1;  // the default
constexpr uint64_t kPieceTypeControl = 3;
constexpr uint64_t kPieceTypeUserDefined = 4;

// Protocol-buffer wire format over a byte range: each read advances; false at a malformed
// or truncated field.
class WireReader {
 public:
  WireReader(const char* data, size_t size, size_t base)
      : p_(data), end_(data + size), base_(base), begin_(data) {}

  bool done() const { return p_ == end_; }
  size_t offset() const { return base_ + static_cast<size_t>(p_ - begin_); }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return false;
      const uint8_t byte = static_cast<uint8_t>(*p_++);
      *v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  // A field's tag; wire type in *wire.
  bool Tag(uint32_t* field, uint32_t* wire) {
    uint64_t tag = 0;
    if (!Varint(&tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire = static_cast<uint32_t>(tag & 7);
    return true;
  }
  // A length-delimited field's bytes.
  bool Bytes(const char** data, size_t* size) {
    uint64_t n = 0;
    if (!Varint(&n) || n > static_cast<uint64_t>(end_ - p_)) return false;
    *data = p_;
    *size = static_cast<size_t>(n);
    p_ += n;
    return true;
  }
  bool Fixed32(uint32_t* v) {
    if (end_ - p_ < 4) return false;
    std::memcpy(v, p_, 4);
    p_ += 4;
    return true;
  }
  // Skips a field of `wire` type (groups are not used by this format: refused).
  bool Skip(uint32_t wire) {
    uint64_t ignored = 0;
    const char* data = nullptr;
    size_t size = 0;
    switch (wire) {
      case 0:
        return Varint(&ignored);
      case 1:
        if (end_ - p_ < 8) return false;
        p_ += 8;
        return true;
      case 2:
        return Bytes(&data, &size);
      case 5:
        if (end_ - p_ < 4) return false;
        p_ += 4;
        return true;
      default:
        return false;
    }
  }

 private:
  const char* p_;
  const char* end_;
  size_t base_;
  const char* begin_;
};

struct Piece {
  std::string text;
  float score = 0;
  uint64_t type = kPieceTypeNormal;
};

// The normalizer_spec fields that change what text becomes before encoding, with proto2's
// defaults. kvd's encoder does what Llama's tokenizer.model asks: no normalization rule, a
// dummy " " prefix, whitespace kept as it is.
struct Normalizer {
  std::string name;
  bool has_charsmap = false;
  uint64_t add_dummy_prefix = 1;
  uint64_t remove_extra_whitespaces = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path,
                                                                      int32_t expected_vocab_size) {
  const std::string what = absl::StrCat("SentencePiece model '", path, "'");
  const absl::StatusOr<int64_t> size = RegularFileSize(path, what);
  if (!size.ok()) return size.status();
  if (*size > Tokenizer::kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", *size, " bytes, more than a ",
                                                   "tokenizer's limit of ",
                                                   Tokenizer::kMaxFileBytes));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return CannotOpen(what, errno);
  std::string data(static_cast<size_t>(*size), '\0');
  if (!in.read(data.data(), *size)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": read error"));
  }
  auto corrupt = [&what](size_t offset, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": at offset ", offset, ": ", why));
  };

  // Pieces past the expected vocabulary are counted, not kept, so that refusing a file costs
  // little more memory than the file.
  std::vector<Piece> pieces;
  size_t num_pieces = 0;
  uint64_t model_type = kModelTypeUnigram;
  uint64_t whitespace_as_suffix = 0;
  Normalizer normalizer;
  WireReader model(data.data(), data.size(), 0);
  while (!model.done()) {
    const size_t at = model.offset();
    uint32_t field = 0, wire = 0;
    if (!model.Tag(&field, &wire)) return corrupt(at, "not a protocol buffer field");
    if ((field == kModelPieces || field == kModelTrainerSpec || field == kModelNormalizerSpec) &&
        wire == 2) {
      const char* bytes = nullptr;
      size_t n = 0;
      if (!model.Bytes(&bytes, &n)) return corrupt(at, "truncated message");
      WireReader inner(bytes, n, static_cast<size_t>(bytes - data.data()));
      Piece piece;
      while (!inner.done()) {
        const size_t inner_at = inner.offset();
        uint32_t f = 0, w = 0;
        if (!inner.Tag(&f, &w)) return corrupt(inner_at, "not a protocol buffer field");
        bool ok = true;
        if (field == kModelPieces && f == kPiecePiece && w == 2) {
          const char* text = nullptr;
          size_t len = 0;
          ok = inner.Bytes(&text, &len);
          if (ok) piece.text.assign(text, len);
        } else if (field == kModelPieces && f == kPieceScore && w == 5) {
          uint32_t bits = 0;
          ok = inner.Fixed32(&bits);
          std::memcpy(&piece.score, &bits, 4);
        } else if (field == kModelPieces && f == kPieceType && w == 0) {
          ok = inner.Varint(&piece.type);
        } else if (field == kModelTrainerSpec && f == kTrainerModelType && w == 0) {
          ok = inner.Varint(&model_type);
        } else if (field == kModelTrainerSpec && f == kTrainerWhitespaceAsSuffix && w == 0) {
          ok = inner.Varint(&whitespace_as_suffix);
        } else if (field == kModelNormalizerSpec && f == kNormalizerName && w == 2) {
          const char* text = nullptr;
          size_t len = 0;
          ok = inner.Bytes(&text, &len);
          if (ok) normalizer.name.assign(text, len);
        } else if (field == kModelNormalizerSpec && f == kNormalizerCharsmap && w == 2) {
          const char* charsmap = nullptr;
          size_t len = 0;
          ok = inner.Bytes(&charsmap, &len);
          normalizer.has_charsmap = normalizer.has_charsmap || len > 0;
        } else if (field == kModelNormalizerSpec && f == kNormalizerDummyPrefix && w == 0) {
          ok = inner.Varint(&normalizer.add_dummy_prefix);
        } else if (field == kModelNormalizerSpec && f == kNormalizerRemoveWhitespaces && w == 0) {
          ok = inner.Varint(&normalizer.remove_extra_whitespaces);
        } else {
          ok = inner.Skip(w);
        }
        if (!ok) return corrupt(inner_at, "truncated or malformed field");
      }
      if (field == kModelPieces &&
          (expected_vocab_size < 0 || num_pieces++ < static_cast<size_t>(expected_vocab_size))) {
        pieces.push_back(std::move(piece));
      }
    } else if (!model.Skip(wire)) {
      return corrupt(at, "truncated or malformed field");
    }
  }

  if (model_type != kModelTypeBpe) {
    return absl::UnimplementedError(absl::StrCat(
        what, ": a ", model_type == kModelTypeUnigram ? "unigram" : "non-BPE",
        " model (trainer_spec.model_type ", model_type, "); kvd's tokenizer encodes BPE models"));
  }
  if (expected_vocab_size >= 0 && num_pieces != static_cast<size_t>(expected_vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": has ", num_pieces, " pieces but the model expects ", expected_vocab_size));
  }
  if ((normalizer.name != "identity" && !normalizer.name.empty()) || normalizer.has_charsmap ||
      normalizer.add_dummy_prefix != 1 || normalizer.remove_extra_whitespaces != 0 ||
      whitespace_as_suffix != 0) {
    return absl::UnimplementedError(absl::StrCat(
        what, ": normalization kvd's encoder does not do (normalizer '", normalizer.name, "'",
        normalizer.has_charsmap ? " with a character map" : "", ", add_dummy_prefix ",
        normalizer.add_dummy_prefix, ", remove_extra_whitespaces ",
        normalizer.remove_extra_whitespaces, ", treat_whitespace_as_suffix ", whitespace_as_suffix,
        "); Llama's is 'identity', 1, 0, 0"));
  }
  if (pieces.size() < 3 || pieces[1].type != kPieceTypeControl ||
      pieces[2].type != kPieceTypeControl) {
    return absl::UnimplementedError(
        absl::StrCat(what,
                     ": BOS and EOS are not the control pieces at ids 1 and 2, where "
                     "kvd's tokenizer has them"));
  }
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (pieces[id].type == kPieceTypeUserDefined) {
      return absl::UnimplementedError(
          absl::StrCat(what, ": piece ", id, " ('", pieces[id].text,
                       "') is user-defined, which kvd's tokenizer does not match as a whole"));
    }
  }
  std::vector<std::string> texts;
  std::vector<float> scores;
  texts.reserve(pieces.size());
  scores.reserve(pieces.size());
  for (size_t id = 0; id < pieces.size(); ++id) {
    texts.push_back(id == 1   ? "\n<s>\n"
                    : id == 2 ? "\n</s>\n"
                              : absl::StrReplaceAll(pieces[id].text, {{"\xE2\x96\x81", " "}}));
    scores.push_back(pieces[id].score);
  }
  return Tokenizer::FromVocabulary(std::move(texts), std::move(scores), what);
}

}  // namespace kvd
