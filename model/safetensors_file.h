#ifndef KVD_MODEL_SAFETENSORS_FILE_H_
#define KVD_MODEL_SAFETENSORS_FILE_H_

// safetensors, Hugging Face's tensor file: uint64 little-endian header length N, N bytes of
// JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the data after the header; "__metadata__" holds strings), then the data. The header
// is read and checked whole at Open; tensor data is read on demand.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;  // outermost first (row-major)
  int64_t offset = 0;          // in the file
  int64_t num_bytes = 0;
  int64_t num_elements = 0;
};

// Whether SafetensorsFile::ReadAsFloat converts tensors of this dtype (F32, F16, BF16).
bool SafetensorsDtypeIsConverted(absl::string_view dtype);

class SafetensorsFile {
 public:
  // The header of the file at `path`: JSON of at most 100 MiB inside the file; every tensor
  // of a known dtype, its bytes equal to its elements times the dtype's size, inside the
  // data section. Errors name the path: NotFound / PermissionDenied as RegularFileSize gives
  // them, InvalidArgument for what is not such a file.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor of that name, or nullptr.
  const SafetensorsTensor* Find(absl::string_view name) const;

  // Reads an F32, F16 or BF16 tensor as fp32 into `out`, a few MiB at a time. Unimplemented
  // naming the tensor and dtype for others; DataLoss if the file changed since Open.
  absl::Status ReadAsFloat(const SafetensorsTensor& tensor, std::vector<float>* out) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace kvd

#endif  // KVD_MODEL_SAFETENSORS_FILE_H_
