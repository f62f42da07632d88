#include "model/gguf_file.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/half_float.h"
#include "model/regular_file.h"

namespace kvd {

namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF files are read as little endian; a big-endian host needs byte swaps");

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;
// Far above any real key or name, and a bound on what a corrupt length makes us allocate
// before the bytes are known to be there.
constexpr uint64_t kMaxKeyBytes = 1 << 16;
constexpr size_t kMaxTensorNameBytes = 64;  // the GGUF specification's limit
// Bytes read from the file at a time, for the header and for tensor data.
constexpr int64_t kReadBytes = int64_t{4} << 20;

// Elements per block and bytes per block of the ggml types whose layout kvd knows (for the
// directory's bounds checks), after ggml's type traits.
struct TypeLayout {
  uint32_t type;
  const char* name;
  int64_t block_elements;  // 0: layout not known here
  int64_t block_bytes;
};
constexpr TypeLayout kTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},       {2, "Q4_0", 32, 18},    {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},    {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {16, "IQ2_XXS", 0, 0},  {17, "IQ2_XS", 0, 0},
    {18, "IQ3_XXS", 0, 0},  {19, "IQ1_S", 0, 0},    {20, "IQ4_NL", 0, 0},   {21, "IQ3_S", 0, 0},
    {22, "IQ2_S", 0, 0},    {23, "IQ4_XS", 0, 0},   {24, "I8", 1, 1},       {25, "I16", 1, 2},
    {26, "I32", 1, 4},      {27, "I64", 1, 8},      {28, "F64", 1, 8},      {29, "IQ1_M", 0, 0},
    {30, "BF16", 1, 2},     {34, "TQ1_0", 0, 0},    {35, "TQ2_0", 0, 0},
};

const TypeLayout* FindType(uint32_t type) {
  for (const TypeLayout& t : kTypes) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

const char* ValueTypeName(GgufValueType type) {
  static constexpr const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                           "int32",  "float32", "bool",   "string", "array",
                                           "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

// Bytes of one scalar of `type` (0 for strings and arrays).
int64_t ScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

// Sequential little-endian reads of a file's header, buffered; every read first checks that
// the file holds the bytes, so a corrupt length fails as truncation before any allocation.
class HeaderReader {
 public:
  HeaderReader(std::ifstream& in, int64_t file_bytes) : in_(in), file_bytes_(file_bytes) {}

  int64_t offset() const { return offset_; }
  int64_t remaining() const { return file_bytes_ - offset_; }

  bool Bytes(void* out, int64_t n) {
    if (n > remaining() || !Fill(n)) return false;
    std::memcpy(out, buffer_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    offset_ += n;
    return true;
  }
  template <typename T>
  bool Read(T* value) {
    return Bytes(value, sizeof(T));
  }
  bool String(std::string* s, uint64_t max_bytes) {
    uint64_t n = 0;
    if (!Read(&n) || n > max_bytes || n > static_cast<uint64_t>(remaining())) return false;
    s->resize(static_cast<size_t>(n));
    return Bytes(s->data(), static_cast<int64_t>(n));
  }

 private:
  // Makes n bytes available at pos_. REQUIRES: n <= remaining().
  bool Fill(int64_t n) {
    const size_t available = buffer_.size() - pos_;
    if (static_cast<size_t>(n) <= available) return true;
    buffer_.erase(0, pos_);
    pos_ = 0;
    const int64_t want = std::min(std::max<int64_t>(n, kReadBytes), remaining());
    const size_t old = buffer_.size();
    buffer_.resize(static_cast<size_t>(want));
    const int64_t more = want - static_cast<int64_t>(old);
    return static_cast<bool>(in_.read(buffer_.data() + old, more));
  }

  std::ifstream& in_;
  int64_t file_bytes_;
  int64_t offset_ = 0;
  std::string buffer_;
  size_t pos_ = 0;
};

}  // namespace

std::string GgmlTypeName(uint32_t type) {
  const TypeLayout* t = FindType(type);
  return t != nullptr ? std::string(t->name) : absl::StrCat("type ", type);
}

bool GgmlTypeIsConverted(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
      return true;
  }
  return false;
}

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  try {
    return Parse(path);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("GGUF file '", path, "': out of memory for its header"));
}

absl::StatusOr<GgufFile> GgufFile::Parse(const std::string& path) {
  const std::string what = absl::StrCat("GGUF file '", path, "'");
  const absl::StatusOr<int64_t> size = RegularFileSize(path, what);
  if (!size.ok()) return size.status();
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return CannotOpen(what, errno);
  HeaderReader r(in, *size);
  auto corrupt = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": at offset ", r.offset(), ": ", why));
  };

  GgufFile file;
  file.path_ = path;
  file.file_bytes_ = *size;
  char magic[4] = {};
  if (!r.Bytes(magic, 4) || std::memcmp(magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a GGUF file (no GGUF magic)"));
  }
  uint64_t num_tensors = 0, num_kv = 0;
  if (!r.Read(&file.version_)) return corrupt("truncated header");
  if (file.version_ != 2 && file.version_ != 3) {
    return corrupt(absl::StrCat("GGUF version ", file.version_, " (kvd reads versions 2 and 3)"));
  }
  if (!r.Read(&num_tensors) || !r.Read(&num_kv)) return corrupt("truncated header");
  // A metadata entry takes at least 13 bytes and a tensor entry at least 32: counts beyond
  // what the file could hold are corrupt, refused before anything is sized by them.
  if (num_kv > static_cast<uint64_t>(r.remaining()) / 13 ||
      num_tensors > static_cast<uint64_t>(r.remaining()) / 32) {
    return corrupt(absl::StrCat(num_kv, " metadata entries and ", num_tensors,
                                " tensors cannot fit in the file's ", *size, " bytes"));
  }

  // One value of `type` into *v (elements of an array of arrays are skipped).
  auto read_value = [&](auto&& self, GgufValueType type, GgufValue* v, int depth) -> bool {
    v->type = type;
    switch (type) {
      case GgufValueType::kUint8: {
        uint8_t x;
        if (!r.Read(&x)) return false;
        v->scalar = uint64_t{x};
        return true;
      }
      case GgufValueType::kInt8: {
        int8_t x;
        if (!r.Read(&x)) return false;
        v->scalar = int64_t{x};
        return true;
      }
      case GgufValueType::kUint16: {
        uint16_t x;
        if (!r.Read(&x)) return false;
        v->scalar = uint64_t{x};
        return true;
      }
      case GgufValueType::kInt16: {
        int16_t x;
        if (!r.Read(&x)) return false;
        v->scalar = int64_t{x};
        return true;
      }
      case GgufValueType::kUint32: {
        uint32_t x;
        if (!r.Read(&x)) return false;
        v->scalar = uint64_t{x};
        return true;
      }
      case GgufValueType::kInt32: {
        int32_t x;
        if (!r.Read(&x)) return false;
        v->scalar = int64_t{x};
        return true;
      }
      case GgufValueType::kUint64: {
        uint64_t x;
        if (!r.Read(&x)) return false;
        v->scalar = x;
        return true;
      }
      case GgufValueType::kInt64: {
        int64_t x;
        if (!r.Read(&x)) return false;
        v->scalar = x;
        return true;
      }
      case GgufValueType::kFloat32: {
        float x;
        if (!r.Read(&x)) return false;
        v->scalar = double{x};
        return true;
      }
      case GgufValueType::kFloat64: {
        double x;
        if (!r.Read(&x)) return false;
        v->scalar = x;
        return true;
      }
      case GgufValueType::kBool: {
        uint8_t x;
        if (!r.Read(&x) || x > 1) return false;
        v->scalar = x == 1;
        return true;
      }
      case GgufValueType::kString: {
        std::string s;
        if (!r.String(&s, std::numeric_limits<uint64_t>::max())) return false;
        v->scalar = std::move(s);
        return true;
      }
      case GgufValueType::kArray: {
        uint32_t element = 0;
        if (depth > 1 || !r.Read(&element) || !r.Read(&v->array_length)) return false;
        v->element_type = static_cast<GgufValueType>(element);
        const int64_t scalar_bytes = ScalarBytes(v->element_type);
        const bool is_string = v->element_type == GgufValueType::kString;
        const bool is_array = v->element_type == GgufValueType::kArray;
        if (!is_string && !is_array && scalar_bytes == 0) return false;
        // Each element takes at least 8 bytes (a string's length), or its scalar's size.
        const uint64_t min_bytes = scalar_bytes > 0 ? scalar_bytes : 8;
        if (v->array_length > static_cast<uint64_t>(r.remaining()) / min_bytes) return false;
        if (!is_string && !is_array) {  // the scalars' bytes as they are
          v->array_bytes.resize(static_cast<size_t>(v->array_length * scalar_bytes));
          if (!r.Bytes(v->array_bytes.data(), static_cast<int64_t>(v->array_bytes.size()))) {
            return false;
          }
          if (v->element_type == GgufValueType::kBool) {
            for (char b : v->array_bytes) {
              if (static_cast<uint8_t>(b) > 1) return false;
            }
          }
          return true;
        }
        if (is_string) v->string_ends.reserve(static_cast<size_t>(v->array_length));
        for (uint64_t i = 0; i < v->array_length; ++i) {
          GgufValue element_value;
          if (!self(self, v->element_type, &element_value, depth + 1)) return false;
          if (is_string) {
            v->array_bytes += std::get<std::string>(element_value.scalar);
            v->string_ends.push_back(v->array_bytes.size());
          }
        }
        return true;
      }
    }
    return false;
  };

  for (uint64_t i = 0; i < num_kv; ++i) {
    std::string key;
    if (!r.String(&key, kMaxKeyBytes)) {
      return corrupt(absl::StrCat("metadata entry ", i, ": truncated or over-long key"));
    }
    uint32_t type = 0;
    GgufValue value;
    if (!r.Read(&type) || !read_value(read_value, static_cast<GgufValueType>(type), &value, 0)) {
      return corrupt(absl::StrCat("metadata '", key, "': truncated or bad value of type ",
                                  ValueTypeName(static_cast<GgufValueType>(type))));
    }
    if (!file.metadata_.emplace(key, std::move(value)).second) {
      return corrupt(absl::StrCat("metadata key '", key, "' appears twice"));
    }
  }

  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* a = file.Find("general.alignment"); a != nullptr) {
    const uint64_t* value = std::get_if<uint64_t>(&a->scalar);
    if (a->type != GgufValueType::kUint32 || value == nullptr || *value == 0 ||
        (*value & (*value - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": general.alignment must be a uint32 power of two"));
    }
    alignment = *value;
  }

  if (num_tensors > (uint64_t{1} << 16)) {  // room for the first ones; the rest as they come
    file.tensors_.reserve(size_t{1} << 16);
  } else {
    file.tensors_.reserve(static_cast<size_t>(num_tensors));
  }
  for (uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensorInfo t;
    uint32_t num_dims = 0;
    if (!r.String(&t.name, kMaxKeyBytes) || !r.Read(&num_dims)) {
      return corrupt(absl::StrCat("tensor entry ", i, ": truncated"));
    }
    if (t.name.empty() || t.name.size() > kMaxTensorNameBytes) {
      return corrupt(absl::StrCat("tensor entry ", i, ": a name of ", t.name.size(),
                                  " bytes (allowed: 1 to ", kMaxTensorNameBytes, ")"));
    }
    if (num_dims == 0 || num_dims > kMaxDims) {
      return corrupt(absl::StrCat("tensor '", t.name, "' has ", num_dims,
                                  " dimensions (allowed: 1 to ", kMaxDims, ")"));
    }
    t.num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      uint64_t dim = 0;
      if (!r.Read(&dim)) return corrupt(absl::StrCat("tensor '", t.name, "': truncated"));
      // A tensor's bytes must fit in the file, so no real dimension reaches 2^40.
      if (dim == 0 || dim > (uint64_t{1} << 40) ||
          static_cast<uint64_t>(t.num_elements) > (uint64_t{1} << 62) / dim) {
        return corrupt(absl::StrCat("tensor '", t.name, "': dimension ", d, " is ", dim));
      }
      t.dims.push_back(static_cast<int64_t>(dim));
      t.num_elements *= static_cast<int64_t>(dim);
    }
    if (!r.Read(&t.type) || !r.Read(&t.offset)) {
      return corrupt(absl::StrCat("tensor '", t.name, "': truncated"));
    }
    if (const TypeLayout* layout = FindType(t.type);
        layout != nullptr && layout->block_elements > 0) {
      if (t.dims[0] % layout->block_elements != 0) {
        return corrupt(absl::StrCat("tensor '", t.name, "' of type ", layout->name, ": its first ",
                                    "dimension ", t.dims[0], " is not a multiple of ",
                                    layout->block_elements));
      }
      const int64_t blocks = t.num_elements / layout->block_elements;
      if (blocks > std::numeric_limits<int64_t>::max() / layout->block_bytes) {
        return corrupt(absl::StrCat("tensor '", t.name, "': ", t.num_elements, " elements of ",
                                    layout->name, " are more bytes than any file holds"));
      }
      t.num_bytes = blocks * layout->block_bytes;
    }
    if (t.offset % alignment != 0) {
      return corrupt(absl::StrCat("tensor '", t.name, "': data offset ", t.offset,
                                  " is not a multiple of the alignment ", alignment));
    }
    if (!file.tensor_index_.emplace(t.name, file.tensors_.size()).second) {
      return corrupt(absl::StrCat("tensor '", t.name, "' appears twice"));
    }
    file.tensors_.push_back(std::move(t));
  }
  const uint64_t header_end = static_cast<uint64_t>(r.offset());
  file.data_offset_ = static_cast<int64_t>((header_end + alignment - 1) / alignment * alignment);
  const int64_t data_bytes = *size - std::min<int64_t>(file.data_offset_, *size);
  for (const GgufTensorInfo& t : file.tensors_) {
    const int64_t bytes = std::max<int64_t>(t.num_bytes, 0);
    if (t.offset > static_cast<uint64_t>(data_bytes) ||
        static_cast<uint64_t>(bytes) > static_cast<uint64_t>(data_bytes) - t.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor '", t.name, "' (", GgmlTypeName(t.type), ", ", bytes,
                       " bytes at data offset ", t.offset, ") ends past the end of the file (",
                       data_bytes, " bytes of data): truncated?"));
    }
  }
  return file;
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

absl::Status Missing(absl::string_view key) {
  return absl::NotFoundError(absl::StrCat("GGUF metadata key '", key, "' is missing"));
}

absl::Status WrongType(absl::string_view key, const GgufValue& v, absl::string_view wanted) {
  std::string stored = ValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) {
    stored = absl::StrCat("array of ", ValueTypeName(v.element_type));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF metadata '", key, "' is ", stored, ", not ", wanted));
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (const auto* i = std::get_if<int64_t>(&v->scalar); i && v->type != GgufValueType::kArray) {
    return *i;
  }
  if (const auto* u = std::get_if<uint64_t>(&v->scalar); u && v->type != GgufValueType::kArray) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF metadata '", key, "' = ", *u, " is out of range"));
    }
    return static_cast<int64_t>(*u);
  }
  return WrongType(key, *v, "an integer");
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type == GgufValueType::kFloat32 || v->type == GgufValueType::kFloat64) {
    return std::get<double>(v->scalar);
  }
  absl::StatusOr<int64_t> i = GetInt(key);
  if (i.ok()) return static_cast<double>(*i);
  return WrongType(key, *v, "a number");
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kString) return WrongType(key, *v, "a string");
  return std::get<std::string>(v->scalar);
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStrings(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kArray || v->element_type != GgufValueType::kString) {
    return WrongType(key, *v, "an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(v->string_ends.size());
  uint64_t begin = 0;
  for (const uint64_t end : v->string_ends) {
    out.push_back(v->array_bytes.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::GetNumbers(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  const int64_t size = ScalarBytes(v->element_type);
  if (v->type != GgufValueType::kArray || size == 0) {
    return WrongType(key, *v, "an array of numbers");
  }
  std::vector<double> out;
  out.reserve(static_cast<size_t>(v->array_length));
  for (size_t at = 0; at < v->array_bytes.size(); at += static_cast<size_t>(size)) {
    const char* p = v->array_bytes.data() + at;
    auto load = [p](auto value) {
      std::memcpy(&value, p, sizeof(value));
      return static_cast<double>(value);
    };
    switch (v->element_type) {
      case GgufValueType::kUint8:
      case GgufValueType::kBool:
        out.push_back(load(uint8_t{}));
        break;
      case GgufValueType::kInt8:
        out.push_back(load(int8_t{}));
        break;
      case GgufValueType::kUint16:
        out.push_back(load(uint16_t{}));
        break;
      case GgufValueType::kInt16:
        out.push_back(load(int16_t{}));
        break;
      case GgufValueType::kUint32:
        out.push_back(load(uint32_t{}));
        break;
      case GgufValueType::kInt32:
        out.push_back(load(int32_t{}));
        break;
      case GgufValueType::kFloat32:
        out.push_back(load(float{}));
        break;
      case GgufValueType::kUint64:
        out.push_back(load(uint64_t{}));
        break;
      case GgufValueType::kInt64:
        out.push_back(load(int64_t{}));
        break;
      default:  // kFloat64
        out.push_back(load(double{}));
        break;
    }
  }
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status GgufFile::ReadAsFloat(const GgufTensorInfo& tensor, std::vector<float>* out) const {
  const std::string where = absl::StrCat("GGUF file '", path_, "': tensor '", tensor.name, "'");
  const auto type = static_cast<GgmlType>(tensor.type);
  if (!GgmlTypeIsConverted(tensor.type)) {
    return absl::UnimplementedError(absl::StrCat(where, " is ", GgmlTypeName(tensor.type),
                                                 "; kvd reads F32, F16, BF16 and Q8_0 tensors"));
  }
  try {
    out->resize(static_cast<size_t>(tensor.num_elements));
  } catch (const std::exception&) {  // bad_alloc, or length_error past what a vector can hold
    return absl::ResourceExhaustedError(absl::StrCat(where, ": out of host memory for its ",
                                                     tensor.num_elements * 4, " bytes as fp32"));
  }
  errno = 0;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return CannotOpen(absl::StrCat("GGUF file '", path_, "'"), errno);
  in.seekg(data_offset_ + static_cast<int64_t>(tensor.offset), std::ios::beg);
  // Whole blocks per read: 32 elements of Q8_0 take 34 bytes.
  const int64_t block_elements = type == GgmlType::kQ8_0 ? 32 : 1;
  const int64_t block_bytes = type == GgmlType::kQ8_0 ? 34 : type == GgmlType::kF32 ? 4 : 2;
  const int64_t blocks_per_read = std::max<int64_t>(1, kReadBytes / block_bytes);
  const int64_t num_blocks = tensor.num_elements / block_elements;
  std::string raw;
  float* dst = out->data();
  for (int64_t first = 0; first < num_blocks; first += blocks_per_read) {
    const int64_t blocks = std::min(blocks_per_read, num_blocks - first);
    raw.resize(static_cast<size_t>(blocks * block_bytes));
    if (!in.read(raw.data(), static_cast<std::streamsize>(raw.size()))) {
      return absl::DataLossError(absl::StrCat(where, ": read failed (file changed since opened?)"));
    }
    const char* src = raw.data();
    switch (type) {
      case GgmlType::kF32:
        std::memcpy(dst, src, raw.size());
        dst += blocks;
        break;
      case GgmlType::kF16:
      case GgmlType::kBF16:
        for (int64_t i = 0; i < blocks; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          *dst++ = type == GgmlType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
        }
        break;
      case GgmlType::kQ8_0:
        for (int64_t b = 0; b < blocks; ++b) {
          const char* block = src + b * block_bytes;
          uint16_t d;
          std::memcpy(&d, block, 2);
          const float scale = HalfToFloat(d);
          for (int i = 0; i < 32; ++i) *dst++ = scale * static_cast<int8_t>(block[2 + i]);
        }
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd
