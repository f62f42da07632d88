#ifndef KVD_KERNELS_CUDA_GEMV_KERNELS_H_
#define KVD_KERNELS_CUDA_GEMV_KERNELS_H_

// Skinny GEMM ("GEMV") for decode: out[m][n] (+)= in[m][k] . weight[n][k]^T for a handful of
// rows m, where the product is bound by reading the bf16 weight once. It computes what the
// cuBLAS path of CudaBackend::Matmul computes (the fp32 input rounded to bf16, round to
// nearest even; bf16 x bf16 products accumulated in fp32) in one kernel, so only the order
// of the fp32 summation differs, and it fuses the input conversion into the same launch.
//
// Work split: each CTA owns 16 or 32 output columns (ChooseSkinnyGemmShape), i.e. that many
// weight rows, for every row of `in`. Its eight warps share k: k is cut into 32-element
// steps and each round of the CTA hands every warp a run of consecutive steps. In a step, a
// lane streams 16-byte pieces of two weight rows (g and g + 8 of a 16-row tile) into an
// m16n8k16 tensor-core product whose eight "n" columns are the (zero-padded) input rows:
//
//   weight rows j0..j0+15 (one tile)     step s covers k in [32s, 32s + 32)
//   lane (g, t) = (lane / 4, lane % 4)   loads W[j0 + g][32s + 8t .. +8] and W[j0 + g + 8][..]
//                                        and in[g][32s + 8t .. +8] (g < m; zero otherwise)
//
// The k order inside a step is permuted identically for W and the input, which a sum does
// not see. The warps' fp32 partial sums meet in shared memory and are added in a fixed
// order, so results are deterministic. Launch shape and every choice depend only on
// (m, n, k): no allocation, no host synchronization, safe to capture in a CUDA graph.
//
// Thread safety: a pure launcher; callers serialize on their stream.

#include <cuda_runtime_api.h>

namespace kvd::cuda {

// Largest m LaunchSkinnyGemm takes (the n-extent of one m16n8k16 tensor-core product).
inline constexpr int kMaxSkinnyRows = 8;

// Whether LaunchSkinnyGemm handles this product: 1 <= m <= kMaxSkinnyRows, n >= 1, k >= 8
// with k % 8 == 0, `in` and `weight` 16-byte aligned (whole rows are then 16-byte
// vectors), `out` 4-byte aligned. Pure; never touches the pointers.
bool SkinnyGemmSupports(const float* out, const float* in, const void* weight, int m, int n, int k);

// Enqueues out[r][j] = sum_i bf16(in[r][i]) * weight[j][i] (plus the old out[r][j] when
// `accumulate`) for r < m, j < n. `weight` is __nv_bfloat16 [n][k] row-major, `in` fp32
// [m][k], `out` fp32 [m][n]; all device memory of the current device; `out` must not
// overlap `in` or `weight`. Nothing outside out[0..m)[0..n) is written; without
// `accumulate`, out is never read. Returns cudaErrorInvalidValue (launching nothing) when
// SkinnyGemmSupports is false, else the launch's error.
cudaError_t LaunchSkinnyGemm(float* out, const float* in, const void* weight, int m, int n, int k,
                             bool accumulate, cudaStream_t stream);

// How the kernel is launched: 16-row tiles a CTA, and CTAs an SM (with the weight loads in
// flight that their registers allow).
enum class SkinnyGemmShape {
  kOneTile,           // two CTAs an SM
  kOneTileThreeCtas,  // three CTAs an SM, half the loads in flight a lane
  kTwoTiles,          // two CTAs an SM
  kFourTiles,         // two CTAs an SM (measured, not chosen)
};

// The shape LaunchSkinnyGemm runs for m rows and n columns (gemv_kernels.cu has the
// measurements): one tile two CTAs an SM up to n = 4224 (two CTAs of 16 rows for each of an
// H100/H200's 132 SMs); past it one tile three CTAs an SM, except two tiles for m > 1 from
// n = 16384.
SkinnyGemmShape ChooseSkinnyGemmShape(int m, int n);

// For gpu_bench and the tests: LaunchSkinnyGemm in `shape` instead of the chosen one.
cudaError_t LaunchSkinnyGemmShape(SkinnyGemmShape shape, float* out, const float* in,
                                  const void* weight, int m, int n, int k, bool accumulate,
                                  cudaStream_t stream);

// The same product with the input rows already in bf16 (`in`: __nv_bfloat16 [m][k], as a
// Matmul prologue writes them), read as they are: half the input bytes, no rounding. The
// same conditions (SkinnyGemmSupports with `in` in place of the fp32 rows), shapes and
// summation order, so out equals LaunchSkinnyGemm's on the fp32 rows those bf16 ones round.
bool SkinnyGemmSupportsBf16Input(const float* out, const void* in, const void* weight, int m, int n,
                                 int k);
cudaError_t LaunchSkinnyGemmBf16Input(float* out, const void* in, const void* weight, int m, int n,
                                      int k, bool accumulate, cudaStream_t stream);
cudaError_t LaunchSkinnyGemmShapeBf16Input(SkinnyGemmShape shape, float* out, const void* in,
                                           const void* weight, int m, int n, int k, bool accumulate,
                                           cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_GEMV_KERNELS_H_
