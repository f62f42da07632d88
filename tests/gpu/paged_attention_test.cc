// CUDA paged attention (split-KV decode, tiled prefill, mixed batches) against the CPU
// reference: scattered block tables over several chunks (one released), block sizes
// 1/16/64, GQA groups 1/4/7/8/12, head_dim 64/128 (and 8-32 on the generic kernel), contexts
// 1 to 32k, f32 and bf16 KV.
// With bf16 KV the backend's prefill runs the tensor-core kernel in its plain-bf16 mode (Q and
// P rounded to bf16, as FlashAttention does): those rows are held to a bf16-sized tolerance,
// every other row (f32 KV, decodes) to fp32 accumulation-order error. The kernel's split mode
// (Q and P as bf16 pairs) is also launched directly and must meet the tight tolerance. The
// Hopper kernel reading the optional bf16 copy of Q (PagedAttentionParams::q_bf16) runs with
// the fp32 rows poisoned, held to the bf16 tolerance.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/decode_kernels.h"
#include "kernels/cuda/decode_split_plan.h"
#include "kernels/cuda/kv_row_map.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/twin_arena.h"

namespace kvd::gpu_test {
namespace {

struct SeqShape {
  int q_len;
  int kv_len;  // including this step's q_len new tokens
};

struct AttentionCase {
  std::string name;
  std::vector<SeqShape> seqs;
  DType kv_dtype = DType::kBF16;
  int head_dim = 128;
  int block_size = 16;
  int num_kv_heads = 2;
  int group = 4;
  bool causal = true;
  // Launch the bf16 prefill kernel directly (prefill-only batches) with Q and P rounded to
  // plain bf16, or split into bf16 pairs.
  bool bf16_qp = false;
  bool split_qp = false;
  // With bf16_qp: keep head_dim 128 on the wide mma.sync kernel where the Hopper (wgmma)
  // kernel would run.
  bool no_wgmma = false;
  // Odd Q and output row strides (q_stride and out_stride need no alignment).
  bool odd_strides = false;
  // Chunks of the arena, one of them released.
  int arena_chunks = 4;
  // Given to the GPU backend alone as max_kv_len (0: none): a promise the batch breaks, which
  // the CPU reference would refuse; the GPU must still compute every key.
  int gpu_broken_kv_promise = 0;
  // Also give the GPU Q as bf16 (PagedAttentionParams::q_bf16, the fp32 rows rounded), rows
  // q_bf16_stride apart, from q_bf16_offset elements into its buffer. In prefill-only batches
  // whichever copy the kernels must not read is poisoned (NaN): on Hopper at head_dim 128 with
  // 16-byte aligned rows the fp32 rows, else the bf16 ones. In mixed batches (decodes read
  // fp32 Q) neither is.
  bool bf16_q = false;
  int q_bf16_pad = 8;  // q_bf16_stride = num_q_heads * head_dim + this
  int q_bf16_offset = 0;
  // CTAs of that direct launch; 0 means four per multiprocessor. A few CTAs make each one
  // take many work items in turn.
  int direct_ctas = 0;
  // Give the backend the batch's largest q_len and kv_len (PagedAttentionParams::max_q_len
  // and max_kv_len), as the model does: pure decodes skip the prefill launch, few prefill rows
  // run the 64-row split-precision kernel, and decodes launch only the split slices their
  // longest context uses (DecodeLaunchSlices).
  bool hint_max_q_len = false;
  // Decode-only batches: launch the decode kernel directly (one split) with no TMA view
  // (every K/V row by cp.async); with a view of the GPU arena's first chunk alone (blocks
  // elsewhere by cp.async); or with that view reading a copy of the chunk while the chunk
  // itself is poisoned (NaN), so that outputs are right only if every K/V row of the chunk
  // came through the view. (Otherwise: the backend's view of all its memory.)
  enum class DecodeView { kBackend, kNone, kFirstChunk, kFirstChunkCopy };
  DecodeView decode_view = DecodeView::kBackend;
  // That direct launch's split slices (DecodeWorkspace::max_splits), with the workspace they
  // need. With more than one, the kernel runs three times back to back (the outputs compared
  // are the last run's) and must leave every counter zero.
  int decode_splits = 1;
  // Of those slices, tail splits a main split's length over decode_tail_divisor, used by
  // every context (DecodeWorkspace::tail_splits, tail_min_keys 0).
  int decode_tails = 0;
  int decode_tail_divisor = 8;
  // That direct launch traced (DecodeWorkspace::trace): every CTA's timeline must be in order.
  bool trace = false;
};

// Tolerances for outputs of the plain-bf16 tensor-core prefill. Q and every probability P are
// rounded to bf16 (8 significant bits, relative rounding error <= 2^-9 ~ 2e-3): P's rounding
// moves an output (a convex combination of |v| <= 1) by <= 2^-9 * max|v| ~ 2e-3, Q's moves
// each logit by ~2^-9 of |q.k| and the softmax turns that into a comparable shift. An fp64
// emulation of the kernel's rounding over this test's inputs (q in [-3, 3], k, v in [-1, 1],
// 1 to 16k keys) peaks at 2.5e-3 absolute, 0.4 of the bound below; a wrong fragment, mask or
// tile moves outputs by ~0.1.
constexpr double kBf16PrefillRtol = 2e-2;
constexpr double kBf16PrefillAtol = 4e-3;
// Everything else attends over the same fp32 values on both sides (bf16 KV was rounded
// beforehand), so only accumulation order, the split-KV merge and exp2 vs exp differ: ~1e-6
// in practice. A dropped key, split or block moves outputs by far more than 5e-5.
constexpr double kExactRtol = 1e-4;
constexpr double kExactAtol = 5e-5;

int NextPowerOfTwo(int64_t x) {
  int shift = 0;
  while ((int64_t{1} << shift) < x) ++shift;
  return shift;
}

// A traced decode launch's records (DecodeWorkspace::trace, `splits` slices of `num_seqs`
// sequences' CTAs): every CTA recorded its start and its plan; an active CTA's points are all
// there (the split ones both or neither) and in order; and each (sequence, head subgroup)
// whose splits arrived had exactly one merger.
absl::Status CheckDecodeTrace(const std::vector<cuda::DecodeTraceRecord>& records, int num_seqs,
                              int splits) {
  const size_t per_slice = records.size() / splits;  // CTAs of one split slice
  const size_t per_seq = per_slice / num_seqs;       // (KV head, subgroup) CTAs of a sequence
  std::vector<int> arrived(per_slice, 0), merged(per_slice, 0);
  for (size_t i = 0; i < records.size(); ++i) {
    const cuda::DecodeTraceRecord& r = records[i];
    const std::string cta = absl::StrCat("CTA ", i, " (split ", i / per_slice, ", sequence ",
                                         i % per_slice / per_seq, ")");
    if (r.ns[cuda::kTraceEntry] == 0 || r.ns[cuda::kTracePlanned] < r.ns[cuda::kTraceEntry]) {
      return absl::InternalError(absl::StrCat(cta, ": no start, or its plan before it"));
    }
    if (r.ns[cuda::kTraceEnd] == 0) continue;  // idle
    const bool split = r.ns[cuda::kTraceArrived] != 0;
    uint64_t last = 0;
    for (int point = 0; point < cuda::kDecodeTracePoints; ++point) {
      const bool split_point = point == cuda::kTracePartialStored || point == cuda::kTraceArrived;
      if (split_point && !split) {
        if (r.ns[point] != 0) return absl::InternalError(absl::StrCat(cta, ": a stray point"));
        continue;
      }
      if (r.ns[point] < last) {
        return absl::InternalError(absl::StrCat(cta, ": point ", point, " out of order"));
      }
      last = r.ns[point];
    }
    arrived[i % per_slice] += split;
    merged[i % per_slice] += r.merged;
  }
  for (size_t g = 0; g < per_slice; ++g) {
    if (merged[g] != (arrived[g] > 0 ? 1 : 0)) {
      return absl::InternalError(
          absl::StrCat("CTA group ", g, ": ", arrived[g], " arrivals, ", merged[g], " mergers"));
    }
  }
  return absl::OkStatus();
}

class PagedAttentionTest : public GpuVsCpuTest,
                           public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(PagedAttentionTest, MatchesCpuReference) {
  const AttentionCase& c = GetParam();
  const int num_seqs = static_cast<int>(c.seqs.size());
  const int num_q_heads = c.num_kv_heads * c.group;
  const int row = c.num_kv_heads * c.head_dim;

  // Arena: c.arena_chunks chunks, chunk 1 released, ~25% spare blocks so ids scatter
  // everywhere.
  int64_t blocks_needed = 0;
  for (const SeqShape& s : c.seqs) blocks_needed += (s.kv_len + c.block_size - 1) / c.block_size;
  ArenaShape shape;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  shape.block_size = c.block_size;
  const int present = c.arena_chunks - 1;
  shape.chunk_shift = NextPowerOfTwo((blocks_needed * 5 / 4 + present - 1) / present);
  shape.num_chunks = c.arena_chunks;
  shape.released = {1};
  shape.gpu_dtype = c.kv_dtype;
  TwinArena arena(cpu(), gpu(), shape);
  const std::vector<int32_t> ids = arena.ShuffledBlockIds(static_cast<uint32_t>(blocks_needed));

  // CSR block tables, and every cached token's slot.
  std::vector<int32_t> indptr = {0}, indices, last_block_len, q_indptr = {0};
  std::vector<int64_t> slots;
  size_t next_id = 0;
  for (const SeqShape& s : c.seqs) {
    const int num_blocks = (s.kv_len + c.block_size - 1) / c.block_size;
    for (int b = 0; b < num_blocks; ++b) indices.push_back(ids[next_id++]);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last_block_len.push_back(s.kv_len - (num_blocks - 1) * c.block_size);
    q_indptr.push_back(q_indptr.back() + s.q_len);
    for (int t = 0; t < s.kv_len; ++t) {
      slots.push_back(int64_t{indices[indptr[indptr.size() - 2] + t / c.block_size]} *
                          c.block_size +
                      t % c.block_size);
    }
  }
  const int total_q = q_indptr.back();

  // K/V through AppendKv on both backends (bf16-rounded when the GPU stores bf16, so both
  // attend over identical values).
  std::vector<float> k = RandomFloats(slots.size() * row, 1);
  std::vector<float> v = RandomFloats(slots.size() * row, 2);
  if (c.kv_dtype == DType::kBF16) {
    k = RoundBf16(k);
    v = RoundBf16(v);
  }
  const int q_stride = num_q_heads * c.head_dim + (c.odd_strides ? 17 : 16);
  const int out_stride = num_q_heads * c.head_dim + (c.odd_strides ? 9 : 8);
  const std::vector<float> q = RandomFloats(size_t(total_q) * q_stride, 3, -3, 3);
  const int q_bf16_stride = num_q_heads * c.head_dim + c.q_bf16_pad;
  std::vector<uint16_t> q_bf16(c.q_bf16_offset + size_t(total_q) * q_bf16_stride, 0xffff);
  for (int r = 0; r < total_q; ++r) {
    for (int i = 0; i < num_q_heads * c.head_dim; ++i) {
      q_bf16[c.q_bf16_offset + size_t(r) * q_bf16_stride + i] =
          Bf16Bits(q[size_t(r) * q_stride + i]);
    }
  }
  // In prefill-only batches (launched directly or through the backend) one copy is read and
  // the other poisoned on the GPU.
  const bool prefill_only =
      std::all_of(c.seqs.begin(), c.seqs.end(), [](const SeqShape& seq) { return seq.q_len > 1; });
  const bool one_q_copy = c.bf16_qp || (c.bf16_q && prefill_only);
  const bool reads_bf16_q = c.bf16_q && one_q_copy && c.head_dim == 128 && !c.no_wgmma &&
                            cuda::HopperPrefillSupported() && q_bf16_stride % 8 == 0 &&
                            c.q_bf16_offset % 8 == 0;

  struct Side {
    DeviceBuffer k, v, slots, q, q_bf16, q_indptr, indptr, indices, last_block_len, out;
  };
  auto make_side = [&](Backend& b) {
    const bool gpu_side = &b == &gpu();
    const bool poison_q = gpu_side && reads_bf16_q;
    const bool poison_q_bf16 = one_q_copy && !reads_bf16_q;
    return Side{Upload(b, k),
                Upload(b, v),
                Upload(b, slots),
                poison_q ? Poisoned(b, q.size() * 4) : Upload(b, q),
                poison_q_bf16 ? Poisoned(b, q_bf16.size() * 2) : Upload(b, q_bf16),
                Upload(b, q_indptr),
                Upload(b, indptr),
                Upload(b, indices),
                Upload(b, last_block_len),
                Poisoned(b, size_t(total_q) * out_stride * 4)};
  };
  Side cpu_side = make_side(cpu());
  Side gpu_side = make_side(gpu());

  auto run = [&](Backend& b, Side& side, const KvCacheView& view) {
    AppendKvParams a;
    a.cache = view;
    a.k = side.k.as<float>();
    a.v = side.v.as<float>();
    a.slot_mapping = side.slots.as<int64_t>();
    a.num_tokens = static_cast<int32_t>(slots.size());
    a.k_stride = row;
    a.v_stride = row;
    if (absl::Status s = b.AppendKv(a); !s.ok()) return s;
    PagedAttentionParams p;
    p.out = side.out.as<float>();
    p.q = side.q.as<float>();
    if (c.bf16_q && &b == &gpu()) {
      p.q_bf16 = side.q_bf16.as<uint16_t>() + c.q_bf16_offset;
      p.q_bf16_stride = q_bf16_stride;
    }
    p.q_indptr = side.q_indptr.as<int32_t>();
    p.cache = view;
    p.blocks.indptr = side.indptr.as<int32_t>();
    p.blocks.indices = side.indices.as<int32_t>();
    p.blocks.last_block_len = side.last_block_len.as<int32_t>();
    p.blocks.num_seqs = num_seqs;
    p.num_q_heads = num_q_heads;
    p.q_stride = q_stride;
    p.out_stride = out_stride;
    p.sm_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    p.causal = c.causal;
    if (c.gpu_broken_kv_promise > 0 && &b == &gpu()) p.max_kv_len = c.gpu_broken_kv_promise;
    if (c.hint_max_q_len) {
      for (const SeqShape& seq : c.seqs) {
        p.max_q_len = std::max(p.max_q_len, seq.q_len);
        if (seq.q_len > 0) p.max_kv_len = std::max(p.max_kv_len, seq.kv_len);
      }
    }
    if (c.decode_view != AttentionCase::DecodeView::kBackend && &b == &gpu()) {
      cuda::KvRowMap first_chunk;
      DeviceBuffer copy;
      if (c.decode_view != AttentionCase::DecodeView::kNone) {
        void* chunk = arena.GpuChunk(0);
        const int64_t bytes = arena.ChunkBytes(/*on_gpu=*/true);
        const void* data = chunk;
        if (c.decode_view == AttentionCase::DecodeView::kFirstChunkCopy) {
          copy = OrDie(b.Allocate(bytes), "Allocate");
          if (cudaMemcpyAsync(copy.data(), chunk, bytes, cudaMemcpyDeviceToDevice,
                              gpu().stream()) != cudaSuccess ||
              cudaMemsetAsync(chunk, kPoisonByte, bytes, gpu().stream()) != cudaSuccess) {
            return absl::InternalError("copying and poisoning chunk 0");
          }
          data = copy.data();
        }
        const auto lo = reinterpret_cast<uintptr_t>(chunk);
        if (cuda::MakeKvRowMap(lo, lo + bytes, first_chunk, data) != cudaSuccess) {
          return absl::InternalError("MakeKvRowMap");
        }
      }
      cuda::DecodeWorkspace ws;
      ws.max_splits = c.decode_splits;
      ws.tail_splits = c.decode_tails;
      ws.tail_divisor = c.decode_tail_divisor;
      ws.tail_min_keys = 0;
      DeviceBuffer partial_out, partial_lse, counters;
      const size_t counter_count = cuda::DecodeArrivalCount(num_seqs, c.num_kv_heads, c.group);
      if (c.decode_splits > 1) {
        partial_out =
            Poisoned(b, sizeof(float) * cuda::DecodePartialOutSize(num_seqs, c.decode_splits,
                                                                   num_q_heads, c.head_dim));
        partial_lse = Poisoned(
            b, sizeof(float) * cuda::DecodePartialLseSize(num_seqs, c.decode_splits, num_q_heads));
        counters = Upload(b, std::vector<int32_t>(counter_count, 0));
        ws.partial_out = partial_out.as<float>();
        ws.partial_lse = partial_lse.as<float>();
        ws.arrivals = counters.as<int32_t>();
      }
      const int64_t trace_count =
          cuda::DecodeTraceCount(num_seqs, c.num_kv_heads, c.group, c.decode_splits);
      DeviceBuffer trace;
      if (c.trace) {
        trace = Poisoned(b, sizeof(cuda::DecodeTraceRecord) * trace_count);
        ws.trace = static_cast<cuda::DecodeTraceRecord*>(trace.data());
      }
      for (int run = 0; run < (c.decode_splits > 1 ? 3 : 1); ++run) {
        const cudaError_t err = cuda::LaunchDecodeAttention(
            p, ws, gpu().stream(),
            c.decode_view == AttentionCase::DecodeView::kNone ? nullptr : &first_chunk);
        if (err != cudaSuccess) return absl::InternalError(cudaGetErrorString(err));
      }
      if (c.decode_splits > 1) {
        std::vector<int32_t> left(counter_count);
        if (absl::Status s = b.CopyToHost(left.data(), counters.data(), left.size() * 4); !s.ok()) {
          return s;
        }
        for (size_t i = 0; i < left.size(); ++i) {
          if (left[i] != 0) {
            return absl::InternalError(absl::StrCat("counter ", i, " left at ", left[i]));
          }
        }
      }
      if (c.trace) {
        std::vector<cuda::DecodeTraceRecord> records(trace_count);
        if (absl::Status s =
                b.CopyToHost(records.data(), trace.data(), records.size() * sizeof(records[0]));
            !s.ok()) {
          return s;
        }
        if (absl::Status s = CheckDecodeTrace(records, num_seqs, c.decode_splits); !s.ok()) {
          return s;
        }
      }
      return b.Synchronize();  // before `copy` is freed
    }
    if ((c.bf16_qp || c.split_qp) && &b == &gpu()) {
      DeviceBuffer tile_indptr = Poisoned(b, sizeof(int32_t) * (num_seqs + 1));
      const cudaError_t err = cuda::LaunchPrefillAttention(
          p, tile_indptr.as<int32_t>(), c.direct_ctas > 0 ? c.direct_ctas : gpu().num_sms() * 4,
          gpu().stream(), c.split_qp ? cuda::MmaPrecision::kSplit : cuda::MmaPrecision::kBf16,
          /*allow_wgmma=*/!c.no_wgmma);
      if (err != cudaSuccess) return absl::InternalError(cudaGetErrorString(err));
      return b.Synchronize();  // before tile_indptr is freed
    }
    if (c.hint_max_q_len && &b == &gpu() && p.max_kv_len > 0) {
      // The max_kv_len promise changes which split slices are launched, not a bit of the
      // output: the batch without it gives the same.
      if (absl::Status s = b.PagedAttention(p); !s.ok()) return s;
      const size_t floats = size_t(total_q) * out_stride;
      DeviceBuffer unpromised_out = Poisoned(b, floats * 4);
      PagedAttentionParams unpromised = p;
      unpromised.out = unpromised_out.as<float>();
      unpromised.max_kv_len = 0;
      if (absl::Status s = b.PagedAttention(unpromised); !s.ok()) return s;
      const std::vector<float> with = DownloadFloats(b, p.out, floats);
      const std::vector<float> without = DownloadFloats(b, unpromised.out, floats);
      if (std::memcmp(with.data(), without.data(), floats * 4) != 0) {
        return absl::InternalError("the max_kv_len promise changed the output");
      }
      return absl::OkStatus();
    }
    return b.PagedAttention(p);
  };
  const absl::Status cpu_status = run(cpu(), cpu_side, arena.CpuView(/*layer=*/1));
  ASSERT_TRUE(cpu_status.ok()) << cpu_status;
  const absl::Status gpu_status = run(gpu(), gpu_side, arena.GpuView(/*layer=*/1));
  ASSERT_TRUE(gpu_status.ok()) << gpu_status;

  const size_t out_floats = size_t(total_q) * out_stride;
  const std::vector<float> gpu_out = DownloadFloats(gpu(), gpu_side.out.data(), out_floats);
  const std::vector<float> cpu_out = DownloadFloats(cpu(), cpu_side.out.data(), out_floats);
  // Rows of bf16 prefills (unless run in split mode) go to the bf16 comparison.
  std::vector<bool> bf16_row(total_q, false);
  for (int s = 0; s < num_seqs; ++s) {
    const bool bf16_prefill = c.kv_dtype == DType::kBF16 && c.seqs[s].q_len > 1 && !c.split_qp;
    for (int r = q_indptr[s]; r < q_indptr[s + 1]; ++r) bf16_row[r] = bf16_prefill;
  }
  std::vector<float> gpu_exact, cpu_exact, gpu_bf16, cpu_bf16;
  for (int r = 0; r < total_q; ++r) {
    for (int i = 0; i < out_stride; ++i) {
      const size_t at = size_t(r) * out_stride + i;
      if (i < num_q_heads * c.head_dim) {
        (bf16_row[r] ? gpu_bf16 : gpu_exact).push_back(gpu_out[at]);
        (bf16_row[r] ? cpu_bf16 : cpu_exact).push_back(cpu_out[at]);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &gpu_out[at], 4);
        ASSERT_EQ(bits, 0xffffffffu) << "row " << r << " padding column " << i << " written";
      }
    }
  }
  EXPECT_TRUE(AllClose(gpu_exact, cpu_exact, kExactRtol, kExactAtol)) << "f32 / decode rows";
  EXPECT_TRUE(AllClose(gpu_bf16, cpu_bf16, kBf16PrefillRtol, kBf16PrefillAtol))
      << "bf16 prefill rows";
}

std::vector<AttentionCase> Cases() {
  std::vector<AttentionCase> cases;
  auto base_name = [](DType dtype, int head_dim, int block_size, int group) {
    return absl::StrCat(std::string(DTypeName(dtype)), "_d", head_dim, "_bs", block_size, "_g",
                        group);
  };
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int head_dim : {64, 128}) {
      for (const int block_size : {1, 16, 64}) {
        for (const int group : {1, 4, 8}) {
          AttentionCase decode;
          decode.name = absl::StrCat("decode_", base_name(dtype, head_dim, block_size, group));
          decode.seqs = {{1, 1}, {1, 17}, {1, 300}, {1, 1029}, {1, 4100}};
          decode.kv_dtype = dtype;
          decode.head_dim = head_dim;
          decode.block_size = block_size;
          decode.group = group;
          cases.push_back(decode);
          AttentionCase prefill = decode;
          prefill.name = absl::StrCat("prefill_", base_name(dtype, head_dim, block_size, group));
          // Fresh prompts, and chunks over a cached prefix.
          prefill.seqs = {{2, 2}, {33, 33}, {100, 600}, {5, 70}};
          cases.push_back(prefill);
        }
      }
    }
  }
  const std::vector<SeqShape> mixed = {{1, 1000}, {77, 377},  {1, 5},  {16, 16},
                                       {1, 4097}, {130, 130}, {2, 900}};
  auto add = [&](std::string name, std::vector<SeqShape> seqs, DType dtype, int head_dim,
                 int block_size, int num_kv_heads, int group, bool causal = true) {
    AttentionCase c;
    c.name = std::move(name);
    c.seqs = std::move(seqs);
    c.kv_dtype = dtype;
    c.head_dim = head_dim;
    c.block_size = block_size;
    c.num_kv_heads = num_kv_heads;
    c.group = group;
    c.causal = causal;
    cases.push_back(c);
  };
  add("mixed_bf16_d128_bs16_g4", mixed, DType::kBF16, 128, 16, 2, 4);
  add("mixed_f32_d64_bs64_g8", mixed, DType::kF32, 64, 64, 2, 8);
  add("mixed_bf16_d128_bs1_g1", mixed, DType::kBF16, 128, 1, 4, 1);
  // Groups that are not a power of two (Qwen-style 7) or exceed one CTA's 8 heads.
  add("mixed_bf16_d128_bs16_g7", mixed, DType::kBF16, 128, 16, 2, 7);
  add("mixed_f32_d64_bs1_g12", mixed, DType::kF32, 64, 1, 1, 12);
  add("mixed_bf16_d64_bs64_g3", mixed, DType::kBF16, 64, 64, 3, 3);
  // Many decodes of different lengths in one batch.
  std::vector<SeqShape> many_decodes;
  for (int i = 0; i < 16; ++i) many_decodes.push_back({1, 1 + 333 * i});
  add("many_decodes_bf16_d128_bs16_g4", many_decodes, DType::kBF16, 128, 16, 2, 4);
  // Long contexts: many splits, merged by log-sum-exp.
  add("long_bf16_d128_bs16_g4", {{1, 32768}}, DType::kBF16, 128, 16, 2, 4);
  add("long_f32_d128_bs64_g8", {{1, 32768}, {1, 20000}}, DType::kF32, 128, 64, 2, 8);
  add("long_bf16_d64_bs1_g1", {{1, 32768}}, DType::kBF16, 64, 1, 4, 1);
  // CUDA cores at head_dim 64 past one merge batch (23 splits of about 512 keys).
  add("long_f32_d64_bs16_g4", {{1, 12000}}, DType::kF32, 64, 16, 2, 4);
  add("long_prefill_bf16_d128_bs16_g8", {{64, 16384}, {1, 16000}}, DType::kBF16, 128, 16, 1, 8);
  // Big batches: the grid fills the device without splitting.
  std::vector<SeqShape> batch;
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) batch.push_back({1, 1 + static_cast<int>(rng() % 3000)});
  add("batch200_bf16_d128_bs16_g8", batch, DType::kBF16, 128, 16, 2, 8);
  batch.resize(40);
  add("batch40_f32_d128_bs16_g4", batch, DType::kF32, 128, 16, 2, 4);
  // More sequences than the planning kernel scans in one round (1024): prefills in the first
  // and in the second round, so the second round's offsets must carry the first's items.
  std::vector<SeqShape> wide_batch;
  for (int i = 0; i < 1100; ++i) wide_batch.push_back({1, 1 + static_cast<int>(rng() % 60)});
  wide_batch[500] = {40, 90};
  wide_batch[1050] = {33, 33};
  wide_batch[1099] = {3, 20};
  add("batch1100_mixed_bf16_d128_bs16_g4", wide_batch, DType::kBF16, 128, 16, 2, 4);
  add("batch1100_mixed_f32_d64_bs16_g4", wide_batch, DType::kF32, 64, 16, 2, 4);
  // Bidirectional attention over the whole sequence.
  add("noncausal_bf16_d128_bs16_g4", {{40, 40}, {10, 300}, {1, 50}}, DType::kBF16, 128, 16, 2, 4,
      /*causal=*/false);
  // More query rows than keys, which only bidirectional attention allows: every row sees
  // all kv_len keys.
  add("noncausal_q_past_kv_bf16_d128_bs16_g4", {{50, 20}, {3, 1}, {1, 40}}, DType::kBF16, 128, 16,
      2, 4, /*causal=*/false);
  // Head dims below 64 run the generic kernel (stories260K: head_dim 8, 4 KV heads, groups of
  // 2): decodes, prefills over a cached prefix, block size 1, GQA, bidirectional.
  add("generic_f32_d8_bs16_g2", mixed, DType::kF32, 8, 16, 4, 2);
  add("generic_bf16_d8_bs1_g2", mixed, DType::kBF16, 8, 1, 4, 2);
  add("generic_bf16_d32_bs64_g4", mixed, DType::kBF16, 32, 64, 2, 4);
  add("generic_f32_d16_bs16_g1", {{1, 4097}, {30, 30}, {5, 200}}, DType::kF32, 16, 16, 3, 1);
  add("generic_noncausal_bf16_d32_bs16_g4", {{40, 40}, {10, 300}, {50, 20}}, DType::kBF16, 32, 16,
      2, 4, /*causal=*/false);
  // Tensor-core prefill with plain-bf16 Q and P (prefill-only batches: the launch runs no
  // decode kernel).
  const std::vector<SeqShape> prefills = {{2, 2}, {33, 33}, {100, 600}, {5, 70}, {130, 1000}};
  for (const int head_dim : {64, 128}) {
    for (const bool causal : {true, false}) {
      add(absl::StrCat("bf16qp_prefill_d", head_dim, causal ? "_causal" : "_noncausal"), prefills,
          DType::kBF16, head_dim, 16, 2, 4, causal);
      cases.back().bf16_qp = true;
    }
  }
  // The model's hint: mixed batches with few prefill rows, and pure decodes.
  add("hinted_mixed_bf16_d128_bs16_g4", mixed, DType::kBF16, 128, 16, 2, 4);
  cases.back().hint_max_q_len = true;
  add("hinted_prefill_bf16_d64_bs64_g8", prefills, DType::kBF16, 64, 64, 2, 8);
  cases.back().hint_max_q_len = true;
  add("hinted_decode_bf16_d128_bs16_g4", {{1, 1}, {1, 300}, {1, 4100}}, DType::kBF16, 128, 16, 2,
      4);
  cases.back().hint_max_q_len = true;
  // A broken promise (256 keys, for contexts up to 4100): 4 split slices of the 43 the batch
  // would get, and every key still read.
  add("broken_kv_promise_decode_bf16_d128_bs16_g4", {{1, 4100}, {1, 300}, {1, 2000}}, DType::kBF16,
      128, 16, 2, 4);
  cases.back().gpu_broken_kv_promise = 256;
  // Blocks scattered over 40 chunks (more than a warp has lanes).
  add("many_chunks_decode_bf16_d128_bs16_g4", {{1, 1}, {1, 300}, {1, 4100}, {1, 2000}},
      DType::kBF16, 128, 16, 2, 4);
  cases.back().arena_chunks = 40;
  add("many_chunks_decode_f32_d64_bs1_g8", {{1, 17}, {1, 1029}, {1, 3000}}, DType::kF32, 64, 1, 1,
      8);
  cases.back().arena_chunks = 40;
  add("many_chunks_mixed_bf16_d128_bs16_g4", mixed, DType::kBF16, 128, 16, 2, 4);
  cases.back().arena_chunks = 40;
  // Fewer split slices than the full grid: one sequence of 700 keys (11 slices of 128), and
  // three whose longest, 1000 keys, wants 16 (of 87), on both kernels.
  add("hinted_decode_bf16_d128_bs16_g4_one", {{1, 700}}, DType::kBF16, 128, 16, 2, 4);
  cases.back().hint_max_q_len = true;
  add("hinted_decode_bf16_d64_bs16_g8_three", {{1, 1000}, {1, 65}, {1, 999}}, DType::kBF16, 64, 16,
      1, 8);
  cases.back().hint_max_q_len = true;
  add("hinted_decode_f32_d128_bs16_g4_three", {{1, 1000}, {1, 65}, {1, 999}}, DType::kF32, 128, 16,
      1, 4);
  cases.back().hint_max_q_len = true;
  add("bf16qp_prefill_d128_bs1_g8", prefills, DType::kBF16, 128, 1, 1, 8);
  cases.back().bf16_qp = true;
  // head_dim 128 on Hopper runs the wgmma kernel: the wide kernel's cases again with it
  // turned off, and longer prefills (many 128-key tiles, causal tiles that end mid-tile, a
  // group of 7, 64-token blocks) for the wgmma kernel.
  for (const bool causal : {true, false}) {
    add(absl::StrCat("bf16qp_prefill_d128_wide", causal ? "_causal" : "_noncausal"), prefills,
        DType::kBF16, 128, 16, 2, 4, causal);
    cases.back().bf16_qp = true;
    cases.back().no_wgmma = true;
  }
  // Q rows that are not 16-byte aligned take the wide kernel's scalar Q loads.
  add("bf16qp_prefill_d128_wide_odd_strides", prefills, DType::kBF16, 128, 16, 2, 4);
  cases.back().bf16_qp = true;
  cases.back().no_wgmma = true;
  cases.back().odd_strides = true;
  const std::vector<SeqShape> long_prefills = {{300, 5000}, {129, 129}, {1000, 1000}, {17, 2100}};
  add("bf16qp_long_prefill_d128_bs16_g4", long_prefills, DType::kBF16, 128, 16, 2, 4);
  cases.back().bf16_qp = true;
  add("bf16qp_long_prefill_d128_bs64_g7", long_prefills, DType::kBF16, 128, 64, 1, 7);
  cases.back().bf16_qp = true;
  add("bf16qp_long_prefill_d128_bs16_g1_noncausal", long_prefills, DType::kBF16, 128, 16, 3, 1,
      /*causal=*/false);
  cases.back().bf16_qp = true;
  add("bf16qp_long_prefill_d128_bs8_g4", long_prefills, DType::kBF16, 128, 8, 2, 4);
  cases.back().bf16_qp = true;
  add("bf16qp_long_prefill_d128_bs16_g4_odd_strides", long_prefills, DType::kBF16, 128, 16, 2, 4);
  cases.back().bf16_qp = true;
  cases.back().odd_strides = true;
  // Q in bf16 (PagedAttentionParams::q_bf16): the Hopper kernel copies it like K and must read
  // nothing else (the fp32 rows are NaN), over long and short prefills, groups of 1, 4 and 7,
  // one or two CTAs taking every item in turn (the Q buffer handed back and refilled each
  // time); rows whose stride is not a multiple of eight, and the mma.sync kernel, read the
  // fp32 rows (the bf16 ones are NaN).
  auto add_bf16_q = [&](const std::string& name, const std::vector<SeqShape>& seqs, int block_size,
                        int num_kv_heads, int group, bool causal = true) {
    add(absl::StrCat("bf16q_", name), seqs, DType::kBF16, 128, block_size, num_kv_heads, group,
        causal);
    cases.back().bf16_qp = true;
    cases.back().bf16_q = true;
  };
  add_bf16_q("long_prefill_d128_bs16_g4", long_prefills, 16, 2, 4);
  add_bf16_q("long_prefill_d128_bs64_g7", long_prefills, 64, 1, 7);
  add_bf16_q("long_prefill_d128_bs16_g1_noncausal", long_prefills, 16, 3, 1, false);
  add_bf16_q("prefill_d128_1cta", prefills, 16, 2, 4);
  cases.back().direct_ctas = 1;
  add_bf16_q("long_prefill_d128_bs8_g4_2ctas", long_prefills, 8, 2, 4);
  cases.back().direct_ctas = 2;
  add_bf16_q("prefill_d128_noncausal_2ctas", prefills, 16, 2, 4, false);
  cases.back().direct_ctas = 2;
  add_bf16_q("prefill_d128_odd_strides", prefills, 16, 2, 4);
  cases.back().odd_strides = true;
  add_bf16_q("prefill_d128_unaligned_bf16_rows", prefills, 16, 2, 4);
  cases.back().q_bf16_pad = 3;
  add_bf16_q("prefill_d128_unaligned_bf16_base", prefills, 16, 2, 4);
  cases.back().q_bf16_offset = 1;
  add_bf16_q("prefill_d128_wide", prefills, 16, 2, 4);
  cases.back().no_wgmma = true;
  // Through the backend: prefills alone (the fp32 rows poisoned on Hopper), and decodes and
  // prefills in one batch.
  add("bf16q_backend_prefill_d128_bs16_g4", long_prefills, DType::kBF16, 128, 16, 2, 4);
  cases.back().bf16_q = true;
  cases.back().hint_max_q_len = true;
  add("bf16q_mixed_bf16_d128_bs16_g4", mixed, DType::kBF16, 128, 16, 2, 4);
  cases.back().bf16_q = true;
  add("mixed_bf16_d128_bs16_g4_odd_strides", mixed, DType::kBF16, 128, 16, 2, 4);
  cases.back().odd_strides = true;
  // Two CTAs for ~20 work items (128-row tiles of several sequences and KV heads): every
  // CTA loops over items taken from the work counter, reusing its shared memory.
  for (const int head_dim : {64, 128}) {
    add(absl::StrCat("bf16qp_prefill_d", head_dim, "_2ctas"), prefills, DType::kBF16, head_dim, 16,
        2, 4);
    cases.back().bf16_qp = true;
    cases.back().direct_ctas = 2;
  }
  // The split mode (Q and P as bf16 pairs) stays within fp32 accumulation error.
  for (const int head_dim : {64, 128}) {
    add(absl::StrCat("splitqp_prefill_d", head_dim), prefills, DType::kBF16, head_dim, 16, 2, 4);
    cases.back().split_qp = true;
  }
  add("splitqp_prefill_d128_bs64_g8_noncausal", prefills, DType::kBF16, 128, 64, 1, 8, false);
  cases.back().split_qp = true;
  // The bf16 decode kernel's loads: all by cp.async (no view), and by TMA where a block lies
  // in the view and cp.async elsewhere (blocks are spread over three chunks), tails included.
  const std::vector<SeqShape> decodes = {{1, 1}, {1, 17}, {1, 300}, {1, 1029}, {1, 4100}};
  for (const int block_size : {1, 16, 64}) {
    add(absl::StrCat("decode_bf16_d128_bs", block_size, "_g4_cp_async"), decodes, DType::kBF16, 128,
        block_size, 2, 4);
    cases.back().decode_view = AttentionCase::DecodeView::kNone;
    add(absl::StrCat("decode_bf16_d128_bs", block_size, "_g4_first_chunk_view"), decodes,
        DType::kBF16, 128, block_size, 2, 4);
    cases.back().decode_view = AttentionCase::DecodeView::kFirstChunk;
    if (block_size >= 16) {  // 16-key runs in one block: all of chunk 0 through the view
      add(absl::StrCat("decode_bf16_d128_bs", block_size, "_g4_first_chunk_view_only"), decodes,
          DType::kBF16, 128, block_size, 2, 4);
      cases.back().decode_view = AttentionCase::DecodeView::kFirstChunkCopy;
    }
  }
  // Contexts split and merged in the kernel at split-slice counts the backend picks for
  // various batches (2 to 8; 17, of which a 4k context takes one merge batch, 16), on CUDA
  // cores and tensor cores (cp.async, and TMA boxes with head subgroups): contexts too short
  // for more than one split, and 1029 and 4100 keys, whose last splits end inside an
  // iteration.
  for (const int splits : {2, 3, 5, 8, 17}) {
    add(absl::StrCat("decode_f32_d64_bs16_g8_splits", splits), decodes, DType::kF32, 64, 16, 2, 8);
    cases.back().decode_view = AttentionCase::DecodeView::kNone;
    cases.back().decode_splits = splits;
    add(absl::StrCat("decode_bf16_d128_bs16_g4_splits", splits, "_cp_async"), decodes, DType::kBF16,
        128, 16, 2, 4);
    cases.back().decode_view = AttentionCase::DecodeView::kNone;
    cases.back().decode_splits = splits;
    add(absl::StrCat("decode_bf16_d128_bs1_g12_splits", splits, "_first_chunk_view"), decodes,
        DType::kBF16, 128, 1, 1, 12);
    cases.back().decode_view = AttentionCase::DecodeView::kFirstChunk;
    cases.back().decode_splits = splits;
  }
  // Contexts cut into main and tail splits (DecodeWorkspace::tail_splits): tails half, a
  // quarter and an eighth of a main split, fewer and more than the mains, on CUDA cores and
  // TMA boxes; with the tail minimum at 0 a context takes tails whenever its granules outnumber
  // the mains (1 and 17 keys never, 300 in some cases, 1029 and 4100 keys some or all of them).
  struct Tails {
    int splits, tails, divisor;
  };
  for (const Tails t : {Tails{3, 2, 2}, Tails{6, 2, 4}, Tails{12, 8, 8}, Tails{24, 16, 4}}) {
    const std::string suffix =
        absl::StrCat("_splits", t.splits, "_tails", t.tails, "_divisor", t.divisor);
    auto set_tails = [&](AttentionCase::DecodeView view) {
      cases.back().decode_view = view;
      cases.back().decode_splits = t.splits;
      cases.back().decode_tails = t.tails;
      cases.back().decode_tail_divisor = t.divisor;
    };
    add(absl::StrCat("decode_f32_d64_bs16_g8", suffix), decodes, DType::kF32, 64, 16, 2, 8);
    set_tails(AttentionCase::DecodeView::kNone);
    add(absl::StrCat("decode_bf16_d128_bs16_g4", suffix, "_first_chunk_view"), decodes,
        DType::kBF16, 128, 16, 2, 4);
    set_tails(AttentionCase::DecodeView::kFirstChunk);
  }
  // Traced launches of the TMA kernel (the outputs must not change either): split and merged
  // with head subgroups, and unsplit.
  add("decode_bf16_d128_bs16_g12_splits5_traced", decodes, DType::kBF16, 128, 16, 1, 12);
  cases.back().decode_view = AttentionCase::DecodeView::kFirstChunk;
  cases.back().decode_splits = 5;
  cases.back().trace = true;
  add("decode_bf16_d128_bs16_g4_traced", decodes, DType::kBF16, 128, 16, 2, 4);
  cases.back().decode_view = AttentionCase::DecodeView::kFirstChunk;
  cases.back().trace = true;
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) {
                           return info.param.name;
                         });

using PagedAttentionLimitsTest = GpuVsCpuTest;

// Params of one sequence over one chunk, `*chunk_table` its table, whose pointers are never
// dereferenced: every call made with them must be refused first. Arrays are given (never read
// either), so that each call fails on the field it changes.
PagedAttentionParams RefusedParams(void** chunk_table) {
  PagedAttentionParams p;
  *chunk_table = reinterpret_cast<void*>(16);
  float* const no_floats = reinterpret_cast<float*>(16);
  int32_t* const no_ints = reinterpret_cast<int32_t*>(16);
  p.out = no_floats;
  p.q = no_floats;
  p.q_indptr = p.blocks.indptr = p.blocks.indices = p.blocks.last_block_len = no_ints;
  p.cache.chunks = chunk_table;
  p.cache.num_chunks = 1;
  p.cache.num_kv_heads = 1;
  p.cache.block_size = 16;
  p.blocks.num_seqs = 1;
  return p;
}

// RefusedParams shaped for the decode kernels' entry points: head_dim 128, a group of
// 4 query heads, KV in `dtype`.
PagedAttentionParams RefusedDecodeParams(void** chunk_table, DType dtype) {
  PagedAttentionParams p = RefusedParams(chunk_table);
  p.cache.head_dim = 128;
  p.cache.dtype = dtype;
  p.num_q_heads = 4;
  return p;
}

TEST_F(PagedAttentionLimitsTest, UnsupportedHeadDimAndBlockSizeAreRejected) {
  void* chunk_table = nullptr;
  PagedAttentionParams p = RefusedParams(&chunk_table);
  p.cache.head_dim = 96;
  p.cache.dtype = DType::kBF16;
  p.cache.block_bytes = 16 * 96 * 2;
  p.num_q_heads = 1;
  p.q_stride = p.out_stride = 96;
  EXPECT_EQ(gpu().PagedAttention(p).code(), absl::StatusCode::kUnimplemented);
  p.cache.head_dim = 64;
  p.cache.block_size = 24;
  p.cache.block_bytes = 24 * 64 * 2;
  p.q_stride = p.out_stride = 64;
  EXPECT_EQ(gpu().PagedAttention(p).code(), absl::StatusCode::kInvalidArgument);
  p.cache.dtype = DType::kInt4;
  EXPECT_EQ(gpu().PagedAttention(p).code(), absl::StatusCode::kUnimplemented);
  // A bf16 copy of Q with rows shorter than num_q_heads * head_dim.
  p.cache.dtype = DType::kBF16;
  p.cache.block_size = 16;
  p.cache.block_bytes = 16 * 64 * 2;
  p.q_bf16 = chunk_table;
  p.q_bf16_stride = 63;
  const absl::Status short_rows = gpu().PagedAttention(p);
  EXPECT_EQ(short_rows.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_rows.message().find("q_bf16_stride"), std::string::npos) << short_rows;
  EXPECT_TRUE(gpu().Synchronize().ok());
}

// Only the TMA kernel (bf16 KV, head_dim 128, a KvRowMap) is traced: a traced launch of any
// other is refused before anything runs.
TEST_F(PagedAttentionLimitsTest, TracedLaunchesOnlyOnTheTmaKernel) {
  void* chunk_table = nullptr;
  PagedAttentionParams p = RefusedDecodeParams(&chunk_table, DType::kF32);
  cuda::DecodeTraceRecord record;
  cuda::DecodeWorkspace ws;
  ws.trace = &record;
  EXPECT_EQ(cuda::LaunchDecodeAttention(p, ws, gpu().stream()), cudaErrorInvalidValue);  // f32
  p.cache.dtype = DType::kBF16;
  EXPECT_EQ(cuda::LaunchDecodeAttention(p, ws, gpu().stream()), cudaErrorInvalidValue);  // no map
  p.cache.head_dim = 64;
  const cuda::KvRowMap rows =
      gpu().UpdatedKvRows() != nullptr ? *gpu().UpdatedKvRows() : cuda::KvRowMap{};
  EXPECT_EQ(cuda::LaunchDecodeAttention(p, ws, gpu().stream(), &rows), cudaErrorInvalidValue);
  p.cache.head_dim = 128;
  const char* name = "";
  EXPECT_EQ(cuda::LaunchDecodeAttentionVariant(p, ws, 0, &rows, gpu().stream(), &name),
            cudaErrorInvalidValue);
  EXPECT_TRUE(gpu().Synchronize().ok());
}

// Tail splits need a main slice beside them, a divisor and a minimum of no keys or more: any
// other workspace is refused before anything runs, by both entry points.
TEST_F(PagedAttentionLimitsTest, RefusesTailSplitsWithoutRoom) {
  void* chunk_table = nullptr;
  const PagedAttentionParams p = RefusedDecodeParams(&chunk_table, DType::kBF16);
  int32_t arrivals = 0;
  float partials = 0.0f;
  const auto bad = [&](int max_splits, int tail_splits, int divisor, int min_keys) {
    cuda::DecodeWorkspace ws;
    ws.max_splits = max_splits;
    ws.tail_splits = tail_splits;
    ws.tail_divisor = divisor;
    ws.tail_min_keys = min_keys;
    ws.arrivals = &arrivals;
    ws.partial_out = ws.partial_lse = &partials;
    const char* name = "";
    return cuda::LaunchDecodeAttention(p, ws, gpu().stream()) == cudaErrorInvalidValue &&
           cuda::LaunchDecodeAttentionVariant(p, ws, 0, nullptr, gpu().stream(), &name) ==
               cudaErrorInvalidValue;
  };
  EXPECT_TRUE(bad(4, 4, 8, 0));  // no main slice left
  EXPECT_TRUE(bad(1, 1, 8, 0));
  EXPECT_TRUE(bad(4, -1, 8, 0));
  EXPECT_TRUE(bad(4, 2, 0, 0));   // divisor
  EXPECT_TRUE(bad(4, 2, 8, -1));  // minimum
  EXPECT_TRUE(gpu().Synchronize().ok());
}

// A causal chunk longer than its context (q_len 40 over 8 keys: its first 32 rows see no key)
// breaks PagedAttentionParams' contract, and the CPU reference refuses it; the CUDA backend,
// whose block tables are in device memory, cannot. Its prefill kernels then write zeros for the
// rows that see no key, attend the others as usual, and leave the rest of the batch intact: an
// item with no key tile must leave no copy in flight (the mma kernel's buffer 0 is the next
// item's) nor skip the barrier that guards the work counter's slot (the wide kernel). One CTA
// takes every item in turn, the keyless ones just before the next sequence's.
TEST_F(PagedAttentionLimitsTest, RowsThatSeeNoKeyAreZerosAndLeaveTheBatchIntact) {
  const std::vector<SeqShape> gpu_seqs = {{64, 64}, {40, 8}, {100, 300}};
  constexpr int kKeyless = 32;  // rows 64 .. 95 of the GPU batch see no key
  constexpr int kKeylessBegin = 64;
  constexpr int kHeadDim = 128, kKvHeads = 2, kGroup = 4, kQHeads = kKvHeads * kGroup;
  constexpr int kRow = kQHeads * kHeadDim;  // q and out rows: dense
  struct Mode {
    const char* name;
    DType dtype;
    cuda::MmaPrecision precision;
    bool allow_wgmma;
    double rtol, atol;
  };
  std::vector<Mode> modes = {
      {"f32", DType::kF32, cuda::MmaPrecision::kSplit, false, kExactRtol, kExactAtol},
      {"bf16 split", DType::kBF16, cuda::MmaPrecision::kSplit, false, kExactRtol, kExactAtol},
      {"bf16 wide", DType::kBF16, cuda::MmaPrecision::kBf16, false, kBf16PrefillRtol,
       kBf16PrefillAtol}};
  if (cuda::HopperPrefillSupported()) {
    modes.push_back({"bf16 wgmma", DType::kBF16, cuda::MmaPrecision::kBf16, true, kBf16PrefillRtol,
                     kBf16PrefillAtol});
  }
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.name);
    ArenaShape shape;
    shape.num_kv_heads = kKvHeads;
    shape.head_dim = kHeadDim;
    shape.block_size = 16;
    shape.chunk_shift = 5;  // 32 blocks: 4 + 1 + 19 needed
    shape.num_chunks = 1;
    shape.gpu_dtype = mode.dtype;
    TwinArena arena(cpu(), gpu(), shape);
    const std::vector<int32_t> ids = arena.ShuffledBlockIds(7);

    // The GPU's block tables and every token's slot; the CPU's batch is the same but for the
    // second sequence, which keeps only its 8 rows that see keys (a valid {8, 8} chunk).
    std::vector<int32_t> indptr = {0}, indices, last_block_len, gpu_q_indptr = {0};
    std::vector<int64_t> slots;
    for (const SeqShape& seq : gpu_seqs) {
      const int num_blocks = (seq.kv_len + 15) / 16;
      for (int b = 0; b < num_blocks; ++b) indices.push_back(ids[indices.size()]);
      for (int t = 0; t < seq.kv_len; ++t) {
        slots.push_back(int64_t{indices[indptr.back() + t / 16]} * 16 + t % 16);
      }
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last_block_len.push_back(seq.kv_len - (num_blocks - 1) * 16);
      gpu_q_indptr.push_back(gpu_q_indptr.back() + seq.q_len);
    }
    const std::vector<int32_t> cpu_q_indptr = {0, 64, 72, 172};
    const int gpu_rows = gpu_q_indptr.back();
    const int cpu_rows = cpu_q_indptr.back();

    std::vector<float> k = RandomFloats(slots.size() * kKvHeads * kHeadDim, 11);
    std::vector<float> v = RandomFloats(slots.size() * kKvHeads * kHeadDim, 12);
    if (mode.dtype == DType::kBF16) {
      k = RoundBf16(k);
      v = RoundBf16(v);
    }
    const std::vector<float> gpu_q = RandomFloats(size_t(gpu_rows) * kRow, 13, -3, 3);
    std::vector<float> cpu_q(gpu_q.begin(), gpu_q.begin() + size_t(kKeylessBegin) * kRow);
    cpu_q.insert(cpu_q.end(), gpu_q.begin() + size_t(kKeylessBegin + kKeyless) * kRow, gpu_q.end());

    auto run = [&](Backend& b, const KvCacheView& view, const std::vector<float>& q,
                   const std::vector<int32_t>& q_indptr, DeviceBuffer& out) {
      const DeviceBuffer dk = Upload(b, k), dv = Upload(b, v), dslots = Upload(b, slots);
      AppendKvParams a{.cache = view,
                       .k = dk.as<float>(),
                       .v = dv.as<float>(),
                       .slot_mapping = dslots.as<int64_t>(),
                       .num_tokens = static_cast<int32_t>(slots.size()),
                       .k_stride = kKvHeads * kHeadDim,
                       .v_stride = kKvHeads * kHeadDim};
      OrDie(b.AppendKv(a), "AppendKv");
      const DeviceBuffer dq = Upload(b, q), dq_indptr = Upload(b, q_indptr),
                         dindptr = Upload(b, indptr), dindices = Upload(b, indices),
                         dlast = Upload(b, last_block_len);
      out = Poisoned(b, q.size() * sizeof(float));
      PagedAttentionParams p;
      p.out = out.as<float>();
      p.q = dq.as<float>();
      p.q_indptr = dq_indptr.as<int32_t>();
      p.cache = view;
      p.blocks = {.indptr = dindptr.as<int32_t>(),
                  .indices = dindices.as<int32_t>(),
                  .last_block_len = dlast.as<int32_t>(),
                  .num_seqs = static_cast<int32_t>(q_indptr.size() - 1)};
      p.num_q_heads = kQHeads;
      p.q_stride = p.out_stride = kRow;
      p.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      if (&b == &cpu()) {
        OrDie(b.PagedAttention(p), "CPU PagedAttention");
        return;
      }
      DeviceBuffer tile_indptr = Poisoned(b, sizeof(int32_t) * (p.blocks.num_seqs + 1));
      ASSERT_EQ(cuda::LaunchPrefillAttention(p, tile_indptr.as<int32_t>(), /*num_ctas=*/1,
                                             gpu().stream(), mode.precision, mode.allow_wgmma),
                cudaSuccess);
      OrDie(b.Synchronize(), "Synchronize");  // before the inputs are freed
    };
    DeviceBuffer cpu_out, gpu_out;
    run(cpu(), arena.CpuView(/*layer=*/0), cpu_q, cpu_q_indptr, cpu_out);
    run(gpu(), arena.GpuView(/*layer=*/0), gpu_q, gpu_q_indptr, gpu_out);
    const std::vector<float> got = DownloadFloats(gpu(), gpu_out.data(), size_t(gpu_rows) * kRow);
    const std::vector<float> want = DownloadFloats(cpu(), cpu_out.data(), size_t(cpu_rows) * kRow);

    const auto keyless_begin = got.begin() + size_t(kKeylessBegin) * kRow;
    const auto keyless_end = keyless_begin + size_t(kKeyless) * kRow;
    EXPECT_TRUE(std::all_of(keyless_begin, keyless_end, [](float x) { return x == 0.0f; }))
        << "rows that see no key are not all zeros";
    std::vector<float> attended(got.begin(), keyless_begin);
    attended.insert(attended.end(), keyless_end, got.end());
    EXPECT_TRUE(AllClose(attended, want, mode.rtol, mode.atol)) << "rows that see keys";
  }
}

// The backend reads a bf16 copy of Q where its Hopper prefill runs, and only there.
TEST_F(PagedAttentionLimitsTest, ReadsBf16QOnlyWhereTheHopperPrefillRuns) {
  EXPECT_EQ(gpu().ReadsBf16Q(128), cuda::HopperPrefillSupported());
  EXPECT_FALSE(gpu().ReadsBf16Q(64));
  EXPECT_FALSE(cpu().ReadsBf16Q(128));
}

// The decode split policy is host code: these run without a GPU too (ctest's
// gpu.decode_split_policy_test). Shapes: an H200's 132 SMs, 2 decode CTAs each (264 slots).
TEST(DecodeSplitPolicyTest, FillsOneWaveOfResidentCtasRoundedDown) {
  EXPECT_EQ(cuda::DecodeMaxSplits(8, 8, 4, 132), 4);   // 64 CTAs a split
  EXPECT_EQ(cuda::DecodeMaxSplits(11, 8, 4, 132), 3);  // 88 CTAs: 3 fill the slots exactly
  EXPECT_EQ(cuda::DecodeMaxSplits(2, 8, 4, 132), 16);  // 16 CTAs: 16.5 rounded down
  EXPECT_EQ(cuda::DecodeMaxSplits(1, 8, 4, 101), 25);  // 202 slots: 25.25 rounded down
}

TEST(DecodeSplitPolicyTest, BeyondOneMergeBatchStaysOneCtaShortOfAFullWave) {
  EXPECT_EQ(cuda::DecodeMaxSplits(1, 8, 4, 132), 32);  // 33 would fill all 264 slots
  EXPECT_EQ(cuda::DecodeMaxSplits(1, 4, 4, 132), 65);  // not 66
}

TEST(DecodeSplitPolicyTest, AddsTailSlicesUpToOneMergeBatch) {
  EXPECT_EQ(cuda::DecodeTailSplits(1), 0);   // an unsplit batch stays unsplit
  EXPECT_EQ(cuda::DecodeTailSplits(2), 2);   // 16 x 16k
  EXPECT_EQ(cuda::DecodeTailSplits(4), 4);   // 8 x 4k
  EXPECT_EQ(cuda::DecodeTailSplits(8), 8);   // 4 x 128k
  EXPECT_EQ(cuda::DecodeTailSplits(11), 5);  // 16 slices in all
  EXPECT_EQ(cuda::DecodeTailSplits(16), 0);
  EXPECT_EQ(cuda::DecodeTailSplits(32), 0);  // batch 1: most slices idle at short contexts
  EXPECT_EQ(cuda::DecodeTailSplits(128), 0);
}

TEST(DecodeSplitPolicyTest, CountsHeadSubgroupsAndClamps) {
  EXPECT_EQ(cuda::DecodeMaxSplits(1, 1, 12, 132), 128);  // 2 subgroups of 8 heads: 131 -> 128
  EXPECT_EQ(cuda::DecodeMaxSplits(32, 8, 4, 132), 1);    // the batch fills the device alone
  EXPECT_EQ(cuda::DecodeMaxSplits(300, 8, 4, 132), 1);
  EXPECT_EQ(cuda::DecodeMaxSplits(0, 8, 4, 132), 1);
}

// A batch of num_seqs decode rows over a cache of `dtype` with 8 KV heads of head_dim and
// GQA groups of `group`, promising max_kv_len (DecodeLaunchSlices reads only these).
PagedAttentionParams SlicesBatch(int num_seqs, DType dtype, int head_dim, int group,
                                 int max_kv_len) {
  PagedAttentionParams p;
  p.blocks.num_seqs = num_seqs;
  p.cache.dtype = dtype;
  p.cache.head_dim = head_dim;
  p.cache.num_kv_heads = 8;
  p.num_q_heads = 8 * group;
  p.max_kv_len = max_kv_len;
  return p;
}

// (slices, tail slices) DecodeLaunchSlices gives for SlicesBatch(...) on an H200's 132 SMs.
std::pair<int, int> LaunchSlices(int num_seqs, DType dtype, int head_dim, int group,
                                 int max_kv_len) {
  const cuda::DecodeSlices s =
      cuda::DecodeLaunchSlices(SlicesBatch(num_seqs, dtype, head_dim, group, max_kv_len), 132);
  return {s.max_splits, s.tail_splits};
}

// PlanSplits' cut of a kv_len-key context over `slices` slices, `tails` of them for tails,
// with the workspace's defaults.
cuda::decode::SplitPlan DefaultCut(int kv_len, int slices, int tails, int granule) {
  const cuda::DecodeWorkspace defaults;
  return cuda::decode::PlanSplits(kv_len, slices, granule, defaults.min_split_granules, tails,
                                  defaults.tail_divisor, defaults.tail_min_keys);
}

bool SameCut(const cuda::decode::SplitPlan& a, const cuda::decode::SplitPlan& b) {
  return a.num_splits == b.num_splits && a.main_splits == b.main_splits &&
         a.main_len == b.main_len && a.tail_len == b.tail_len;
}

// Without a promise, the full grid: DecodeMaxSplits' main slices and DecodeTailSplits' tails.
TEST(DecodeSplitPolicyTest, WithoutAKvLengthPromiseLaunchesEverySlice) {
  using S = std::pair<int, int>;
  EXPECT_EQ(LaunchSlices(1, DType::kBF16, 128, 4, 0), S(32, 0));
  EXPECT_EQ(LaunchSlices(8, DType::kBF16, 128, 4, 0), S(8, 4));
  EXPECT_EQ(LaunchSlices(64, DType::kBF16, 128, 4, 0), S(1, 0));
  EXPECT_EQ(LaunchSlices(1, DType::kF32, 128, 4, 0), S(32, 0));
}

// With one, the main slices the longest context wants (bf16, head_dim 128: granules of 64
// keys, 16 splits up to 8k keys, then one more per 512), and the tails only where it takes
// them (8 x 4k's splits are too short for any; 4 x 128k's and 16 x 16k's are not).
TEST(DecodeSplitPolicyTest, AKvLengthPromiseLeavesOutSlicesNoContextUses) {
  using S = std::pair<int, int>;
  auto slices = [](int num_seqs, int max_kv_len) {
    return LaunchSlices(num_seqs, DType::kBF16, 128, 4, max_kv_len);
  };
  EXPECT_EQ(slices(1, 1), S(1, 0));
  EXPECT_EQ(slices(1, 512), S(8, 0));
  EXPECT_EQ(slices(1, 4096), S(16, 0));
  EXPECT_EQ(slices(1, 12288), S(24, 0));
  EXPECT_EQ(slices(1, 32768), S(32, 0));
  EXPECT_EQ(slices(8, 4096), S(4, 0));
  EXPECT_EQ(slices(8, 100), S(2, 0));
  EXPECT_EQ(slices(16, 16384), S(4, 2));
  EXPECT_EQ(slices(4, 131072), S(16, 8));
  EXPECT_EQ(slices(64, 4096), S(1, 0));
  // Past what PlanSplits takes, no promise.
  EXPECT_EQ(slices(1, cuda::decode::kMaxPlannedKeys), S(32, 0));
}

// SlicesForContexts, for every main split count a grid can have beside DecodeTailSplits'
// tails, granules of 32 to 128 keys and the workspace's tail parameters: every context up to
// the promised length is cut as over the full grid. Among them, a grid of 15 main slices and 1
// tail at granules of 128: a promise of 124032 keys goes into the tail branch without ending
// in a tail, and a context of 123904 keys ends in one.
TEST(DecodeSplitPolicyTest, SlicesForContextsChangeNoCutAtAnyGranule) {
  const cuda::DecodeWorkspace defaults;
  {
    const cuda::decode::PromisedSlices s = cuda::decode::SlicesForContexts(
        124032, 15, 1, 128, defaults.min_split_granules, defaults.tail_min_keys);
    EXPECT_EQ(s.slices, 16);
    EXPECT_EQ(s.tail_slices, 1);
    EXPECT_TRUE(
        SameCut(DefaultCut(123904, 16, 1, 128), DefaultCut(123904, s.slices, s.tail_slices, 128)));
    EXPECT_EQ(DefaultCut(123904, 16, 1, 128).num_splits, 16);  // it does end in a tail
  }
  for (const int granule : {32, 64, 128}) {
    for (int main_splits = 1; main_splits <= 128; ++main_splits) {
      const int tails = cuda::DecodeTailSplits(main_splits);
      for (int promise = 1; promise <= 300000; promise += promise < 20000 ? 211 : 4999) {
        const cuda::decode::PromisedSlices s =
            cuda::decode::SlicesForContexts(promise, main_splits, tails, granule,
                                            defaults.min_split_granules, defaults.tail_min_keys);
        ASSERT_LE(s.slices, main_splits + tails);
        for (int kv_len = 1; kv_len <= promise; kv_len += 1 + kv_len / 8) {
          ASSERT_TRUE(SameCut(DefaultCut(kv_len, main_splits + tails, tails, granule),
                              DefaultCut(kv_len, s.slices, s.tail_slices, granule)))
              << "granule " << granule << ", " << main_splits << " + " << tails
              << " slices, promise " << promise << ", kv_len " << kv_len;
        }
      }
    }
  }
}

// The promise changes no context's cut: every context up to the promised length is cut
// (PlanSplits, with the workspace's defaults) as in the full grid, for both kernels' granules
// and batches with and without tail slices; a longer one, breaking it, still gets a cut that
// covers it within the launched slices.
TEST(DecodeSplitPolicyTest, AKvLengthPromiseChangesNoContextsCut) {
  struct Kernel {
    DType dtype;
    int head_dim, group, granule;
  };
  const Kernel kernels[] = {
      {DType::kBF16, 128, 4, cuda::DecodeMmaSplitGranule(128)},
      {DType::kF32, 128, 8, cuda::DecodeSimtSplitGranule(DType::kF32, 128, 8)},
      {DType::kF32, 64, 1, cuda::DecodeSimtSplitGranule(DType::kF32, 64, 1)},
  };
  auto cut = [](int kv_len, const cuda::DecodeSlices& s, int granule) {
    return DefaultCut(kv_len, s.max_splits, s.tail_splits, granule);
  };
  for (const Kernel& k : kernels) {
    ASSERT_GT(k.granule, 0);
    for (const int num_seqs : {1, 2, 4, 8, 16}) {
      const cuda::DecodeSlices full =
          cuda::DecodeLaunchSlices(SlicesBatch(num_seqs, k.dtype, k.head_dim, k.group, 0), 132);
      for (int promise = 1; promise <= 300000; promise += promise < 20000 ? 97 : 1999) {
        SCOPED_TRACE(testing::Message() << "granule " << k.granule << ", " << num_seqs
                                        << " sequences, max_kv_len " << promise);
        const cuda::DecodeSlices trimmed = cuda::DecodeLaunchSlices(
            SlicesBatch(num_seqs, k.dtype, k.head_dim, k.group, promise), 132);
        ASSERT_LE(trimmed.max_splits, full.max_splits);
        for (int kv_len = 1; kv_len <= promise; kv_len += 1 + kv_len / 16) {
          const cuda::decode::SplitPlan a = cut(kv_len, full, k.granule);
          const cuda::decode::SplitPlan b = cut(kv_len, trimmed, k.granule);
          ASSERT_TRUE(SameCut(a, b))
              << "kv_len " << kv_len << ": " << b.num_splits << " splits of " << b.main_len
              << " keys against " << a.num_splits << " of " << a.main_len;
        }
        const int longer = 2 * promise + 1000;  // a broken promise
        const cuda::decode::SplitPlan c = cut(longer, trimmed, k.granule);
        ASSERT_LE(c.num_splits, trimmed.max_splits);
        ASSERT_GE(c.Begin(c.num_splits - 1) + c.Len(c.num_splits - 1), longer);
      }
    }
  }
}

}  // namespace
}  // namespace kvd::gpu_test
