#ifndef KVD_TESTS_MODEL_LLAMA_TOKENIZER_CASES_H_
#define KVD_TESTS_MODEL_LLAMA_TOKENIZER_CASES_H_

// Test support: llama.cpp's tokenizer test cases for the 32,000-token LLaMA SentencePiece
// vocabulary (../shared/models/ggml-vocab-llama-spm.gguf.inp and .out: inputs separated by
// "__ggml_vocab_test__" lines, each case's expected ids, without BOS, on one line).

#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer.h"

namespace kvd::test {

inline const std::string kLlamaSpmVocab = KVD_SHARED_DIR "/models/ggml-vocab-llama-spm.gguf";

struct TokenizerCase {
  std::string input;
  std::vector<int32_t> expected;
};

// The cases, in file order; empty when the files cannot be read or their counts differ.
inline std::vector<TokenizerCase> LlamaTokenizerCases() {
  std::ifstream inputs_file(kLlamaSpmVocab + ".inp", std::ios::binary);
  std::string inputs((std::istreambuf_iterator<char>(inputs_file)),
                     std::istreambuf_iterator<char>());
  std::ifstream expected_lines(kLlamaSpmVocab + ".out");
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<TokenizerCase> cases;
  std::string line;
  for (size_t end; (end = inputs.find(separator)) != std::string::npos;) {
    TokenizerCase c{inputs.substr(0, end), {}};
    inputs.erase(0, end + separator.size());
    if (!std::getline(expected_lines, line)) return {};
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.expected.push_back(id);
    cases.push_back(std::move(c));
  }
  if (std::getline(expected_lines, line)) return {};  // more expected lines than inputs
  return cases;
}

// Every case encodes, without BOS, to its expected ids with `tokenizer` (46 cases).
inline void ExpectEncodesLlamaTokenizerCases(const Tokenizer& tokenizer) {
  const std::vector<TokenizerCase> cases = LlamaTokenizerCases();
  ASSERT_EQ(cases.size(), 46u);
  for (const TokenizerCase& c : cases) {
    EXPECT_EQ(tokenizer.Encode(c.input, /*add_bos=*/false), c.expected) << "'" << c.input << "'";
  }
}

}  // namespace kvd::test

#endif  // KVD_TESTS_MODEL_LLAMA_TOKENIZER_CASES_H_
