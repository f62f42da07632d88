#ifndef KVD_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
#define KVD_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_

// Launchers for the row-wise kernels of the CUDA backend. Each takes the POD params of
// kernels/params.h with device pointers, enqueues on `stream` and returns the launch
// result (cudaErrorInvalidValue for a dtype no kernel exists for). The callers validate
// shapes; these only launch. Activations are fp32; weights and tables are fp32 or bf16.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/params.h"

namespace kvd::cuda {

// out[t][:] = table[token_ids[t]][:]; an id outside [0, vocab_size) yields a NaN row.
cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream);

// One CTA per row; fp32 sum of squares.
cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);
// The same over input rows in_stride floats apart.
cudaError_t LaunchRmsNorm(const RmsNormParams& p, int64_t in_stride, cudaStream_t stream);
// The same rows rounded to bf16 (nearest even) into `out` ([num_rows][dim]
// __nv_bfloat16) instead of p.out: the input of a product (MatmulPrologue::kRmsNorm).
// in's rows are in_stride floats apart here (p.out unused).
cudaError_t LaunchRmsNormToBf16(const RmsNormParams& p, int64_t in_stride, void* out,
                                cudaStream_t stream);

// The angle of pair i at position pos is pos * (1 / theta^(2i/head_dim)), each step
// rounded to fp32 as the CPU reference does (the power in fp64, then rounded, to match a
// correctly rounded powf). With q_bf16, also the rotated q rows rounded to bf16; with
// append_kv, also what LaunchAppendKv would then write (a negative slot skips its token).
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);

cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream);
// The same rows rounded to bf16 into `out` ([num_rows][dim]) instead of p.out (unused): the
// input of a product (MatmulPrologue::kSiluMul).
cudaError_t LaunchSiluMulToBf16(const SiluMulParams& p, void* out, cudaStream_t stream);

// out[i] = bf16(in[i]) for i < count, round to nearest even. `out` is __nv_bfloat16*.
cudaError_t LaunchF32ToBf16(void* out, const float* in, int64_t count, cudaStream_t stream);
// out[r][c] = bf16(in[r * in_stride + c]) for r < rows, c < cols (out dense).
cudaError_t LaunchF32ToBf16Rows(void* out, const float* in, int64_t rows, int64_t cols,
                                int64_t in_stride, cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
