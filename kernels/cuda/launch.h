#ifndef KVD_KERNELS_CUDA_LAUNCH_H_
#define KVD_KERNELS_CUDA_LAUNCH_H_

// The host half of launch.cuh, for the kernel launchers (launch.cc defines it).

#include <cuda_runtime_api.h>

namespace kvd::cuda {

// Lets `kernel` (a __global__ function's address) launch with up to `bytes` of dynamic
// shared memory on the calling thread's current device. cudaFuncSetAttribute is called only
// the first time a kernel and device need more than before: called before every launch, it
// was part of each op's host time. Thread-safe.
//
// The grants are process-wide, as the attribute they mirror is: the driver keeps it per
// function and device. So nothing else may lower a kernel's limit (a direct
// cudaFuncSetAttribute, or cudaDeviceReset) while this table says it is granted.
cudaError_t AllowDynamicSmemOf(const void* kernel, int bytes);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_LAUNCH_H_
