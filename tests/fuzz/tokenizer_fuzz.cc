// Fuzz target: stories260K's tokenizer (tok512.bin in ../shared/models) encoding and
// decoding any text, and StreamingDecoder turning any token stream into text.
//
// Invariants:
// - Encode gives exactly the tokens of run.c's quadratic encoder (reference_encoder.h);
//   every id is in the vocabulary, BOS comes first exactly when asked for, there are at
//   least MinEncodedTokens ids, and decoding them after BOS gives the text back, byte for
//   byte (invalid UTF-8 and NUL bytes included: they become byte tokens).
// - StreamingDecoder, fed any ids (out-of-vocabulary ones too), or the bytes of any text
//   as byte tokens: every delta and the final Flush() are valid UTF-8 (checked with the
//   API's own IsValidUtf8, a separate implementation), and when the decoded bytes are valid
//   UTF-8 the deltas add up to exactly Decode()'s text.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/streaming_decoder.h"
#include "model/tokenizer.h"
#include "server/utf8.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/reference_encoder.h"
#include "tests/fuzz/stories260k_tokenizer.h"

namespace {

using kvd::Tokenizer;
using kvd::fuzz::Require;
using kvd::fuzz::Stories260kTokenizer;

// The reference encoder is quadratic: longer texts are checked without it.
constexpr size_t kMaxReferenceBytes = 512;

// Streams `ids` (the prompt ended in `prev`) and checks the deltas against Decode().
void CheckStreaming(const Tokenizer& tokenizer, int32_t prev, const std::vector<int32_t>& ids) {
  kvd::StreamingDecoder decoder(&tokenizer, prev);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string delta = decoder.Push(id);
    Require(kvd::IsValidUtf8(delta), "a streamed delta is not valid UTF-8");
    Require(decoder.num_held_bytes() <= 3, "more than one unfinished character held");
    streamed += delta;
  }
  const std::string rest = decoder.Flush();
  Require(kvd::IsValidUtf8(rest), "Flush() is not valid UTF-8");
  Require(decoder.num_held_bytes() == 0, "Flush() kept bytes");
  streamed += rest;
  const std::string decoded = tokenizer.Decode(ids, prev);
  if (kvd::IsValidUtf8(decoded)) {
    Require(streamed == decoded, "streamed text differs from Decode() of valid UTF-8");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tokenizer = Stories260kTokenizer();
  kvd::fuzz::InputReader input(data, size);
  const unsigned char mode = input.Byte();
  const std::string_view rest = input.Rest();
  switch (mode % 3) {
    case 0: {  // text -> ids -> text
      const bool add_bos = mode & 4;
      const std::vector<int32_t> ids = tokenizer.Encode(rest, add_bos);
      if (rest.size() <= kMaxReferenceBytes) {
        Require(ids == kvd::fuzz::RunCEncode(tokenizer, rest, add_bos),
                "Encode differs from run.c");
      }
      Require(static_cast<int64_t>(ids.size()) >=
                  tokenizer.MinEncodedTokens(static_cast<int64_t>(rest.size()), add_bos),
              "fewer tokens than MinEncodedTokens");
      for (int32_t id : ids) Require(id >= 0 && id < tokenizer.vocab_size(), "id out of range");
      Require(add_bos == (!ids.empty() && ids[0] == Tokenizer::kBosId), "BOS misplaced");
      const std::vector<int32_t> body(ids.begin() + (add_bos ? 1 : 0), ids.end());
      Require(rest.empty() == body.empty(), "an empty text must give no tokens but BOS");
      Require(tokenizer.Decode(body, Tokenizer::kBosId) == rest, "decode(encode(text)) != text");
      CheckStreaming(tokenizer, Tokenizer::kBosId, body);
      break;
    }
    case 1: {  // any ids, in and out of the vocabulary, after any previous token
      std::vector<int32_t> ids;
      for (size_t i = 0; i + 2 <= rest.size(); i += 2) {
        const int32_t raw =
            static_cast<uint8_t>(rest[i]) | (static_cast<uint8_t>(rest[i + 1]) << 8);
        ids.push_back(raw % (tokenizer.vocab_size() + 8) - 4);  // a few ids on each side
      }
      CheckStreaming(tokenizer, mode % 2 ? Tokenizer::kBosId : 13, ids);
      break;
    }
    case 2: {  // any bytes, one byte token each
      std::vector<int32_t> ids;
      for (char c : rest) ids.push_back(Tokenizer::kFirstByteId + static_cast<uint8_t>(c));
      CheckStreaming(tokenizer, 13, ids);
      Require(tokenizer.Decode(ids, 13) == rest, "byte tokens did not decode to their bytes");
      break;
    }
  }
  return 0;
}
