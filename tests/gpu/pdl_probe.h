#ifndef KVD_TESTS_GPU_PDL_PROBE_H_
#define KVD_TESTS_GPU_PDL_PROBE_H_

// Kernels that probe what launch.cuh's contract relies on: that a kernel launched as a
// programmatic dependent (LaunchDependent) sees, after WaitForPrecedingGrid, the writes of the
// kernel before it, also through loads that may hit a stale L1 line: plain loads (what the
// kernels read activations with) and the non-coherent path (ld.global.nc, which the skinny GEMM
// read its input rows with until gemv_kernels.cu found it outside the contract). Test-only.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvd::gpu_test {

// How a probe kernel reads the buffer.
enum class ProbeLoad { kNonCoherent, kPlain, kL2Only };

// Every CTA of a `ctas`-CTA grid reads all `words` 32-bit words at `buf` (a multiple of 4,
// 16-byte aligned) with `load`, so that each multiprocessor's L1 may hold every line. `*sink`
// is a use of what it read (written only if its xor is 0x9e3779b9, which a buffer of equal
// words never gives); nothing checks it.
// A programmatic dependent of the work before it: waits for it, then lets the next kernel
// launch, before reading (as the backend's kernels do).
cudaError_t LaunchProbeRead(const uint32_t* buf, int words, ProbeLoad load, int ctas,
                            uint32_t* sink, cudaStream_t stream);

// One CTA writes `value` to every word at `buf`, after waiting for the kernel before, letting
// the next one launch and then sleeping about `delay_us` microseconds (a programmatic
// dependent).
cudaError_t LaunchProbeWrite(uint32_t* buf, int words, uint32_t value, int delay_us,
                             cudaStream_t stream);

// Every CTA of a `ctas`-CTA grid reads all `words` words with `load`, after waiting for the
// kernel before (or, with read_before_wait, before that wait: the control that shows the
// probe can see old words), and adds to `*mismatches` how many differ from `expected`.
cudaError_t LaunchProbeCheck(const uint32_t* buf, int words, ProbeLoad load, uint32_t expected,
                             bool read_before_wait, int ctas, uint32_t* mismatches,
                             cudaStream_t stream);

}  // namespace kvd::gpu_test

#endif  // KVD_TESTS_GPU_PDL_PROBE_H_
