#include "kernels/backend.h"

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

void DeviceBuffer::Reset() {
  if (backend_ != nullptr && data_ != nullptr) backend_->Free(data_, bytes_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace kvd
