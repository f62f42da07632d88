#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace kvd::cuda {
namespace {

constexpr int kRowThreads = 256;

template <typename T>
__global__ void EmbeddingKernel(EmbeddingParams p) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  AllowDependentLaunch();  // short: the next kernel's reads before its wait overlap this one
  const int t = blockIdx.x;
  const int32_t id = p.token_ids[t];
  float* out = p.out + int64_t{t} * p.dim;
  if (id < 0 || id >= p.vocab_size) {
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = __int_as_float(0x7fffffff);
    return;
  }
  const T* row = static_cast<const T*>(p.table) + int64_t{id} * p.dim;
  // Four loads in flight before their stores (out may alias nothing, but the compiler
  // cannot know).
  constexpr int kUnroll = 4;
  for (int base = 0; base < p.dim; base += kUnroll * kRowThreads) {
    float x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRowThreads + threadIdx.x;
      x[u] = i < p.dim ? ToFloat(row[i]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRowThreads + threadIdx.x;
      if (i < p.dim) out[i] = x[u];
    }
  }
}

// Sum of `v` over the CTA; every thread gets the result. `scratch` holds one float per warp.
__device__ float BlockSum(float v, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x / 32;
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];
  return total;
}

// One output value: fp32 as is, or rounded to bf16 (nearest even).
__device__ __forceinline__ void StoreOut(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void StoreOut(__nv_bfloat16* dst, float v) {
  *dst = __float2bfloat16_rn(v);
}
// Four consecutive output values as one store. REQUIRES: dst aligned to four of them.
__device__ __forceinline__ void StoreOut4(float* dst, float4 v) {
  *reinterpret_cast<float4*>(dst) = v;
}
__device__ __forceinline__ void StoreOut4(__nv_bfloat16* dst, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = packed;
}

// The row-wise kernels write `out` ([rows][dim] of OutT), not p.out: p.out itself, or the
// bf16 input of a product (LaunchRmsNormToBf16, LaunchSiluMulToBf16).
template <typename T, typename OutT>
__global__ void __launch_bounds__(kRowThreads)
    RmsNormKernel(RmsNormParams p, int64_t in_stride, OutT* out_rows) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  AllowDependentLaunch();  // short: the next kernel's reads before its wait overlap this one
  __shared__ float scratch[kRowThreads / 32];
  const float* in = p.in + blockIdx.x * in_stride;
  OutT* out = out_rows + int64_t{blockIdx.x} * p.dim;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x) sum_sq += in[i] * in[i];
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(p.dim) + p.eps);
  const T* weight = static_cast<const T*>(p.weight);
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
    StoreOut(out + i, in[i] * inv_rms * ToFloat(weight[i]));
  }
}

// Four consecutive weights widened to fp32. REQUIRES: w 4-element aligned.
__device__ __forceinline__ float4 LoadWeight4(const float* w) {
  return *reinterpret_cast<const float4*>(w);
}
__device__ __forceinline__ float4 LoadWeight4(const __nv_bfloat16* w) {
  const uint2 raw = *reinterpret_cast<const uint2*>(w);
  return make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                     __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u));
}

// RmsNormKernel for rows of up to kRowThreads * 4 * kVecs floats held in registers: every
// load of the row is issued before any is used (a decode step's single row is otherwise a
// chain of dependent round trips), and the row is read once.
// REQUIRES: dim % 4 == 0; in 16-byte, out 4-element and weight 4-element aligned rows.
template <typename T, typename OutT, int kVecs>
__global__ void __launch_bounds__(kRowThreads)
    RmsNormVecKernel(RmsNormParams p, int64_t in_stride, OutT* out_rows) {
  const int n4 = p.dim / 4;
  // The weight is read before the wait (launch.cuh: no kernel writes weights), while the
  // kernel before ends.
  const T* weight = static_cast<const T*>(p.weight);
  float4 w[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    w[j] = i < n4 ? LoadWeight4(weight + 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  WaitForPrecedingGrid();  // launch.cuh: before reading what kernels write
  AllowDependentLaunch();  // short: the next kernel's reads before its wait overlap this one
  __shared__ float scratch[kRowThreads / 32];
  const float4* in = reinterpret_cast<const float4*>(p.in + blockIdx.x * in_stride);
  OutT* out = out_rows + int64_t{blockIdx.x} * p.dim;
  float4 x[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    x[j] = i < n4 ? in[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    sum_sq += x[j].x * x[j].x + x[j].y * x[j].y + x[j].z * x[j].z + x[j].w * x[j].w;
  }
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(p.dim) + p.eps);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    if (i < n4) {
      StoreOut4(out + 4 * i, make_float4(x[j].x * inv_rms * w[j].x, x[j].y * inv_rms * w[j].y,
                                         x[j].z * inv_rms * w[j].z, x[j].w * inv_rms * w[j].w));
    }
  }
}

// One thread per (head, rotated pair) and token: grid (CeilDiv(heads * head_dim / 2,
// kRowThreads), min(num_tokens, 65535)), tokens strided over grid rows. A decode step's token
// spreads over many CTAs instead of one thread walking every head in turn. With append_kv,
// a KV head's thread also stores its rotated K pair and the same pair of V into the cache
// (of T).
template <typename T>
__global__ void __launch_bounds__(kRowThreads) RopeKernel(RopeParams p) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  AllowDependentLaunch();  // short: the next kernel's reads before its wait overlap this one
  const int half = p.head_dim / 2;
  const int index = blockIdx.x * kRowThreads + threadIdx.x;
  if (index >= (p.num_q_heads + p.num_kv_heads) * half) return;
  const int h = index / half;
  const int i = index % half;
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(p.head_dim);
  const float power =
      static_cast<float>(pow(static_cast<double>(p.theta), static_cast<double>(exponent)));
  const int i0 = p.style == RopeStyle::kInterleaved ? 2 * i : i;
  const int i1 = p.style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
  for (int t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    const float angle = static_cast<float>(p.positions[t]) * (1.0f / power);
    float sin_a;
    float cos_a;
    sincosf(angle, &sin_a, &cos_a);
    float* head = h < p.num_q_heads
                      ? p.q + int64_t{t} * p.q_stride + int64_t{h} * p.head_dim
                      : p.k + int64_t{t} * p.k_stride + int64_t{h - p.num_q_heads} * p.head_dim;
    const float x0 = head[i0];
    const float x1 = head[i1];
    const float y0 = x0 * cos_a - x1 * sin_a;
    const float y1 = x0 * sin_a + x1 * cos_a;
    head[i0] = y0;
    head[i1] = y1;
    const int64_t slot = p.append_kv && h >= p.num_q_heads ? p.slot_mapping[t] : -1;
    if (slot >= 0) {
      const KvCacheView& c = p.cache;
      const int kv_head = h - p.num_q_heads;
      const int64_t block = slot / c.block_size;
      const int64_t row = (slot % c.block_size) * c.head_dim;
      T* k_row = BlockHead<T>(c, block, c.k_offset_bytes, kv_head) + row;
      T* v_row = BlockHead<T>(c, block, c.v_offset_bytes, kv_head) + row;
      const float* v = p.v + int64_t{t} * p.v_stride + int64_t{kv_head} * p.head_dim;
      k_row[i0] = FromFloat<T>(y0);
      k_row[i1] = FromFloat<T>(y1);
      v_row[i0] = FromFloat<T>(v[i0]);
      v_row[i1] = FromFloat<T>(v[i1]);
    }
    if (p.q_bf16 != nullptr && h < p.num_q_heads) {
      __nv_bfloat16* copy = static_cast<__nv_bfloat16*>(p.q_bf16) + int64_t{t} * p.q_bf16_stride +
                            int64_t{h} * p.head_dim;
      copy[i0] = __float2bfloat16_rn(y0);
      copy[i1] = __float2bfloat16_rn(y1);
    }
  }
}

template <typename OutT>
__global__ void SiluMulKernel(SiluMulParams p, OutT* out_rows) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  AllowDependentLaunch();  // short: the next kernel's reads before its wait overlap this one
  for (int r = blockIdx.y; r < p.num_rows; r += gridDim.y) {
    const float* gate = p.gate + int64_t{r} * p.gate_stride;
    const float* up = p.up + int64_t{r} * p.up_stride;
    OutT* out = out_rows + int64_t{r} * p.dim;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.dim; i += gridDim.x * blockDim.x) {
      const float g = gate[i];
      StoreOut(out + i, g / (1.0f + expf(-g)) * up[i]);
    }
  }
}

// out[r][c] = bf16(in[r * in_stride + c]) for r < rows, c < cols; out dense.
__global__ void F32ToBf16Kernel(__nv_bfloat16* out, const float* in, int64_t rows, int64_t cols,
                                int64_t in_stride) {
  WaitForPrecedingGrid();  // launch.cuh: first, before any global access
  AllowDependentLaunch();  // short: the next kernel's reads before its wait overlap this one
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t count = rows * cols;
  const bool dense = in_stride == cols;  // no 64-bit division per element then
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = __float2bfloat16_rn(in[dense ? i : i / cols * in_stride + i % cols]);
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  return KVD_DISPATCH_STORAGE_DTYPE(p.table_dtype, T, [&] {
    return LaunchDependent(EmbeddingKernel<T>, p.num_tokens, kRowThreads, 0, stream, p);
  }());
}

namespace {

template <typename OutT>
cudaError_t LaunchRmsNormInto(const RmsNormParams& p, int64_t in_stride, OutT* out,
                              cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  constexpr int kMaxVecs = 4;  // rows up to 4096 floats in registers
  auto aligned = [](const void* ptr, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  return KVD_DISPATCH_STORAGE_DTYPE(p.weight_dtype, T, [&] {
    const bool vec = p.dim % 4 == 0 && p.dim <= kRowThreads * 4 * kMaxVecs && aligned(p.in, 16) &&
                     in_stride % 4 == 0 && aligned(out, 4 * sizeof(OutT)) &&
                     aligned(p.weight, 4 * sizeof(T));
    if (vec && p.dim <= kRowThreads * 4) {
      return LaunchDependent(RmsNormVecKernel<T, OutT, 1>, p.num_rows, kRowThreads, 0, stream, p,
                             in_stride, out);
    }
    if (vec) {
      return LaunchDependent(RmsNormVecKernel<T, OutT, kMaxVecs>, p.num_rows, kRowThreads, 0,
                             stream, p, in_stride, out);
    }
    return LaunchDependent(RmsNormKernel<T, OutT>, p.num_rows, kRowThreads, 0, stream, p, in_stride,
                           out);
  }());
}

template <typename OutT>
cudaError_t LaunchSiluMulInto(const SiluMulParams& p, OutT* out, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  const dim3 grid((p.dim + kRowThreads - 1) / kRowThreads, std::min(p.num_rows, 65535));
  return LaunchDependent(SiluMulKernel<OutT>, grid, kRowThreads, 0, stream, p, out);
}

}  // namespace

cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  return LaunchRmsNormInto(p, p.dim, p.out, stream);
}

cudaError_t LaunchRmsNorm(const RmsNormParams& p, int64_t in_stride, cudaStream_t stream) {
  return LaunchRmsNormInto(p, in_stride, p.out, stream);
}

cudaError_t LaunchRmsNormToBf16(const RmsNormParams& p, int64_t in_stride, void* out,
                                cudaStream_t stream) {
  return LaunchRmsNormInto(p, in_stride, static_cast<__nv_bfloat16*>(out), stream);
}

cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  const int pairs = (p.num_q_heads + p.num_kv_heads) * (p.head_dim / 2);
  if (pairs == 0) return cudaSuccess;
  const dim3 grid((pairs + kRowThreads - 1) / kRowThreads, std::min(p.num_tokens, 65535));
  if (!p.append_kv) return LaunchDependent(RopeKernel<float>, grid, kRowThreads, 0, stream, p);
  return KVD_DISPATCH_STORAGE_DTYPE(p.cache.dtype, T, [&] {
    return LaunchDependent(RopeKernel<T>, grid, kRowThreads, 0, stream, p);
  }());
}

cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream) {
  return LaunchSiluMulInto(p, p.out, stream);
}

cudaError_t LaunchSiluMulToBf16(const SiluMulParams& p, void* out, cudaStream_t stream) {
  return LaunchSiluMulInto(p, static_cast<__nv_bfloat16*>(out), stream);
}

cudaError_t LaunchF32ToBf16Rows(void* out, const float* in, int64_t rows, int64_t cols,
                                int64_t in_stride, cudaStream_t stream) {
  const int64_t count = rows * cols;
  if (count == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((count + kRowThreads - 1) / kRowThreads, 65536);
  return LaunchDependent(F32ToBf16Kernel, static_cast<int>(blocks), kRowThreads, 0, stream,
                         static_cast<__nv_bfloat16*>(out), in, rows, cols, in_stride);
}

cudaError_t LaunchF32ToBf16(void* out, const float* in, int64_t count, cudaStream_t stream) {
  return LaunchF32ToBf16Rows(out, in, 1, count, count, stream);
}

}  // namespace kvd::cuda
