#ifndef KVD_MODEL_SENTENCEPIECE_MODEL_H_
#define KVD_MODEL_SENTENCEPIECE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace kvd {

// A SentencePiece model file (`tokenizer.model`, a serialized sentencepiece.ModelProto) as
// kvd's tokenizer: its pieces (field 1: piece, score, type) taken as llama2.c's export takes
// them (U+2581 becomes a space; BOS and EOS decode as "\n<s>\n" and "\n</s>\n"). Only the
// layout of Llama 2, Mistral and TinyLlama's files is read: a BPE model (trainer_spec
// model_type 2) with <unk>, BOS and EOS at ids 0, 1, 2 (BOS and EOS control pieces), the
// byte pieces at 3..258, no user-defined pieces, and Llama's normalizer_spec (name
// "identity", no character map, add_dummy_prefix 1, remove_extra_whitespaces 0; whitespace
// not a suffix); others are Unimplemented naming what differs. Pieces past an expected
// vocabulary are counted, not kept. InvalidArgument
// naming the file and offset for a corrupt file, and when expected_vocab_size >= 0 does not
// match.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& path, int32_t expected_vocab_size = -1);

}  // namespace kvd

#endif  // KVD_MODEL_SENTENCEPIECE_MODEL_H_
