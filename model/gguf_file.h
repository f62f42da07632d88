#ifndef KVD_MODEL_GGUF_FILE_H_
#define KVD_MODEL_GGUF_FILE_H_

// GGUF, the file format of llama.cpp and ggml (versions 2 and 3, little endian):
//   "GGUF", uint32 version, uint64 tensor count, uint64 metadata count,
//   metadata: string key, uint32 value type, the value (strings are uint64 length + bytes;
//             arrays uint32 element type + uint64 count + the elements),
//   tensor directory: string name, uint32 dimension count, uint64 dims (innermost first),
//             uint32 ggml type, uint64 offset into the data section,
//   padding to `general.alignment` (default 32), then the data section.
// The header is read and checked whole at Open; tensor data is read on demand.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd {

// A metadata value's type, as the file stores it.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// The ggml tensor types kvd converts to fp32 (others are named in errors, not read).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ8_0 = 8,
  kBF16 = 30,
};

// "F32", "Q4_K", ...; "type <n>" for a number ggml does not define.
std::string GgmlTypeName(uint32_t type);

// Whether GgufFile::ReadAsFloat converts tensors of this ggml type (GgmlType's).
bool GgmlTypeIsConverted(uint32_t type);

// One metadata value. Integers keep their sign (`int64_t`, or `uint64_t` for the unsigned
// types). An array keeps its elements as the file stores them, so that it never takes more
// memory than its bytes in the file: scalars as their bytes; strings one after another,
// string i ending at string_ends[i]; an array of arrays only its length.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  std::variant<int64_t, uint64_t, double, bool, std::string> scalar;
  GgufValueType element_type = GgufValueType::kUint8;  // arrays
  uint64_t array_length = 0;                           // arrays
  std::string array_bytes;
  std::vector<uint64_t> string_ends;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is contiguous
  uint32_t type = 0;          // a ggml type (GgmlType for those kvd reads)
  uint64_t offset = 0;        // from the start of the data section
  int64_t num_elements = 0;
  int64_t num_bytes = -1;  // -1 for a type whose block layout kvd does not know
};

class GgufFile {
 public:
  // Reads and checks the header of the GGUF file at `path`: magic, version 2 or 3, every
  // metadata value and tensor entry inside the file, no key or tensor name twice, tensor
  // names of 1 to 64 bytes, at most 4 dimensions, general.alignment a uint32 power of two,
  // each tensor's data aligned and inside the data section. Nothing is sized by a length or
  // count before the file is known to hold it, and the header never takes much more memory
  // than its bytes. Errors name the path and, for a corrupt header, the byte offset:
  // NotFound / PermissionDenied as RegularFileSize gives them, InvalidArgument for what is
  // not such a file, ResourceExhausted when the header does not fit in memory.
  static absl::StatusOr<GgufFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  int64_t data_offset() const { return data_offset_; }

  bool Has(absl::string_view key) const { return metadata_.count(std::string(key)) > 0; }
  const GgufValue* Find(absl::string_view key) const;
  // Typed lookups: NotFound naming the key when it is absent, InvalidArgument naming the key
  // and the stored type when it holds another kind of value (or an integer out of range).
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;  // any number
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  // An array's elements, copied out: strings, or numbers (integers exact up to 2^53, bools
  // as 0 and 1).
  absl::StatusOr<std::vector<std::string>> GetStrings(absl::string_view key) const;
  absl::StatusOr<std::vector<double>> GetNumbers(absl::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // The tensor of that name, or nullptr.
  const GgufTensorInfo* FindTensor(absl::string_view name) const;

  // Reads a tensor of type F32, F16, BF16 or Q8_0 as fp32 into `out` (resized to its
  // elements), a few MiB at a time. Unimplemented naming the tensor and its type for any
  // other type; DataLoss if the file changed since Open; ResourceExhausted when `out` cannot
  // be allocated.
  absl::Status ReadAsFloat(const GgufTensorInfo& tensor, std::vector<float>* out) const;

 private:
  GgufFile() = default;
  // Open's work; may throw std::bad_alloc or std::length_error, which Open turns into a status.
  static absl::StatusOr<GgufFile> Parse(const std::string& path);

  std::string path_;
  uint32_t version_ = 0;
  int64_t file_bytes_ = 0;
  int64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace kvd

#endif  // KVD_MODEL_GGUF_FILE_H_
