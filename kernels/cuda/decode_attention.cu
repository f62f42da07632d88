#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/paged_kv.cuh"

namespace kvd::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Resident decode CTAs per multiprocessor (shared memory allows two) and the grid size,
// in waves of those, that the split count aims for: several waves keep the tail short.
constexpr int kCtasPerSm = 2;
constexpr int kTargetWaves = 4;
// Splits start at multiples of kSplitGranule keys, a multiple of every warp iteration's
// key count, and hold at least kMinKeysPerSplit keys.
constexpr int kSplitGranule = 128;
constexpr int kMinKeysPerSplit = 128;
constexpr int kMaxSplits = 128;
constexpr int kMaxGroupPerCta = 8;
constexpr int kStages = 3;  // cp.async stages per warp
constexpr int kMergeThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kMaxSplits <= kMergeThreads);

struct SplitPlan {
  int num_splits;
  int split_len;  // keys, a multiple of kSplitGranule
};

// Shared by the decode and merge kernels so both see the same cut.
__device__ __forceinline__ SplitPlan PlanSplits(int kv_len, int max_splits) {
  const int wanted = max(1, min(max_splits, CeilDiv(kv_len, kMinKeysPerSplit)));
  const int len = max(1, CeilDiv(CeilDiv(kv_len, wanted), kSplitGranule)) * kSplitGranule;
  return {max(1, CeilDiv(kv_len, len)), len};
}

// Work layout of one warp, for 16-byte vectors of kVec elements of T:
//
//   lane = row * kLanesPerKey + slice: `slice` owns dims [slice*kVec, slice*kVec + kVec) of
//   a key and `row` picks one of the kKeysPerRow keys a warp-wide 16-byte load covers.
//   One warp iteration covers kKeysPerIter = kRounds * kKeysPerRow consecutive keys; round
//   r, row q is key r*kKeysPerRow + q. Every lane keeps its own online-softmax state and
//   partial output for all kGroup heads over the keys of its row; rows and warps are
//   combined once at the end.
//
//   Shared memory per warp and stage: K then V, [kRounds][32 lanes][16 bytes] each; a lane
//   only ever reads back the 16-byte slots it copied itself, so the cp.async wait alone
//   orders its reads.
template <typename T, int kHeadDim, int kGroup>
struct DecodeShape {
  static constexpr int kVec = Vec16<T>::kSize;
  static constexpr int kLanesPerKey = kHeadDim / kVec;
  static constexpr int kKeysPerRow = 32 / kLanesPerKey;
  static constexpr int kRounds = kGroup >= 8 ? 4 : 8;  // fewer score registers for 8 heads
  static constexpr int kKeysPerIter = kRounds * kKeysPerRow;
  static constexpr int kStageBytes = 2 * kRounds * 32 * 16;
  static constexpr int kPipelineBytes = kWarps * kStages * kStageBytes;
  // Combine area, reusing the pipeline: [kWarps][kGroup][kHeadDim] outputs, then
  // [kWarps][kGroup] maxima and sums.
  static constexpr int kCombineBytes = kWarps * kGroup * (kHeadDim + 2) * 4;
  static constexpr int kSmemBytes = kPipelineBytes > kCombineBytes ? kPipelineBytes : kCombineBytes;
  static_assert(kLanesPerKey <= 32 && 32 % kLanesPerKey == 0);
  static_assert(kKeysPerIter <= 32, "one lane holds one block pointer of an iteration");
  static_assert(kSplitGranule % (kWarps * kKeysPerIter) == 0);
};

__device__ __forceinline__ const char* ShflPtr(const char* ptr, int src_lane) {
  const unsigned long long bits = reinterpret_cast<unsigned long long>(ptr);
  return reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, bits, src_lane));
}

// grid (num_kv_heads * subgroups, num_seqs, max_splits), kThreads threads, Shape::kSmemBytes
// of dynamic shared memory.
template <typename T, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    DecodeKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                 int block_shift) {
  using Shape = DecodeShape<T, kHeadDim, kGroup>;
  constexpr int kVec = Shape::kVec;
  constexpr int kLanesPerKey = Shape::kLanesPerKey;
  constexpr int kKeysPerRow = Shape::kKeysPerRow;
  constexpr int kRounds = Shape::kRounds;
  constexpr int kKeysPerIter = Shape::kKeysPerIter;
  constexpr int kStageBytes = Shape::kStageBytes;
  extern __shared__ __align__(16) unsigned char smem[];

  const int kv_head = blockIdx.x / subgroups;
  const int head_base = kv_head * group + (blockIdx.x % subgroups) * kGroup;
  const int heads = min(kGroup, (kv_head + 1) * group - head_base);  // live heads, >= 1
  const int s = blockIdx.y;
  const int split = blockIdx.z;
  const int q_row = p.q_indptr[s];
  if (p.q_indptr[s + 1] - q_row != 1) return;
  const KvCacheView& c = p.cache;
  const int kv_len = SeqKvLen(p.blocks, s, c.block_size);
  const SplitPlan plan = PlanSplits(kv_len, ws.max_splits);
  if (split >= plan.num_splits) return;
  const int key_begin = split * plan.split_len;
  const int key_end = min(kv_len, key_begin + plan.split_len);
  const int32_t* seq_blocks = p.blocks.indices + p.blocks.indptr[s];
  const int num_seq_blocks = p.blocks.indptr[s + 1] - p.blocks.indptr[s];

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int row = lane / kLanesPerKey;
  const int dim0 = (lane % kLanesPerKey) * kVec;

  // Query slices, pre-scaled so that scores are base-2 logits.
  float q[kGroup][kVec];
  const float q_scale = p.sm_scale * kLog2e;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    const float* q_head = p.q + int64_t{q_row} * p.q_stride + int64_t{head_base + h} * kHeadDim;
#pragma unroll
    for (int i = 0; i < kVec; ++i) q[h][i] = h < heads ? q_head[dim0 + i] * q_scale : 0.0f;
  }

  // This warp's iterations start at key_begin + (warp + kWarps * i) * kKeysPerIter.
  const int cta_iters = CeilDiv(key_end - key_begin, kKeysPerIter);
  const int num_iters = cta_iters > warp ? CeilDiv(cta_iters - warp, kWarps) : 0;
  auto iter_start = [&](int it) { return key_begin + (warp + kWarps * it) * kKeysPerIter; };
  const int block_mask = c.block_size - 1;
  const int64_t row_bytes = int64_t{kHeadDim} * sizeof(T);
  const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;

  // Lane j's K head pointer of block j of iteration `it` (the block table is read once per
  // block, an iteration ahead of its copies). Lanes past the iteration's blocks, and
  // blocks past the sequence's, repeat a real block so every address stays valid.
  const int blocks_per_iter = max(1, kKeysPerIter >> block_shift);
  auto block_ptrs = [&](int it) -> const char* {
    if (it >= num_iters) return nullptr;
    const int b =
        min((iter_start(it) >> block_shift) + min(lane, blocks_per_iter - 1), num_seq_blocks - 1);
    return reinterpret_cast<const char*>(BlockHead<T>(c, seq_blocks[b], c.k_offset_bytes, kv_head));
  };
  unsigned char* warp_smem = smem + warp * kStages * kStageBytes;
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < num_iters) {
      const int start = iter_start(it);
      unsigned char* k_dst = warp_smem + stage * kStageBytes;
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        const int key_in_iter = r * kKeysPerRow + row;
        const int key = start + key_in_iter;
        // start is a multiple of the block size whenever an iteration spans blocks, so
        // the iteration's block index of the key is key_in_iter >> block_shift.
        const char* src = ShflPtr(ptrs, key_in_iter >> block_shift) +
                          (key & block_mask) * row_bytes + dim0 * sizeof(T);
        unsigned char* dst = k_dst + (r * 32 + lane) * 16;
        CpAsync16(dst, src, key < key_end);
        CpAsync16(dst + kStageBytes / 2, src + v_minus_k, key < key_end);
      }
    }
    CpAsyncCommit();  // empty groups too, so that group counts line up
  };

  float acc[kGroup][kVec];
  float run_max[kGroup];  // warp-uniform
  float run_sum[kGroup];  // over this lane's row of keys
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    run_max[h] = -INFINITY;
    run_sum[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[h][i] = 0.0f;
  }

  // Pipeline: kStages - 1 iterations in flight while one is computed.
  const char* ptrs[kStages - 1];
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) ptrs[i] = block_ptrs(i);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, ptrs[i], i);
  const char* pending = block_ptrs(kStages - 1);
  int read_stage = 0;
  for (int it = 0; it < num_iters; ++it) {
    const int write_stage = read_stage == 0 ? kStages - 1 : read_stage - 1;
    __syncwarp();
    issue(it + kStages - 1, pending, write_stage);
    pending = block_ptrs(it + kStages);
    CpAsyncWait<kStages - 1>();

    const unsigned char* k_src = warp_smem + read_stage * kStageBytes;
    const int start = iter_start(it);
    float score[kRounds][kGroup];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      float k[kVec];
      Vec16<T>::Load(k_src + (r * 32 + lane) * 16, k);
      const bool live = start + r * kKeysPerRow + row < key_end;
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot = fmaf(q[h][i], k[i], dot);
#pragma unroll
        for (int offset = kLanesPerKey / 2; offset > 0; offset /= 2) {
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        }
        score[r][h] = live ? dot : -INFINITY;
      }
    }
    // Online softmax: the iteration holds at least one live key, so the new max is finite.
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      float iter_max = score[0][h];
#pragma unroll
      for (int r = 1; r < kRounds; ++r) iter_max = fmaxf(iter_max, score[r][h]);
#pragma unroll
      for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
        iter_max = fmaxf(iter_max, __shfl_xor_sync(0xffffffffu, iter_max, offset));
      }
      const float new_max = fmaxf(run_max[h], iter_max);
      const float rescale = exp2f(run_max[h] - new_max);
      run_max[h] = new_max;
      float sum = run_sum[h] * rescale;
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        score[r][h] = exp2f(score[r][h] - new_max);
        sum += score[r][h];
      }
      run_sum[h] = sum;
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[h][i] *= rescale;
    }
    // Weighted values; masked keys have probability 0 and zero-filled V.
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      float v[kVec];
      Vec16<T>::Load(k_src + kStageBytes / 2 + (r * 32 + lane) * 16, v);
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[h][i] = fmaf(score[r][h], v[i], acc[h][i]);
      }
    }
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
  }

  // Sum the rows of the warp (same max everywhere in a warp).
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
#pragma unroll
    for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
      run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], offset);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], offset);
      }
    }
  }

  // Combine the warps through shared memory (the pipeline buffers are free once every
  // copy, including the empty tail groups, has landed).
  CpAsyncWait<0>();
  __syncthreads();
  float* s_acc = reinterpret_cast<float*>(smem);      // [kWarps][kGroup][kHeadDim]
  float* s_max = s_acc + kWarps * kGroup * kHeadDim;  // [kWarps][kGroup]
  float* s_sum = s_max + kWarps * kGroup;             // [kWarps][kGroup]
  if (row == 0) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) s_acc[(warp * kGroup + h) * kHeadDim + dim0 + i] = acc[h][i];
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      s_max[warp * kGroup + h] = run_max[h];
      s_sum[warp * kGroup + h] = run_sum[h];
    }
  }
  __syncthreads();

  const int64_t seq_split = int64_t{s} * ws.max_splits + split;
  for (int index = threadIdx.x; index < heads * kHeadDim; index += kThreads) {
    const int h = index / kHeadDim;
    const int d = index % kHeadDim;
    float max_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max_all = fmaxf(max_all, s_max[w * kGroup + h]);
    float sum = 0.0f;
    float o = 0.0f;
    if (max_all != -INFINITY) {  // else no key at all (an empty sequence): output 0
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float weight = exp2f(s_max[w * kGroup + h] - max_all);  // 0 for idle warps
        sum = fmaf(weight, s_sum[w * kGroup + h], sum);
        o = fmaf(weight, s_acc[(w * kGroup + h) * kHeadDim + d], o);
      }
    }
    o = sum > 0.0f ? o / sum : 0.0f;
    const int head = head_base + h;
    if (plan.num_splits == 1) {
      p.out[int64_t{q_row} * p.out_stride + int64_t{head} * kHeadDim + d] = o;
    } else {
      ws.partial_out[(seq_split * p.num_q_heads + head) * kHeadDim + d] = o;
      if (d == 0) {
        ws.partial_lse[seq_split * p.num_q_heads + head] =
            sum > 0.0f ? max_all + log2f(sum) : -INFINITY;
      }
    }
  }
}

// Block-wide reduction of kMergeThreads values; every thread gets the result.
template <typename Op>
__device__ float BlockReduce(float x, Op op, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  __syncthreads();  // scratch may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kMergeThreads / 32; ++w) x = op(x, scratch[w]);
  return x;
}

// grid (num_q_heads, num_seqs), kMergeThreads threads: out = sum_i w_i * partial_i / sum_i w_i
// with w_i = exp2(lse_i - max lse) over a split sequence's partial outputs. Thread t sums
// float4 column t % columns over splits t / columns, t / columns + groups, ...
__global__ void __launch_bounds__(kMergeThreads)
    MergeKernel(PagedAttentionParams p, DecodeWorkspace ws) {
  __shared__ float s_weight[kMaxSplits];
  __shared__ float s_scratch[kMergeThreads / 32];
  __shared__ float4 s_part[kMergeThreads];
  const int head = blockIdx.x;
  const int s = blockIdx.y;
  const int q_row = p.q_indptr[s];
  if (p.q_indptr[s + 1] - q_row != 1) return;
  const int kv_len = SeqKvLen(p.blocks, s, p.cache.block_size);
  const SplitPlan plan = PlanSplits(kv_len, ws.max_splits);
  if (plan.num_splits == 1) return;
  const int64_t first = int64_t{s} * ws.max_splits;
  const int t = threadIdx.x;

  const float lse =
      t < plan.num_splits ? ws.partial_lse[(first + t) * p.num_q_heads + head] : -INFINITY;
  const float max_lse = BlockReduce(
      lse, [](float a, float b) { return fmaxf(a, b); }, s_scratch);
  const float weight = max_lse == -INFINITY ? 0.0f : exp2f(lse - max_lse);
  if (t < plan.num_splits) s_weight[t] = weight;
  const float weight_sum = BlockReduce(
      weight, [](float a, float b) { return a + b; }, s_scratch);

  const int columns = p.cache.head_dim / 4;
  const int groups = kMergeThreads / columns;
  const int column = t % columns;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int i = t / columns; i < plan.num_splits; i += groups) {
    const float w = s_weight[i];
    const float4 part = reinterpret_cast<const float4*>(
        ws.partial_out + ((first + i) * p.num_q_heads + head) * p.cache.head_dim)[column];
    o.x = fmaf(w, part.x, o.x);
    o.y = fmaf(w, part.y, o.y);
    o.z = fmaf(w, part.z, o.z);
    o.w = fmaf(w, part.w, o.w);
  }
  s_part[t] = o;
  __syncthreads();
  if (t < columns) {
    float4 total = s_part[t];
    for (int g = 1; g < groups; ++g) {
      const float4 x = s_part[g * columns + t];
      total.x += x.x;
      total.y += x.y;
      total.z += x.z;
      total.w += x.w;
    }
    const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
    float* out = p.out + int64_t{q_row} * p.out_stride + int64_t{head} * p.cache.head_dim + 4 * t;
    out[0] = total.x * inv;
    out[1] = total.y * inv;
    out[2] = total.z * inv;
    out[3] = total.w * inv;
  }
}

template <typename T, int kHeadDim, int kGroup>
cudaError_t Launch(const PagedAttentionParams& p, const DecodeWorkspace& ws, cudaStream_t stream) {
  using Shape = DecodeShape<T, kHeadDim, kGroup>;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int subgroups = (group + kGroup - 1) / kGroup;
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  const dim3 grid(p.cache.num_kv_heads * subgroups, p.blocks.num_seqs, ws.max_splits);
  auto* kernel = DecodeKernel<T, kHeadDim, kGroup>;
  if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             Shape::kSmemBytes);
      err != cudaSuccess) {
    return err;
  }
  kernel<<<grid, kThreads, Shape::kSmemBytes, stream>>>(p, ws, group, subgroups, block_shift);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (ws.max_splits > 1) {
    MergeKernel<<<dim3(p.num_q_heads, p.blocks.num_seqs), kMergeThreads, 0, stream>>>(p, ws);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

int DecodeMaxSplits(int num_seqs, int num_kv_heads, int group_size, int num_sms) {
  const int subgroups = (group_size + kMaxGroupPerCta - 1) / kMaxGroupPerCta;
  const int64_t ctas = int64_t{num_seqs} * num_kv_heads * subgroups;
  if (ctas <= 0) return 1;
  const int64_t target = int64_t{kTargetWaves} * kCtasPerSm * num_sms;
  const int64_t wanted = (target + ctas - 1) / ctas;
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, kMaxSplits));
}

int64_t DecodePartialOutSize(int num_seqs, int max_splits, int num_q_heads, int head_dim) {
  return int64_t{num_seqs} * max_splits * num_q_heads * head_dim;
}

int64_t DecodePartialLseSize(int num_seqs, int max_splits, int num_q_heads) {
  return int64_t{num_seqs} * max_splits * num_q_heads;
}

cudaError_t LaunchDecodeAttention(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                  cudaStream_t stream) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (ws.max_splits < 1 || ws.max_splits > kMaxSplits) return cudaErrorInvalidValue;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  return KVD_DISPATCH_STORAGE_DTYPE(
      p.cache.dtype, T,
      KVD_DISPATCH_HEAD_DIM(
          p.cache.head_dim, kHeadDim,
          KVD_DISPATCH_GROUP_SIZE(group, kGroup, Launch<T, kHeadDim, kGroup>(p, ws, stream))));
}

}  // namespace kvd::cuda
