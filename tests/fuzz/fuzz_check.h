#ifndef KVD_TESTS_FUZZ_FUZZ_CHECK_H_
#define KVD_TESTS_FUZZ_FUZZ_CHECK_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace kvd::fuzz {

// A fuzz target's invariant: when it does not hold, say which and abort, so that libFuzzer
// saves the input and the replay test (replay_main.cc) fails on it.
inline void Require(bool holds, std::string_view what) {
  if (holds) return;
  std::fprintf(stderr, "fuzz invariant broken: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

// A path that reads back `bytes` (a memfd, opened through /proc), for loaders that take a
// path; valid until `*fd` is closed.
inline std::string MemoryFile(std::string_view bytes, int* fd) {
  *fd = ::memfd_create("kvd_fuzz", 0);
  Require(*fd >= 0, "memfd_create failed");
  Require(::write(*fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()),
          "short write to the memfd");
  return "/proc/self/fd/" + std::to_string(*fd);
}

// Consumes the fuzz input front to back: small integers that steer a target, then the rest.
class InputReader {
 public:
  InputReader(const unsigned char* data, size_t size) : data_(data), size_(size) {}

  // The next byte, or 0 once the input is used up.
  unsigned char Byte() { return pos_ < size_ ? data_[pos_++] : 0; }

  // Up to `max_bytes` bytes, fewer at the end of the input.
  std::string_view Bytes(size_t max_bytes) {
    const size_t n = max_bytes < size_ - pos_ ? max_bytes : size_ - pos_;
    const std::string_view out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }

  // Everything not yet consumed.
  std::string_view Rest() { return Bytes(size_ - pos_); }

  bool empty() const { return pos_ == size_; }

 private:
  const unsigned char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kvd::fuzz

#endif  // KVD_TESTS_FUZZ_FUZZ_CHECK_H_
