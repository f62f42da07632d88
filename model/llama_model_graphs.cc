// LlamaModel's decode graphs: pure-decode steps padded to a power-of-two bucket and
// replayed from a recorded graph while the KV views and scratch stay where they were.

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "model/llama_model.h"

namespace kvd {

namespace {

// Every field, so a graph recorded against one view is never replayed against another
// (a new chunk changes num_chunks even though the table address stays).
bool SameView(const KvCacheView& a, const KvCacheView& b) {
  return a.chunks == b.chunks && a.num_chunks == b.num_chunks && a.chunk_shift == b.chunk_shift &&
         a.k_offset_bytes == b.k_offset_bytes && a.v_offset_bytes == b.v_offset_bytes &&
         a.block_bytes == b.block_bytes && a.scale_offset_bytes == b.scale_offset_bytes &&
         a.dtype == b.dtype && a.num_kv_heads == b.num_kv_heads && a.block_size == b.block_size &&
         a.head_dim == b.head_dim;
}

bool SameViews(absl::Span<const KvCacheView> a, absl::Span<const KvCacheView> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameView(a[i], b[i])) return false;
  }
  return true;
}

// Fixed layout of the decode-graph metadata buffer, in int32 words, for `rows` padded
// sequences (one token each) and `blocks` kv_indices slots. The int64 slot mapping comes
// first so it stays 8-byte aligned:
//
//   | slot_mapping [rows] int64 | token_ids [rows] | positions [rows] | q_indptr [rows+1] |
//   | kv_indptr [rows+1] | kv_last [rows] | logit_rows [rows] | kv_indices [blocks] |
struct GraphBatchLayout {
  explicit GraphBatchLayout(int32_t rows)
      : token_ids(2 * static_cast<size_t>(rows)),
        positions(token_ids + rows),
        q_indptr(positions + rows),
        kv_indptr(q_indptr + rows + 1),
        kv_last(kv_indptr + rows + 1),
        logit_rows(kv_last + rows),
        kv_indices(logit_rows + rows) {}
  size_t token_ids, positions, q_indptr, kv_indptr, kv_last, logit_rows, kv_indices;
};

// log2 of the smallest power of two >= n. REQUIRES: n <= 2^30.
int32_t BucketIndex(int32_t n) {
  int32_t index = 0;
  while ((int32_t{1} << index) < n) ++index;
  return index;
}

// Smallest power of two >= n. REQUIRES: n <= 2^30.
int32_t BucketFor(int32_t n) { return int32_t{1} << BucketIndex(n); }

// A graph promises its attention the longest context of its class: the smallest power of two,
// at least kMinKvClass keys, that holds the batch's longest context. Classes a power of two
// apart keep the graphs recorded as contexts grow to a few (a bucket whose longest context
// grows from 1 to 32k keys records 8); the CUDA backend launches no more attention work for a
// class than for a context of the class's length (PagedAttentionParams::max_kv_len). A class
// whose launch needs a larger attention workspace grows it, which records every graph again
// once (the backend's scratch epoch), as any scratch growth does.
constexpr int32_t kMinKvClass = 256;

}  // namespace

void LlamaModel::SetDecodeGraphs(std::unique_ptr<OpGraphRecorder> recorder,
                                 int32_t max_batch_size) {
  graphs_.clear();
  graph_batch_.Reset();
  graph_block_capacity_ = 0;
  recorder_ = std::move(recorder);
  max_bucket_ = recorder_ != nullptr ? BucketFor(std::max(max_batch_size, 1)) : 0;
}

bool LlamaModel::IsGraphableDecode(const ForwardBatch& batch) const {
  const int32_t n = batch.num_seqs();
  if (n < 1 || n > max_bucket_ || batch.num_tokens() != n ||
      static_cast<int32_t>(batch.logit_rows.size()) != n) {
    return false;
  }
  for (int32_t i = 0; i < n; ++i) {
    if (batch.q_indptr[i + 1] != i + 1 || batch.logit_rows[i] != i) return false;
  }
  return true;
}

absl::Status LlamaModel::ForwardDecodeGraph(const ForwardBatch& batch,
                                            absl::Span<const KvCacheView> layers) {
  const int32_t n = batch.num_seqs();
  const int32_t bucket = BucketFor(n);
  const int32_t pad = bucket - n;

  const int32_t num_blocks = static_cast<int32_t>(batch.kv_indices.size()) + pad;
  const GraphBatchLayout at(max_bucket_);
  if (num_blocks > graph_block_capacity_) {
    // Allocated before the old buffer goes, so that a failure leaves the buffer, its
    // capacity and the graphs recorded against it as they were.
    const int32_t capacity = std::max(2 * num_blocks, 64 * max_bucket_);
    auto buf = backend_->Allocate((at.kv_indices + capacity) * sizeof(int32_t));
    if (!buf.ok()) return buf.status();
    // New addresses: every recorded graph reads the old buffer.
    graphs_.clear();
    graph_batch_ = *std::move(buf);
    graph_block_capacity_ = capacity;
  }

  // Padding rows: token 0 at position 0, no K/V write (kNoSlot), attention over the first
  // key of the first sequence's first block; their logits are computed and ignored.
  std::vector<int32_t> host(at.kv_indices + num_blocks, 0);
  int64_t* slots = reinterpret_cast<int64_t*>(host.data());
  for (int32_t i = 0; i < bucket; ++i) {
    const bool real = i < n;
    slots[i] = real ? batch.slot_mapping[i] : kNoSlot;
    host[at.token_ids + i] = real ? batch.token_ids[i] : 0;
    host[at.positions + i] = real ? batch.positions[i] : 0;
    host[at.q_indptr + i + 1] = i + 1;
    host[at.kv_indptr + i + 1] = real ? batch.kv_indptr[i + 1] : host[at.kv_indptr + i] + 1;
    host[at.kv_last + i] = real ? batch.kv_last_block_len[i] : 1;
    host[at.logit_rows + i] = i;
  }
  std::copy(batch.kv_indices.begin(), batch.kv_indices.end(), host.begin() + at.kv_indices);
  std::fill(host.begin() + at.kv_indices + batch.kv_indices.size(), host.end(),
            batch.kv_indices[0]);
  KVD_RETURN_IF_ERROR(
      backend_->CopyToDevice(graph_batch_.data(), host.data(), host.size() * sizeof(int32_t)));

  const int32_t* base = graph_batch_.as<const int32_t>();
  DeviceBatch d;
  d.slot_mapping = reinterpret_cast<const int64_t*>(base);
  d.token_ids = base + at.token_ids;
  d.positions = base + at.positions;
  d.q_indptr = base + at.q_indptr;
  d.kv_indptr = base + at.kv_indptr;
  d.kv_indices = base + at.kv_indices;
  d.kv_last = base + at.kv_last;
  d.logit_rows = base + at.logit_rows;
  d.num_tokens = d.num_seqs = d.num_logit_rows = bucket;
  d.max_q_len = 1;  // pure decode
  // The padding rows' single key is no longer than any real context. Past 2^30 keys (no
  // int32 power of two above), class 31 and no promise.
  const int32_t longest = std::max(batch.MaxKvLen(layers[0].block_size), kMinKvClass);
  const int32_t kv_class = longest <= (int32_t{1} << 30) ? BucketIndex(longest) : 31;
  d.max_kv_len = kv_class < 31 ? int32_t{1} << kv_class : 0;

  BucketGraph& g = graphs_[{BucketIndex(bucket), kv_class}];
  if (g.graph != nullptr && g.backend_epoch == recorder_->epoch() &&
      g.model_epoch == scratch_epoch_ && SameViews(g.views, layers)) {
    KVD_RETURN_IF_ERROR(g.graph->Launch());
    ++graph_stats_.replays;
    return absl::OkStatus();
  }
  // This step runs uncaptured (which also sizes every backend scratch buffer for the
  // bucket), then the same ops are recorded for the next steps.
  g = BucketGraph{};
  KVD_RETURN_IF_ERROR(Enqueue(d, layers));
  absl::Status recorded = recorder_->BeginCapture();
  if (recorded.ok()) {
    recorded = Enqueue(d, layers);
    auto graph = recorder_->EndCapture();
    if (recorded.ok()) recorded = graph.status();
    if (recorded.ok()) g.graph = *std::move(graph);
  }
  if (!recorded.ok()) {
    // This step's result is already enqueued; later steps run uncaptured.
    ++graph_stats_.capture_failures;
    graph_stats_.last_failure = std::string(recorded.message());
    recorder_.reset();  // `g` dangles from here on
    graphs_.clear();
    max_bucket_ = 0;
    return absl::OkStatus();
  }
  g.views.assign(layers.begin(), layers.end());
  g.backend_epoch = recorder_->epoch();
  g.model_epoch = scratch_epoch_;
  ++graph_stats_.captures;
  return absl::OkStatus();
}

}  // namespace kvd
