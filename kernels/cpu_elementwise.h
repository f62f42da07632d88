#ifndef KVD_KERNELS_CPU_ELEMENTWISE_H_
#define KVD_KERNELS_CPU_ELEMENTWISE_H_

#include "absl/status/status.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvd {

// The CPU backend's row-wise ops, fp32, written to follow llama2.c's arithmetic order so
// the embedded stories260K model reproduces its reference. Rows (tokens) are independent
// work items run in parallel on `pool`; each row is computed by the same code however the
// rows are split, so results do not depend on the thread count or on the batch.
//
// All return InvalidArgument naming the op and field for null pointers, non-positive
// dims/heads or too-narrow strides (a row count of 0 is a no-op), and Unimplemented for a
// weight/table dtype other than f32. Nothing is written when the status is not OK.
// Thread safe if `pool` is.

// out[t] = table[token_ids[t]]. An id outside [0, vocab_size) is InvalidArgument.
absl::Status CpuEmbedding(const EmbeddingParams& p, ThreadPool& pool);

// llama2.c's rmsnorm: ss = sum(x^2) in order; scale = 1/sqrtf(ss/dim + eps);
// out[i] = weight[i] * (scale * x[i]). `out` may alias `in`.
absl::Status CpuRmsNorm(const RmsNormParams& p, ThreadPool& pool);

// Rotates q and k in place. Pair i turns by angle pos * freq_i with
// freq_i = 1.0f / powf(theta, 2i / (float)head_dim), cos/sin by cosf/sinf: pair
// (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos). kInterleaved pairs are (2i, 2i+1),
// kHalf pairs are (i, i + head_dim/2). REQUIRES for OK: head_dim even, theta > 0; either
// head count may be 0 (that tensor is then not read), not both. With q_bf16 also writes the
// rotated q rows rounded to bf16 there (q_bf16_stride >= num_q_heads * head_dim).
absl::Status CpuRope(const RopeParams& p, ThreadPool& pool);

// out = (gate * (1 / (1 + expf(-gate)))) * up. `out` may be gate or up itself when that
// input's stride is dim; any other overlap is InvalidArgument (ValidateSiluMul).
absl::Status CpuSiluMul(const SiluMulParams& p, ThreadPool& pool);

}  // namespace kvd

#endif  // KVD_KERNELS_CPU_ELEMENTWISE_H_
