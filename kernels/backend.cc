#include "kernels/backend.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace kvd {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    backend_ = other.backend_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

absl::Status ValidateRopeAppend(const RopeParams& p) {
  if (!p.append_kv || p.num_tokens <= 0) return absl::OkStatus();
  if (p.cache.num_kv_heads != p.num_kv_heads || p.cache.head_dim != p.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: append_kv cache has ", p.cache.num_kv_heads, " KV heads of head_dim ",
                     p.cache.head_dim, ", the op ", p.num_kv_heads, " of ", p.head_dim));
  }
  if (p.k == nullptr || p.v == nullptr || p.slot_mapping == nullptr) {
    return absl::InvalidArgumentError("Rope: append_kv needs k, v and slot_mapping");
  }
  const int64_t width = int64_t{p.num_kv_heads} * p.head_dim;
  if (p.k_stride < width || p.v_stride < width) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: append_kv k_stride ", p.k_stride, " and v_stride ", p.v_stride,
                     " must be >= ", width, " (num_kv_heads * head_dim)"));
  }
  return absl::OkStatus();
}

void DeviceBuffer::Reset() {
  if (backend_ != nullptr && data_ != nullptr) backend_->Free(data_, bytes_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace kvd
