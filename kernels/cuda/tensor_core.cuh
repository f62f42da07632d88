#ifndef KVD_KERNELS_CUDA_TENSOR_CORE_CUH_
#define KVD_KERNELS_CUDA_TENSOR_CORE_CUH_

// Warp-level bf16 tensor-core helpers (sm_80+ `mma.sync` and `ldmatrix`), and the staging of
// fp32 Q rows as bf16 operands (StageScaledQ). Fragment layouts as in the PTX ISA for
// mma.m16n8k16 with g = lane / 4 and t = lane % 4:
//
//   A (16x16, row-major), 4 regs of bf16x2:  a0 (g, 2t..2t+1)   a1 (g+8, 2t..2t+1)
//                                            a2 (g, 2t+8..2t+9) a3 (g+8, 2t+8..2t+9)
//   B (16x8, "col"),      2 regs of bf16x2:  b0 (k 2t..2t+1, n g)  b1 (k 2t+8..2t+9, n g)
//   C/D (16x8) fp32, 4 floats:               c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
//
// In each bf16x2 register the element with the lower column (or k) index is the low half.
// Also the bf16 packing of fp32 operands, and the online-softmax step over accumulator rows
// that the attention kernels share (wgmma's accumulators hold rows the same way). Only for
// .cu files.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace kvd::cuda {

// d += a * b, bf16 inputs, fp32 accumulation.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices from shared memory: lanes 8i..8i+7 give the row addresses (16
// bytes each) of matrix i, and r[i] receives this lane's part of matrix i: (row g, columns
// 2t, 2t+1), or with `kTranspose` (rows 2t, 2t+1, column g).
template <bool kTranspose>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row_address) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row_address));
  if constexpr (kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
}

__device__ __forceinline__ uint32_t BitsOf(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

// (lo, hi) rounded to bf16x2 as `high_part`, and the rounding residual, also bf16, as
// `low_part`: high_part + low_part carries ~16 significant bits of each input, so a product
// with an exact bf16 operand split this way loses almost nothing against fp32.
__device__ __forceinline__ void SplitBf16x2(float lo, float hi, uint32_t& high_part,
                                            uint32_t& low_part) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  high_part = BitsOf(h);
  low_part = BitsOf(__floats2bfloat162_rn(lo - __low2float(h), hi - __high2float(h)));
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  return BitsOf(__floats2bfloat162_rn(lo, hi));
}

// v[0..7] * scale as eight bf16, element 0 in the low half of .x.
__device__ __forceinline__ uint4 PackScaledBf16x8(const float (&v)[8], float scale) {
  return make_uint4(PackBf16x2(v[0] * scale, v[1] * scale), PackBf16x2(v[2] * scale, v[3] * scale),
                    PackBf16x2(v[4] * scale, v[5] * scale), PackBf16x2(v[6] * scale, v[7] * scale));
}

// Q rows into shared memory as scaled bf16, kRounds chunks of eight floats a thread:
// `source(round, live)` gives a chunk's floats, always readable (a row past the end gives a
// real row's, loaded and dropped), and sets `live` false for a chunk that must be zeros;
// `store(round, bits)` puts its bf16. `aligned`: every chunk 16-byte aligned (two 16-byte
// loads, else eight scalar ones). Every load is issued before the first store, with no branch
// between them: the compiler cannot move a load above a shared store it cannot tell apart from
// it, and it converts inside a branch, so either way each round would wait out a memory round
// trip (prefill_attention_sm90a.cu has the measurements). Loads go through L2 only
// (ld.global.cg): Q is read once, and the Hopper prefill's L1 is the few KB its shared memory
// leaves.
template <int kRounds, typename SourceFn, typename StoreFn>
__device__ __forceinline__ void StageScaledQ(bool aligned, float scale, SourceFn&& source,
                                             StoreFn&& store) {
  float v[kRounds][8];
  bool live[kRounds];
  if (aligned) {
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      const float4* src = reinterpret_cast<const float4*>(source(round, live[round]));
      const float4 a = __ldcg(src);
      const float4 b = __ldcg(src + 1);
      v[round][0] = a.x, v[round][1] = a.y, v[round][2] = a.z, v[round][3] = a.w;
      v[round][4] = b.x, v[round][5] = b.y, v[round][6] = b.z, v[round][7] = b.w;
    }
  } else {
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      const float* src = source(round, live[round]);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[round][i] = __ldcg(src + i);
    }
  }
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    store(round, live[round] ? PackScaledBf16x8(v[round], scale) : make_uint4(0, 0, 0, 0));
  }
}

// 2^x by the special function unit alone (ex2.approx.ftz: relative error ~2^-22, results
// below 2^-126 flushed to 0), without exp2f's range fix-ups: for probabilities rounded to
// bf16 anyway.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax keeps its base (the running max) until a logit exceeds it by more than
// this (base 2), so rescaling the output, which costs a multiply per accumulator, is rare
// once a row's largest logits have gone by. Probabilities reach 2^kRescaleSlack at most:
// far from overflow, and bf16 keeps the same relative precision there.
inline constexpr float kRescaleSlack = 8.0f;

// The base after a tile whose largest (base-2) logit is `tile_max`: the old one unless the
// tile exceeds it by more than kRescaleSlack (and the first finite logit's tile).
__device__ __forceinline__ float NextSoftmaxBase(float row_max, float tile_max) {
  return tile_max > row_max + kRescaleSlack ? tile_max : row_max;
}

// One online-softmax step of an accumulator row (g or g + 8), which a quad of lanes holds:
// `lane_max` is this lane's largest new (base-2) logit of the row. Updates the row's running
// base (NextSoftmaxBase) and this lane's running sum (scaled by the returned `rescale`, the
// factor for everything accumulated so far, 1 while the base stays) and returns the base to
// subtract from the new logits, or 0 while the row has seen no key (so its sum and output
// stay 0). kFastExp2: FastExp2, else exp2f.
template <bool kFastExp2>
__device__ __forceinline__ float OnlineSoftmaxStep(float lane_max, float& row_max,
                                                   float& row_sum, float& rescale) {
  float tile_max = fmaxf(lane_max, __shfl_xor_sync(0xffffffffu, lane_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float new_max = NextSoftmaxBase(row_max, tile_max);
  const float base = new_max == -INFINITY ? 0.0f : new_max;
  rescale = kFastExp2 ? FastExp2(row_max - base) : exp2f(row_max - base);
  row_max = new_max;
  row_sum *= rescale;
  return base;
}

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_TENSOR_CORE_CUH_
