// Fuzz target: Tokenizer::LoadLlama2c on any file (written to a memfd and opened by path).
//
// Invariants: loading returns a status, never crashes (nor, under scripts/fuzz, makes one
// allocation over its -malloc_limit_mb); a vocabulary it accepts has the 256 byte pieces at
// ids 3..258, and encoding any text with it gives exactly the tokens of run.c's encoder
// (reference_encoder.h, whatever the scores and ties; a piece given twice is looked up as
// its lowest id on both sides, where run.c's binary search may take either), in the
// vocabulary and at least MinEncodedTokens of them.

#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/reference_encoder.h"

namespace {

using kvd::Tokenizer;
using kvd::fuzz::MemoryFile;
using kvd::fuzz::Require;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::fuzz::InputReader input(data, size);
  const unsigned char flags = input.Byte();
  const std::string_view text = input.Bytes(input.Byte());
  int fd = -1;
  const std::string path = MemoryFile(input.Rest(), &fd);
  // Half the time the loader is told a vocabulary size, as a model does.
  const int32_t expected_vocab = flags & 1 ? 259 + (flags >> 1) : -1;
  auto loaded = Tokenizer::LoadLlama2c(path, expected_vocab);
  ::close(fd);
  if (!loaded.ok()) {
    Require(!loaded.status().message().empty(), "an error without a message");
    return 0;
  }
  const Tokenizer& tokenizer = **loaded;
  Require(tokenizer.vocab_size() >= 259, "fewer than 259 tokens accepted");
  Require(expected_vocab < 0 || tokenizer.vocab_size() == expected_vocab, "wrong vocab size");
  for (int byte = 0; byte < 256; ++byte) {
    Require(tokenizer.DecodeToken(13, Tokenizer::kFirstByteId + byte) ==
                std::string(1, static_cast<char>(byte)),
            "a byte token does not decode to its byte");
  }
  for (bool add_bos : {false, true}) {
    const std::vector<int32_t> ids = tokenizer.Encode(text, add_bos);
    Require(ids == kvd::fuzz::RunCEncode(tokenizer, text, add_bos), "Encode differs from run.c");
    Require(static_cast<int64_t>(ids.size()) >=
                tokenizer.MinEncodedTokens(static_cast<int64_t>(text.size()), add_bos),
            "fewer tokens than MinEncodedTokens");
    for (int32_t id : ids) Require(id >= 0 && id < tokenizer.vocab_size(), "id out of range");
    tokenizer.Decode(ids, Tokenizer::kBosId);
  }
  return 0;
}
