#include "kernels/cpu_paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/kv_addressing.h"
#include "kernels/kv_quant.h"

namespace kvd {
namespace {

constexpr int kLanes = 8;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
// Score or value multiply-adds a parallel chunk should hold at least.
constexpr int64_t kMinChunkWork = int64_t{1} << 15;

// Vectors go through pointers and references only: these helpers are always inlined,
// and a by-value vector would change the ABI between the generic and AVX2 builds.
inline void LoadVec(const float* p, Vec* v) { std::memcpy(v, p, sizeof(*v)); }

// Dot product in a fixed order: 8 lane sums, a fixed reduction tree, then the tail.
inline float Dot(const float* a, const float* b, int n) {
  Vec acc{};
  const int n_main = n - n % kLanes;
  for (int i = 0; i < n_main; i += kLanes) {
    Vec x, y;
    LoadVec(a + i, &x);
    LoadVec(b + i, &y);
    acc += x * y;
  }
  float tail = 0.0f;
  for (int i = n_main; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail;
}

int64_t KvLen(const BlockTableView& b, int32_t block_size, int32_t s) {
  return int64_t{b.indptr[s + 1] - b.indptr[s] - 1} * block_size + b.last_block_len[s];
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", what));
}

absl::Status Validate(const PagedAttentionParams& p) {
  if (p.blocks.num_seqs < 0) return Invalid(absl::StrCat("blocks.num_seqs is ", p.blocks.num_seqs));
  if (p.blocks.num_seqs == 0) return absl::OkStatus();
  if (absl::Status s = ValidateKvCacheView("PagedAttention", p.cache); !s.ok()) return s;
  if (absl::Status s = ValidatePagedAttentionArgs(p); !s.ok()) return s;
  const BlockTableView& b = p.blocks;
  if (p.q_indptr[0] < 0 || b.indptr[0] < 0) return Invalid("q_indptr[0] or blocks.indptr[0] < 0");
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    // Compared before subtracting: a decrease to a large negative entry would wrap the
    // difference to a positive length.
    if (p.q_indptr[s + 1] < p.q_indptr[s]) {
      return Invalid(absl::StrCat("q_indptr decreases at sequence ", s));
    }
    if (b.indptr[s + 1] < b.indptr[s]) {
      return Invalid(absl::StrCat("blocks.indptr decreases at sequence ", s));
    }
    // Both entries are in [0, INT32_MAX] (entry 0 is checked above), so these fit.
    const int32_t q_len = p.q_indptr[s + 1] - p.q_indptr[s];
    const int32_t num_blocks = b.indptr[s + 1] - b.indptr[s];
    for (int32_t i = b.indptr[s]; i < b.indptr[s + 1]; ++i) {
      if (absl::Status st =
              ValidateBlockId("PagedAttention", "blocks.indices", b.indices[i], p.cache.chunks,
                              p.cache.num_chunks, p.cache.chunk_shift);
          !st.ok()) {
        return st;
      }
    }
    // A device backend skips work the promise rules out, so the reference holds callers to it.
    if (p.max_q_len > 0 && q_len > p.max_q_len) {
      return Invalid(absl::StrCat("sequence ", s, " has q_len ", q_len, " > max_q_len ",
                                  p.max_q_len, " (the batch's promise)"));
    }
    if (q_len == 0) continue;
    if (num_blocks == 0) return Invalid(absl::StrCat("sequence ", s, " has queries but no blocks"));
    if (b.last_block_len[s] < 1 || b.last_block_len[s] > p.cache.block_size) {
      return Invalid(absl::StrCat("blocks.last_block_len[", s, "] is ", b.last_block_len[s],
                                  ", not in [1, block_size=", p.cache.block_size, "]"));
    }
    const int64_t kv_len = KvLen(b, p.cache.block_size, s);
    if (p.causal && q_len > kv_len) {
      return Invalid(
          absl::StrCat("sequence ", s, " has q_len ", q_len, " > kv_len ", kv_len, " with causal"));
    }
    if (p.max_kv_len > 0 && kv_len > p.max_kv_len) {
      return Invalid(absl::StrCat("sequence ", s, " has kv_len ", kv_len, " > max_kv_len ",
                                  p.max_kv_len, " (the batch's promise)"));
    }
  }
  return absl::OkStatus();
}

// Keys whose softmax weights, and weighted V rows, an fp32 partial sum covers before it joins
// the fp64 total: one running fp32 sum over a long context drifts (1.4e-5 relative over 32k
// and 128k keys of offset values), a tile's stays near fp32's own rounding.
constexpr int64_t kTileKeys = 64;

// One thread's scratch for AttendGroup, sized for the batch's longest context, its GQA group
// and head_dim.
struct AttendScratch {
  AttendScratch(int64_t max_kv_len, int32_t group, int32_t block_size, int32_t head_dim)
      : scores(max_kv_len * group),
        max_score(group),
        sum(group),
        partial(int64_t{group} * head_dim),
        total(int64_t{group} * head_dim),
        rows(int64_t{block_size} * head_dim) {}
  std::vector<float> scores;     // [group][max_kv_len]: scores, then unnormalized weights
  std::vector<float> max_score;  // [group]
  std::vector<double> sum;       // [group]: the softmax weights' sums
  std::vector<float> partial;    // [group][head_dim]: the current tile's weighted V sums
  std::vector<double> total;     // [group][head_dim]: the finished tiles' weighted V sums
  std::vector<float> rows;       // [block_size][head_dim]: a quantized block's rows, as floats
};

// The first n rows of `head` in `block` (a block of the view's K or V region) as floats: the
// stored rows of an f32 cache; an int8 cache's dequantized into `rows` (the same values an f32
// cache holding them would give, so the arithmetic after this is the f32 path's).
const float* BlockRows(const KvCacheView& c, char* block, int32_t head, int64_t n, float* rows) {
  if (c.dtype != DType::kInt8) return F32BlockHead(c, block, head);
  const int8_t* q = Int8BlockHead(c, block, head);
  const float* scales = Int8BlockScales(c, block, head);
  for (int64_t i = 0; i < n; ++i) {
    for (int32_t d = 0; d < c.head_dim; ++d) {
      rows[i * c.head_dim + d] = DequantizeInt8Kv(q[i * c.head_dim + d], scales[i]);
    }
  }
  return rows;
}

// Attention of one query row of sequence `seq` (row `j` of its q_len) for the `group` query
// heads of KV head `kv_head`. Each K and V row is read once for the whole group, and each
// head's arithmetic is done in the same order as for a group of one.
void AttendGroup(const PagedAttentionParams& p, int32_t seq, int64_t row, int64_t j,
                 int32_t kv_head, int32_t group, AttendScratch& scratch) {
  const KvCacheView& c = p.cache;
  const int32_t hd = c.head_dim;
  const int32_t bs = c.block_size;
  const int64_t q_len = p.q_indptr[seq + 1] - p.q_indptr[seq];
  const int64_t kv_len = KvLen(p.blocks, bs, seq);
  const int64_t num_visible = p.causal ? kv_len - q_len + j + 1 : kv_len;
  const int32_t* table = p.blocks.indices + p.blocks.indptr[seq];
  const int64_t first_head = int64_t{kv_head} * group;
  const float* q = p.q + row * p.q_stride + first_head * hd;
  float* out = p.out + row * p.out_stride + first_head * hd;
  const int64_t scores_stride = static_cast<int64_t>(scratch.scores.size()) / group;
  float* max_score = scratch.max_score.data();
  double* sum = scratch.sum.data();

  // Pass 1: scaled scores, block by block, every head of the group on each K row.
  std::fill(max_score, max_score + group, -INFINITY);
  for (int64_t t0 = 0; t0 < num_visible; t0 += bs) {
    const int64_t n = std::min<int64_t>(bs, num_visible - t0);
    const float* k = BlockRows(c, KeyBlock(c, table[t0 / bs]), kv_head, n, scratch.rows.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int32_t g = 0; g < group; ++g) {
        const float s = Dot(q + int64_t{g} * hd, k + i * hd, hd) * p.sm_scale;
        scratch.scores[g * scores_stride + t0 + i] = s;
        max_score[g] = std::max(max_score[g], s);
      }
    }
  }
  // Softmax weights with the max subtracted, so exp never overflows; normalized at the end.
  for (int32_t g = 0; g < group; ++g) {
    float* scores = scratch.scores.data() + g * scores_stride;
    sum[g] = 0.0;
    for (int64_t t0 = 0; t0 < num_visible; t0 += kTileKeys) {
      const int64_t t_end = std::min(num_visible, t0 + kTileKeys);
      float tile_sum = 0.0f;
      for (int64_t t = t0; t < t_end; ++t) {
        scores[t] = std::exp(scores[t] - max_score[g]);
        tile_sum += scores[t];
      }
      sum[g] += tile_sum;
    }
  }
  // Pass 2: weighted V rows in key order, in tiles of at least kTileKeys keys (whole blocks).
  float* partial = scratch.partial.data();
  double* total = scratch.total.data();
  std::fill(total, total + int64_t{group} * hd, 0.0);
  std::fill(partial, partial + int64_t{group} * hd, 0.0f);
  int64_t tile_keys = 0;
  for (int64_t t0 = 0; t0 < num_visible; t0 += bs) {
    const int64_t n = std::min<int64_t>(bs, num_visible - t0);
    const float* v = BlockRows(c, ValueBlock(c, table[t0 / bs]), kv_head, n, scratch.rows.data());
    for (int64_t i = 0; i < n; ++i) {
      const float* vr = v + i * hd;
      for (int32_t g = 0; g < group; ++g) {
        const float w = scratch.scores[g * scores_stride + t0 + i];
        float* acc = partial + int64_t{g} * hd;
        for (int32_t d = 0; d < hd; ++d) acc[d] += w * vr[d];
      }
    }
    tile_keys += n;
    if (tile_keys >= kTileKeys || t0 + n == num_visible) {
      for (int64_t d = 0; d < int64_t{group} * hd; ++d) total[d] += partial[d];
      std::fill(partial, partial + int64_t{group} * hd, 0.0f);
      tile_keys = 0;
    }
  }
  for (int32_t g = 0; g < group; ++g) {
    const double inv_sum = 1.0 / sum[g];
    for (int32_t d = 0; d < hd; ++d) {
      out[int64_t{g} * hd + d] = static_cast<float>(total[int64_t{g} * hd + d] * inv_sum);
    }
  }
}

}  // namespace

absl::Status CpuPagedAttention(const PagedAttentionParams& p, ThreadPool& pool) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const int32_t num_seqs = p.blocks.num_seqs;
  if (num_seqs == 0) return absl::OkStatus();

  // Rows are q_indptr[0] .. q_indptr[num_seqs]; map each to its sequence.
  const int64_t first_row = p.q_indptr[0];
  const int64_t num_rows = p.q_indptr[num_seqs] - first_row;
  std::vector<int32_t> row_seq(num_rows);
  int64_t max_kv_len = 0;
  int64_t total_work = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = p.q_indptr[s + 1] - p.q_indptr[s];
    if (q_len == 0) continue;
    std::fill(row_seq.begin() + (p.q_indptr[s] - first_row),
              row_seq.begin() + (p.q_indptr[s + 1] - first_row), s);
    const int64_t kv_len = KvLen(p.blocks, p.cache.block_size, s);
    max_kv_len = std::max(max_kv_len, kv_len);
    total_work += q_len * kv_len;
  }
  // One work item a (query row, KV head): its GQA group's query heads.
  const int32_t num_kv_heads = p.cache.num_kv_heads;
  const int32_t group = p.num_q_heads / num_kv_heads;
  const int64_t num_items = num_rows * num_kv_heads;
  if (num_items == 0) return absl::OkStatus();
  const int64_t work_per_item =
      std::max<int64_t>(1, total_work * 2 * p.cache.head_dim * group / num_rows);
  const int64_t grain = std::max<int64_t>(1, kMinChunkWork / work_per_item);
  pool.ParallelFor(num_items, grain, [&](int64_t begin, int64_t end) {
    AttendScratch scratch(max_kv_len, group, p.cache.block_size, p.cache.head_dim);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row = first_row + item / num_kv_heads;
      const int32_t kv_head = static_cast<int32_t>(item % num_kv_heads);
      const int32_t s = row_seq[row - first_row];
      AttendGroup(p, s, row, row - p.q_indptr[s], kv_head, group, scratch);
    }
  });
  return absl::OkStatus();
}

}  // namespace kvd
