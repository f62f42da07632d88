#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/gemv_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/tensor_core.cuh"

namespace kvd::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// 16-byte weight loads each lane keeps in flight per iteration. Eight warps of 16 loads is
// 64 KiB per CTA: with a CTA or two per SM the device holds several MB in flight, which is
// what the HBM bandwidth-latency product of an H100/H200 asks for.
constexpr int kLoadsPerLane = 16;
// n from which a CTA takes four 16-row tiles instead of two: halves the input re-reads per
// weight byte (m / 32 instead of m / 16 of the weight traffic at fp32) once there are
// enough columns (>= 256 CTAs) to keep every SM busy anyway.
constexpr int kWideTileMinN = 16384;
// n up to which a CTA takes a single 16-row tile: 2 x 132 CTAs of 16 rows cover n = 4224,
// so the 4096-row projections (attention output, FFN down) fill both CTA slots of every
// SM of an H100/H200 instead of one (with two tiles, 128 CTAs, the attention output
// projection at m = 1 read 0.66 of copy bandwidth on an H200).
constexpr int kNarrowTileMaxN = 4224;
constexpr int kChunkElems = 8;  // bf16 per 16-byte load
constexpr int kStepChunks = 4;  // lanes t = 0..3 cover one 32-element step

// 16 bytes of weight that no one else reads soon: skip L1 (keep it for the input rows) and
// let L2 fetch 256-byte lines, the weight being streamed front to back.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Eight consecutive fp32 inputs rounded to bf16 (nearest even), packed in k order. Read
// through the non-coherent path only after WaitForPrecedingGrid, which makes the writes of
// the kernel before (that produced the input) visible to this grid. Plain coherent loads
// measured far slower (H200, gpu_bench gemv, m = 1 from a graph: qkv 0.60 against 0.77 of
// copy bandwidth, gate_up 0.83 against 0.96).
__device__ __forceinline__ uint4 LoadInputChunk(const float* p) {
  const float4 lo = __ldg(reinterpret_cast<const float4*>(p));
  const float4 hi = __ldg(reinterpret_cast<const float4*>(p) + 1);
  return uint4{PackBf16x2(lo.x, lo.y), PackBf16x2(lo.z, lo.w), PackBf16x2(hi.x, hi.y),
               PackBf16x2(hi.z, hi.w)};
}

// One CTA: weight rows [blockIdx.x * 16 * kTiles, +16 * kTiles) against all m input rows.
// An iteration covers kWarps * kSteps consecutive steps; warp w takes steps
// base + w * kSteps + u (u < kSteps), so each warp reads contiguous runs of 64 * kSteps
// bytes (256 or 128) of each of its rows, what the L2 prefetch hint fetches at once.
template <int kTiles>
__global__ void __launch_bounds__(kThreads, 2)
    SkinnyGemmKernel(float* __restrict__ out, const float* __restrict__ in,
                     const uint4* __restrict__ weight, int m, int n, int k, bool accumulate) {
  constexpr int kSteps = kLoadsPerLane / (2 * kTiles);
  constexpr int kStepsPerIteration = kSteps * kWarps;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int num_chunks = k / kChunkElems;
  const int num_steps = (num_chunks + kStepChunks - 1) / kStepChunks;
  const int first_row = blockIdx.x * 16 * kTiles;

  // The two weight rows of each tile this lane reads (row g and g + 8 of the tile).
  const uint4* rows[kTiles][2];
  bool row_valid[kTiles][2];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + 16 * i + 8 * h + g;
      row_valid[i][h] = row < n;
      rows[i][h] = weight + int64_t{row_valid[i][h] ? row : 0} * num_chunks;
    }
  }
  const bool input_valid = g < m;
  const float* input_row = in + int64_t{input_valid ? g : 0} * k;

  // acc[i]: the m16n8 product tile i (see tensor_core.cuh for the fragment layout).
  float acc[kTiles][4] = {};
  for (int base = 0; base < num_steps; base += kStepsPerIteration) {
    uint4 a[kSteps][kTiles][2];
    uint4 b[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int chunk = (base + warp * kSteps + u) * kStepChunks + t;
      const bool chunk_valid = chunk < num_chunks;
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          a[u][i][h] = chunk_valid && row_valid[i][h] ? LoadStreaming(rows[i][h] + chunk)
                                                      : uint4{0, 0, 0, 0};
        }
      }
    }
    // The first weight loads go out before the wait (launch.cuh: no kernel writes weights),
    // while the kernel before ends; the input and `out` are read after it.
    if (base == 0) WaitForPrecedingGrid();
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int chunk = (base + warp * kSteps + u) * kStepChunks + t;
      b[u] = chunk < num_chunks && input_valid
                 ? LoadInputChunk(input_row + int64_t{chunk} * kChunkElems)
                 : uint4{0, 0, 0, 0};
    }
    // Elements 0-3 of the lane's chunk play k slots (2t, 2t+1, 2t+8, 2t+9) of one product,
    // elements 4-7 the same slots of a second; A and B use the same assignment.
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        const uint32_t first[4] = {a[u][i][0].x, a[u][i][1].x, a[u][i][0].y, a[u][i][1].y};
        MmaBf16(acc[i], first, b[u].x, b[u].y);
        const uint32_t second[4] = {a[u][i][0].z, a[u][i][1].z, a[u][i][0].w, a[u][i][1].w};
        MmaBf16(acc[i], second, b[u].z, b[u].w);
      }
    }
  }

  AllowDependentLaunch();  // the weights are read; only the small epilogue is left
  // partial[w][slot][lane]: warp w's acc, slot = 4 * tile + register.
  __shared__ float partial[kWarps][kTiles * 4][32];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[warp][4 * i + r][lane] = acc[i][r];
  }
  __syncthreads();
  for (int v = threadIdx.x; v < kTiles * 4 * 32; v += kThreads) {
    const int slot = v / 32;
    const int src_lane = v % 32;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][slot][src_lane];
    // Register r of lane (g, t) in tile i holds (weight row 16i + g + 8 * (r / 2),
    // input row 2t + r % 2).
    const int tile = slot / 4;
    const int r = slot % 4;
    const int col = first_row + 16 * tile + src_lane / 4 + 8 * (r / 2);
    const int row = 2 * (src_lane % 4) + r % 2;
    if (row < m && col < n) {
      float* dst = out + int64_t{row} * n + col;
      *dst = accumulate ? *dst + sum : sum;
    }
  }
}

bool AlignedTo(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

template <int kTiles>
cudaError_t Launch(float* out, const float* in, const void* weight, int m, int n, int k,
                   bool accumulate, cudaStream_t stream) {
  constexpr int kRowsPerCta = 16 * kTiles;
  const int ctas = (n + kRowsPerCta - 1) / kRowsPerCta;
  return LaunchDependent(SkinnyGemmKernel<kTiles>, ctas, kThreads, 0, stream, out, in,
                         static_cast<const uint4*>(weight), m, n, k, accumulate);
}

}  // namespace

bool SkinnyGemmSupports(const float* out, const float* in, const void* weight, int m, int n,
                        int k) {
  return m >= 1 && m <= kMaxSkinnyRows && n >= 1 && k >= kChunkElems && k % kChunkElems == 0 &&
         AlignedTo(in, 16) && AlignedTo(weight, 16) && AlignedTo(out, alignof(float));
}

cudaError_t LaunchSkinnyGemm(float* out, const float* in, const void* weight, int m, int n, int k,
                             bool accumulate, cudaStream_t stream) {
  if (!SkinnyGemmSupports(out, in, weight, m, n, k)) return cudaErrorInvalidValue;
  // One input row: single tiles at every n (H200, m = 1, fraction of copy bandwidth with
  // 1 / 2 / 4 tiles per CTA: qkv 0.79 / 0.71 / 0.62, gate_up 0.98 / 0.92 / 0.88, lm_head
  // 1.02 / 0.99 / 0.98): the input re-read per CTA is only k fp32.
  if (m == 1 || n <= kNarrowTileMaxN) {
    return Launch<1>(out, in, weight, m, n, k, accumulate, stream);
  }
  if (n >= kWideTileMinN) return Launch<4>(out, in, weight, m, n, k, accumulate, stream);
  return Launch<2>(out, in, weight, m, n, k, accumulate, stream);
}

cudaError_t LaunchSkinnyGemmTiles(int tiles, float* out, const float* in, const void* weight, int m,
                                  int n, int k, bool accumulate, cudaStream_t stream) {
  if (!SkinnyGemmSupports(out, in, weight, m, n, k)) return cudaErrorInvalidValue;
  switch (tiles) {
    case 1:
      return Launch<1>(out, in, weight, m, n, k, accumulate, stream);
    case 2:
      return Launch<2>(out, in, weight, m, n, k, accumulate, stream);
    case 4:
      return Launch<4>(out, in, weight, m, n, k, accumulate, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvd::cuda
