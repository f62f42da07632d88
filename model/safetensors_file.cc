#include "model/safetensors_file.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/half_float.h"
#include "model/json_text.h"
#include "model/regular_file.h"
#include "nlohmann/json.hpp"

namespace kvd {

namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors files are little endian; a big-endian host needs byte swaps");

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;
constexpr int64_t kReadBytes = int64_t{4} << 20;

// Bytes per element of the dtypes safetensors defines; 0 for an unknown name.
int64_t DtypeBytes(absl::string_view dtype) {
  struct Known {
    const char* name;
    int64_t bytes;
  };
  static constexpr Known kDtypes[] = {{"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1},
                                      {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
                                      {"BF16", 2},    {"I32", 4}, {"U32", 4}, {"F32", 4},
                                      {"I64", 8},     {"U64", 8}, {"F64", 8}};
  for (const Known& k : kDtypes) {
    if (dtype == k.name) return k.bytes;
  }
  return 0;
}

}  // namespace

bool SafetensorsDtypeIsConverted(absl::string_view dtype) {
  return dtype == "F32" || dtype == "F16" || dtype == "BF16";
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const std::string what = absl::StrCat("safetensors file '", path, "'");
  const absl::StatusOr<int64_t> size = RegularFileSize(path, what);
  if (!size.ok()) return size.status();
  auto bad = [&what](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return CannotOpen(what, errno);
  uint64_t header_bytes = 0;
  if (*size < 8 || !in.read(reinterpret_cast<char*>(&header_bytes), 8)) {
    return bad(absl::StrCat("truncated: ", *size, " bytes, no header length"));
  }
  if (header_bytes > static_cast<uint64_t>(std::min(*size - 8, kMaxHeaderBytes))) {
    return bad(absl::StrCat("header length ", header_bytes, " exceeds the file's ", *size,
                            " bytes or the limit of ", kMaxHeaderBytes));
  }
  std::string header(static_cast<size_t>(header_bytes), '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_bytes))) {
    return bad("read of the header failed");
  }
  if (JsonDepth(header) > kMaxJsonDepth) {
    return bad(absl::StrCat("the header is nested deeper than ", kMaxJsonDepth, " levels"));
  }
  const nlohmann::json json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return bad("the header is not a JSON object");

  SafetensorsFile file;
  file.path_ = path;
  const int64_t data_start = 8 + static_cast<int64_t>(header_bytes);
  const int64_t data_bytes = *size - data_start;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {  // strings only, by the format
      if (!entry.is_object() ||
          std::any_of(entry.begin(), entry.end(), [](const auto& v) { return !v.is_string(); })) {
        return bad("__metadata__ is not an object of strings");
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", name, "'");
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return bad(absl::StrCat(where, ": needs dtype, shape and two data_offsets"));
    }
    SafetensorsTensor t;
    t.name = name;
    t.dtype = entry["dtype"].get<std::string>();
    const int64_t element_bytes = DtypeBytes(t.dtype);
    if (element_bytes == 0) {
      return absl::UnimplementedError(
          absl::StrCat(what, ": ", where, ": dtype '", t.dtype, "', which kvd does not know"));
    }
    t.num_elements = 1;
    for (const nlohmann::json& d : entry["shape"]) {
      // Any tensor's bytes fit in the file, so no real dimension or product reaches 2^40.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40) ||
          (d.get<uint64_t>() > 0 &&
           static_cast<uint64_t>(t.num_elements) > (uint64_t{1} << 40) / d.get<uint64_t>())) {
        return bad(absl::StrCat(where, ": bad shape ", ShownJson(entry["shape"])));
      }
      t.shape.push_back(d.get<int64_t>());
      t.num_elements *= d.get<int64_t>();
    }
    const nlohmann::json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return bad(absl::StrCat(where, ": bad data_offsets ", ShownJson(offsets)));
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > static_cast<uint64_t>(data_bytes)) {
      return bad(absl::StrCat(where, ": data_offsets ", ShownJson(offsets), " outside the ",
                              data_bytes, " bytes of data (truncated?)"));
    }
    t.offset = data_start + static_cast<int64_t>(begin);
    t.num_bytes = static_cast<int64_t>(end - begin);
    if (t.num_bytes != t.num_elements * element_bytes) {
      return bad(absl::StrCat(where, ": ", t.num_bytes, " bytes for ", t.num_elements,
                              " elements of ", t.dtype));
    }
    file.index_.emplace(t.name, file.tensors_.size());
    file.tensors_.push_back(std::move(t));
  }
  return file;
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::ReadAsFloat(const SafetensorsTensor& tensor,
                                          std::vector<float>* out) const {
  const std::string where =
      absl::StrCat("safetensors file '", path_, "': tensor '", tensor.name, "'");
  const bool f32 = tensor.dtype == "F32";
  const bool f16 = tensor.dtype == "F16";
  if (!SafetensorsDtypeIsConverted(tensor.dtype)) {
    return absl::UnimplementedError(
        absl::StrCat(where, " is ", tensor.dtype, "; kvd reads F32, F16 and BF16 tensors"));
  }
  try {
    out->resize(static_cast<size_t>(tensor.num_elements));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(where, ": out of host memory for its ",
                                                     tensor.num_elements * 4, " bytes as fp32"));
  }
  errno = 0;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return CannotOpen(absl::StrCat("safetensors file '", path_, "'"), errno);
  in.seekg(tensor.offset, std::ios::beg);
  const int64_t element_bytes = f32 ? 4 : 2;
  const int64_t per_read = kReadBytes / element_bytes;
  std::string raw;
  float* dst = out->data();
  for (int64_t first = 0; first < tensor.num_elements; first += per_read) {
    const int64_t n = std::min(per_read, tensor.num_elements - first);
    raw.resize(static_cast<size_t>(n * element_bytes));
    if (!in.read(raw.data(), static_cast<std::streamsize>(raw.size()))) {
      return absl::DataLossError(absl::StrCat(where, ": read failed (file changed since opened?)"));
    }
    if (f32) {
      std::memcpy(dst, raw.data(), raw.size());
      dst += n;
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      *dst++ = f16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd
