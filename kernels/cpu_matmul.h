#ifndef KVD_KERNELS_CPU_MATMUL_H_
#define KVD_KERNELS_CPU_MATMUL_H_

#include "absl/status/status.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvd {

// The CPU backend's fp32 GEMM, out[m][n] (+)= in[m][:] . weight[n][:] (MatmulParams).
//
// Work is cut into blocks of rows x output features whose boundaries depend only on the
// shape, and blocks run in parallel on `pool`. Every output element is one dot product
// computed by the same code in the same order wherever it falls, so results are bitwise
// independent of the thread count and of the other rows in the batch (row r of `in` gives
// the same row r of `out` whatever m is): the batch invariance the engine relies on.
// On x86-64 CPUs with AVX2 and FMA a faster instantiation of the same kernel is chosen
// once per process; results then differ from other CPUs in the last bits.
//
// A prologue (MatmulParams::prologue) runs first, as CpuRmsNorm or CpuSiluMul into a
// scratch [m][k], so a fused product gives the bits of the two ops run one after the other.
//
// Returns InvalidArgument for null pointers, non-positive n or k or what
// ValidateMatmulPrologue refuses (m == 0 is a no-op), Unimplemented for a weight_dtype or
// norm_dtype other than f32. Thread safe if `pool` is.
absl::Status CpuMatmul(const MatmulParams& p, ThreadPool& pool);

}  // namespace kvd

#endif  // KVD_KERNELS_CPU_MATMUL_H_
