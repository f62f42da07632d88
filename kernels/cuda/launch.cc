// AllowDynamicSmemOf (launch.h): the dynamic shared memory grants, asked of the driver once.

#include "kernels/cuda/launch.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kvd::cuda {
namespace {

ABSL_CONST_INIT absl::Mutex grants_mu(absl::kConstInit);

// The largest grant so far per (kernel, device): a launch may use less than its limit.
absl::flat_hash_map<std::pair<const void*, int>, int>& Grants()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(grants_mu) {
  static auto* grants = new absl::flat_hash_map<std::pair<const void*, int>, int>();
  return *grants;
}

}  // namespace

cudaError_t AllowDynamicSmemOf(const void* kernel, int bytes) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  absl::MutexLock lock(&grants_mu);
  int& limit = Grants()[{kernel, device}];
  if (limit >= bytes) return cudaSuccess;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) limit = bytes;  // on failure the next launch asks again
  return err;
}

}  // namespace kvd::cuda
