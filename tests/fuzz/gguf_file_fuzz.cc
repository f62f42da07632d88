// Fuzz target: the GGUF reader and the llama loader on any file (written to a memfd and
// opened by path).
//
// Invariants: every refusal is a status with a message, never a crash (nor, under
// scripts/fuzz, one allocation over its -malloc_limit_mb: a length or count in the header
// is checked against the file before anything is sized by it); in a file the reader
// accepts every tensor of a known layout lies inside the data section, and one of a type
// kvd converts (up to 2^20 elements) reads as exactly its elements; a spec the loader
// accepts passes ModelSpec::Validate(), and its weights load with exactly the spec's shapes
// unless a tensor is of another type or holds a non-finite value; a tokenizer it accepts has
// the byte pieces at 3..258 and encodes text to ids inside the vocabulary.

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/gguf_file.h"
#include "model/gguf_loader.h"
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
  absl::StatusOr<kvd::GgufFile> file = kvd::GgufFile::Open(path);
  if (!file.ok()) {
    Require(!file.status().message().empty(), "an error without a message");
    ::close(fd);
    return 0;
  }
  Require(file->data_offset() >= 0, "a negative data offset");
  std::vector<float> values;
  for (const kvd::GgufTensorInfo& t : file->tensors()) {
    if (t.num_bytes >= 0) {
      Require(file->data_offset() + static_cast<int64_t>(t.offset) + t.num_bytes <=
                  static_cast<int64_t>(size),
              "a tensor past the end of the file");
    }
    if (kvd::GgmlTypeIsConverted(t.type) && t.num_elements <= (int64_t{1} << 20)) {
      Require(file->ReadAsFloat(t, &values).ok(), "a tensor kvd converts did not read");
      Require(values.size() == static_cast<size_t>(t.num_elements), "a tensor's element count");
    }
  }

  absl::StatusOr<kvd::ModelSpec> spec = kvd::ReadGgufSpec(path);
  if (spec.ok()) {
    Require(spec->Validate().ok(), "an accepted spec does not pass Validate()");
    absl::StatusOr<kvd::ModelWeights> weights =
        kvd::LoadGgufModel(path, /*host_bytes_available=*/int64_t{64} << 20);
    if (weights.ok()) {
      kvd::fuzz::RequireSpecShapes(*weights);
    } else {
      const absl::StatusCode code = weights.status().code();
      Require(code == absl::StatusCode::kUnimplemented || code == absl::StatusCode::kDataLoss ||
                  code == absl::StatusCode::kResourceExhausted,
              "an accepted spec whose weights were refused for another reason");
    }
  } else {
    Require(!spec.status().message().empty(), "a spec error without a message");
  }

  absl::StatusOr<std::unique_ptr<kvd::Tokenizer>> tokenizer = kvd::LoadGgufTokenizer(path);
  if (tokenizer.ok()) {
    kvd::fuzz::RequireUsableTokenizer(**tokenizer, bytes.substr(0, 64));
  } else {
    Require(!tokenizer.status().message().empty(), "a tokenizer error without a message");
  }
  ::close(fd);
  return 0;
}
