#ifndef KVD_KERNELS_CUDA_DECODE_ATTENTION_H_
#define KVD_KERNELS_CUDA_DECODE_ATTENTION_H_

// Paged decode attention: the sequences of a PagedAttentionParams batch with exactly one
// query row (others are left to the prefill kernel).
//
// One CTA of four warps serves one (KV head, sequence, split) and every query head of its
// GQA group (up to 8; larger groups take several CTAs), so each K/V byte is read once per
// group. The warps stream different runs of 16 keys through a pipeline of three stages (two
// runs in flight per warp while a third is scored; two stages with TMA boxes), each keeping
// an online softmax for the whole group in registers; the warps are combined through shared
// memory at the end. The block table is read once per block, an iteration ahead. A run's K
// and V come as four TMA boxes (bf16, head_dim 128, given a KvRowMap that holds them) or as
// 16-byte cp.async copies by every lane (otherwise).
//
// Files: the split policy and the dispatch here (decode_attention.cu); the kernels
// in decode_attention_mma.cu (tensor cores, its K/V staging in decode_mma_stage.cuh) and
// decode_attention_simt.cu (CUDA cores), with their shared device and launch code (split
// plan, a warp's keys and copy pipeline, the grid launch, warp combine, merge) in
// decode_common.cuh.
//
// bf16 KV runs on tensor cores: the group's query heads are rows 0-7 of an m16n8k16 tile,
// S = Q K^T and O += P V are MMAs over the staged K/V tiles (ldmatrix from a swizzled
// layout), with Q and P each split into a bf16 high part and a bf16 residual so the result
// keeps ~16 significant bits (fp32-close, like the f32 path); the residuals ride in rows
// 8-15, so the split costs no extra MMA. f32 KV runs on CUDA cores: a key's dims are cut
// over 2 x group lanes (head_dim 128) and one transposing butterfly reduces the dot
// products of all group heads at once.
// On an H200 (gpu_bench decode, 64 x 4k) the tensor-core kernel reads 0.99 of copy bandwidth
// per call with TMA boxes, 1.01 from a one-launch graph; with cp.async it read 0.86 back to
// back in a graph (CUDA cores: 0.85; gpu_bench sweep, before the boxes lost their L2
// promotion), and deeper pipelines (more stages, one CTA per SM) and larger L2 prefetches
// measured slower. What bounds it is L2 throughput (ncu: 94% of peak, DRAM 91%): cp.async
// makes three L2 requests per 128-byte line, a TMA box one (kv_row_map.cc: with no L2
// promotion). Short batches are bound by fixed costs instead: at 8 x 4k the kernel with its
// math removed read 0.81 back to back. All K/V is read after the wait for the preceding
// kernel (launch.cuh): issuing the first copies of the keys that kernel cannot be writing
// (all but the newest) before the wait gained nothing in the engine (H200, kvd bench
// graphs on, two rounds alternating: 1 x 4k step 4.485/4.512 ms vs 4.479/4.483 without,
// 64 x 4k 13.02/13.07 vs 13.02/12.95) and 1-2% back to back (gpu_bench sweep, 8 x 4k
// auto: 0.888/0.891 of copy vs 0.873/0.880), too little to tie the kernel to what the
// kernel before it writes. Measured again on the TMA kernel (first boxes before the wait
// under a promise from the model that Rope's append was the only KV write in flight; five
// rounds alternating builds, kvd bench graphs on, median step): 1 x 512 4.330 ms
// against 4.346, 1 x 4k 4.488 against 4.494, 64 x 1k 7.142 against 7.153: not kept.
//
// A context is cut into up to `max_splits` ranges of whole granules of one iteration of
// every warp (64 keys for head_dim 128; 32 to 128 for other shapes), each at least
// `min_split_granules` granules, and more than 16 only where they average 512 keys or more
// (the merge reads 16 a round trip); DecodeMaxSplits sizes them so that the grid fills one wave
// of resident CTAs (at batch 1 a 4k context makes 16 splits per KV head of 256 keys, a 32k
// one 32 of 1024; 32 sequences x 8 KV heads, none). Where the batch leaves room in one merge batch
// (DecodeTailSplits: 8 x 4k, 16 x 16k, 4 x 128k) the grid has up to as many tail slices again, 16
// slices in all at most, which contexts of 8192 keys a main split or more use: the main splits end
// an eighth of a main split short, and a second wave of splits that long covers the rest, taken by
// the multiprocessors that finish first (H200, gpu_bench sweep, three rounds of 16 launches back to
// back in a graph, the same process alternating: 16 x 16k 1.021-1.027 of copy against 1.007-1.012,
// 4 x 128k 1.030-1.032 against 1.023-1.025; 8 x 4k, whose splits are too short to use them,
// 0.861-0.865 against 0.858-0.864; idle tails at batch 1, 1 x 4k: 0.376-0.394 against 0.412-0.415,
// so batches of 16 main splits or more, a merge batch already, get none).
// Each split writes its normalized partial output and log-sum-exp to the workspace and
// counts itself in `arrivals`; the last split of a (sequence, head group) to finish merges
// them all into `out` in the same kernel (no second launch). A sequence with one split
// writes `out` directly.
// Where a short split batch's time goes (H200, 8 x 4k in 4 splits, one launch from a graph,
// gpu_bench decode with KVD_DECODE_TRACE=8, medians of the launches; 37 us from the first
// CTA's start to the last CTA's end, against 31 us for its bytes at the rate the kernel
// reaches at 64 x 4k): the CTAs have read their metadata 0.7-1.0 us in and their first K/V
// lands 3.3-6.1 us in (the block table takes another round trip to memory before the first
// copy); the key loops, equal in work, end anywhere from 27 to 34 us (the same SMs early or
// late from launch to launch); after the last one, the combine takes 0.5 us, the partial's
// stores 0.6, the arrival's atomic 0.7 and the merge 1.1-1.4. By multiprocessor (the same
// trace, 40 launches, medians over them): the 8 SMs that hold one CTA of the 256 are done at
// 27.8 us, the 124 with two at 32.0, the slowest at 33.1, so beyond those 8 the loops end within
// about a microsecond; which SMs are late repeats from launch to launch (the odd and even
// launches' per-SM medians correlate, r = 0.90; at 32 x 4k, r = 0.99, with the SMs' medians
// spread from 103 to 124 us and the slowest in pairs of adjacent ids, 4-5, 12-13, 52-53, 60-61:
// a property of where an SM sits, not of the data). Tail splits (DecodeTailSplits) gain nothing
// at 8 x 4k: the gap they could fill is those 8 SMs' 4 us. Measured and
// not kept (gpu_bench decode, builds alternating in one run, 16 calls back to back in a graph):
// the splits of a context as one thread block cluster merging through each other's shared
// memory (the device holds only 62 four-CTA clusters at two CTAs per SM, so 8 x 4k could not
// be placed in one wave; allowed three per SM it was, unevenly: 0.733 of copy against 0.871,
// and 64 x 4k 0.943 against 1.045; the cluster's barrier waits for the slowest split as the
// counter does, and the merge over shared memory took 1.4 us); splits claiming 16-key
// iterations from a shared counter past a few fixed ones, so that faster CTAs take more (0.81
// against 0.86 at 8 x 4k, 0.89 against 1.01 at 16 x 16k, 0.87 against 1.02 at 4 x 128k, 0.34
// against 0.42 at 1 x 4k, with one claim in flight a warp; with two or four, no better: the
// long contexts lose in the steady stream too, perhaps because the CTAs of a sequence's KV
// heads no longer read the same blocks at about the same time, which was not pursued);
// prefetching the partial's lines, merge counter and output row during the last iteration,
// and the tensor map at the kernel's start (within the spread of the rounds). Nor would a
// merge whose round trips overlap gain enough to be worth making safe: a build that counted
// its arrival with a relaxed atomic (no release, so the partials it read could be stale) and
// issued the merge's partial and log-sum-exp loads beside that atomic, before knowing it was
// last, bounds what tagging the partials so that they need no release could reach (gpu_bench
// decode, three rounds alternating with the kept kernel in one run, 16 launches back to back
// in a graph: 8 x 4k 0.860-0.864 of copy against 0.858-0.861, 1 x 4k 0.436-0.440 against
// 0.428-0.431; from a one-launch graph within the rounds' spread, 1 x 4k 0.281-0.294 against
// 0.276-0.294). Nor did a round trip fewer before the first copy: each lane loading one entry
// of the chunk table at the CTA's start, beside the metadata, and a block's address taking its
// chunk's base from that lane instead of from the table after the block id. The first K/V
// landed no sooner (1 x 4k, KVD_DECODE_TRACE: 2.69/3.58/4.10 us against 2.72/3.62/4.19), and
// three rounds alternating in one run measured 8 x 4k back to back 0.885-0.887 of copy
// against 0.878-0.881, 1 x 4k from a one-launch graph 0.268-0.292 against 0.267-0.285,
// kvd bench steps within the spread: not kept, its one gain under 1% and not in the
// engine's steps, for a second way to address blocks.
//
// Workspace layout (only touched when max_splits > 1):
//   partial_out: [num_seqs][max_splits][num_q_heads][head_dim] fp32 (16-byte aligned)
//   partial_lse: [num_seqs][max_splits][num_q_heads] fp32, base-2 log-sum-exp
//
// Supported: head_dim 64 or 128, KV dtype f32 or bf16, block_size a power of two, K/V region
// offsets, block_bytes and chunk bases multiples of 16 bytes (the kernel copies 16-byte
// vectors), contexts below 2^30 keys (PlanSplits). The caller checks these.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kv_row_map.h"
#include "kernels/params.h"

namespace kvd::cuda {

// Where a CTA of a traced decode launch (DecodeWorkspace::trace) was when: the points of its
// timeline, in order.
enum DecodeTracePoint : int {
  kTraceEntry,          // the CTA starts
  kTracePlanned,        // its sequence's metadata read (an idle CTA records only these two)
  kTraceFirstKv,        // warp 0's first K/V landed
  kTraceKeysDone,       // warp 0 done with its keys
  kTraceCombined,       // every warp's results in shared memory
  kTracePartialStored,  // with splits: the CTA's partial stored
  kTraceArrived,        // with splits: its arrival counted
  kTraceEnd,            // done, the merge included where it merged
  kDecodeTracePoints
};

// One CTA's timeline: %globaltimer readings (nanoseconds, the GPU's clock) at each
// DecodeTracePoint it reached, 0 at the others; the multiprocessor it ran on; and whether it
// merged its context's splits.
struct DecodeTraceRecord {
  uint64_t ns[kDecodeTracePoints];
  uint32_t sm;
  uint32_t merged;
};

struct DecodeWorkspace {
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int32_t max_splits = 1;
  // Granules a split holds at least (unless the context is shorter). One: with the split
  // count at one wave (DecodeMaxSplits) longer minimums only cost short contexts
  // (gpu_bench sweep, H200, back to back in a graph: 1 x 512 7.6 us with 8 splits
  // of one granule, 11.0 us with 2 of four; 1 x 4k 0.305 vs 0.313 of copy bandwidth, before
  // the 16-split cap of short contexts made its plan the same with 1 or 2).
  int32_t min_split_granules = 1;
  // Of the max_splits slices, how many hold tail splits (0: none; DecodeTailSplits). A context
  // whose main splits would average tail_min_keys keys or more is cut into up to
  // max_splits - tail_splits main splits and, covering its end, up to tail_splits shorter ones,
  // each a main split's length over tail_divisor (whole granules; the mains the shortest that
  // leave the tails enough); other contexts leave the tail slices idle. The split slices are the
  // grid's slowest dimension, so every main split's CTA is dispatched before any tail's, and
  // the tails go to the multiprocessors whose main splits end first. In [0, max_splits);
  // tail_divisor >= 1, tail_min_keys >= 0 (the launch refuses others).
  int32_t tail_splits = 0;
  int32_t tail_divisor = 8;
  int32_t tail_min_keys = 8192;
  // [num_seqs][num_kv_heads * ceil(group / 8)] split counters (DecodeArrivalCount), zero
  // before a launch and left zero by it.
  int32_t* arrivals = nullptr;
  // Null (the default), or one record a CTA of the grid, [max_splits][num_seqs][num_kv_heads *
  // ceil(group / 8)] in blockIdx order (DecodeTraceCount), for the launch to fill: a diagnostic
  // (gpu_bench decode with KVD_DECODE_TRACE set). Traced launches run an instantiation of
  // their own of the tensor-core kernel with TMA boxes (bf16 KV, head_dim 128, a KvRowMap
  // given), with a barrier or two more a CTA; the untraced kernel has none of it. Any other
  // kernel refuses a trace (cudaErrorInvalidValue).
  DecodeTraceRecord* trace = nullptr;
};

// Splits per sequence worth launching so that the decode grid fills about one wave of
// resident CTAs on `num_sms` multiprocessors (rounded down; one CTA short of a full wave
// where more than 16 splits are wanted); 1 when the batch alone fills the device. In
// [1, 128].
int DecodeMaxSplits(int num_seqs, int num_kv_heads, int group_size, int num_sms);

// Tail split slices (DecodeWorkspace::tail_splits) to add to `main_splits` main ones
// (DecodeMaxSplits): as many again, up to 16 slices in all (one merge round trip); none beside
// a single main one.
int DecodeTailSplits(int main_splits);

// The split slices to launch a batch like `p` with (DecodeWorkspace::max_splits and
// tail_splits) on `num_sms` multiprocessors: DecodeMaxSplits' main slices and
// DecodeTailSplits' tails; or, where p.max_kv_len promises the longest context, of those only
// the ones contexts that long use (SlicesForContexts, at the granule of the kernel
// LaunchDecodeAttention runs): the longest context's wanted main splits and no tail slice,
// unless its cut could end in tails. Every context of the batch is cut as in the full grid (a
// batch that broke the promise would have its longer contexts cut into at most as many
// splits), but slices no context uses are not launched: such a slice still costs a CTA for
// each (sequence, head subgroup). On an H200 (three rounds
// alternating with a build that launched every slice, in one run): gpu_bench decode at 8 x 4k
// (4 slices of 8) read 0.723-0.730 of copy per call against 0.706-0.710 (from graphs, within
// the rounds' spread); at 1 x 4k (16 of 32) 0.432 back to back in a graph against 0.427-0.429
// (per call and from a one-launch graph within the spread); kvd bench's 8 x 1k step with
// graphs took 4.571-4.601 ms against 4.614-4.642, its batch-1 steps the same.
struct DecodeSlices {
  int max_splits;
  int tail_splits;
};
DecodeSlices DecodeLaunchSlices(const PagedAttentionParams& p, int num_sms);

// Elements of DecodeWorkspace::arrivals a call with these sizes needs.
int64_t DecodeArrivalCount(int num_seqs, int num_kv_heads, int group_size);

// Records of DecodeWorkspace::trace a call with these sizes needs.
int64_t DecodeTraceCount(int num_seqs, int num_kv_heads, int group_size, int max_splits);

// Elements of partial_out and partial_lse a call with these sizes needs.
int64_t DecodePartialOutSize(int num_seqs, int max_splits, int num_q_heads, int head_dim);
int64_t DecodePartialLseSize(int num_seqs, int max_splits, int num_q_heads);

// Enqueues the decode kernel (one launch, merge included). `rows_map` (may be null): a TMA
// view of the memory holding the KV chunks (kv_row_map.h), through which the bf16,
// head_dim 128 kernel loads the K/V rows it covers.
// REQUIRES: 1 <= ws.max_splits <= 128; when max_splits > 1, every workspace pointer set,
// partial_out 16-byte aligned and arrivals zero (as every launch leaves them).
cudaError_t LaunchDecodeAttention(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                  cudaStream_t stream, const KvRowMap* rows_map = nullptr);

// Benchmark only (gpu_bench sweep): the bf16, head_dim 128, GQA-group-4 kernel
// under alternative launch shapes (warps per CTA, pipeline stages, resident CTAs), variant
// in [0, kDecodeVariants); 0 is what LaunchDecodeAttention runs given `rows_map` (TMA boxes
// with a non-empty one, else the same kernel as variant 2), 5 the same without its L2 warm-up
// (decode_attention_mma.cu). Sets *name.
// cudaErrorInvalidValue for other shapes or variants.
inline constexpr int kDecodeVariants = 6;
cudaError_t LaunchDecodeAttentionVariant(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                         int variant, const KvRowMap* rows_map, cudaStream_t stream,
                                         const char** name);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_DECODE_ATTENTION_H_
