#ifndef KVD_KERNELS_CUDA_ASYNC_COPY_CUH_
#define KVD_KERNELS_CUDA_ASYNC_COPY_CUH_

// Asynchronous 16-byte global -> shared copies (sm_80+ `cp.async`), used by the attention
// kernels to keep many loads in flight without holding registers for them, and an L2
// prefetch (PrefetchL2) that holds nothing at all.
//
// Ordering: a thread's copies are grouped by CpAsyncCommit(); CpAsyncWait<N>() returns once
// at most N of the thread's groups are still pending, and then the completed copies are
// visible to that thread. Other threads see them only after a barrier (__syncthreads or
// __syncwarp) that follows the wait. Only for .cu files.

#include <cuda_runtime.h>

#include <cstdint>

namespace kvd::cuda {

// Copies 16 bytes from `global_src` to shared address `shared_dst` (__cvta_generic_to_shared;
// with the address in a register, constant offsets fold into the instruction), or writes 16
// zero bytes (reading nothing) when `valid` is false. REQUIRES: both addresses 16-byte
// aligned; `global_src` a global-memory address even when `valid` is false.
__device__ __forceinline__ void CpAsync16(uint32_t shared_dst, const void* global_src,
                                          bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst),
               "l"(global_src), "r"(src_bytes)
               : "memory");
}

// As above, to the generic address of shared memory `shared_dst`.
__device__ __forceinline__ void CpAsync16(void* shared_dst, const void* global_src, bool valid) {
  CpAsync16(static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst)), global_src, valid);
}

// As CpAsync16 with `valid` true (no source size operand: one register fewer).
__device__ __forceinline__ void CpAsync16(uint32_t shared_dst, const void* global_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_dst), "l"(global_src)
               : "memory");
}

// As CpAsync16, with a hint that L2 fetch the whole aligned kPrefetchBytes (128 or 256)
// around the source from memory: for streams read front to back by many requests.
template <int kPrefetchBytes>
__device__ __forceinline__ void CpAsync16Prefetch(void* shared_dst, const void* global_src,
                                                  bool valid) {
  static_assert(kPrefetchBytes == 128 || kPrefetchBytes == 256);
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst));
  const int src_bytes = valid ? 16 : 0;
  if constexpr (kPrefetchBytes == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(global_src), "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(global_src), "r"(src_bytes)
                 : "memory");
  }
}

// Asks L2 to fetch the line holding `global_address` from memory; no registers, no waiting.
__device__ __forceinline__ void PrefetchL2(const void* global_address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(global_address));
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPendingGroups>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPendingGroups) : "memory");
}

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_ASYNC_COPY_CUH_
