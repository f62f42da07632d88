// The host half of launch.cuh: the dynamic shared memory grants, asked of the driver once.

#include "kernels/cuda/launch.cuh"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kvd::cuda {

cudaError_t AllowDynamicSmemOf(const void* kernel, int bytes) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  // The largest grant so far per (kernel, device): a launch may use less than its kernel's limit.
  static absl::Mutex mu(absl::kConstInit);
  static auto* granted ABSL_GUARDED_BY(mu) =
      new absl::flat_hash_map<std::pair<const void*, int>, int>();
  absl::MutexLock lock(&mu);
  int& limit = (*granted)[{kernel, device}];
  if (limit >= bytes) return cudaSuccess;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) limit = bytes;
  return err;
}

}  // namespace kvd::cuda
