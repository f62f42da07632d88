#ifndef KVD_TESTS_GPU_STREAM_READ_H_
#define KVD_TESTS_GPU_STREAM_READ_H_

// gpu_bench's read reference: a kernel that only reads memory, as fast as a plain kernel
// can, to set beside kernels that mostly read (decode attention). Not part of the backend.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kvd {

// A launch shape of the read kernel: threads per CTA, and the grid's CTAs per multiprocessor.
struct StreamReadShape {
  int threads;
  int ctas_per_sm;
};

// The shapes gpu_bench tries, each as its own row or the best of them.
inline constexpr StreamReadShape kStreamReadShapes[] = {{256, 8}, {512, 4}, {1024, 2}, {512, 1}};

// Enqueues one kernel on `stream` that reads the `bytes` at `src` (16-byte aligned, a
// multiple of 16) in 16-byte streaming loads (ld.global.cs: evict-first), eight a thread per
// round, on a grid of shape.ctas_per_sm CTAs per multiprocessor of `num_sms` (how many are
// resident at once is the hardware's affair). A thread writes `*sink` only if the xor of what
// it read is 0x9e3779b9, so that the loads cannot be dropped; a buffer of equal 32-bit words
// never writes it.
cudaError_t LaunchStreamRead(const void* src, size_t bytes, unsigned* sink, StreamReadShape shape,
                             int num_sms, cudaStream_t stream);

}  // namespace kvd

#endif  // KVD_TESTS_GPU_STREAM_READ_H_
