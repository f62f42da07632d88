// Fuzz target: the readers of a Hugging Face directory's files on any bytes (written to a
// memfd and opened by path): SafetensorsFile and LoadSentencePieceTokenizer.
//
// Invariants: every refusal is a status with a message, never a crash (nor, under
// scripts/fuzz, one allocation over its -malloc_limit_mb); in a safetensors file the reader
// accepts every tensor lies inside the file and one of F32, F16 or BF16 (up to 2^20
// elements) reads as exactly its elements; a tokenizer accepted has the byte pieces at
// 3..258 and encodes text to ids inside its vocabulary.

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/safetensors_file.h"
#include "model/sentencepiece_model.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/loader_checks.h"

namespace {

using kvd::fuzz::MemoryFile;
using kvd::fuzz::Require;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  int fd = -1;
  const std::string path = MemoryFile(bytes, &fd);

  absl::StatusOr<kvd::SafetensorsFile> file = kvd::SafetensorsFile::Open(path);
  if (file.ok()) {
    std::vector<float> values;
    for (const kvd::SafetensorsTensor& t : file->tensors()) {
      Require(t.offset >= 8 && t.num_bytes >= 0 &&
                  t.offset + t.num_bytes <= static_cast<int64_t>(size),
              "a tensor outside the file");
      if (kvd::SafetensorsDtypeIsConverted(t.dtype) && t.num_elements <= (int64_t{1} << 20)) {
        Require(file->ReadAsFloat(t, &values).ok(), "a tensor kvd converts did not read");
        Require(values.size() == static_cast<size_t>(t.num_elements), "element count");
      }
    }
  } else {
    Require(!file.status().message().empty(), "a safetensors error without a message");
  }

  absl::StatusOr<std::unique_ptr<kvd::Tokenizer>> tokenizer =
      kvd::LoadSentencePieceTokenizer(path);
  if (tokenizer.ok()) {
    kvd::fuzz::RequireUsableTokenizer(**tokenizer, bytes.substr(0, 64));
  } else {
    Require(!tokenizer.status().message().empty(), "a tokenizer error without a message");
  }
  ::close(fd);
  return 0;
}
