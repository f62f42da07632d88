// Decode attention on tensor cores for bf16 KV (decode_kernels.h), what
// LaunchDecodeAttention runs for bf16 caches.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/decode_common.cuh"
#include "kernels/cuda/decode_kernels.h"
#include "kernels/cuda/decode_mma_stage.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/hopper_sync.cuh"
#include "kernels/cuda/kv_row_map.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/tensor_core.cuh"

namespace kvd::cuda {
namespace {

using decode::CombineSlots;
using decode::DecodeConfig;
using decode::DecodeCta;
using decode::DecodeSmem;
using decode::DefaultConfig;
using decode::FinishCta;
using decode::kMaxGroupPerCta;
using decode::LaunchDecodeGrid;
using decode::MmaDecodeShape;
using decode::MmaStageLoader;
using decode::PlanDecodeCta;
using decode::RunWarpPipeline;
using decode::WarpKeys;

// Tensor-core decode for bf16 KV (DecodeMmaKernel). The GQA group's query heads are rows
// 0-7 of an m16n8k16 tile (up to 8 live), so every warp iteration of 16 keys is a handful of
// MMAs instead of thousands of CUDA-core FMAs:
//   S[head][key] = Q K^T : Q as a bf16 high part plus a bf16 residual (~16 significant bits,
//                          as the prefill kernel's split mode): head g's high part is row g,
//                          its residual row g + 8, so one MMA multiplies both and the score
//                          is the sum of the two rows; K fragments by ldmatrix from the
//                          staged tile;
//   O += P V             : P split the same way (high part row g, residual row g + 8), V
//                          fragments by ldmatrix.trans; rows g and g + 8 of O are summed at
//                          the end.
// K and V are staged as decode_mma_stage.cuh describes; pipeline, splits and the end of the
// CTA are the CUDA-core kernel's.

// One warp's share of the tensor-core decode math: its query heads' Q fragments, O
// accumulators and softmax state, fed one staged iteration of kKeysPerIter keys at a time.
template <int kHeadDim, typename Cfg>
struct MmaWarpMath {
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  static constexpr int kKeysPerIter = Shape::kKeysPerIter;

  __device__ __forceinline__ explicit MmaWarpMath(int lane) : g(lane / 4), t(lane % 4) {
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // ldmatrix row addresses within a tile: matrix lane / 8, row lane % 8.
    const int matrix = lane / 8;
    k_key = (matrix >= 2 ? 8 : 0) + lane % 8;  // K: m0, m1 keys 0-7; m2, m3 keys 8-15
    k_chunk_odd = matrix & 1;                  // K: m1, m3 the second 8 dims
    v_key = (matrix & 1) * 8 + lane % 8;       // V: m0, m2 keys 0-7; m1, m3 keys 8-15
    v_chunk_odd = matrix >> 1;                 // V: m2, m3 the second dim tile
  }

  // This lane's elements of its head's query row, as loaded: for each k-step, dims 2t, 2t+1,
  // 2t+8 and 2t+9.
  struct QLane {
    float x[Shape::kDimSteps][4];
  };

  // Starts loading this lane's Q elements of heads [head_base, head_base + heads) of query
  // row q_row (dead heads read a live head's row, which SetQ zeroes). The loads complete on
  // first use, in SetQ.
  __device__ __forceinline__ QLane LoadQ(const PagedAttentionParams& p, int q_row, int head_base,
                                         int heads) const {
    const float* q_head =
        p.q + int64_t{q_row} * p.q_stride + int64_t{head_base + (g < heads ? g : 0)} * kHeadDim;
    QLane q;
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      const float* x = q_head + 16 * ks + 2 * t;  // q_stride may be odd: scalar loads
      q.x[ks][0] = x[0];
      q.x[ks][1] = x[1];
      q.x[ks][2] = x[8];
      q.x[ks][3] = x[9];
    }
    return q;
  }

  // The Q fragments of each k-step from LoadQ's elements, pre-scaled to base-2 logits and
  // split: a0 and a2 (row g, dims 2t, 2t+1 and 2t+8, 2t+9) the high parts of head g, a1 and a3
  // (row g + 8, the same dims) the residuals. Dead heads are zero. Before the first Consume.
  __device__ __forceinline__ void SetQ(const QLane& q, const PagedAttentionParams& p, int heads) {
    const float scale = g < heads ? p.sm_scale * kLog2e : 0.0f;
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      SplitBf16x2(q.x[ks][0] * scale, q.x[ks][1] * scale, q_frag[ks][0], q_frag[ks][1]);
      SplitBf16x2(q.x[ks][2] * scale, q.x[ks][3] * scale, q_frag[ks][2], q_frag[ks][3]);
    }
  }

  // Keys [start, start + kKeysPerIter) staged at k_tile (V a tile later); keys at or past
  // key_end are masked. At least one key is below key_end.
  __device__ __forceinline__ void Consume(const unsigned char* k_tile, int start, int key_end) {
    const unsigned char* v_tile = k_tile + Shape::kTileBytes;
    // S for keys 0-7 (sc[0]) and 8-15 (sc[1]), even and odd k-steps apart (two shorter
    // chains of dependent MMAs); in each, c0 and c1 the high parts' products, c2 and c3 the
    // residuals'.
    float sc[2][2][4] = {};
#pragma unroll
    for (int ks = 0; ks < Shape::kDimSteps; ++ks) {
      uint32_t b[4];
      const int chunk = 2 * ks + k_chunk_odd;
      LdMatrixX4<false>(b, k_tile + Shape::TileOffset(k_key, chunk));
      MmaBf16(sc[0][ks & 1], q_frag[ks], b[0], b[1]);
      MmaBf16(sc[1][ks & 1], q_frag[ks], b[2], b[3]);
    }
    // This lane's scores: head g, keys 2t, 2t+1, 8+2t, 9+2t of the iteration; keys past
    // the end only in a range's last iteration (the same answer in every lane).
    const bool tail = start + kKeysPerIter > key_end;
    float score[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float* even = sc[i / 2][0];
      const float* odd = sc[i / 2][1];
      score[i] = (even[i & 1] + even[2 + (i & 1)]) + (odd[i & 1] + odd[2 + (i & 1)]);
    }
    if (tail) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = start + (i >= 2 ? 8 : 0) + 2 * t + (i & 1);
        if (key >= key_end) score[i] = -INFINITY;
      }
    }
    // Head g's row is a quad of lanes, as an accumulator row of the prefill kernels; rescale
    // is 0 on the first iteration (which has a live key).
    float rescale;
    const float base = OnlineSoftmaxStep</*kFastExp2=*/true>(
        fmaxf(fmaxf(score[0], score[1]), fmaxf(score[2], score[3])), row_max, row_sum, rescale);
    float prob[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) prob[i] = FastExp2(score[i] - base);
    row_sum += (prob[0] + prob[1]) + (prob[2] + prob[3]);
    // O only when some head's base moved (else every rescale is exactly 1), which after the
    // first iterations is rare.
    if (__any_sync(0xffffffffu, rescale != 1.0f)) {
#pragma unroll
      for (int n = 0; n < Shape::kDimTiles; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) o[n][r] *= rescale;
      }
    }
    // P as the A operand: a0 (row g, keys 2t, 2t+1) and a2 (row g, keys 2t+8, 2t+9) the high
    // parts, a1 and a3 (row g + 8) the residuals; masked keys have probability 0 and V rows
    // of zeros (zero-filled copies, or zeroed in the fragments).
    uint32_t p_frag[4];
    SplitBf16x2(prob[0], prob[1], p_frag[0], p_frag[1]);
    SplitBf16x2(prob[2], prob[3], p_frag[2], p_frag[3]);
    // kTma: V rows past the end may hold anything (NaN times probability 0 is NaN): zero
    // them in the fragments, whose registers hold keys 2t, 2t+1 (b0, b2) and 8+2t, 9+2t
    // (b1, b3), the lower key in the low half.
    uint32_t v_mask[2] = {0xffffffffu, 0xffffffffu};
    const bool mask_v = Cfg::kTma && tail;
    if (mask_v) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = start + 8 * j + 2 * t;
        v_mask[j] = (key < key_end ? 0x0000ffffu : 0u) | (key + 1 < key_end ? 0xffff0000u : 0u);
      }
    }
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; n += 2) {
      uint32_t b[4];
      const int chunk = n + v_chunk_odd;
      LdMatrixX4<true>(b, v_tile + Shape::TileOffset(v_key, chunk));
      if (mask_v) {
#pragma unroll
        for (int r = 0; r < 4; ++r) b[r] &= v_mask[r & 1];
      }
      MmaBf16(o[n], p_frag, b[0], b[1]);
      MmaBf16(o[n + 1], p_frag, b[2], b[3]);
    }
  }

  // After the last Consume: this lane's row sum over the quad's keys.
  __device__ __forceinline__ void ReduceSum() {
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
  }

  // Leaves the warp's results in its CombineSlots entries (FinishCta combines the warps).
  template <typename Slots>
  __device__ __forceinline__ void Store(const Slots& slots, int warp) const {
#pragma unroll
    for (int n = 0; n < Shape::kDimTiles; ++n) {
      float* dst = slots.Row(warp, g) + 8 * n + 2 * t;
      dst[0] = o[n][0] + o[n][2];  // rows g and g + 8: the high parts' and residuals' products
      dst[1] = o[n][1] + o[n][3];
    }
    if (t == 0) {
      slots.max[warp * kMaxGroupPerCta + g] = row_max;
      slots.sum[warp * kMaxGroupPerCta + g] = row_sum;
    }
  }

  int g;  // fragment row: head g of the subgroup
  int t;
  int k_key, k_chunk_odd, v_key, v_chunk_odd;
  uint32_t q_frag[Shape::kDimSteps][4];
  float o[Shape::kDimTiles][4];
  // Head g's softmax base over the warp's keys so far (NextSoftmaxBase: the running max, up
  // to kRescaleSlack stale; the same across the quad).
  float row_max = -INFINITY;
  float row_sum = 0.0f;  // over this lane's keys, relative to row_max
};

// A warp with at most this many iterations leaves its first out of the L2 prefetch ahead of
// the wait (Cfg::kL2AheadIters): that iteration's copy is issued right after the wait anyway,
// and for such short warps prefetching it too measured slower (presumably the copy then
// waits on its own prefetch, its latency on every short warp's path). H100, gpu_bench
// decode, three rounds alternating with prefetching it too, in one run: 1 x 4k (four
// iterations a warp) 0.561-0.563 of copy 16 back to back against 0.535-0.538, per call
// 0.270-0.290 against 0.262-0.281, from a one-launch graph 0.333-0.344 against 0.327-0.341;
// the other shapes (16 iterations or more) unchanged.
constexpr int kL2SkipFirstMaxIters = 4;

// grid (num_kv_heads * subgroups, num_seqs, max_splits), Cfg::kThreads threads,
// MmaDecodeShape::kSmemBytes of dynamic shared memory; subgroups of kMaxGroupPerCta heads.
// kTrace: the launch is traced (DecodeWorkspace::trace), a separate instantiation so that
// untraced launches carry none of it.
template <int kHeadDim, typename Cfg, bool kTrace = false>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    DecodeMmaKernel(PagedAttentionParams p, DecodeWorkspace ws, int group, int subgroups,
                    int block_shift, const __grid_constant__ KvRowMap rows) {
  using Shape = MmaDecodeShape<kHeadDim, Cfg>;
  constexpr int kGroup = kMaxGroupPerCta;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ uint64_t stage_full[Cfg::kTma ? Cfg::kWarps : 1][kStages];  // kTma: [warp][stage]

  // The sequence metadata and the block table are read before the wait for the preceding
  // kernel (launch.cuh), K/V and Q after it (RunWarpPipeline's start).
  const uint64_t entry_ns = decode::TraceClock<kTrace>();
  // The TMA view's descriptor on its way while the metadata is read. (H100, gpu_bench decode,
  // three rounds alternating with a build without it, 16 back to back: 1 x 4k 0.560-0.564 of
  // copy against 0.554-0.558, 8 x 4k 0.987-0.991 against 0.984-0.985, 1 x 32k 0.965-0.967
  // against 0.962; per call and from a one-launch graph within the rounds' spread.)
  if constexpr (Cfg::kTma) {
    if (threadIdx.x == 0 && rows.num_rows > 0) PrefetchTensorMap(&rows.map);
  }
  DecodeCta cta;
  const bool active = PlanDecodeCta(p, ws, group, subgroups, kGroup, Shape::kSplitGranule, cta);
  const uint64_t planned_ns = decode::TraceClock<kTrace>();
  if (!active) {
    WaitForPrecedingGrid();  // launch.cuh: every CTA waits, also one with nothing to do
    decode::TraceStart<kTrace>(ws, entry_ns, planned_ns);
    return;
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  unsigned char* smem = DecodeSmem<Cfg>(smem_raw, stage_full, warp, lane);

  MmaWarpMath<kHeadDim, Cfg> math(lane);
  const WarpKeys<__nv_bfloat16, Shape::kKeysPerIter, Cfg::kWarps> keys(cta, p.cache, block_shift,
                                                                       warp, lane);
  const MmaStageLoader<kHeadDim, Cfg> loader(p.cache, rows, block_shift,
                                             smem + warp * kStages * Shape::kStageBytes,
                                             stage_full[Cfg::kTma ? warp : 0], lane);
  auto issue = [&](int it, const char* ptrs, int stage) {
    if (it < keys.num_iters()) loader.Issue(keys.start(it), ptrs, cta.key_end, stage);
    if constexpr (!Cfg::kTma) CpAsyncCommit();
  };
  // Q's loads go out first, but the first K/V copies are issued before they are waited for:
  // the two round trips overlap, and Q still lands ahead of the KV.
  typename MmaWarpMath<kHeadDim, Cfg>::QLane q_lane;
  static_assert(Cfg::kL2AheadIters <= kStages, "the pipeline reads kStages block pointers ahead");
  // Before the wait, the first iterations' K/V rows start towards L2 (from the pipeline's
  // first kStages block pointers, `ptrs`) while the preceding kernel finishes; a short warp's
  // from its second (kL2SkipFirstMaxIters).
  auto load_q = [&](const auto& ptrs) {
    const int first = keys.num_iters() <= kL2SkipFirstMaxIters ? 1 : 0;
#pragma unroll
    for (int it = 0; it < Cfg::kL2AheadIters; ++it) {
      if (it >= first && it < keys.num_iters()) loader.PrefetchL2(keys.start(it), ptrs[it]);
    }
    WaitForPrecedingGrid();  // launch.cuh: before reading what kernels write (K/V, Q)
    decode::TraceStart<kTrace>(ws, entry_ns, planned_ns);
    q_lane = math.LoadQ(p, cta.q_row, cta.head_base, cta.heads);
  };
  auto set_q = [&] { math.SetQ(q_lane, p, cta.heads); };
  RunWarpPipeline<kStages>(keys, load_q, issue, set_q, [&](int it, int read_stage) {
    if constexpr (Cfg::kTma) {
      MbarrierWait(&stage_full[warp][read_stage], (it / kStages) & 1);
    } else {
      CpAsyncWait<kStages - 1>();
      __syncwarp();  // other lanes' copies of this stage have landed too
    }
    if (it == 0) decode::Trace<kTrace>(ws, kTraceFirstKv);
    math.Consume(loader.Tile(read_stage), keys.start(it), cta.key_end);
  });
  math.ReduceSum();
  decode::Trace<kTrace>(ws, kTraceKeysDone);

  AllowDependentLaunch();  // past the KV stream: only the combine and merge are left
  CpAsyncWait<0>();
  __syncthreads();
  const CombineSlots<kHeadDim, kGroup, Cfg> slots(smem);
  math.Store(slots, warp);
  __syncthreads();
  decode::Trace<kTrace>(ws, kTraceCombined);
  FinishCta<kHeadDim, kGroup, Cfg, kTrace>(p, ws, cta, slots.acc);
  if constexpr (kTrace) __syncthreads();  // the whole CTA is done
  decode::Trace<kTrace>(ws, kTraceEnd);
}

// The TMA variant of the default shape: what LaunchDecodeMma runs at head_dim 128 when a
// KvRowMap is given. Two stages (one iteration's boxes in flight per warp while one is
// scored), not three: on an H200 (gpu_bench decode, per call, two rounds alternating builds
// in one run) three stages read 0.700-0.714 / 0.937-0.950 / 0.988-1.000 / 0.966-0.983 /
// 1.006-1.021 of copy at 8 x 4k, 32 x 4k, 64 x 4k, 16 x 16k and 4 x 128k against
// 0.732-0.735 / 0.963-0.964 / 1.014-1.018 / 1.004-1.016 / 1.038-1.044 with two; with the
// memory system this full, a deeper queue only waits longer (and takes 97 KB of shared
// memory a CTA, not 65). Nor did other shapes of the same boxes help the short batches
// (gpu_bench sweep, two rounds, each shape at its best split count, per call): 8 or 12 warps
// in 2 stages and 8 warps in 3, each at one CTA per SM, and 6 warps at two, read
// 0.700-0.732 of copy at 8 x 4k against this one's 0.720-0.731, and 0.251-0.265 at 1 x 4k
// against 0.258-0.264. At 32 x 4k and 64 x 4k the one-CTA shapes were 2-5% slower and 6
// warps within 1%. (Sixteen launches back to back in a graph, 8 warps at one CTA per SM
// read 0.519-0.522 at 1 x 4k against 0.479-0.484: an attention call that is a few
// microseconds of a batch-1 step whose weights take milliseconds. Measured again later, each
// at its best split count, 16 launches back to back in a graph, two rounds in one run: 8 warps
// at one CTA per SM 0.417 at 1 x 4k, 0.849 at 1 x 32k, 0.829-0.833 at 8 x 4k; three stages at
// two 0.393, 0.827, 0.844; this shape 0.430-0.433, 0.846-0.851, 0.864-0.866. Nor did room
// for a third CTA an SM (launch bounds of three: 166 registers, no spills), meant to let the
// next launch's CTAs read their metadata and block table while this one's last CTAs merge:
// back to back, three rounds, 8 x 4k 0.763-0.767 against 0.862-0.866, 64 x 4k 0.921-0.922
// against 1.014-1.017, 16 x 16k 0.961-0.965 against 1.008-1.014; per call 64 x 4k 0.89-0.90
// against 0.99, its 512 CTAs now in one and a third waves.) Nor did one CTA per SM with
// more boxes in flight, which lets 8 x 4k run unsplit (64 CTAs, no merge): on an H100
// (gpu_bench sweep, two rounds, per call, then 16 back to back) 6 warps in 4 stages read
// 0.793-0.799 and 0.909-0.913 of copy unsplit, 0.792-0.795 and 0.938-0.941 in two splits;
// 8 warps in 3, 0.740-0.743 and 0.908 unsplit, 0.807 and 0.968-0.969 in two; 4 warps in 6,
// 0.628-0.632 unsplit; against this shape's 0.827-0.832 and 0.995-0.996 in four splits. The
// merge left out saves under 2 us a call, and 64 SMs stream the KV about 8% slower than all.
// Each warp bulk-prefetches (cp.async.bulk.prefetch.L2) the K and V rows of its first two
// iterations before the wait for the preceding grid: no ordering is needed, as a prefetch
// loads nothing into the CTA and the preceding kernel's writes land in L2. Measured on an H100
// (copy ~3040 GB/s; gpu_bench sweep at the backend's split counts, two rounds alternating
// with the same kernel without it, variant 5, in one run), per call and 16 back to back:
// 8 x 4k 0.852-0.853 and 0.987-0.988 against 0.810-0.812 and 0.910; 1 x 32k 0.836-0.837 and
// 0.966-0.968 against 0.781-0.796 and 0.897-0.898; 32 x 4k and larger 1-2% more; 1 x 4k
// 0.326-0.329 per call against 0.342-0.344 but 0.537-0.539 back to back against 0.498-0.515.
// Other depths in the same run: iterations [0,4) and [1,4) as good at 8 x 4k back to back but
// 0.297-0.308 per call at 1 x 4k; [1,2) best at 1 x 4k back to back (0.565) but 0.820 per call
// at 8 x 4k; [0,8) slower than none at 8 x 4k per call (0.782). Warps of four iterations or
// fewer (1 x 4k) now take [1,2), the rest [0,2): kL2SkipFirstMaxIters.
using TmaConfig = DecodeConfig<DefaultConfig::kWarps, /*kStagesT=*/2, DefaultConfig::kCtasPerSm,
                               /*kL2PrefetchT=*/0, /*kTmaT=*/true, /*kL2AheadItersT=*/2>;
// TmaConfig without the L2 warm-up: gpu_bench sweep's comparison variant 5.
using TmaColdConfig = DecodeConfig<TmaConfig::kWarps, TmaConfig::kStages, TmaConfig::kCtasPerSm,
                                   TmaConfig::kL2Prefetch, TmaConfig::kTma,
                                   /*kL2AheadItersT=*/0>;

template <int kHeadDim, typename Cfg = DefaultConfig, bool kTrace = false>
cudaError_t LaunchMma(const PagedAttentionParams& p, const DecodeWorkspace& ws, cudaStream_t stream,
                      const KvRowMap* rows_map) {
  static const KvRowMap kNoRows{};
  return LaunchDecodeGrid(DecodeMmaKernel<kHeadDim, Cfg, kTrace>, Cfg::kThreads,
                          MmaDecodeShape<kHeadDim, Cfg>::kSmemBytes, kMaxGroupPerCta, p, ws, stream,
                          rows_map != nullptr ? *rows_map : kNoRows);
}

}  // namespace

int DecodeMmaSplitGranule(int head_dim) {
  static_assert(MmaDecodeShape<128, TmaConfig>::kSplitGranule ==
                MmaDecodeShape<128, DefaultConfig>::kSplitGranule);
  switch (head_dim) {
    case 64:
      return MmaDecodeShape<64, DefaultConfig>::kSplitGranule;
    case 128:
      return MmaDecodeShape<128, DefaultConfig>::kSplitGranule;
    default:
      return 0;
  }
}

cudaError_t LaunchDecodeMma(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                            cudaStream_t stream, const KvRowMap* rows_map) {
  if (p.cache.head_dim == 128 && HasRows(rows_map)) {
    return ws.trace != nullptr ? LaunchMma<128, TmaConfig, /*kTrace=*/true>(p, ws, stream, rows_map)
                               : LaunchMma<128, TmaConfig>(p, ws, stream, rows_map);
  }
  return KVD_DISPATCH_HEAD_DIM(p.cache.head_dim, kHeadDim,
                               LaunchMma<kHeadDim>(p, ws, stream, nullptr));
}

cudaError_t LaunchDecodeMmaShape(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                 int shape, const KvRowMap* rows_map, cudaStream_t stream,
                                 const char** name) {
  if (p.cache.head_dim != 128) return cudaErrorInvalidValue;
  switch (shape) {
    case 0:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM";
      return LaunchMma<128, DefaultConfig>(p, ws, stream, nullptr);
    case 1:
      *name = "tensor cores, 8 warps, 3 stages, 1 CTA/SM";
      return LaunchMma<128, DecodeConfig<8, 3, 1>>(p, ws, stream, nullptr);
    case 2:
      *name = "tensor cores, 4 warps, 3 stages, 2 CTAs/SM, L2::128B prefetch";
      return LaunchMma<128, DecodeConfig<4, 3, 2, 128>>(p, ws, stream, nullptr);
    case 3:
      *name = "tensor cores, 4 warps, 2 stages, 2 CTAs/SM, TMA boxes";
      if (!HasRows(rows_map)) return cudaErrorInvalidValue;
      return LaunchMma<128, TmaConfig>(p, ws, stream, rows_map);
    case 4:
      *name = "tensor cores, 4 warps, 2 stages, 2 CTAs/SM, TMA boxes, no L2 warm-up";
      if (!HasRows(rows_map)) return cudaErrorInvalidValue;
      return LaunchMma<128, TmaColdConfig>(p, ws, stream, rows_map);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvd::cuda
