#ifndef KVD_KERNELS_CUDA_HOPPER_SYNC_CUH_
#define KVD_KERNELS_CUDA_HOPPER_SYNC_CUH_

// Synchronization for warp-specialized kernels (sm_90): shared-memory mbarriers between a
// producer (loads) and consumers (math), tensor-map copies (TMA) completing on them and the
// 128-byte-swizzled layout they write, named barriers between warpgroups, and register
// budgets per warpgroup. Only for .cu files.

#include <cuda_runtime.h>

#include <cstdint>

namespace kvd::cuda {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Bytes from shared address `address` up to the next multiple of 1024, where a
// 128-byte-swizzled region (below) must start.
__device__ __forceinline__ uint32_t PadTo1024(uint32_t address) {
  return ((address + 1023) & ~1023u) - address;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a region of `rows` rows of 8 * k
// chunks stored as k column halves of 128-byte rows with the 128-byte swizzle (chunk c of a
// row at position c ^ (row % 8)): the layout TMA boxes of 64 bf16 columns land in and wgmma
// descriptors describe.
__device__ __forceinline__ uint32_t Swizzle128Offset(int row, int chunk, int rows) {
  return (chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// An mbarrier whose phase completes after `count` arrivals. Call from one thread, then a
// barrier, before any use.
__device__ __forceinline__ void MbarrierInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(bar)), "r"(count)
               : "memory");
}

// MbarrierArrive where `arrive` holds, as a predicated instruction rather than a branch around
// one: the arrival then depends on whatever computes `arrive`, which orders it after that
// (the Hopper prefill kernel relies on it).
__device__ __forceinline__ void MbarrierArriveIf(uint64_t* bar, bool arrive) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 state;\nsetp.ne.b32 p, %1, 0;\n"
      "@p mbarrier.arrive.release.cta.shared::cta.b64 state, [%0];\n}\n" ::"r"(SharedAddress(bar)),
      "r"(static_cast<int>(arrive))
      : "memory");
}

// One arrival (release: this thread's prior memory accesses happen before the phase
// completes for any waiter).
__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) { MbarrierArriveIf(bar, true); }

// Waits until the phase of parity `parity` (0 or 1) has completed (acquire).
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

// Counts one arrival on `bar` once all of this thread's earlier cp.async copies have landed
// (.noinc: the arrival is one of the count the barrier was initialized with).
__device__ __forceinline__ void CpAsyncArriveOnMbarrier(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(SharedAddress(bar))
               : "memory");
}

// As CpAsyncArriveOnMbarrier, but not one of the barrier's counted arrivals: the pending
// count goes up by one now and back down once the copies land, so the current phase also
// waits for them. (Make every such call before the phase's last counted arrival.)
__device__ __forceinline__ void CpAsyncTrackOnMbarrier(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(SharedAddress(bar))
               : "memory");
}

// Makes mbarrier initializations visible to the asynchronous proxy (TMA completions); then a
// barrier before any use.
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also makes the current phase wait for `bytes` more bytes of tensor copies
// (TmaLoad2d) to land.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [%0], "
      "%1;\n}\n" ::"r"(SharedAddress(bar)),
      "r"(bytes)
      : "memory");
}

// An L2 cache policy (for TmaLoad2d) whose lines are evicted first: for data read once, such
// as a decode step's K/V stream.
__device__ __forceinline__ uint64_t L2EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// The box at element coordinates (x, y) of the 2D tensor map `map` (a __grid_constant__
// kernel parameter) into shared memory at `dst`, its bytes counted on `bar` as they land, its
// lines kept in L2 under the cache policy `l2_policy` (L2EvictFirstPolicy).
__device__ __forceinline__ void TmaLoad2d(void* dst, const void* map, int x, int y, uint64_t* bar,
                                          uint64_t l2_policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(SharedAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(SharedAddress(bar)), "l"(l2_policy)
      : "memory");
}

// Starts fetching the tensor map `map` (a __grid_constant__ kernel parameter) into the TMA
// unit's descriptor cache, so that the first TmaLoad2d through it need not wait for it.
__device__ __forceinline__ void PrefetchTensorMap(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Starts bringing `bytes` (a multiple of 16) at `src` (16-byte aligned) into L2: nothing lands
// in the CTA and nothing waits for it, so no ordering against other writers is needed.
__device__ __forceinline__ void BulkPrefetchL2(const void* src, uint32_t bytes) {
  asm volatile(
      "cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(reinterpret_cast<uint64_t>(src)),
      "r"(bytes)
      : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32):
// Sync waits for all of them, Arrive counts this warp without waiting.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Raise or lower this warpgroup's per-thread register budget (a multiple of 8 in [24, 256];
// sm_90a only); every warp of the warpgroup makes the same call. A producer warpgroup lowers
// its budget so that consumer warpgroups can raise theirs past launch_bounds' even share; the
// compiler allocates the code each call dominates within the new budget.
template <int kRegisters>
__device__ __forceinline__ void IncreaseMaxRegisters() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256);
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void DecreaseMaxRegisters() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256);
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
#endif

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_HOPPER_SYNC_CUH_
