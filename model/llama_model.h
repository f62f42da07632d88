#ifndef KVD_MODEL_LLAMA_MODEL_H_
#define KVD_MODEL_LLAMA_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "model/forward_batch.h"
#include "model/model_spec.h"
#include "model/model_weights.h"

namespace kvd {

// One weight tensor as LlamaModel stores it, for factories that make weights in place
// (e.g. seeded random ones generated on the device). Fused tensors are row-concatenated:
// wqkv = [wq; wk; wv], w13 = [w1 (gate); w3 (up)]; matrices are [out_features][fan_in].
struct WeightTensorInfo {
  // Stable id: 0 token_embedding, 1 final_norm, 2 classifier (only when unshared), then
  // 3 + 6 * layer + {0 attn_norm, 1 wqkv, 2 wo, 3 ffn_norm, 4 w13, 5 w2}.
  int32_t index = 0;
  int64_t count = 0;   // values
  int32_t fan_in = 0;  // input features per row (dim for the embedding); 0 for norm weights
};

// Makes `info.count` values of the backend's weight_dtype() in backend memory.
using WeightFactory = absl::FunctionRef<absl::StatusOr<DeviceBuffer>(const WeightTensorInfo& info)>;

// Records the backend ops enqueued between BeginCapture and EndCapture as one replayable
// graph, for backends that can (CUDA graphs; tools/device.h's MakeOpGraphRecorder). Not
// thread safe: the thread driving the backend uses it.
class OpGraphRecorder {
 public:
  // One recorded op sequence. Launch enqueues it again with the same addresses and by-value
  // parameters, reading whatever those addresses hold then.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual absl::Status Launch() = 0;
  };

  virtual ~OpGraphRecorder() = default;
  // Ops after this are recorded, not run; backend copies and waits fail until EndCapture,
  // and so does an op that would grow backend scratch. REQUIRES: not capturing.
  virtual absl::Status BeginCapture() = 0;
  // Ends the capture; call it also after a recorded op failed (the capture then fails).
  virtual absl::StatusOr<std::unique_ptr<Graph>> EndCapture() = 0;
  // Changes whenever backend scratch that recorded ops may use moves; a graph recorded
  // under another epoch must not be launched.
  virtual uint64_t epoch() const = 0;
};

// Counters of LlamaModel's decode graphs, for tests and benchmarks.
struct DecodeGraphStats {
  int64_t captures = 0;  // graphs recorded (first use of a bucket, or re-recorded)
  int64_t replays = 0;   // steps run by launching a recorded graph
  // Recordings that failed; the first failure turns graphs off (steps run uncaptured).
  int64_t capture_failures = 0;
  std::string last_failure;
};

// The Llama decoder (RMSNorm, GQA attention with RoPE, SwiGLU FFN) written against
// Backend. Owns the weights in backend memory and scratch activations, grown on demand.
// K/V live outside, in the paged arena the caller's per-layer views describe. Not thread
// safe: one engine thread calls Forward.
class LlamaModel {
 public:
  // Uploads the weights, freeing each host tensor once it is uploaded: weights moved in
  // (std::move) take at most their size plus one layer's joined Q/K/V or gate/up tensor of
  // host memory while they load, where a copy kept by the caller would double that.
  // `backend` must outlive the model.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(ModelWeights weights, Backend* backend);
  // Weights made by `make`, once per tensor in index order: for synthetic models too large
  // for host fp32 (llama3-8b is 16 GB in bf16). InvalidArgument for an invalid spec or a
  // buffer smaller than the tensor; otherwise the factory's error.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> CreateFromFactory(const ModelSpec& spec,
                                                                       Backend* backend,
                                                                       WeightFactory make);

  const ModelSpec& spec() const { return spec_; }
  // Backend bytes the weights hold (part of backend()->allocated_bytes()): on the CPU
  // spec().NumParameters() fp32 values, on CUDA as many bf16 ones (a factory's buffers may be
  // larger).
  int64_t weight_bytes() const { return weight_bytes_; }
  Backend* backend() const { return backend_; }

  // Runs the batch: writes every token's K/V into `layers` (one view per layer) and stores
  // logits [batch.logit_rows.size()][vocab_size] into *logits on the host.
  // REQUIRES: layers.size() == spec().num_layers; views share block_size and head shape.
  absl::Status Forward(const ForwardBatch& batch, absl::Span<const KvCacheView> layers,
                       std::vector<float>* logits);
  // As Forward, but the logits stay in backend memory: returns [logit_rows.size()]
  // [vocab_size] fp32, valid until the next Forward call. The work is only enqueued (call
  // Backend::Synchronize or copy from the result, which waits, before reading it), so a
  // caller can sample on the device and copy back token ids instead of 128k logits a row.
  absl::StatusOr<const float*> ForwardToDevice(const ForwardBatch& batch,
                                               absl::Span<const KvCacheView> layers);

  // As Forward, but samples on the backend: row i of the logits (logit_rows[i]) is sampled
  // with rows[i] (Backend::Sample) and only the token ids come back, into *tokens. On the
  // CPU backend the tokens equal Sampler::Sample over Forward's logits exactly.
  // REQUIRES: rows.size() == batch.logit_rows.size(); each row's fields in range
  // (SamplingParams::Validate, u in [0, 1)).
  absl::Status ForwardAndSample(const ForwardBatch& batch, absl::Span<const KvCacheView> layers,
                                absl::Span<const SamplingRow> rows, std::vector<int32_t>* tokens);

  // Runs pure-decode batches (one new token per sequence, logits for every row in order)
  // of up to `max_batch_size` sequences as recorded graphs, one per batch-size bucket (1, 2,
  // 4, ... up to max_batch_size rounded up to a power of two) and context class (the longest
  // context rounded up to a power of two of at least 256 keys, which the graph promises its
  // attention as PagedAttentionParams::max_kv_len). A batch is padded to its bucket with
  // dummy rows (token 0 at position 0, kNoSlot so no K/V is written, attention over one key
  // of the first sequence's first block; their logits are computed and ignored); its
  // metadata goes to device buffers at fixed addresses, and the graph of its bucket and
  // class is replayed when the KV views, the model's and the backend's scratch are those it
  // was recorded with. Otherwise the padded batch runs once uncaptured (this step's
  // result; it also sizes every scratch buffer) and is recorded for the next steps. Other
  // batches run uncaptured. Logits equal the uncaptured path's bit for bit when a batch
  // fills its bucket, and up to the GEMM's algorithm choice for the padded row count
  // otherwise. Should a recording fail, the step's (uncaptured) result stands, the failure
  // is counted in decode_graph_stats() and graphs are turned off. Graphs take scratch for
  // the largest bucket; a decode step for which that cannot be allocated runs uncaptured. A
  // null recorder turns graphs off (the default).
  // REQUIRES: max_batch_size >= 1 when recorder is not null.
  void SetDecodeGraphs(std::unique_ptr<OpGraphRecorder> recorder, int32_t max_batch_size);

  // Allocates now the activations of the largest step to come, at most `max_step_tokens`
  // tokens of which at most `max_logit_rows` sample (and, with decode graphs, their largest
  // bucket), where Forward would grow them as the steps come. A server on a GPU calls it
  // before its KV pool grows into the memory left, so that the pool cannot take what a full
  // step needs. The backend's error (out of memory) when it cannot, with the rows and bytes
  // asked for; nothing is freed then.
  // REQUIRES: max_step_tokens >= 1, max_logit_rows >= 1.
  absl::Status ReserveActivations(int32_t max_step_tokens, int32_t max_logit_rows);
  // The bytes of the activations of a step of `tokens` tokens of which `logit_rows` sample
  // (fp32 hidden, Q/K/V, attention output and gate/up rows per token; the final norm's row
  // and the logits per sampled row): what Forward holds for the largest step so far.
  static int64_t ActivationBytes(const ModelSpec& spec, int32_t tokens, int32_t logit_rows);
  const DecodeGraphStats& decode_graph_stats() const { return graph_stats_; }

 private:
  struct Layer {
    DeviceBuffer attn_norm, wqkv, wo, ffn_norm, w13, w2;
  };

  // Device addresses of one batch's metadata, and its sizes.
  struct DeviceBatch {
    const int64_t* slot_mapping = nullptr;
    const int32_t *token_ids = nullptr, *positions = nullptr, *q_indptr = nullptr;
    const int32_t *kv_indptr = nullptr, *kv_indices = nullptr, *kv_last = nullptr;
    const int32_t* logit_rows = nullptr;
    int32_t num_tokens = 0, num_seqs = 0, num_logit_rows = 0;
    int32_t max_q_len = 0;   // most new tokens of one sequence (0 = unknown)
    int32_t max_kv_len = 0;  // most keys of a sequence with new tokens (0 = unknown)
  };
  // A recorded decode step for one bucket and context class, and what it was recorded
  // against.
  struct BucketGraph {
    std::unique_ptr<OpGraphRecorder::Graph> graph;
    std::vector<KvCacheView> views;
    uint64_t backend_epoch = 0;
    uint64_t model_epoch = 0;
  };

  LlamaModel(const ModelSpec& spec, Backend* backend) : spec_(spec), backend_(backend) {}
  absl::Status Upload(ModelWeights& weights);  // leaves the host tensors empty
  // The weights' buffer bytes, summed once they are all made (weight_bytes_).
  int64_t SumWeightBytes() const;
  absl::Status EnsureScratch(int32_t num_tokens, int32_t num_logit_rows);
  absl::Status UploadBatch(const ForwardBatch& batch);
  // Enqueues the whole forward pass of `b`; logits land in logits_.
  absl::Status Enqueue(const DeviceBatch& b, absl::Span<const KvCacheView> layers);
  bool IsGraphableDecode(const ForwardBatch& batch) const;
  // REQUIRES: IsGraphableDecode(batch); scratch holds max_bucket_ rows.
  absl::Status ForwardDecodeGraph(const ForwardBatch& batch, absl::Span<const KvCacheView> layers);

  ModelSpec spec_;
  Backend* backend_;
  DType weight_dtype_ = DType::kF32;
  DeviceBuffer token_embedding_, final_norm_, classifier_;
  std::vector<Layer> layers_;
  int64_t weight_bytes_ = 0;  // fixed once the model is made

  // Scratch, sized for scratch_tokens_ rows.
  int32_t scratch_tokens_ = 0;
  int32_t scratch_logit_rows_ = 0;
  DeviceBuffer x_, qkv_, attn_, h13_, logit_in_, logits_;
  // Q rows in bf16 for prefill attention over a bf16 cache, where the backend reads them
  // (Backend::ReadsBf16Q), for q_bf16_tokens_ tokens; empty until a prefill needs it. Never
  // read by decode graphs.
  DeviceBuffer q_bf16_;
  int32_t q_bf16_tokens_ = 0;
  DeviceBuffer batch_ints_;  // token ids, positions, indptrs, indices, ... packed
  DeviceBuffer sample_io_;   // ForwardAndSample: [rows] SamplingRow, then [rows] token ids
  size_t sample_io_capacity_ = 0;
  size_t batch_ints_capacity_ = 0;
  uint64_t scratch_epoch_ = 0;  // bumped whenever a scratch activation buffer moves

  // Decode graphs (SetDecodeGraphs); graphs_[{i, j}] serves buckets of 1 << i sequences whose
  // longest context is at most 1 << j keys (the graph's context class).
  std::unique_ptr<OpGraphRecorder> recorder_;
  int32_t max_bucket_ = 0;
  std::map<std::pair<int32_t, int32_t>, BucketGraph> graphs_;
  DeviceBuffer graph_batch_;          // fixed-address metadata of a padded decode batch
  int32_t graph_block_capacity_ = 0;  // kv_indices slots in graph_batch_
  DecodeGraphStats graph_stats_;
};

}  // namespace kvd

#endif  // KVD_MODEL_LLAMA_MODEL_H_
