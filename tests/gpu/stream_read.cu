// The read reference of gpu_bench (stream_read.h).

#include <cuda_runtime.h>

#include <cstdint>

#include "tests/gpu/stream_read.h"

namespace kvd {
namespace {

constexpr int kInFlight = 8;  // 16-byte loads a thread makes per round

// Thread i of the grid reads vectors i, i + stride, ..., kInFlight of them per round, written
// as all loads (predicated past the end) before the first use.
__global__ void StreamReadKernel(const uint4* __restrict__ src, size_t count, unsigned* sink) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  unsigned acc = 0;
  for (size_t base = size_t{blockIdx.x} * blockDim.x + threadIdx.x; base < count;
       base += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const size_t i = base + u * stride;
      v[u] = i < count ? __ldcs(src + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

cudaError_t LaunchStreamRead(const void* src, size_t bytes, unsigned* sink, StreamReadShape shape,
                             int num_sms, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(src) % 16 != 0 || bytes % 16 != 0 || shape.threads <= 0 ||
      shape.ctas_per_sm <= 0 || num_sms <= 0) {
    return cudaErrorInvalidValue;
  }
  StreamReadKernel<<<shape.ctas_per_sm * num_sms, shape.threads, 0, stream>>>(
      static_cast<const uint4*>(src), bytes / 16, sink);
  return cudaGetLastError();
}

}  // namespace kvd
