#ifndef KVD_KERNELS_CUDA_WGMMA_CUH_
#define KVD_KERNELS_CUDA_WGMMA_CUH_

// Hopper warpgroup MMA (`wgmma.mma_async`, sm_90a only): a warpgroup of four warps computes
// a 64 x N tile at once, reading B (and optionally A) straight from shared memory through
// 64-bit matrix descriptors. Only for .cu files built for sm_90a; callers guard their device
// code with KVD_HAVE_WGMMA.
//
// Shared-memory operands use the 128-byte swizzle: a matrix is stored as rows of 64 bf16
// (128 bytes), and 16-byte chunk c of row r sits at chunk c ^ (r % 8). Regions must start
// 1024-byte aligned (the hardware applies the swizzle to address bits 4-6 ^ 7-9).
//   K-major (the reduction dimension is contiguous: A = Q, B = K in S = Q K^T): rows are
//     M or N; 8-row groups repeat every SBO = 1024 bytes; a k16 step within the 64 columns of
//     a row advances the start address by 32 bytes.
//   MN-major (B = V in O = P V, stored [key][dim]): rows are K; 64-column groups of N repeat
//     every LBO bytes, 8-row groups of K every SBO = 1024 bytes.
//
// Fragments (per warp w of the warpgroup, g = lane / 4, t = lane % 4), as mma.m16n8k16's:
//   accumulator d[4j + e]: row 16w + g + 8 (e / 2), column 8j + 2t + (e % 2)
//   A from registers, k16 step: a0 (row g, k 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..),
//                               a3 (g+8, 2t+8..), each a bf16x2 with the lower k low.
// So the accumulator of S = Q K^T turns into P's A fragments by packing pairs in place.

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVD_HAVE_WGMMA 1
#else
#define KVD_HAVE_WGMMA 0
#endif

namespace kvd::cuda {

// A matrix descriptor is 64 bits. Its high word holds SBO and the swizzle mode, the same for
// every matrix here (SBO 1024 bytes, 128-byte swizzle), so the code carries only the low word
// (start address and LBO) and the MMA wrappers add the constant high word: a k-step's
// descriptor is one 32-bit add instead of a 64-bit one, and its high word a constant, about
// two instructions fewer per MMA (the Hopper prefill kernel's header has the measurement).
constexpr uint32_t kSwizzledDescriptorHigh = (1024 >> 4) | (1u << 30);

// Low word of the descriptor of a 128-byte-swizzled shared-memory matrix starting at shared
// address `address` (1024-byte aligned, or a k-step into such a matrix), with the leading byte
// offset described above.
__device__ __forceinline__ uint32_t SwizzledDescriptor(uint32_t address, uint32_t lbo_bytes) {
  return ((address & 0x3FFFF) >> 4) | (((lbo_bytes & 0x3FFFF) >> 4) << 16);
}

// `desc` (SwizzledDescriptor) moved on by `bytes`, a multiple of 16: one add to the start
// address field, LBO unchanged. Valid while the address stays in shared memory (below 256 KB,
// the field's reach), so no carry leaves the field.
__device__ __forceinline__ uint32_t AdvanceDescriptor(uint32_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

#if KVD_HAVE_WGMMA

// Orders this thread's register and shared-memory accesses before the wgmma that follows.
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPendingGroups>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPendingGroups) : "memory");
}
// Orders generic-proxy shared-memory writes before this thread's later async-proxy accesses
// (wgmma operand reads). Writer side: after a thread's own stores, before the barrier that
// publishes them. Reader side: after waiting for writes it cannot fence itself, e.g. another
// thread's cp.async copies completed through an mbarrier.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMA that
// reads and writes it (between issue and WgmmaWait the registers belong to the hardware).
template <int N>
__device__ __forceinline__ void PinRegisters(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int M, int N>
__device__ __forceinline__ void PinRegisters(uint32_t (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

#define KVD_WGMMA_D8(i)                                                                    \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define KVD_WGMMA_D64                                                                     \
  KVD_WGMMA_D8(0), KVD_WGMMA_D8(8), KVD_WGMMA_D8(16), KVD_WGMMA_D8(24), KVD_WGMMA_D8(32), \
      KVD_WGMMA_D8(40), KVD_WGMMA_D8(48), KVD_WGMMA_D8(56)
#define KVD_WGMMA_D64_LIST                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "   \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "   \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (64 x 128, fp32) = A B + (accumulate ? d : 0); A (64 x 16) and B (16 x 128) bf16 in
// shared memory, both K-major; desc_a and desc_b are SwizzledDescriptor low words.
__device__ __forceinline__ void WgmmaM64N128K16SS(float (&d)[64], uint32_t desc_a,
                                                  uint32_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\n"
      "mov.b64 da, {%64, %67};\nmov.b64 db, {%65, %67};\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KVD_WGMMA_D64_LIST
      ", da, db, p, 1, 1, 0, 0;\n}\n"
      : KVD_WGMMA_D64
      : "r"(desc_a), "r"(desc_b), "r"(static_cast<int>(accumulate)),
        "r"(kSwizzledDescriptorHigh));
}

// d (64 x 128, fp32) = A B + (accumulate ? d : 0); A (64 x 16, bf16) from registers,
// B (16 x 128, bf16) in shared memory, MN-major; desc_b is a SwizzledDescriptor low word.
__device__ __forceinline__ void WgmmaM64N128K16RS(float (&d)[64], const uint32_t (&a)[4],
                                                  uint32_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 db;\nmov.b64 db, {%68, %70};\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KVD_WGMMA_D64_LIST
      ", {%64, %65, %66, %67}, db, p, 1, 1, 1;\n}\n"
      : KVD_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(desc_b),
        "r"(static_cast<int>(accumulate)), "r"(kSwizzledDescriptorHigh));
}

#undef KVD_WGMMA_D8
#undef KVD_WGMMA_D64
#undef KVD_WGMMA_D64_LIST

#endif  // KVD_HAVE_WGMMA

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_WGMMA_CUH_
