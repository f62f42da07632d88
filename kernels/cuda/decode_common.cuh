#ifndef KVD_KERNELS_CUDA_DECODE_COMMON_CUH_
#define KVD_KERNELS_CUDA_DECODE_COMMON_CUH_

// Code shared by the decode attention kernels (decode_attention_mma.cu for bf16 KV on tensor
// cores, decode_attention_simt.cu on CUDA cores): launch shapes and the grid launch, the split
// plan, a warp's keys and its copy pipeline, and the end of a CTA (the warps' combine, the
// split partials and their in-kernel merge). See decode_attention.h for the algorithm and the
// workspace. Only for .cu files.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/decode_split_plan.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/params.h"

namespace kvd::cuda::decode {

inline constexpr int kMaxSplits = 128;
inline constexpr int kMaxGroupPerCta = 8;
// Subgroups of at most kMaxGroupPerCta query heads in a KV head's group: the merge counters
// are sized per (sequence, KV head, subgroup).
inline int MergeSubgroups(int group) { return (group + kMaxGroupPerCta - 1) / kMaxGroupPerCta; }
// Launch shape: warps per CTA, pipeline stages per warp (kStages - 1 iterations in flight
// while one is scored) and the resident CTAs per multiprocessor the shared memory allows,
// which the split count aims to fill once; then the cp.async L2 prefetch hint, whether K/V
// come as TMA boxes where they can, and the iterations warmed in L2 (decode_attention_mma.cu).
template <int kWarpsT, int kStagesT, int kCtasPerSmT, int kL2PrefetchT = 0, bool kTmaT = false,
          int kL2AheadItersT = 0>
struct DecodeConfig {
  // A warp's first iterations whose K/V rows it prefetches into L2 before the wait for the
  // preceding kernel (decode_attention_mma.cu).
  static constexpr int kL2AheadIters = kL2AheadItersT;
  static constexpr int kL2Prefetch = kL2PrefetchT;  // 0, or the cp.async L2 prefetch size
  static constexpr bool kTma = kTmaT;  // K/V through the KvRowMap's TMA boxes where they can
  static constexpr int kWarps = kWarpsT;
  static constexpr int kThreads = 32 * kWarpsT;
  static constexpr int kStages = kStagesT;
  static constexpr int kCtasPerSm = kCtasPerSmT;
};
using DefaultConfig = DecodeConfig<4, 3, 2>;

// A traced launch's timeline of this CTA (DecodeWorkspace::trace; kernels instantiated with
// kTrace, every call a no-op otherwise). Thread 0 reads the clock and writes the record. The
// start and plan come before the wait for the preceding kernel (launch.cuh), when the record
// may still be the previous launch's to write: they are read there (TraceClock) and recorded
// after it (TraceStart), which clears the record first; every other point after it (Trace).
template <bool kTrace>
__device__ __forceinline__ uint64_t TraceClock() {
  uint64_t ns = 0;
  if constexpr (kTrace) asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns));
  return ns;
}

__device__ __forceinline__ DecodeTraceRecord& CtaTraceRecord(const DecodeWorkspace& ws) {
  return ws.trace[(int64_t{blockIdx.z} * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x];
}

// REQUIRES: after WaitForPrecedingGrid().
template <bool kTrace>
__device__ __forceinline__ void TraceStart(const DecodeWorkspace& ws, uint64_t entry,
                                           uint64_t planned) {
  if constexpr (kTrace) {
    if (threadIdx.x != 0) return;
    DecodeTraceRecord& record = CtaTraceRecord(ws);
    for (int i = 0; i < kDecodeTracePoints; ++i) record.ns[i] = 0;
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    record.sm = sm;
    record.merged = 0;
    record.ns[kTraceEntry] = entry;
    record.ns[kTracePlanned] = planned;
  }
}

// REQUIRES: after TraceStart.
template <bool kTrace>
__device__ __forceinline__ void Trace(const DecodeWorkspace& ws, DecodeTracePoint point) {
  if constexpr (kTrace) {
    if (threadIdx.x == 0) CtaTraceRecord(ws).ns[point] = TraceClock<true>();
  }
}

// What one decode CTA serves, from blockIdx = (KV head * subgroups + subgroup, sequence,
// split): a subgroup of up to group_per_cta query heads of one KV head's GQA group, and the
// keys [key_begin, key_end) of one split of the sequence's context.
struct DecodeCta {
  int kv_head;
  int head_base;  // first query head served
  int heads;      // query heads served, >= 1
  int seq;
  int split;
  int q_row;  // the sequence's (single) query row
  int key_begin;
  int key_end;
  int num_seq_blocks;
  const int32_t* seq_blocks;  // the sequence's block ids
  SplitPlan plan;
};

// Fills `cta` for this CTA, reading all sequence metadata in one round trip. False when the
// CTA has nothing to do: the sequence is not a decode (q_len != 1), or the split is past
// the sequence's last.
__device__ __forceinline__ bool PlanDecodeCta(const PagedAttentionParams& p,
                                              const DecodeWorkspace& ws, int group, int subgroups,
                                              int group_per_cta, int granule, DecodeCta& cta) {
  cta.kv_head = blockIdx.x / subgroups;
  cta.head_base = cta.kv_head * group + (blockIdx.x % subgroups) * group_per_cta;
  cta.heads = min(group_per_cta, (cta.kv_head + 1) * group - cta.head_base);
  cta.seq = blockIdx.y;
  cta.split = blockIdx.z;
  cta.q_row = p.q_indptr[cta.seq];
  const int q_next = p.q_indptr[cta.seq + 1];
  const int block_begin = p.blocks.indptr[cta.seq];
  cta.num_seq_blocks = p.blocks.indptr[cta.seq + 1] - block_begin;
  const int last_len = p.blocks.last_block_len[cta.seq];
  if (q_next - cta.q_row != 1) return false;
  const int kv_len =
      cta.num_seq_blocks == 0 ? 0 : (cta.num_seq_blocks - 1) * p.cache.block_size + last_len;
  cta.plan = PlanSplits(kv_len, ws.max_splits, granule, ws.min_split_granules, ws.tail_splits,
                        ws.tail_divisor, ws.tail_min_keys);
  if (cta.split >= cta.plan.num_splits) return false;
  cta.key_begin = cta.plan.Begin(cta.split);
  cta.key_end = min(kv_len, cta.key_begin + cta.plan.Len(cta.split));
  cta.seq_blocks = p.blocks.indices + block_begin;
  return true;
}

// One warp's share of a CTA's keys: iterations of kKeysPerIter consecutive keys, warp w
// taking iterations w, w + kWarps, w + 2 kWarps, ... of the CTA's range. T is the KV
// storage type.
// Static, though a trace of 8 x 4k has its CTAs' keys done anywhere from 33 to 44 us: tried
// and dropped, the last quarter (or half) of each warp's iterations taken instead one at a
// time from a counter shared by the splits of the (sequence, head group), each taken an
// iteration ahead, so that the faster warps take more (H100, gpu_bench sweep at the backend's
// split counts, each kernel its own process, two rounds; per call, then 16 back to back):
// 8 x 4k 0.816-0.841 and 0.968-0.970 of copy (half: 0.828-0.843, 0.969-0.970) against
// 0.825-0.839 and 0.971-0.972; 1 x 4k 0.324 and 0.512 (half: 0.319, 0.500) against
// 0.339-0.340 and 0.561-0.567; 16 x 16k within 1%, 1 x 32k within 2% (one round). Presumably
// the memory system stays saturated while the early CTAs' share goes to the late ones, so
// balancing them gains nothing.
template <typename T, int kKeysPerIter, int kWarps>
class WarpKeys {
 public:
  __device__ __forceinline__ WarpKeys(const DecodeCta& cta, const KvCacheView& c, int block_shift,
                                      int warp, int lane)
      : cta_(cta), c_(c), block_shift_(block_shift), warp_(warp), lane_(lane) {
    const int cta_iters = CeilDiv(cta.key_end - cta.key_begin, kKeysPerIter);
    num_iters_ = cta_iters > warp ? CeilDiv(cta_iters - warp, kWarps) : 0;
  }

  __device__ __forceinline__ int num_iters() const { return num_iters_; }

  // First key of iteration `it`.
  __device__ __forceinline__ int start(int it) const {
    return cta_.key_begin + (warp_ + kWarps * it) * kKeysPerIter;
  }

  // Lane j's K head pointer of block j of iteration `it` (the block table is read once per
  // block, an iteration ahead of its copies); null past the warp's iterations. Lanes past
  // the iteration's blocks, and blocks past the sequence's, repeat a real block so every
  // address stays valid.
  __device__ __forceinline__ const char* BlockPtrs(int it) const {
    if (it >= num_iters_) return nullptr;
    const int blocks_per_iter = max(1, kKeysPerIter >> block_shift_);
    const int b =
        min((start(it) >> block_shift_) + min(lane_, blocks_per_iter - 1), cta_.num_seq_blocks - 1);
    return reinterpret_cast<const char*>(
        BlockHead<T>(c_, cta_.seq_blocks[b], c_.k_offset_bytes, cta_.kv_head));
  }

 private:
  const DecodeCta& cta_;
  const KvCacheView& c_;
  int block_shift_;
  int warp_;
  int lane_;
  int num_iters_;
};

// A warp's software pipeline over its iterations (WarpKeys), kStages - 1 iterations' copies
// in flight while one is consumed: issue(it, block_ptrs, stage) enqueues iteration it's copies
// into buffer `stage`, consume(it, stage) waits for them and uses them. The callers own how a
// stage completes: issue commits a cp.async group (an empty one past the warp's last
// iteration) and consume starts with CpAsyncWait<kStages - 1>() (this lane's copies; another
// lane's need a __syncwarp too); or issue commits nothing and consume waits for the stage's
// own barrier (TMA). The block table is read an iteration ahead; the first kStages
// iterations' entries in one round trip, before start(). start() runs before the first copy:
// the place to wait for the preceding kernel (launch.cuh; the block table may be read before
// it, K/V and the query not) and to issue the query's loads; it gets those kStages
// iterations' block pointers (for L2 prefetches ahead of the wait). primed() runs once the
// first copies are issued: the place to use the query, whose round trip then overlaps the
// KV's instead of delaying it.
template <int kStages, typename Keys, typename Start, typename Issue, typename Primed,
          typename Consume>
__device__ __forceinline__ void RunWarpPipeline(const Keys& keys, Start&& start, Issue& issue,
                                                Primed&& primed, Consume&& consume) {
  const char* ptrs[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) ptrs[i] = keys.BlockPtrs(i);
  start(ptrs);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, ptrs[i], i);
  primed();
  const char* pending = ptrs[kStages - 1];
  int read_stage = 0;
  for (int it = 0; it < keys.num_iters(); ++it) {
    const int write_stage = read_stage == 0 ? kStages - 1 : read_stage - 1;
    __syncwarp();  // every lane is done with write_stage's previous iteration
    issue(it + kStages - 1, pending, write_stage);
    pending = keys.BlockPtrs(it + kStages);
    consume(it, read_stage);
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
  }
}

// Launches a decode kernel over (num_kv_heads * subgroups, num_seqs, max_splits) CTAs of
// `threads` threads, subgroups of up to group_per_cta query heads, as a programmatic dependent
// of the work before it on `stream`; `extra` follows the common parameters.
template <typename... Extra>
cudaError_t LaunchDecodeGrid(void (*kernel)(PagedAttentionParams, DecodeWorkspace, int, int, int,
                                            Extra...),
                             int threads, int smem_bytes, int group_per_cta,
                             const PagedAttentionParams& p, const DecodeWorkspace& ws,
                             cudaStream_t stream, const Extra&... extra) {
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int subgroups = (group + group_per_cta - 1) / group_per_cta;
  // The merge counters are sized for MergeSubgroups (DecodeArrivalCount): a kernel that split
  // a group more finely would count past their end.
  if (ws.max_splits > 1 && subgroups != MergeSubgroups(group)) {
    return cudaErrorInvalidValue;
  }
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  const dim3 grid(p.cache.num_kv_heads * subgroups, p.blocks.num_seqs, ws.max_splits);
  if (cudaError_t err = AllowDynamicSmem(kernel, smem_bytes); err != cudaSuccess) {
    return err;
  }
  return LaunchDependent(kernel, grid, dim3(threads), smem_bytes, stream, p, ws, group, subgroups,
                         block_shift, extra...);
}

// Combines the split partials of heads [head_base, head_base + heads) of sequence s into
// `out`, with the kThreads threads of one CTA: out = sum_i w_i partial_i / sum_i w_i with
// w_i = exp2(lse_i - max lse). `scratch` holds kGroup * (kMaxSplits + 1) floats. Partials
// written by other CTAs are read through L2 (__ldcg): L1 is not coherent across CTAs. A
// thread takes one (head, 4 columns) item at a time and loads its partials kMergeBatch splits
// at a time; its first item's first batch is loaded before the weights are known, so that
// with up to kMergeBatch splits the merge waits on L2 once (H200, 8 x 4k in 4 splits: the
// merging CTA's merge took 1.18 us, against 1.31 with the loads after the weights).
template <int kHeadDim, int kGroup, typename Cfg>
__device__ void MergeGroup(const PagedAttentionParams& p, const DecodeWorkspace& ws, int s,
                           int q_row, int head_base, int heads, int num_splits, float* scratch) {
  float* s_weight = scratch;                         // [kGroup][kMaxSplits]
  float* s_inv_sum = scratch + kGroup * kMaxSplits;  // [kGroup]
  const int64_t first = int64_t{s} * ws.max_splits;
  constexpr int kColumns = kHeadDim / 4;
  const int64_t split_stride = int64_t{p.num_q_heads} * kColumns;  // float4s per split
  // Item `item`'s partials of splits [first_split, first_split + kMergeBatch) into x (zeros
  // past the last split).
  auto load_batch = [&](int item, int first_split, float4 (&x)[kMergeBatch]) {
    const float4* part =
        reinterpret_cast<const float4*>(ws.partial_out +
                                        (first * p.num_q_heads + head_base + item / kColumns) *
                                            kHeadDim) +
        item % kColumns;
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      x[j] = first_split + j < num_splits ? __ldcg(part + (first_split + j) * split_stride)
                                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  float4 x[kMergeBatch];
  if (threadIdx.x < heads * kColumns) load_batch(threadIdx.x, 0, x);
  // Weights: one warp per head.
  const int lane = threadIdx.x % 32;
  for (int h = threadIdx.x / 32; h < heads; h += Cfg::kWarps) {
    float lse[kMaxSplits / 32];
    float max_lse = -INFINITY;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int i = lane + 32 * j;
      lse[j] = i < num_splits ? __ldcg(ws.partial_lse + (first + i) * p.num_q_heads + head_base + h)
                              : -INFINITY;
      max_lse = fmaxf(max_lse, lse[j]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int i = lane + 32 * j;
      const float w = max_lse == -INFINITY ? 0.0f : exp2f(lse[j] - max_lse);
      sum += w;
      if (i < num_splits) s_weight[h * kMaxSplits + i] = w;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) s_inv_sum[h] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  __syncthreads();
  for (int item = threadIdx.x; item < heads * kColumns; item += Cfg::kThreads) {
    const int h = item / kColumns;
    const float* w = s_weight + h * kMaxSplits;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int first_split = 0; first_split < num_splits; first_split += kMergeBatch) {
      if (item != threadIdx.x || first_split != 0) load_batch(item, first_split, x);
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const float weight = first_split + j < num_splits ? w[first_split + j] : 0.0f;
        o.x = fmaf(weight, x[j].x, o.x);
        o.y = fmaf(weight, x[j].y, o.y);
        o.z = fmaf(weight, x[j].z, o.z);
        o.w = fmaf(weight, x[j].w, o.w);
      }
    }
    const float inv = s_inv_sum[h];
    float* out = p.out + int64_t{q_row} * p.out_stride + int64_t{head_base + h} * kHeadDim +
                 4 * (item % kColumns);  // out_stride need not keep float4 alignment
    out[0] = o.x * inv;
    out[1] = o.y * inv;
    out[2] = o.z * inv;
    out[3] = o.w * inv;
  }
}

// A split's arrival at its merge counter: adds one to *counter at GPU scope with acquire-release
// semantics and returns the old value. Issued by one thread after a __syncthreads(), its
// release covers every store the CTA made before the barrier (PTX releases are cumulative);
// its acquire, followed by a __syncthreads(), makes the other splits' stores visible to the
// whole CTA. (On an H200 this put the merging CTA's end 0.3-0.5 us earlier at 1 x 4k than a
// __threadfence() in every thread around a relaxed atomicAdd.)
__device__ __forceinline__ int ArriveAcqRel(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.add.s32 %0, [%1], 1;\n"  // generic address
               : "=r"(old)
               : "l"(counter)
               : "memory");
  return old;
}

// Where the warps of a decode CTA leave their results for FinishCta, in the (then free)
// pipeline buffers: acc [kWarps][kGroup] rows of kHeadDim outputs normalized by nothing yet,
// kRowStride floats apart, then max and sum [kWarps][kGroup] (base-2 softmax bases, the
// running maxima or a little below, and the sums relative to them; -inf and 0 for a warp that
// saw no key). The 8 floats between rows put the rows of 4 heads on distinct banks: a warp's
// 8-byte stores of 8 heads' rows (the tensor-core kernel's fragments) take the 2 wavefronts
// they need, where rows kHeadDim apart would all start on bank 0. Every row starts 16-byte
// aligned, as the base is (FinishCta reads the rows four floats at a time).
template <int kHeadDim, int kGroup, typename Cfg>
struct CombineSlots {
  static constexpr int kRowStride = kHeadDim + 8;
  static_assert(kRowStride % 4 == 0, "rows of whole float4s");
  static constexpr int kBytes = Cfg::kWarps * kGroup * (kRowStride + 2) * 4;
  __device__ __forceinline__ explicit CombineSlots(void* smem)
      : acc(static_cast<float*>(smem)),
        max(acc + Cfg::kWarps * kGroup * kRowStride),
        sum(max + Cfg::kWarps * kGroup) {}
  // Warp w's row for head h.
  __device__ __forceinline__ float* Row(int w, int h) const {
    return acc + (w * kGroup + h) * kRowStride;
  }
  float* acc;
  float* max;
  float* sum;
};

// The end of a decode CTA once every warp's results are in its CombineSlots at s_acc.
// Combines the warps and writes `out` (one split) or this split's partials; the last split
// of the (sequence, head group) to finish then merges them all into `out`.
// REQUIRES: called by every thread of the CTA after a __syncthreads() that follows the
// writes to s_acc.
template <int kHeadDim, int kGroup, typename Cfg, bool kTrace = false>
__device__ void FinishCta(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                          const DecodeCta& cta, float* s_acc) {
  const int s = cta.seq;
  const int q_row = cta.q_row;
  const int head_base = cta.head_base;
  const int heads = cta.heads;
  const SplitPlan& plan = cta.plan;
  const CombineSlots<kHeadDim, kGroup, Cfg> slots(s_acc);
  float* s_weight = slots.max;  // [kWarps][kGroup], in place of the maxima
  float* s_lse = slots.sum;     // [kGroup], in place of warp 0's sums
  const int64_t seq_split = int64_t{s} * ws.max_splits + cta.split;
  // Per head, once (thread h owns head h's column of the slots): each warp's weight
  // exp2(max_w - max) / sum, and the base-2 log-sum-exp. Every weight is 0 for a head with no
  // key at all (an empty sequence): its output is 0. (Computing these for every element
  // instead made this combine 1.36 us against 0.9 per CTA, H200, 1 x 4k; on the path of every
  // CTA that ends a short decode.)
  if (threadIdx.x < heads) {
    const int h = threadIdx.x;
    float max_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) max_all = fmaxf(max_all, slots.max[w * kGroup + h]);
    float weight[Cfg::kWarps];
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      // 0 for idle warps (max -inf)
      weight[w] = max_all == -INFINITY ? 0.0f : exp2f(slots.max[w * kGroup + h] - max_all);
      sum = fmaf(weight[w], slots.sum[w * kGroup + h], sum);
    }
    const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) s_weight[w * kGroup + h] = weight[w] * inv_sum;
    s_lse[h] = sum > 0.0f ? max_all + log2f(sum) : -INFINITY;
  }
  __syncthreads();
  // Four columns a thread at a time: one 16-byte store of a partial's four (H200, gpu_bench
  // decode, three rounds alternating builds, 16 calls back to back in a graph: 1 x 4k
  // 0.432-0.434 of copy against 0.419 with a store per column, 1 x 32k 0.860-0.864 against
  // 0.852-0.856, 8 x 4k 0.877-0.883 against 0.872-0.875; per call, and the larger shapes,
  // within the rounds' spread).
  constexpr int kColumns = kHeadDim / 4;
#pragma unroll 2
  for (int index = threadIdx.x; index < heads * kColumns; index += Cfg::kThreads) {
    const int h = index / kColumns;
    const int d = 4 * (index % kColumns);
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float weight = s_weight[w * kGroup + h];
      const float4 x = *reinterpret_cast<const float4*>(slots.Row(w, h) + d);
      o.x = fmaf(weight, x.x, o.x);
      o.y = fmaf(weight, x.y, o.y);
      o.z = fmaf(weight, x.z, o.z);
      o.w = fmaf(weight, x.w, o.w);
    }
    const int head = head_base + h;
    if (plan.num_splits == 1) {
      float* out = p.out + int64_t{q_row} * p.out_stride + int64_t{head} * kHeadDim + d;
      out[0] = o.x;  // out_stride need not keep float4 alignment
      out[1] = o.y;
      out[2] = o.z;
      out[3] = o.w;
    } else {
      *reinterpret_cast<float4*>(ws.partial_out + (seq_split * p.num_q_heads + head) * kHeadDim +
                                 d) = o;
      if (d == 0) ws.partial_lse[seq_split * p.num_q_heads + head] = s_lse[h];
    }
  }
  if (plan.num_splits == 1) return;
  if constexpr (kTrace) __syncthreads();  // every thread's partial stored
  Trace<kTrace>(ws, kTracePartialStored);

  // In-kernel merge: the last CTA of this (sequence, head group) to finish combines every
  // split's partials. Each CTA publishes its partials and counts itself in with one
  // acquire-release atomic (ArriveAcqRel) rather than a fence in every thread; the counter
  // goes back to 0 for the next launch. (Tried and measured slower on an H200, gpu_bench
  // decode, two rounds alternating builds: the merger elected by a count at the end of the
  // key loops, keeping its own partials in shared memory while the others publish theirs with
  // a release reduction and it polls for them. 1 x 4k from a graph read 0.310-0.315 of copy
  // against 0.329, 8 x 4k 0.798-0.804 against 0.806-0.814: the splits end close together, so
  // the merger waits for the others' partials anyway, and a poll notices them later than the
  // last arrival's atomic returns. Nor a thread-block cluster of the group's splits, each
  // leaving its output and LSE in its own shared memory and rank 0 merging them through
  // distributed shared memory between two cluster barriers: results right, but on an H100,
  // gpu_bench sweep, two rounds, per call and 16 back to back, 1 x 4k read 0.253-0.266 and
  // 0.376-0.377 of copy against 0.303-0.333 and 0.555-0.556, 8 x 4k 0.660-0.668 and 0.737
  // against 0.816-0.839 and 0.970-0.973: presumably every CTA holds its slot until its cluster's
  // slowest is done, and the clusters' co-scheduling costs residency. Nor a CTA that reads its
  // counter as its keys end (relaxed, made an acquire by a fence where acted on) and, finding
  // every other split arrived, merges without the atomic: right on an H100 (gpu_test), but it
  // found them all arrived in 36 of 512 merges at 8 x 4k, 2 of 64 at 1 x 32k and none of 64 at
  // 1 x 4k (8 traced launches each), the splits ending too close together, and gpu_bench sweep
  // at 8 x 4k, two rounds alternating with the kernel without it, read 0.818-0.844 of copy per
  // call against 0.823-0.829, 0.988 back to back against 0.989-0.990.)
  __shared__ int s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    int* arrivals = ws.arrivals + int64_t{s} * gridDim.x + blockIdx.x;
    const int done = ArriveAcqRel(arrivals) + 1;
    s_last = done == plan.num_splits;
    if (s_last) *arrivals = 0;
    Trace<kTrace>(ws, kTraceArrived);
    if constexpr (kTrace) CtaTraceRecord(ws).merged = s_last;
  }
  __syncthreads();
  if (!s_last) return;
  MergeGroup<kHeadDim, kGroup, Cfg>(p, ws, s, q_row, head_base, heads, plan.num_splits, s_acc);
}

}  // namespace kvd::cuda::decode

#endif  // KVD_KERNELS_CUDA_DECODE_COMMON_CUH_
