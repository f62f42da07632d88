#ifndef KVD_TESTS_MODEL_GGUF_VOCAB_H_
#define KVD_TESTS_MODEL_GGUF_VOCAB_H_

// Test support: the SentencePiece vocabulary of a GGUF file (its tokenizer.ggml.tokens and
// tokenizer.ggml.scores metadata arrays) as the bytes of a llama2.c tokenizer.bin, so that
// kvd's tokenizer can run llama.cpp's tokenizer test cases (../shared/models/).

#include <string>

#include "absl/status/statusor.h"

namespace kvd::test {

// Reads GGUF (version 2 or 3, little endian) metadata from `path`. The pieces are converted as
// llama2.c's tokenizer export converts them: U+2581 (SentencePiece's word boundary) becomes a
// space, and BOS (id 1) and EOS (id 2) become "\n<s>\n" and "\n</s>\n". InvalidArgument naming
// the offset for a file that is not such GGUF or lacks the arrays.
absl::StatusOr<std::string> GgufVocabAsLlama2cTokenizer(const std::string& path);

}  // namespace kvd::test

#endif  // KVD_TESTS_MODEL_GGUF_VOCAB_H_
