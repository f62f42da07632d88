#ifndef KVD_TESTS_FUZZ_LOADER_CHECKS_H_
#define KVD_TESTS_FUZZ_LOADER_CHECKS_H_

// Fuzz support: what a model or tokenizer file a loader accepted must hold.

#include <cstdint>
#include <string_view>

#include "model/model_weights.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace kvd::fuzz {

inline void RequireSpecShapes(ModelWeights& w) {
  Require(w.layers.size() == static_cast<size_t>(w.spec.num_layers), "layer count");
  Require(w.spec.shared_classifier == w.classifier.empty(), "classifier presence");
  for (const WeightSlot& slot : WeightSlots(w)) {
    int64_t elements = 1;
    for (int64_t d : slot.shape) elements *= d;
    Require(slot.dest->size() == static_cast<size_t>(elements), "a tensor of another shape");
  }
}

// A tokenizer read from a foreign vocabulary (GGUF, SentencePiece) has the byte pieces at
// 3..258 and encodes `text` to ids inside its vocabulary.
inline void RequireUsableTokenizer(const Tokenizer& t, std::string_view text) {
  for (int32_t id = 3; id < 259; ++id) {
    Require(t.piece(id).size() == 6 && t.piece(id).substr(0, 3) == "<0x", "a byte piece");
  }
  for (int32_t id : t.Encode(text, /*add_bos=*/true)) {
    Require(id >= 0 && id < t.vocab_size(), "an id outside the vocabulary");
  }
}

}  // namespace kvd::fuzz

#endif  // KVD_TESTS_FUZZ_LOADER_CHECKS_H_
