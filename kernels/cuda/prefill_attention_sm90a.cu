// The Hopper prefill kernel of prefill_attention_mma.h (kBf16 mode, head_dim 128): the wide
// kernel's work items (128 packed query rows of one sequence and KV head, from the work
// counter, costliest first) computed with warpgroup MMAs. Built for sm_90a only (see
// kernels/cuda/CMakeLists.txt); on any other device the wide kernel runs instead.
//
// A CTA is three warpgroups, FlashAttention-3 style:
//
//   producer (warpgroup 2): gathers each 128-key K tile and V tile from the paged arena with
//     cp.async into rings of kStages buffers, in wgmma's 128-byte swizzled layout, K running a
//     tile ahead of V (K kt+1 is issued before V kt); `full[x][stage]` (an mbarrier, x = K or
//     V) completes when a tile has landed, `empty[x][stage]` when both consumers are done with
//     it. K buffers turn over once S's softmax has its row sums (see below), before V's, so K
//     gets further ahead of the math than whole K+V tiles could.
//   consumers (warpgroups 0 and 1, 64 packed rows each): their Q rows in bf16 in shared
//     memory (see Q below), then per key tile kt
//       S_kt = Q K_kt^T        8 wgmma m64n128k16, A and B from shared memory
//       O += P_kt-1 V_kt-1     8 wgmma m64n128k16, P from registers, V MN-major
//       mask, online softmax   fp32 in the accumulator registers (a quad of lanes per row);
//                              O's rescale once the P V MMAs are done
//     The two consumers take turns to issue their MMAs (two named barriers), so one's
//     softmax runs while the other's MMAs keep the tensor cores busy, and its own P V too:
//     ptxas 13.0 would move the wait for P V up to before the exponentials, so K's release,
//     an mbarrier arrival it keeps the wait below, comes after the row sums and depends on
//     them. (With that and 32-bit descriptors, see wgmma.cuh, the kernel measured 9% faster at
//     1 x 16k, 5% at 1 x 4k and 3% at 8 x 2k, alternating with the old build in one run; each
//     change alone measured within the run-to-run noise.)
//
// Numerics as the wide kernel's: Q and P rounded to bf16, fp32 accumulation (results agree
// within that rounding, not bit for bit: ex2.approx, other tile sizes). From a bf16 copy of
// Q the rounding comes before the scale, not after: the same precision.
//
// Q. Where the caller gives Q in bf16 too (PagedAttentionParams::q_bf16, which the model's RoPE
// writes for prefills), the producer copies each item's rows like K, into the Q buffer as each
// consumer is done with the last item's (after its last S: an mbarrier pair a consumer), and
// the softmax scales the raw logits (an FFMA where it subtracted the base). Else each consumer
// converts its own fp32 rows at the start of the item (StageScaledQ: every load issued before
// the first shared store, no branch between them), scaled to base-2 logits.
//
// Between items. The producer takes and decodes the next work item as soon as it has issued
// this one's loads, a few tiles before the consumers finish, and issues its first two turns'
// tiles (K 0, K 1, V 0; their ring buffers are all released within the current item) and
// its Q (bf16: copied; fp32: an L2 prefetch): the atomic's round trip, the decoding's
// dependent loads (~0.9k cycles) and the first tiles' latency are then off the consumers'
// path (decoded once, not by each thread: 8 x 2k +4% over decoding in every thread,
// alternating builds in one run).
//
// Measured per item with a %clock64 trace (a diagnostic build, H200), the fp32 Q staging took:
// 11-12k cycles with each round's store next to its load (5% of causal 1 x 16k's time, 19% of
// 1 x 4k's and 30% of 8 x 2k's); 6k with the loads batched but a branch per round (the
// compiler converted inside each branch), which measured 1 x 4k +9% and 8 x 2k +15% against
// the first, alternating builds in one run; 5.4k at 1 x 16k and 6.0k at 8 x 2k branchless,
// through L2 only and with the next item taken early (8 x 2k +2% more). Without any Q loads
// it is 2.2k: the rest is the loads' latency while the K/V stream keeps L2 busy. Staging the
// next item's Q at the end of the item before, its loads among the output's stores (registers
// allow no more), only moved that latency there. The bf16 copy removes the phase: cycles per
// call (the slowest CTA's %clock64 span, median of 23 calls, clock-independent) against fp32
// Q in the same build: 1 x 16k 6.07M vs 6.26M (-3%), 1 x 4k 0.436M vs 0.470M (-7%), 8 x 2k
// 0.985M vs 1.107M (-11%), 1 x 512 / 4096 0.105M vs 0.112M (-6%).
//
// When comparing runs: the same trace against %globaltimer put the SM clock during this kernel
// at 1.64-1.79 GHz while nvidia-smi read 1980 MHz. Over those runs a 1 x 16k call took 6.1-6.3M
// cycles per CTA and 3.42-3.79 ms: its time followed the clock. (A probe kernel right after a
// row cannot see this: after 1 x 4k rows whose kernels ran at 1.72 GHz it read 1.97.)
//
// Where the time goes (H200, `gpu_bench prefill`, causal 1 x 16k, random data), measured
// before the P V wait and descriptor change above (the kernel now measures 535-603 TFLOP/s
// from run to run, before it 510-575; SDPA 591-655). Variants built only to measure: the producer's
// copies turned into zero fills (no reads, same instructions) 566; half the tiles' reads
// skipped 569; no copies at all 590; no exp2 +1%; no P V MMAs 671 (at the full flop
// count). So the K/V gather costs ~8% (at 128 rows per tile read the kernel streams ~4 TB/s
// from L2) and the producer's instructions ~4%. Clusters of two CTAs that gather half of
// each tile and copy it into the other's shared memory measured +3% at 1 x 16k and 2-4%
// slower at 1 x 4k and 8 x 2k: each refill then waits on the other CTA's consumers too.
// K/V as TMA boxes through the backend's view (kv_row_map.h: 16 rows of 64 dims a box, the
// most a 16-token block allows; 16 boxes a tile issued by the producer's first warp, the runs
// that key_end or the view cut by cp.async) measured slower than this gather in the same
// build (H200, gpu_bench prefill, two runs: 1 x 16k 489 TFLOP/s against 527-530, 8 x 2k
// 396-402 against 438-451, 1 x 512 / 4096 0.094-0.100 ms against 0.075-0.077). (Its first
// form, one lane expecting every box's bytes behind a __syncwarp in that warp's branch, made
// ptxas turn each shuffle of the copy rounds into a collective sequence: twice the code, and
// the gather itself 20% slower.)
//
// Against cuDNN's kernel (what PyTorch's SDPA ran at 1 x 16k causal, GQA 32/8, on an H100
// SXM): ncu (`--clock-control none`, one launch each) timed it at 3.35 ms at 1.69 GHz, 5.66M
// cycles, tensor-bound at 72% of the SM's throughput and 1.70 instructions a cycle; this
// kernel at 3.50-3.53 ms at 1.72-1.73 GHz, 6.06M cycles, 68% and 1.76: about 0.93 of its
// rate at the same clock, issuing ~10% more instructions for the same work (the paged gather
// among them). The event-timed rows swing more than that with the clock (1 x 16k 3.57-4.02
// ms over six rows of two runs, SDPA 3.36-3.60). Tried on that H100 and dropped, each
// alternating with this kernel over three rounds of `gpu_bench prefill`:
//   - Q kept in registers (ldmatrix once per item, S as register-A wgmma, the Q buffer freed
//     at once; producer 56 / consumers 224 registers): slower at every shape in every round
//     (1 x 16k 6-12%, 1 x 4k and 1 x 512 / 4096 6-36%); ncu: fewer warps eligible (0.51
//     against 0.69 a scheduler). Shared memory was not the limit it was thought to be: this
//     kernel's L1/shared throughput reads 56% of peak.
//   - Items published by an mbarrier pair instead of the all-thread barrier, so a
//     warpgroup need not drain at an item's end: 1 x 16k within the noise (3.87-4.23 ms),
//     1 x 4k and 1 x 512 / 4096 4-25% slower.
//   - Items ordered KV head by KV head instead of by tile across heads: ncu read DRAM
//     traffic down from 400 to 133 GB/s (L2 hits 87% -> 99%) with the cycles unchanged,
//     1 x 16k within the noise and the small shapes 2-3% slower (head 7's costliest tiles
//     then start last, so the last wave is less balanced).
//
// Where the extra instructions are (another H100, ncu `--set full` with source counters, one
// launch each at 1 x 16k: 6.12M cycles against cuDNN's 5.75M, 0.94 of its rate at equal
// clocks): not in the consumers, whose turn runs 520 instructions a warp against the 567 of
// cuDNN's loop (which computes S, waits for it, then the softmax, then P V and waits again:
// no turns, no overlap within a warpgroup, P kept in S's registers). Of
// this kernel's 1.55G instructions by the source counters (cuDNN 1.24G) about 0.28G are the
// producer's gather (the copies, two shuffles each, their addresses), where cuDNN's
// tensor-copy producer issues ~0.02G; and 0.14G are consumers spinning on V's full barrier
// (ncu's summary counts 1.41G in all, 0.14G fewer: about the spins): 95% of turns find
// tile kt's K landed but tile kt-1's V, issued right after it, not yet (23 retries of the
// try_wait on average), so the data stream still arrives just in time. Holding the turn
// while it lands costs a lot: waiting for V only after issuing S, within the turn, measured
// 24-36% slower at 1 x 16k (H200, three rounds alternating with this kernel in one run:
// 4.86-4.96 ms against 3.66-3.91), 26-49% at 1 x 4k and 8 x 2k; with the other consumer's
// turn passed on right after S, 18-24% slower at 1 x 16k.
// Nor did three small changes help (one round on an H100, each alternating with this kernel
// in one run): every mbarrier wait given a suspend-time hint (as CUTLASS's barrier waits), so
// that the V spins sleep, took 4.04 ms at 1 x 16k against 3.79; V's ring released before the
// rescale and pack instead of after it, 3.97; both, 3.90 (and 0.269 ms at 1 x 4k against
// 0.298, 0.589 at 8 x 2k against 0.565). One round is thin evidence (rounds above spread by
// as much), but none of them gained at 1 x 16k, the shape the target is set at.
// Nor did halving the gather's shuffles (blocks of 16 keys or more: rounds 2 i and 2 i + 1
// copy keys eight rows apart in one block, so one shuffled row pointer serves both): H100,
// four rounds alternating with this kernel in one run, 1 x 16k 4.036 / 3.581 / 3.581 / 4.084
// ms against 4.031 / 3.571 / 3.975 / 4.132, 1 x 4k and 8 x 2k as mixed. The spread is by
// process, not by build: six runs of one build read 3.55-3.61 or 3.98-4.18 ms at 1 x 16k
// (SDPA 3.67-3.74 in the rounds above), while nvidia-smi, sampled every 50 ms, read the SM
// clock at 1545-1980 MHz during those rows and flagged the software power cap. That spread is
// far wider than any gain left to find here. Paired call by call with SDPA instead, each pair
// at one clock (tests/gpu/paired_prefill.py, 31 or 61 pairs a shape, three processes on one
// H100), this kernel read 0.954-0.957x SDPA's rate at 1 x 16k (quartiles 0.951-0.963),
// 1.016-1.020x at 1 x 4k and 0.893-0.898x at 8 x 2k; separate processes in the same run read
// 0.93x and 0.85x at 1 x 16k.

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/hopper_sync.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/prefill_attention_mma.h"
#include "kernels/cuda/prefill_common.cuh"
#include "kernels/cuda/tensor_core.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace kvd::cuda {
namespace {

using prefill::Item;
using prefill::ItemOf;

constexpr int kHeadDim = kHopperPrefillHeadDim;
constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1
constexpr int kProducerThreads = 128;  // warpgroup 2
constexpr int kThreads = kConsumerThreads + kProducerThreads;
// Registers a thread: launch_bounds gives every thread 168 (65536 / 384, rounded down to a
// multiple of 8), and setmaxnreg only moves registers within the CTA's 168 * 384: the
// producer gives part of its share to the consumers, whose S, P and O tiles alone take 160.
// (Asking for more than the CTA holds would block the consumers' setmaxnreg forever.)
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
constexpr int kProducerRegisters = 88;
constexpr int kConsumerRegisters = 208;
static_assert(kProducerRegisters * kProducerThreads + kConsumerRegisters * kConsumerThreads <=
              kLaunchRegisters * kThreads);
constexpr int kRows = 128;      // packed query rows per item
constexpr int kGroupRows = 64;  // per consumer warpgroup
constexpr int kKeys = 128;      // keys per K/V tile
constexpr int kStages = 3;
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
constexpr int kRowBytes = 128;         // one swizzled row: 64 dims
constexpr int kQBytes = kRows * kHeadDim * 2;
constexpr int kTileBytes = kKeys * kHeadDim * 2;
constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + 1024;  // + alignment slack
// Named barriers: kTurnBarrier + w lets consumer w issue its MMAs; kQBarrier + w publishes
// consumer w's Q rows to its own warpgroup.
constexpr int kTurnBarrier = 1;
constexpr int kQBarrier = 3;
constexpr int kItemBarrier = 5;      // all threads: the next work item
constexpr int kProducerBarrier = 6;  // the producer warpgroup: the next work item
static_assert(kRows == MmaPrefillTileRows(MmaPrecision::kBf16));

// A work item as taken from the counter: `item` is set when index < the item count.
struct TakenItem {
  int index;
  Item item;
};

// kBf16Q: Q rows from p.q_bf16 (unscaled bf16), copied by the producer like K; else from p.q
// (fp32), scaled and rounded by the consumers.
template <bool kBf16Q>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillHopperKernel(PagedAttentionParams p, int32_t* tile_indptr, int block_shift) {
#if KVD_HAVE_WGMMA
  extern __shared__ unsigned char smem_raw[];
  __shared__ TakenItem s_taken[2];  // by item parity
  __shared__ uint64_t full[2][kStages];  // [K or V][stage]
  __shared__ uint64_t empty[2][kStages];
  // kBf16Q: consumer w's Q rows have landed (q_full[w]) / are no longer read (q_empty[w]); one
  // phase an item.
  __shared__ uint64_t q_full[2];
  __shared__ uint64_t q_empty[2];
  // Swizzled regions must be 1024-byte aligned in the shared address space.
  const uint32_t raw_address = SharedAddress(smem_raw);
  const uint32_t pad = PadTo1024(raw_address);
  unsigned char* smem = smem_raw + pad;
  const uint32_t q_address = raw_address + pad;
  // [Q][K stage 0][V stage 0][K stage 1][V stage 1]...
  const uint32_t tiles_offset = kQBytes;

  const KvCacheView& c = p.cache;
  const int group = p.num_q_heads / c.num_kv_heads;
  const int warpgroup = threadIdx.x / 128;
  const bool producer = warpgroup == 2;

  if (threadIdx.x == 0) {
    for (int x = 0; x < 2; ++x) {
      for (int stage = 0; stage < kStages; ++stage) {
        MbarrierInit(&full[x][stage], kProducerThreads);
        MbarrierInit(&empty[x][stage], kConsumerThreads / 32);  // one arrival a warp
      }
      MbarrierInit(&q_full[x], kProducerThreads);
      MbarrierInit(&q_empty[x], 128 / 32);  // one arrival a warp of its warpgroup
    }
  }
  cudaGridDependencySynchronize();  // tile_indptr is written by the planning kernel
  const int total_items = tile_indptr[p.blocks.num_seqs];
  __syncthreads();  // the mbarriers are initialized
  if (total_items == 0) return;
  int32_t* work_counter = tile_indptr;  // [0]: offset 0 by definition, never read as one

  uint32_t tile_count = 0;  // key tiles so far, over all items: ring stage and phase
  // Work items come from the counter. The producer's first thread takes and decodes each one
  // once it has issued the loads of the one before (the consumers are then a few tiles from
  // its end), so that the next item's first tiles and its Q rows can be fetched early and
  // nobody waits for the counter or decodes on the consumers' path; the item barrier (all three
  // warpgroups, in both roles' loops) publishes it. Slots alternate by item: item k + 2 goes
  // into item k's slot only after the taker has passed the barrier that publishes item k + 1,
  // where every thread arrives after reading item k.
  const bool taker = threadIdx.x == kConsumerThreads;
  auto take = [&](TakenItem& slot) {
    slot.index = atomicAdd(work_counter, 1);
    if (slot.index < total_items) {
      slot.item = ItemOf<kRows, kKeys>(p, tile_indptr, slot.index, group);
    }
  };
  if (taker) take(s_taken[0]);
  int num_items_taken = 0;  // published by the item barrier so far, the same in every thread
  // The next work item into `item`; false once the counter has run out.
  auto next_item = [&](Item& item) {
    NamedBarrierSync(kItemBarrier, kThreads);
    const TakenItem& taken = s_taken[num_items_taken++ & 1];
    if (taken.index >= total_items) return false;
    item = taken.item;
    return true;
  };

  // The two roles run separate loops (register budgets differ: setmaxnreg applies to the code
  // it dominates).
  if (producer) {
    DecreaseMaxRegisters<kProducerRegisters>();
    // Thread (warp w, lane l) copies chunk l % 16 of keys 8 r + 2 w + l / 16 of a tile, in
    // rounds r = 0..15. Each lane first finds the row of one of its warp's 32 keys (key
    // 8 (l / 2) + 2 w + l % 2): a block-id load and a chunk-base load, issued before the wait
    // for the K buffer (which hides them) and kept for V a tile later; the rounds take the
    // rows by shuffle. (The copies' asm orders memory: a lookup between two copies would
    // stall each round for two round trips.)
    const int lane = threadIdx.x % 32;
    const int load_chunk = lane % kChunks;
    const int half = lane / kChunks;
    const int warp_key0 = 2 * ((threadIdx.x - kConsumerThreads) / 32);
    const int lane_key = 8 * (lane / 2) + warp_key0 + lane % 2;
    const int64_t v_minus_k = c.v_offset_bytes - c.k_offset_bytes;
    // Lane's K row of tile kt (a real row; keys past key_end read key 0's and copy nothing).
    auto lane_row = [&](const Item& item, int kt) {
      const int key = kt * kKeys + lane_key;
      const int safe_key = key < item.key_end ? key : 0;
      return reinterpret_cast<const char*>(TokenRow<__nv_bfloat16>(
          c, item.seq_blocks, block_shift, safe_key, c.k_offset_bytes, item.kv_head));
    };
    // Tile kt's K (x = 0) or V (x = 1) into its ring, counted on full[x] once landed; `rows`
    // from lane_row.
    auto load = [&](const Item& item, int kt, int x, const char* rows) {
      const uint32_t count = tile_count + kt;
      const int stage = count % kStages;
      if (count >= kStages) MbarrierWait(&empty[x][stage], ((count / kStages) & 1) ^ 1);
      const int64_t offset = (x == 0 ? 0 : v_minus_k) + load_chunk * 16;
      // Round r's destination is round 0's plus r eight-row groups, the swizzle unchanged
      // (key % 8 is the same every round): a register plus a constant.
      const uint32_t dst = q_address + tiles_offset + (2 * stage + x) * kTileBytes +
                           Swizzle128Offset(warp_key0 + half, load_chunk, kKeys);
      constexpr int kRounds = kKeys * kChunks / kProducerThreads;
      if ((kt + 1) * kKeys <= item.key_end) {
        // A whole tile (the common case): each copy is two shuffles, a 64-bit add and the
        // copy itself.
#pragma unroll
        for (int round = 0; round < kRounds; ++round) {
          CpAsync16(dst + round * 8 * kRowBytes, ShflPtr(rows, 2 * round + half) + offset);
        }
      } else {
        const int key0 = kt * kKeys + warp_key0 + half;  // this thread's key of round 0
#pragma unroll
        for (int round = 0; round < kRounds; ++round) {
          CpAsync16(dst + round * 8 * kRowBytes, ShflPtr(rows, 2 * round + half) + offset,
                    key0 + 8 * round < item.key_end);  // past it: zeros, nothing read
        }
      }
      // full[x][stage] counts this thread once its copies have landed; no waiting here.
      CpAsyncArriveOnMbarrier(&full[x][stage]);
    };
    // kBf16Q: the item's Q rows into the Q buffer, as K's (row = packed row within the tile;
    // rows past the end zeros), consumer w's 64 rows counted on q_full[w]. Item n's rows go in
    // once item n - 1's are no longer read (q_empty's phase n - 1).
    auto load_q = [&](const Item& item, int n) {
      const int lane_packed = min(item.tile_row0 + lane_key, item.packed_rows - 1);
      const __nv_bfloat16* q_row = static_cast<const __nv_bfloat16*>(p.q_bf16) +
                                   PackedRowOffset<kHeadDim>(item.q_begin, lane_packed, group,
                                                             item.kv_head, p.q_bf16_stride);
      const char* q_rows = reinterpret_cast<const char*>(q_row);
      const uint32_t dst = q_address + Swizzle128Offset(warp_key0 + half, load_chunk, kRows);
      constexpr int kGroupRounds = kGroupRows * kChunks / kProducerThreads;
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        if (n > 0) MbarrierWait(&q_empty[w], (n - 1) & 1);
#pragma unroll
        for (int r = 0; r < kGroupRounds; ++r) {
          const int round = w * kGroupRounds + r;
          CpAsync16(dst + round * 8 * kRowBytes,
                    ShflPtr(q_rows, 2 * round + half) + load_chunk * 16,
                    item.tile_row0 + 8 * round + warp_key0 + half < item.packed_rows);
        }
        CpAsyncArriveOnMbarrier(&q_full[w]);
      }
    };
    // fp32 Q: the item's Q rows into L2, a row a thread (its four 128-byte lines, and the fifth
    // a row not 128-byte aligned reaches into), for the consumers' StageScaledQ.
    auto prefetch_q = [&](const Item& item) {
      const int packed = item.tile_row0 + (threadIdx.x - kConsumerThreads);
      if (packed >= item.packed_rows) return;
      const float* row =
          p.q + PackedRowOffset<kHeadDim>(item.q_begin, packed, group, item.kv_head, p.q_stride);
#pragma unroll
      for (int line = 0; line < kHeadDim * 4 / 128; ++line) PrefetchL2(row + line * 32);
      PrefetchL2(row + kHeadDim - 1);
    };
    // The item's first two turns' tiles in the order the consumers need them: K 0, K 1 (when
    // there is one), V 0. `rows` becomes tile 1's lane rows (V 1 goes out with K 2).
    const char* rows = nullptr;
    auto load_first = [&](const Item& item) {
      const char* rows0 = lane_row(item, 0);
      load(item, 0, 0, rows0);
      const bool second = item.num_key_tiles > 1;
      rows = second ? lane_row(item, 1) : nullptr;
      if (second) load(item, 1, 0, rows);
      load(item, 0, 1, rows0);
    };
    // Item n's first tiles and its Q rows (kBf16Q: into the Q buffer as each consumer is done
    // with item n - 1's; else into L2, a row a thread), issued as soon as the taker has it: for
    // item 0 at the start, for later ones at the end of the item before, where every ring
    // buffer they wait for is released within that item, so the consumers never wait on it.
    for (int n = 0;; ++n) {
      NamedBarrierSync(kProducerBarrier, kProducerThreads);  // the taker has item n
      if (s_taken[n & 1].index < total_items) {
        const Item next = s_taken[n & 1].item;
        // Q first where nothing is waited for (item 0), else once the ring buffers are issued.
        if constexpr (kBf16Q) {
          if (n == 0) load_q(next, n);
        }
        if (next.num_key_tiles > 0) load_first(next);
        if constexpr (kBf16Q) {
          if (n > 0) load_q(next, n);
        } else {
          prefetch_q(next);
        }
      }
      Item item;
      if (!next_item(item)) break;
      // The rest: K kt+1 before V kt.
      for (int kt = 1; kt < item.num_key_tiles; ++kt) {
        const bool more = kt + 1 < item.num_key_tiles;
        const char* next_rows = more ? lane_row(item, kt + 1) : nullptr;
        if (more) load(item, kt + 1, 0, next_rows);
        load(item, kt, 1, rows);
        rows = next_rows;
      }
      tile_count += item.num_key_tiles;
      if (taker) take(s_taken[(n + 1) & 1]);
    }
    // No copy outlives its thread (the consumers' waits cover them already).
    CpAsyncCommit();
    CpAsyncWait<0>();
    return;
  }

  IncreaseMaxRegisters<kConsumerRegisters>();
  const bool q_aligned = RowsAligned<float4>(p.q, p.q_stride);  // Q chunks as 16-byte loads
  const bool out_pairs = RowsAligned<float2>(p.out, p.out_stride);  // output pairs as 8-byte stores
  // Consumer 0 issues first: its turn barrier starts with consumer 1's arrival.
  if (warpgroup == 1) NamedBarrierArrive(kTurnBarrier + 0, kConsumerThreads);
  for (Item item; next_item(item);) {
    // Consumer warpgroup `warpgroup`.
    const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int group_row0 = item.tile_row0 + warpgroup * kGroupRows;
    const int first_pos = item.kv_len - item.q_len;  // position of token 0
    // Keys at or past group_key_end are visible to no row of this warpgroup (not computed),
    // keys below group_unmasked_end to all of them. Rows past the end repeat the last row's
    // limits; a warpgroup with no rows computes nothing (but keeps its turns).
    const bool group_live = group_row0 < item.packed_rows;
    const int group_key_end =
        p.causal ? first_pos + min(item.packed_rows - 1, group_row0 + kGroupRows - 1) / group + 1
                 : item.kv_len;
    const int group_unmasked_end =
        p.causal ? first_pos + min(item.packed_rows - 1, group_row0) / group + 1 : item.kv_len;
    const int thread_row0 = group_row0 + warp * 16 + g;  // and thread_row0 + 8
    int row_key_end[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = min(item.packed_rows - 1, thread_row0 + 8 * half);
      row_key_end[half] = p.causal ? first_pos + r / group + 1 : item.kv_len;
    }
    // Key tiles this warpgroup computes; it takes num_key_tiles + 1 turns regardless.
    const int num_compute = group_live ? min(item.num_key_tiles, CeilDiv(group_key_end, kKeys)) : 0;

    // This warpgroup's Q rows (rows past the end are zeros, never written out). kBf16Q: as the
    // producer copied them, unscaled (the softmax scales the logits); else -> bf16, scaled.
    const int item_number = num_items_taken - 1;
    // The Q buffer goes back to the producer (for the next item) once this warpgroup's last S
    // has been computed.
    auto release_q = [&] {
      if constexpr (kBf16Q) {
        __syncwarp();
        MbarrierArriveIf(&q_empty[warpgroup], lane == 0);
      }
    };
    if constexpr (kBf16Q) {
      // (The FenceProxyAsyncShared after K 0's wait, before the first S, covers these copies
      // too.)
      MbarrierWait(&q_full[warpgroup], item_number & 1);
      if (num_compute == 0) release_q();
    } else {
      StageScaledQ<kGroupRows * kChunks / 128>(
          q_aligned, p.sm_scale * kLog2e,
          [&](int round, bool& live) {
            const int index = round * 128 + threadIdx.x % 128;
            return PackedQChunk<kHeadDim>(p, item.q_begin,
                                          item.tile_row0 + warpgroup * kGroupRows + index / kChunks,
                                          item.packed_rows, group, item.kv_head, index % kChunks,
                                          live);
          },
          [&](int round, uint4 bits) {
            const int index = round * 128 + threadIdx.x % 128;
            const int r = warpgroup * kGroupRows + index / kChunks;
            *reinterpret_cast<uint4*>(smem + Swizzle128Offset(r, index % kChunks, kRows)) = bits;
          });
      FenceProxyAsyncShared();
      NamedBarrierSync(kQBarrier + warpgroup, 128);
    }
    // Logits are S times this (base 2).
    const float logit_scale = kBf16Q ? p.sm_scale * kLog2e : 1.0f;

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float sc[kKeys / 2];              // S, then P, of the current tile
    uint32_t pa[kKeys / 16][4];       // P of the previous tile, as A fragments
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};  // this thread's columns only

    constexpr uint32_t kHalfQ = kRows * kRowBytes;
    constexpr uint32_t kHalfTile = kKeys * kRowBytes;
    // Descriptors (low words) of this warpgroup's Q rows and of stage 0's K and V tiles; every
    // k-step's descriptor is one of these advanced (AdvanceDescriptor). The shuffle shows the
    // compiler that the warpgroup is the same across the warp (ptxas 13.0 still copies each
    // descriptor into uniform registers before its MMA).
    const int uniform_warpgroup = __shfl_sync(0xffffffffu, warpgroup, 0);
    const uint32_t q_desc =
        SwizzledDescriptor(q_address + uniform_warpgroup * kGroupRows * kRowBytes, 16);
    const uint32_t k_desc0 = SwizzledDescriptor(q_address + tiles_offset, 16);
    const uint32_t v_desc0 = SwizzledDescriptor(q_address + tiles_offset + kTileBytes, kHalfTile);
    auto stage_of = [&](int kt) { return (tile_count + kt) % kStages; };
    // Tile kt's K (x = 0) or V (x = 1) has landed. A FenceProxyAsyncShared after the waits
    // makes the producer's copies (generic proxy) visible to this warpgroup's wgmma reads
    // (async proxy).
    auto wait_full = [&](int kt, int x) {
      MbarrierWait(&full[x][stage_of(kt)], ((tile_count + kt) / kStages) & 1);
    };
    // One arrival a warp (each is an atomic on one shared word: 32 lanes would queue), by
    // lane 0. An arrival that must come after a value is computed passes it as `after`: the
    // arrival's predicate reads it (`!(after < -1)` holds for any sum of exponentials, NaN
    // included, but the compiler cannot know that while FastExp2 is inline asm; were it to
    // fold the test, only the overlap described at the top would be lost).
    auto release = [&](int kt, int x, float after = 0.0f) {
      __syncwarp();
      MbarrierArriveIf(&empty[x][stage_of(kt)], lane == 0 && !(after < -1.0f));
    };
    // A tile this warpgroup does not compute: waited for (so its ring phases stay in step)
    // and handed back.
    auto pass = [&](int kt) {
      wait_full(kt, 0);
      release(kt, 0);
      wait_full(kt, 1);
      release(kt, 1);
    };
    // S = Q K^T over eight 16-dim steps: 64-dim half kk / 4, 32 bytes per step within it.
    auto issue_s = [&](int kt) {
      const uint32_t k_desc = AdvanceDescriptor(k_desc0, 2 * stage_of(kt) * kTileBytes);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t step = (kk & 3) * 32;
        WgmmaM64N128K16SS(sc, AdvanceDescriptor(q_desc, (kk >> 2) * kHalfQ + step),
                          AdvanceDescriptor(k_desc, (kk >> 2) * kHalfTile + step), kk > 0);
      }
    };
    // O += P V over 16-key steps; V's two 64-dim halves are LBO apart.
    auto issue_pv = [&](int kt) {
      const uint32_t v_desc = AdvanceDescriptor(v_desc0, 2 * stage_of(kt) * kTileBytes);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        WgmmaM64N128K16RS(o, pa[kk], AdvanceDescriptor(v_desc, kk * 16 * kRowBytes), true);
      }
    };
    // Softmax of tile kt's S (complete): mask, running max, exponentials, row sums. Returns
    // through `rescale` the factor for O, applied once the previous P V is done.
    auto softmax = [&](int kt, float (&rescale)[2]) {
      const int key0 = kt * kKeys;
      if (key0 + kKeys > group_unmasked_end) {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + 8 * n + 2 * t + (e & 1);
            if (key >= row_key_end[e >> 1]) sc[4 * n + e] = -INFINITY;
          }
        }
      }
      float base[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // Four independent chains, then combined: short dependency chains for one warp per
        // scheduler.
        float part[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          part[n % 4] = fmaxf(part[n % 4], fmaxf(sc[4 * n + 2 * half], sc[4 * n + 2 * half + 1]));
        }
        base[half] = OnlineSoftmaxStep</*kFastExp2=*/true>(
            fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3])) * logit_scale, row_max[half],
            row_sum[half], rescale[half]);
      }
      float sum[2][4] = {};
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) {
        sc[i] = FastExp2(fmaf(sc[i], logit_scale, -base[(i >> 1) & 1]));
        sum[(i >> 1) & 1][(i >> 2) % 4] += sc[i];
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        row_sum[half] += (sum[half][0] + sum[half][1]) + (sum[half][2] + sum[half][3]);
      }
    };
    // After the previous P V: rescale O (skipped when no row of the warp saw a new max, the
    // common case once a row's largest logits have gone by), and P's A fragments from the S
    // layout.
    auto rescale_and_pack = [&](const float (&rescale)[2]) {
      if (__any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] *= rescale[(i >> 1) & 1];
      }
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          pa[kk][reg] = PackBf16x2(sc[8 * kk + 2 * reg], sc[8 * kk + 2 * reg + 1]);
        }
      }
    };

    // Turns, alternating with the other consumer: tile kt's S is issued together with tile
    // kt - 1's P V; one last turn issues the last P V; turns without work only pass.
    const int my_turn = kTurnBarrier + warpgroup;
    const int other_turn = kTurnBarrier + (warpgroup ^ 1);
    int turn = 0;
    if (num_compute > 0) {
      float rescale[2];
      wait_full(0, 0);
      FenceProxyAsyncShared();
      NamedBarrierSync(my_turn, kConsumerThreads);
      WgmmaFence();
      issue_s(0);
      WgmmaCommit();
      NamedBarrierArrive(other_turn, kConsumerThreads);
      WgmmaWait<0>();
      release(0, 0);
      if (num_compute == 1) release_q();
      PinRegisters(sc);
      softmax(0, rescale);
      rescale_and_pack(rescale);
      for (turn = 1; turn < num_compute; ++turn) {
        wait_full(turn, 0);
        wait_full(turn - 1, 1);
        FenceProxyAsyncShared();
        NamedBarrierSync(my_turn, kConsumerThreads);
        PinRegisters(o);
        PinRegisters(pa);
        WgmmaFence();
        issue_s(turn);
        WgmmaCommit();
        issue_pv(turn - 1);
        WgmmaCommit();
        NamedBarrierArrive(other_turn, kConsumerThreads);
        WgmmaWait<1>();  // S (committed first); the P V MMAs run on during the softmax
        if (turn == num_compute - 1) release_q();
        PinRegisters(sc);
        softmax(turn, rescale);
        // K's buffer goes back once the row sums exist. ptxas 13.0 keeps the wait for P V
        // below an mbarrier arrival, and otherwise moves it up to before the exponentials.
        release(turn, 0, row_sum[0] + row_sum[1]);
        WgmmaWait<0>();
        PinRegisters(o);
        PinRegisters(pa);
        rescale_and_pack(rescale);
        release(turn - 1, 1);
      }
      wait_full(num_compute - 1, 1);
      FenceProxyAsyncShared();
      NamedBarrierSync(my_turn, kConsumerThreads);
      PinRegisters(o);
      PinRegisters(pa);
      WgmmaFence();
      issue_pv(num_compute - 1);
      WgmmaCommit();
      NamedBarrierArrive(other_turn, kConsumerThreads);
      WgmmaWait<0>();
      PinRegisters(o);
      release(num_compute - 1, 1);
      if (num_compute < item.num_key_tiles) pass(num_compute);
      turn = num_compute + 1;
    }
    for (; turn <= item.num_key_tiles; ++turn) {
      NamedBarrierSync(my_turn, kConsumerThreads);
      NamedBarrierArrive(other_turn, kConsumerThreads);
      if (turn < item.num_key_tiles) pass(turn);
    }
    tile_count += item.num_key_tiles;

    if (group_live) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float sum = row_sum[half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int packed = thread_row0 + 8 * half;
        if (packed >= item.packed_rows) continue;
        const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
        float* out = p.out + PackedRowOffset<kHeadDim>(item.q_begin, packed, group, item.kv_head,
                                                       p.out_stride);
#pragma unroll
        for (int n = 0; n < kHeadDim / 8; ++n) {
          const float x = o[4 * n + 2 * half] * inv_sum;
          const float y = o[4 * n + 2 * half + 1] * inv_sum;
          if (out_pairs) {
            *reinterpret_cast<float2*>(out + 8 * n + 2 * t) = make_float2(x, y);
          } else {
            out[8 * n + 2 * t] = x;
            out[8 * n + 2 * t + 1] = y;
          }
        }
      }
    }
  }
  // Consume consumer 1's last turn arrival for consumer 0, so no barrier is left half done.
  if (warpgroup == 0) NamedBarrierSync(kTurnBarrier + 0, kConsumerThreads);
#endif  // KVD_HAVE_WGMMA
}

}  // namespace

cudaError_t LaunchPrefillAttentionHopper(const PagedAttentionParams& p, int32_t* tile_indptr,
                                         int max_ctas, cudaStream_t stream) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (p.cache.dtype != DType::kBF16 || p.cache.head_dim != kHeadDim || max_ctas < 1) {
    return cudaErrorInvalidValue;
  }
  // The bf16 Q rows when given and fit for 16-byte copies (and a scale the softmax can apply
  // to raw logits: positive, finite); else the fp32 ones.
  const float logit_scale = p.sm_scale * kLog2e;
  bool bf16_q = p.q_bf16 != nullptr && reinterpret_cast<uintptr_t>(p.q_bf16) % 16 == 0 &&
                p.q_bf16_stride % 8 == 0 && p.q_bf16_stride >= p.num_q_heads * kHeadDim &&
                logit_scale > 0.0f && std::isfinite(logit_scale);
  // setmaxnreg moves registers within what the launch gave the CTA: with fewer per thread
  // than kLaunchRegisters (another compiler's choice) the consumers would wait forever.
  auto check_registers = [](auto* k) {
    cudaFuncAttributes attributes;
    if (cudaError_t err = cudaFuncGetAttributes(&attributes, k); err != cudaSuccess) return err;
    return attributes.numRegs >= kLaunchRegisters ? cudaSuccess : cudaErrorNotSupported;
  };
  static const cudaError_t registers_checked[2] = {check_registers(PrefillHopperKernel<false>),
                                                   check_registers(PrefillHopperKernel<true>)};
  if (registers_checked[1] != cudaSuccess) bf16_q = false;  // the fp32 build may still run
  if (registers_checked[bf16_q] != cudaSuccess) return registers_checked[bf16_q];
  auto* kernel = bf16_q ? PrefillHopperKernel<true> : PrefillHopperKernel<false>;
  if (cudaError_t err = AllowDynamicSmem(kernel, kSmemBytes); err != cudaSuccess) {
    return err;
  }
  int num_sms = 0;
  if (cudaError_t err = CurrentDeviceSms(num_sms); err != cudaSuccess) return err;
  // One CTA per multiprocessor (225 KB of shared memory); items come from the work counter.
  // A programmatic dependent of the planning kernel that writes tile_indptr.
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.cache.block_size));
  return LaunchDependent(kernel, dim3(std::min(max_ctas, num_sms)), dim3(kThreads), kSmemBytes,
                         stream, p, tile_indptr, block_shift);
}

}  // namespace kvd::cuda
