// Fuzz target: the llama2.c checkpoint reader on any file (written to a memfd and opened by
// path).
//
// A file's size must match its header exactly, which random bytes almost never do; so when
// the reader refuses a file for its size alone, the same header is tried again at the size
// the reader said it expects (when that is small), padded with the input's bytes and zeros.
//
// Invariants: every refusal is a status with a message, never a crash (nor, under
// scripts/fuzz, one allocation over its -malloc_limit_mb, such as a header's before the size
// check); a file the reader accepts gives a spec that
// passes ModelSpec::Validate() and, loaded, weights of exactly the spec's shapes (or a refusal
// naming a float that is not finite); a NaN planted in its first weight is refused.

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "model/llama2c_loader.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/loader_checks.h"

namespace {

using kvd::fuzz::MemoryFile;
using kvd::fuzz::Require;

constexpr int64_t kMaxPaddedBytes = int64_t{1} << 20;

// The byte count a size-mismatch error expects ("... expected N bytes, file has M ..."),
// or -1 for any other error.
int64_t ExpectedBytes(absl::string_view message) {
  if (message.find("file size does not match its header") == absl::string_view::npos) return -1;
  const size_t at = message.find("expected ");
  if (at == absl::string_view::npos) return -1;
  const absl::string_view digits = message.substr(at + 9, message.find(' ', at + 9) - (at + 9));
  int64_t bytes = -1;
  return absl::SimpleAtoi(digits, &bytes) ? bytes : -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string file(reinterpret_cast<const char*>(data), size);
  int fd = -1;
  std::string path = MemoryFile(file, &fd);
  auto spec = kvd::ReadLlama2cSpec(path);
  ::close(fd);
  if (!spec.ok()) {
    Require(!spec.status().message().empty(), "an error without a message");
    const int64_t expected = ExpectedBytes(spec.status().message());
    if (expected < 0 || expected > kMaxPaddedBytes) return 0;
    file.resize(static_cast<size_t>(expected), '\0');
    path = MemoryFile(file, &fd);
    spec = kvd::ReadLlama2cSpec(path);
    Require(spec.ok(), "refused a file of the size it asked for");
  } else {
    path = MemoryFile(file, &fd);
  }
  Require(spec->Validate().ok(), "an accepted spec does not pass Validate()");
  // Weights start after the header: 256 bytes in version 1 (magic "ak42"), 28 in version 0.
  const size_t header_bytes = file.compare(0, 4, "24ka") == 0 ? 256 : 28;
  const int64_t host_bytes = static_cast<int64_t>(file.size());
  auto weights = kvd::LoadLlama2cCheckpoint(path, host_bytes);
  ::close(fd);
  bool all_finite = true;
  for (size_t i = header_bytes; i + 4 <= file.size(); i += 4) {
    float x;
    std::memcpy(&x, file.data() + i, 4);
    all_finite = all_finite && std::isfinite(x);
  }
  if (weights.ok()) {
    Require(weights->spec.dim == spec->dim && weights->spec.num_layers == spec->num_layers,
            "the loaded spec differs from the header's");
    kvd::fuzz::RequireSpecShapes(*weights);
  } else {
    // Only a non-finite float (a weight, or the skipped RoPE tables') may fail the load.
    Require(!all_finite, "refused a well-formed file");
  }
  // A NaN in the first weight (token_embedding's in version 0, attn_norm's in 1) is refused.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(file.data() + header_bytes, &nan, 4);
  path = MemoryFile(file, &fd);
  Require(!kvd::LoadLlama2cCheckpoint(path, host_bytes).ok(), "a NaN weight was loaded");
  ::close(fd);
  return 0;
}
