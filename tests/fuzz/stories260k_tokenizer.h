#ifndef KVD_TESTS_FUZZ_STORIES260K_TOKENIZER_H_
#define KVD_TESTS_FUZZ_STORIES260K_TOKENIZER_H_

#include <string>

#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace kvd::fuzz {

// stories260K's tokenizer (tok512.bin in ../shared/models), loaded once and kept for the
// process: fuzz targets run millions of inputs against it.
inline const Tokenizer& Stories260kTokenizer() {
  static const Tokenizer* tokenizer = [] {
    auto loaded = Tokenizer::LoadLlama2c(KVD_SHARED_DIR "/models/tok512.bin", 512);
    Require(loaded.ok(), std::string(loaded.status().message()));
    return loaded->release();
  }();
  return *tokenizer;
}

}  // namespace kvd::fuzz

#endif  // KVD_TESTS_FUZZ_STORIES260K_TOKENIZER_H_
