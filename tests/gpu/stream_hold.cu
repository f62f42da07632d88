// The stream hold of gpu_bench (stream_hold.h).

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "tests/gpu/stream_hold.h"

namespace kvd {
namespace {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// Spins on words[0] (host memory, read through on every poll) until it is nonzero or
// timeout_ns pass; records in words[1] whether the timeout ended it.
__global__ void StreamHoldKernel(volatile int* words, uint64_t timeout_ns) {
  const uint64_t start = GlobalTimerNs();
  while (words[0] == 0) {
    if (GlobalTimerNs() - start > timeout_ns) {
      words[1] = 1;
      break;
    }
    __nanosleep(500);
  }
  __threadfence_system();
}

}  // namespace

StreamHold::~StreamHold() {
  if (host_words_ != nullptr) cudaFreeHost(const_cast<int*>(host_words_));
}

cudaError_t StreamHold::Init() {
  if (host_words_ != nullptr) return cudaSuccess;
  void* host = nullptr;
  if (const cudaError_t err = cudaHostAlloc(&host, 2 * sizeof(int), cudaHostAllocMapped);
      err != cudaSuccess) {
    return err;
  }
  void* device = nullptr;
  if (const cudaError_t err = cudaHostGetDevicePointer(&device, host, 0); err != cudaSuccess) {
    cudaFreeHost(host);
    return err;
  }
  host_words_ = static_cast<volatile int*>(host);
  device_words_ = static_cast<int*>(device);
  host_words_[0] = 0;
  host_words_[1] = 0;
  return cudaSuccess;
}

cudaError_t StreamHold::Hold(cudaStream_t stream, double timeout_ms) {
  if (host_words_ == nullptr || !(timeout_ms > 0)) return cudaErrorInvalidValue;
  host_words_[0] = 0;
  host_words_[1] = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the words reset before the launch
  StreamHoldKernel<<<1, 1, 0, stream>>>(device_words_, static_cast<uint64_t>(timeout_ms * 1e6));
  return cudaGetLastError();
}

void StreamHold::Release() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // what was enqueued, before the store
  host_words_[0] = 1;
}

bool StreamHold::TimedOut() const { return host_words_ != nullptr && host_words_[1] != 0; }

}  // namespace kvd
