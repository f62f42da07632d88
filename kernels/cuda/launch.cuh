#ifndef KVD_KERNELS_CUDA_LAUNCH_CUH_
#define KVD_KERNELS_CUDA_LAUNCH_CUH_

// Programmatic dependent launch (sm_90) for the kernels of a decode step, which are short
// and back to back: a kernel launched with LaunchDependent may be set up, and its CTAs made
// resident, while the kernel before it on the stream still runs, instead of after; the part
// of it before WaitForPrecedingGrid() then overlaps that kernel.
//
// Contract for every kernel launched this way:
//   - every CTA calls WaitForPrecedingGrid() before it exits (also one with nothing to do, so
//     that the kernel never completes before the one it follows) and before its first access
//     to global memory that a kernel may write; that returns once the preceding kernel has
//     completed and its writes are visible to plain loads (at once when the kernel was
//     launched without the attribute, or after a non-kernel operation; gpu_test's
//     PdlVisibilityTest checks it on the GPU it runs on). Not to the non-coherent path
//     (ld.global.nc, __ldg), whose data must stay unwritten for the whole life of the kernel
//     reading it, which here begins before the kernel before ends (gemv_kernels.cu has the
//     failure it caused). Before the wait, a kernel may read only what no kernel writes while
//     ops are in flight: model weights (the skinny Matmul's first loads, RmsNorm's weight;
//     CudaBackend's UploadWeights and FillRandom return once their writes are done; not
//     Embedding's table, which may be an activation) and a batch's block tables, sequence
//     metadata and the KV chunk table (decode attention; written by copies). It may also
//     prefetch anything into L2 (BulkPrefetchL2): that loads nothing into the CTA, and the
//     preceding kernel's writes land in L2 all the same;
//   - it may call AllowDependentLaunch() to let the next kernel start early (otherwise that
//     happens as its CTAs exit): the next kernel's CTAs launch once every CTA of this one has
//     called it or exited, so this kernel's own CTAs have all been launched by then and never
//     wait for slots the next one holds. Short kernels call it right after their wait, so that
//     the next kernel's reads before its own wait overlap their work; long ones once their
//     main loads are done.
// Both are no-ops for kernels launched normally, so tests may launch them directly. Only for
// .cu files.

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/launch.h"

namespace kvd::cuda {

__device__ __forceinline__ void WaitForPrecedingGrid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

__device__ __forceinline__ void AllowDependentLaunch() {
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the work
// before it on `stream`. Returns the launch result.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// AllowDynamicSmemOf (launch.h) for a typed kernel.
template <typename... Params>
cudaError_t AllowDynamicSmem(void (*kernel)(Params...), int bytes) {
  return AllowDynamicSmemOf(reinterpret_cast<const void*>(kernel), bytes);
}

// Multiprocessors of the calling thread's current device, into `num_sms`.
inline cudaError_t CurrentDeviceSms(int& num_sms) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
}

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_LAUNCH_CUH_
