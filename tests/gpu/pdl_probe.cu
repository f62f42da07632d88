// Kernels of pdl_probe.h.

#include "kernels/cuda/launch.cuh"
#include "tests/gpu/pdl_probe.h"

namespace kvd::gpu_test {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ uint4 Load(const uint4* p, ProbeLoad load) {
  uint4 v;
  switch (load) {
    case ProbeLoad::kNonCoherent:
      asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(p));
      break;
    case ProbeLoad::kPlain:
      asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(p));
      break;
    case ProbeLoad::kL2Only:
      asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(p));
      break;
  }
  return v;
}

__global__ void __launch_bounds__(kThreads)
    ProbeReadKernel(const uint4* buf, int vectors, ProbeLoad load, uint32_t* sink) {
  cuda::WaitForPrecedingGrid();
  cuda::AllowDependentLaunch();
  uint32_t x = 0;
  for (int i = threadIdx.x; i < vectors; i += kThreads) {
    const uint4 v = Load(buf + i, load);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) *sink = x;
}

__global__ void __launch_bounds__(kThreads)
    ProbeWriteKernel(uint4* buf, int vectors, uint32_t value, int delay_us) {
  cuda::WaitForPrecedingGrid();
  cuda::AllowDependentLaunch();
  for (int us = 0; us < delay_us; ++us) __nanosleep(1000);
  for (int i = threadIdx.x; i < vectors; i += kThreads) buf[i] = uint4{value, value, value, value};
}

__global__ void __launch_bounds__(kThreads)
    ProbeCheckKernel(const uint4* buf, int vectors, ProbeLoad load, uint32_t expected,
                     bool read_before_wait, uint32_t* mismatches) {
  if (!read_before_wait) cuda::WaitForPrecedingGrid();
  uint32_t wrong = 0;
  for (int i = threadIdx.x; i < vectors; i += kThreads) {
    const uint4 v = Load(buf + i, load);
    wrong += (v.x != expected) + (v.y != expected) + (v.z != expected) + (v.w != expected);
  }
  // The counter only after the wait, as launch.cuh asks of anything a kernel may write.
  if (read_before_wait) cuda::WaitForPrecedingGrid();
  cuda::AllowDependentLaunch();
  if (wrong != 0) atomicAdd(mismatches, wrong);
}

}  // namespace

cudaError_t LaunchProbeRead(const uint32_t* buf, int words, ProbeLoad load, int ctas,
                            uint32_t* sink, cudaStream_t stream) {
  return cuda::LaunchDependent(ProbeReadKernel, dim3(ctas), dim3(kThreads), 0, stream,
                               reinterpret_cast<const uint4*>(buf), words / 4, load, sink);
}

cudaError_t LaunchProbeWrite(uint32_t* buf, int words, uint32_t value, int delay_us,
                             cudaStream_t stream) {
  return cuda::LaunchDependent(ProbeWriteKernel, dim3(1), dim3(kThreads), 0, stream,
                               reinterpret_cast<uint4*>(buf), words / 4, value, delay_us);
}

cudaError_t LaunchProbeCheck(const uint32_t* buf, int words, ProbeLoad load, uint32_t expected,
                             bool read_before_wait, int ctas, uint32_t* mismatches,
                             cudaStream_t stream) {
  return cuda::LaunchDependent(ProbeCheckKernel, dim3(ctas), dim3(kThreads), 0, stream,
                               reinterpret_cast<const uint4*>(buf), words / 4, load, expected,
                               read_before_wait, mismatches);
}

}  // namespace kvd::gpu_test
