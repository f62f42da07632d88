#ifndef KVD_MODEL_TOKENIZER_H_
#define KVD_MODEL_TOKENIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvd {

// A llama2.c byte-fallback BPE tokenizer (the `tokenizer.bin` format that ships with
// llama2.c checkpoints). It encodes and decodes exactly like llama2.c's run.c.
//
// Vocabulary layout: id 0 is <unk>, 1 is BOS, 2 is EOS (taken as such: their pieces are not
// checked), ids 3..258 are the byte pieces "<0x00>".."<0xFF>" (id = byte + 3; checked at
// load), the rest are merged pieces with a score each (higher merges first).
//
// Immutable after loading, so all methods are safe to call concurrently. Pieces are owned
// by the Tokenizer; string_views it returns live as long as it does.
class Tokenizer {
 public:
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;
  static constexpr int32_t kFirstByteId = 3;  // id of "<0x00>"
  // The largest tokenizer file LoadLlama2c reads (Llama 2's 32k vocabulary is 0.4 MB).
  static constexpr int64_t kMaxFileBytes = int64_t{256} << 20;

  // Reads a llama2.c tokenizer.bin:
  //   int32 max_token_length
  //   repeated until EOF: float32 score, int32 num_bytes, num_bytes bytes of the piece
  // (little endian). The file does not store the vocabulary size; entries are read to EOF.
  // Errors: NotFound if nothing is at `path`; InvalidArgument for what is not a regular file
  // or is larger than kMaxFileBytes, naming the file and the byte offset for a truncated or
  // corrupt file (short header, negative or too long piece, NaN score, missing byte
  // pieces), and when expected_vocab_size >= 0 does not match (entries past it are counted,
  // not stored); RegularFileSize and CannotOpen (regular_file.h) for the rest, e.g.
  // PermissionDenied for a file this process may not read.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2c(const std::string& path,
                                                                int32_t expected_vocab_size = -1);

  // A vocabulary given whole, e.g. from a GGUF file's metadata (gguf_loader.h), pieces as
  // llama2.c stores them (spaces, not U+2581). `source` starts every error: Unimplemented
  // for a vocabulary without the layout above (too few tokens, a byte piece out of place),
  // InvalidArgument for unequal lengths or a NaN score.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromVocabulary(std::vector<std::string> pieces,
                                                                   std::vector<float> scores,
                                                                   std::string_view source);

  // The llama2.c tokenizer beside a checkpoint: `tok512.bin`, then `tokenizer.bin`, in the
  // model's folder, the first whose vocabulary has `vocab_size` tokens. NotFound saying
  // what was tried (and why each candidate failed) when none fits.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FindBesideModel(const std::string& model_path,
                                                                    int32_t vocab_size);

  // llama2.c's encoder. When text is non-empty the piece " " (dummy prefix) comes first;
  // then each UTF-8 code point (a lead byte plus up to 3 continuation bytes) is looked up
  // as a piece, else its bytes become byte tokens; then the adjacent pair whose
  // concatenated pieces form the vocabulary piece with the highest score (> -1e10) is
  // merged, leftmost on ties, until no pair merges. BOS is prepended when add_bos and
  // never merges (run.c would try piece(BOS) + next piece, which no real vocabulary has).
  // Unlike run.c (which takes a C string) an embedded NUL byte is encoded as <0x00>.
  // Runs in O(n log n) for n bytes; results equal run.c's quadratic rescan.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;

  // A lower bound, in O(1), on Encode(text, add_bos).size() for any text of `text_bytes`
  // bytes: no token covers more bytes of the text (dummy prefix included) than its piece
  // is long. Lets a caller refuse a text too long for a context before encoding it.
  int64_t MinEncodedTokens(int64_t text_bytes, bool add_bos) const;

  // llama2.c's decoder for one token: a byte piece "<0xXX>" becomes that raw byte; any
  // other piece is returned as is, except that after BOS (prev_token == 1) a leading
  // space is dropped. Special tokens decode to their pieces (e.g. BOS is "\n<s>\n"), as
  // in run.c. An id outside [0, vocab_size()) decodes to the empty string.
  std::string DecodeToken(int32_t prev_token, int32_t token) const;

  // Concatenation of DecodeToken over tokens, each token's predecessor being the previous
  // element (prev_token for the first). May be invalid UTF-8 when byte tokens are used
  // that way; see StreamingDecoder for text that is always valid.
  std::string Decode(absl::Span<const int32_t> tokens, int32_t prev_token) const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const { return kBosId; }
  int32_t eos_id() const { return kEosId; }
  int32_t max_token_length() const { return max_token_length_; }

  // REQUIRES: 0 <= id < vocab_size().
  std::string_view piece(int32_t id) const { return pieces_[id]; }
  // REQUIRES: 0 <= id < vocab_size().
  float score(int32_t id) const { return scores_[id]; }

  // The id of the piece equal to text, or -1. With duplicate pieces the lowest id wins.
  int32_t PieceToId(std::string_view text) const;

 private:
  // Transparent hashing so lookups take string_view without building a std::string.
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };

  Tokenizer() = default;
  // Fills byte_of_ and id_of_ from pieces_, checking the byte pieces; errors start with source.
  absl::Status Index(std::string_view source);

  int32_t max_token_length_ = 0;     // the file's header, at least longest_piece_
  int32_t longest_piece_ = 0;        // bytes of the longest piece read
  std::vector<std::string> pieces_;  // [vocab_size]
  std::vector<float> scores_;        // [vocab_size]
  std::vector<int16_t> byte_of_;     // [vocab_size] raw byte of a "<0xXX>" piece, else -1
  std::unordered_map<std::string, int32_t, PieceHash, std::equal_to<>> id_of_;
};

}  // namespace kvd

#endif  // KVD_MODEL_TOKENIZER_H_
