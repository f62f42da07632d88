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
// n up to which a CTA takes a single 16-row tile, two CTAs an SM: 2 x 132 CTAs of 16 rows
// cover n = 4224, so the 4096-row projections (attention output, FFN down) fill both CTA
// slots of every SM of an H100/H200 in one wave (with two tiles, 128 CTAs, the attention
// output projection at m = 1 read 0.66 of copy bandwidth on an H200; with three CTAs an SM
// the 256 CTAs land unevenly: 0.78 against 0.82-0.83, FFN down 0.75-0.77 against 0.96-0.98).
constexpr int kNarrowTileMaxN = 4224;
// Past it, single tiles run three CTAs an SM with kThreeCtaLoads loads a lane in flight (the
// registers of three CTAs hold no more): q/k/v's 384 CTAs then fit one wave of 396 slots
// instead of taking one and a half of 264. H200, gpu_bench gemv from graphs, two runs, of
// copy bandwidth, against two CTAs an SM with one tile (m = 1) or two (m = 8): q/k/v
// 0.91-0.93 against 0.76-0.78 at m = 1 and 0.81-0.82 against 0.75-0.77 at m = 8; FFN
// gate/up 0.98-1.00 against 0.96-0.98 at m = 1; lm_head 1.02-1.04 against 1.00-1.04 at
// m = 1. (With 12 loads a lane the same four read 0.89, 0.75, 0.92, 0.99; four CTAs an SM
// with 8 loads, 0.83, 0.75, 0.98, 1.02.) kvd bench, graphs on, three rounds alternating
// with the two-CTA kernel: steps at 1 x 512 4.15 ms against 4.30, 1 x 4k 4.30 against 4.48,
// 8 x 1k 4.70 against 4.81.
constexpr int kThreeCtaLoads = 8;
// n from which a CTA takes two 16-row tiles for more than one input row: the input re-reads
// per weight byte halve (m / 32 instead of m / 16 of the weight traffic at fp32), and the
// wide products have CTAs enough to fill every SM anyway. (H200, m = 8, two runs, of copy:
// gate/up 0.92-0.94 against 0.90-0.94 with single tiles three CTAs an SM and 0.87-0.89 with
// four tiles; lm_head 0.98-1.02 against 0.93-1.00 and 0.96-0.98.)
constexpr int kWideTileMinN = 16384;
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

// 16 bytes of input rows, written by the kernel before: a plain (weak) load after
// WaitForPrecedingGrid, which the memory model makes see that kernel's writes. Not the
// non-coherent path (ld.global.nc, __ldg): its data must stay unwritten for the reading
// kernel's lifetime, and a programmatic dependent's begins before the kernel before it ends.
// Measured on an H200: with the fp32 rows read through it as volatile asm (every load after
// the wait in the SASS), gpu_engine_test's DecodeGraphTest failed (replayed decode steps differ
// from uncaptured ones), while every skinny GEMM test and PdlVisibilityTest's simpler chain
// passed; read through __ldg, or bf16 rows through volatile asm, it passed. The plain loads
// pass every test and cost the engine 1.4-2.2% a step against the non-coherent bf16 rows
// (kvd bench graphs on, two rounds alternating builds: 1 x 512 4.231-4.247 ms against
// 4.169-4.193, 8 x 1k 4.636-4.652 against 4.536-4.545); gpu_bench gemv's rows alone, the
// same. (Once, plain coherent loads of the fp32 rows measured far slower, qkv 0.60 against
// 0.77 of copy at m = 1; not so now: 0.91 with either.) The other coherent loads were slower
// still (kvd bench graphs on, three rounds alternating builds): ld.global.cg, 8 x 1k
// 4.798-4.810 ms against 4.587-4.611 (1 x 512 the same); a C++ load the compiler schedules
// (`in` without __restrict__, so that it stays off the non-coherent path), 1 x 512
// 4.265-4.278 ms against 4.204-4.227 (8 x 1k the same).
__device__ __forceinline__ uint4 LoadInput16(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Eight consecutive fp32 inputs rounded to bf16 (nearest even), packed in k order.
__device__ __forceinline__ uint4 LoadInputChunk(const float* p) {
  const uint4 lo = LoadInput16(p);
  const uint4 hi = LoadInput16(p + 4);
  return uint4{PackBf16x2(__uint_as_float(lo.x), __uint_as_float(lo.y)),
               PackBf16x2(__uint_as_float(lo.z), __uint_as_float(lo.w)),
               PackBf16x2(__uint_as_float(hi.x), __uint_as_float(hi.y)),
               PackBf16x2(__uint_as_float(hi.z), __uint_as_float(hi.w))};
}

// Eight consecutive bf16 inputs as they lie in memory (element 0 in the low half of .x), the
// packing above.
__device__ __forceinline__ uint4 LoadInputChunk(const __nv_bfloat16* p) { return LoadInput16(p); }

// One CTA: weight rows [blockIdx.x * 16 * kTiles, +16 * kTiles) against all m input rows.
// An iteration covers kWarps * kSteps consecutive steps; warp w takes steps
// base + w * kSteps + u (u < kSteps), so each warp reads contiguous runs of 64 * kSteps
// bytes (256 or 128) of each of its rows, what the L2 prefetch hint fetches at once.
// kMinCtas CTAs an SM (the register budget), kLoads loads a lane in flight.
template <int kTiles, int kMinCtas, int kLoads, typename In>
__global__ void __launch_bounds__(kThreads, kMinCtas)
    SkinnyGemmKernel(float* __restrict__ out, const In* __restrict__ in,
                     const uint4* __restrict__ weight, int m, int n, int k, bool accumulate) {
  constexpr int kSteps = kLoads / (2 * kTiles);
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
  const In* input_row = in + int64_t{input_valid ? g : 0} * k;

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

template <int kTiles, int kMinCtas = 2, int kLoads = kLoadsPerLane, typename In>
cudaError_t Launch(float* out, const In* in, const void* weight, int m, int n, int k,
                   bool accumulate, cudaStream_t stream) {
  constexpr int kRowsPerCta = 16 * kTiles;
  const int ctas = (n + kRowsPerCta - 1) / kRowsPerCta;
  return LaunchDependent(SkinnyGemmKernel<kTiles, kMinCtas, kLoads, In>, ctas, kThreads, 0, stream,
                         out, in, static_cast<const uint4*>(weight), m, n, k, accumulate);
}

template <typename In>
cudaError_t LaunchShape(SkinnyGemmShape shape, float* out, const In* in, const void* weight, int m,
                        int n, int k, bool accumulate, cudaStream_t stream) {
  switch (shape) {
    case SkinnyGemmShape::kOneTile:
      return Launch<1>(out, in, weight, m, n, k, accumulate, stream);
    case SkinnyGemmShape::kOneTileThreeCtas:
      return Launch<1, 3, kThreeCtaLoads>(out, in, weight, m, n, k, accumulate, stream);
    case SkinnyGemmShape::kTwoTiles:
      return Launch<2>(out, in, weight, m, n, k, accumulate, stream);
    case SkinnyGemmShape::kFourTiles:
      return Launch<4>(out, in, weight, m, n, k, accumulate, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool SkinnyGemmSupports(const float* out, const float* in, const void* weight, int m, int n,
                        int k) {
  return m >= 1 && m <= kMaxSkinnyRows && n >= 1 && k >= kChunkElems && k % kChunkElems == 0 &&
         AlignedTo(in, 16) && AlignedTo(weight, 16) && AlignedTo(out, alignof(float));
}

SkinnyGemmShape ChooseSkinnyGemmShape(int m, int n) {
  if (n <= kNarrowTileMaxN) return SkinnyGemmShape::kOneTile;
  // One input row re-reads only k fp32 a CTA: single tiles at every n.
  if (m == 1 || n < kWideTileMinN) return SkinnyGemmShape::kOneTileThreeCtas;
  return SkinnyGemmShape::kTwoTiles;
}

cudaError_t LaunchSkinnyGemm(float* out, const float* in, const void* weight, int m, int n, int k,
                             bool accumulate, cudaStream_t stream) {
  if (!SkinnyGemmSupports(out, in, weight, m, n, k)) return cudaErrorInvalidValue;
  return LaunchShape(ChooseSkinnyGemmShape(m, n), out, in, weight, m, n, k, accumulate, stream);
}

cudaError_t LaunchSkinnyGemmShape(SkinnyGemmShape shape, float* out, const float* in,
                                  const void* weight, int m, int n, int k, bool accumulate,
                                  cudaStream_t stream) {
  if (!SkinnyGemmSupports(out, in, weight, m, n, k)) return cudaErrorInvalidValue;
  return LaunchShape(shape, out, in, weight, m, n, k, accumulate, stream);
}

bool SkinnyGemmSupportsBf16Input(const float* out, const void* in, const void* weight, int m, int n,
                                 int k) {
  // The same conditions: 16-byte aligned rows of k % 8 == 0 bf16 are whole 16-byte vectors.
  return SkinnyGemmSupports(out, static_cast<const float*>(in), weight, m, n, k);
}

cudaError_t LaunchSkinnyGemmBf16Input(float* out, const void* in, const void* weight, int m, int n,
                                      int k, bool accumulate, cudaStream_t stream) {
  return LaunchSkinnyGemmShapeBf16Input(ChooseSkinnyGemmShape(m, n), out, in, weight, m, n, k,
                                        accumulate, stream);
}

cudaError_t LaunchSkinnyGemmShapeBf16Input(SkinnyGemmShape shape, float* out, const void* in,
                                           const void* weight, int m, int n, int k, bool accumulate,
                                           cudaStream_t stream) {
  if (!SkinnyGemmSupportsBf16Input(out, in, weight, m, n, k)) return cudaErrorInvalidValue;
  return LaunchShape(shape, out, static_cast<const __nv_bfloat16*>(in), weight, m, n, k, accumulate,
                     stream);
}

}  // namespace kvd::cuda
