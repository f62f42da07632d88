#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace kvd {

namespace {

// Frees a host tensor's memory (clear() alone keeps the capacity).
void Release(std::vector<float>& v) { std::vector<float>().swap(v); }

// Uploads the parts as one tensor, rows of each in order, and releases them.
absl::StatusOr<DeviceBuffer> UploadConcat(Backend* backend,
                                          std::initializer_list<std::vector<float>*> parts) {
  std::vector<float> joined;
  size_t total = 0;
  for (const auto* p : parts) total += p->size();
  try {
    joined.reserve(total);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("model weights: no host memory to join ",
                                                     total * sizeof(float),
                                                     " bytes of tensors for upload"));
  }
  for (auto* p : parts) {
    joined.insert(joined.end(), p->begin(), p->end());
    Release(*p);
  }
  return backend->UploadWeights(joined.data(), joined.size());
}

absl::Status CheckSize(const char* name, const std::vector<float>& v, int64_t expected) {
  if (static_cast<int64_t>(v.size()) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model weights: ", name, " has ", v.size(),
                                                 " values, the spec needs ", expected));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(ModelWeights weights,
                                                               Backend* backend) {
  KVD_RETURN_IF_ERROR(weights.spec.Validate());
  std::unique_ptr<LlamaModel> model(new LlamaModel(weights.spec, backend));
  KVD_RETURN_IF_ERROR(model->Upload(weights));
  model->weight_bytes_ = model->SumWeightBytes();
  return model;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::CreateFromFactory(const ModelSpec& spec,
                                                                          Backend* backend,
                                                                          WeightFactory make) {
  KVD_RETURN_IF_ERROR(spec.Validate());
  std::unique_ptr<LlamaModel> model(new LlamaModel(spec, backend));
  model->weight_dtype_ = backend->weight_dtype();
  const int64_t elem_bits = DTypeBits(model->weight_dtype_);
  auto build = [&](int32_t index, int64_t count, int32_t fan_in,
                   DeviceBuffer* out) -> absl::Status {
    auto buf = make(WeightTensorInfo{.index = index, .count = count, .fan_in = fan_in});
    if (!buf.ok()) return buf.status();
    if (static_cast<int64_t>(buf->bytes()) * 8 < count * elem_bits) {
      return absl::InvalidArgumentError(absl::StrCat("weight factory: tensor ", index, " has ",
                                                     buf->bytes(), " bytes, needs ",
                                                     count * elem_bits / 8));
    }
    *out = std::move(*buf);
    return absl::OkStatus();
  };
  const int64_t dim = spec.dim, hidden = spec.hidden_dim;
  const int64_t q_dim = int64_t{spec.num_heads} * spec.head_dim;
  const int64_t kv_dim = int64_t{spec.num_kv_heads} * spec.head_dim;
  KVD_RETURN_IF_ERROR(build(0, spec.vocab_size * dim, spec.dim, &model->token_embedding_));
  KVD_RETURN_IF_ERROR(build(1, dim, 0, &model->final_norm_));
  if (!spec.shared_classifier) {
    KVD_RETURN_IF_ERROR(build(2, spec.vocab_size * dim, spec.dim, &model->classifier_));
  }
  model->layers_.resize(spec.num_layers);
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    Layer& layer = model->layers_[l];
    const int32_t base = 3 + 6 * l;
    KVD_RETURN_IF_ERROR(build(base + 0, dim, 0, &layer.attn_norm));
    KVD_RETURN_IF_ERROR(build(base + 1, (q_dim + 2 * kv_dim) * dim, spec.dim, &layer.wqkv));
    KVD_RETURN_IF_ERROR(build(base + 2, dim * q_dim, static_cast<int32_t>(q_dim), &layer.wo));
    KVD_RETURN_IF_ERROR(build(base + 3, dim, 0, &layer.ffn_norm));
    KVD_RETURN_IF_ERROR(build(base + 4, 2 * hidden * dim, spec.dim, &layer.w13));
    KVD_RETURN_IF_ERROR(build(base + 5, dim * hidden, spec.hidden_dim, &layer.w2));
  }
  model->weight_bytes_ = model->SumWeightBytes();
  return model;
}

absl::Status LlamaModel::Upload(ModelWeights& w) {
  const ModelSpec& s = spec_;
  const int64_t dim = s.dim, hidden = s.hidden_dim;
  const int64_t q_dim = int64_t{s.num_heads} * s.head_dim;
  const int64_t kv_dim = int64_t{s.num_kv_heads} * s.head_dim;
  weight_dtype_ = backend_->weight_dtype();

  KVD_RETURN_IF_ERROR(CheckSize("token_embedding", w.token_embedding, s.vocab_size * dim));
  KVD_RETURN_IF_ERROR(CheckSize("final_norm", w.final_norm, dim));
  if (static_cast<int32_t>(w.layers.size()) != s.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model weights: ", w.layers.size(), " layers, the spec needs ", s.num_layers));
  }
  if (!s.shared_classifier) {
    KVD_RETURN_IF_ERROR(CheckSize("classifier", w.classifier, s.vocab_size * dim));
  }

  auto upload = [&](std::vector<float>& v, DeviceBuffer* out) -> absl::Status {
    auto buf = backend_->UploadWeights(v.data(), v.size());
    if (!buf.ok()) return buf.status();
    *out = std::move(*buf);
    Release(v);
    return absl::OkStatus();
  };
  KVD_RETURN_IF_ERROR(upload(w.token_embedding, &token_embedding_));
  KVD_RETURN_IF_ERROR(upload(w.final_norm, &final_norm_));
  if (!s.shared_classifier) KVD_RETURN_IF_ERROR(upload(w.classifier, &classifier_));

  layers_.resize(s.num_layers);
  for (int32_t l = 0; l < s.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    const std::string at = absl::StrCat("layers[", l, "].");
    KVD_RETURN_IF_ERROR(CheckSize((at + "attn_norm").c_str(), lw.attn_norm, dim));
    KVD_RETURN_IF_ERROR(CheckSize((at + "wq").c_str(), lw.wq, q_dim * dim));
    KVD_RETURN_IF_ERROR(CheckSize((at + "wk").c_str(), lw.wk, kv_dim * dim));
    KVD_RETURN_IF_ERROR(CheckSize((at + "wv").c_str(), lw.wv, kv_dim * dim));
    KVD_RETURN_IF_ERROR(CheckSize((at + "wo").c_str(), lw.wo, dim * q_dim));
    KVD_RETURN_IF_ERROR(CheckSize((at + "ffn_norm").c_str(), lw.ffn_norm, dim));
    KVD_RETURN_IF_ERROR(CheckSize((at + "w1").c_str(), lw.w1, hidden * dim));
    KVD_RETURN_IF_ERROR(CheckSize((at + "w2").c_str(), lw.w2, dim * hidden));
    KVD_RETURN_IF_ERROR(CheckSize((at + "w3").c_str(), lw.w3, hidden * dim));

    Layer& layer = layers_[l];
    KVD_RETURN_IF_ERROR(upload(lw.attn_norm, &layer.attn_norm));
    KVD_RETURN_IF_ERROR(upload(lw.ffn_norm, &layer.ffn_norm));
    KVD_RETURN_IF_ERROR(upload(lw.wo, &layer.wo));
    KVD_RETURN_IF_ERROR(upload(lw.w2, &layer.w2));
    // Q, K and V share one matmul: rows [wq; wk; wv]. Gate and up likewise: [w1; w3].
    auto wqkv = UploadConcat(backend_, {&lw.wq, &lw.wk, &lw.wv});
    if (!wqkv.ok()) return wqkv.status();
    layer.wqkv = std::move(*wqkv);
    auto w13 = UploadConcat(backend_, {&lw.w1, &lw.w3});
    if (!w13.ok()) return w13.status();
    layer.w13 = std::move(*w13);
  }
  return absl::OkStatus();
}

int64_t LlamaModel::SumWeightBytes() const {
  int64_t bytes = token_embedding_.bytes() + final_norm_.bytes() + classifier_.bytes();
  for (const Layer& l : layers_) {
    bytes += l.attn_norm.bytes() + l.wqkv.bytes() + l.wo.bytes() + l.ffn_norm.bytes() +
             l.w13.bytes() + l.w2.bytes();
  }
  return bytes;
}

int64_t LlamaModel::ActivationBytes(const ModelSpec& s, int32_t tokens, int32_t logit_rows) {
  const int64_t q_dim = int64_t{s.num_heads} * s.head_dim;
  const int64_t qkv_dim = q_dim + 2 * int64_t{s.num_kv_heads} * s.head_dim;
  const int64_t per_token = s.dim + qkv_dim + q_dim + 2 * int64_t{s.hidden_dim};
  const int64_t per_row = s.dim + int64_t{s.vocab_size};
  return static_cast<int64_t>(sizeof(float)) * (tokens * per_token + logit_rows * per_row);
}

absl::Status LlamaModel::ReserveActivations(int32_t max_step_tokens, int32_t max_logit_rows) {
  const int32_t tokens = std::max(max_step_tokens, max_bucket_);
  const int32_t rows = std::max(max_logit_rows, max_bucket_);
  const absl::Status s = EnsureScratch(tokens, rows);
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("allocating the activations of a step of ", tokens, " tokens and ",
                             rows, " sampled rows (", ActivationBytes(spec_, tokens, rows),
                             " bytes): ", s.message()));
}

absl::Status LlamaModel::EnsureScratch(int32_t num_tokens, int32_t num_logit_rows) {
  const ModelSpec& s = spec_;
  const int64_t q_dim = int64_t{s.num_heads} * s.head_dim;
  const int64_t qkv_dim = q_dim + 2 * int64_t{s.num_kv_heads} * s.head_dim;
  // The epoch moves with each buffer, not once all are replaced: a later allocation may
  // fail, and a decode graph must not be replayed with a buffer freed before that.
  auto alloc = [&](DeviceBuffer* buf, int64_t floats) -> absl::Status {
    auto b = backend_->Allocate(static_cast<size_t>(floats) * sizeof(float));
    if (!b.ok()) return b.status();
    *buf = std::move(*b);
    ++scratch_epoch_;
    return absl::OkStatus();
  };
  if (num_tokens > scratch_tokens_) {
    const int64_t t = num_tokens;
    KVD_RETURN_IF_ERROR(alloc(&x_, t * s.dim));
    KVD_RETURN_IF_ERROR(alloc(&qkv_, t * qkv_dim));
    KVD_RETURN_IF_ERROR(alloc(&attn_, t * q_dim));
    KVD_RETURN_IF_ERROR(alloc(&h13_, t * 2 * s.hidden_dim));
    scratch_tokens_ = num_tokens;
  }
  if (num_logit_rows > scratch_logit_rows_) {
    const int64_t r = num_logit_rows;
    KVD_RETURN_IF_ERROR(alloc(&logit_in_, r * s.dim));
    KVD_RETURN_IF_ERROR(alloc(&logits_, r * s.vocab_size));
    scratch_logit_rows_ = num_logit_rows;
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::UploadBatch(const ForwardBatch& b) {
  // Packed as int32 words: slot_mapping (int64, first for alignment), token_ids, positions,
  // q_indptr, kv_indptr, kv_indices, kv_last_block_len, logit_rows.
  const size_t words = 2 * b.slot_mapping.size() + b.token_ids.size() + b.positions.size() +
                       b.q_indptr.size() + b.kv_indptr.size() + b.kv_indices.size() +
                       b.kv_last_block_len.size() + b.logit_rows.size();
  const size_t bytes = words * sizeof(int32_t);
  if (bytes > batch_ints_capacity_) {
    auto buf = backend_->Allocate(bytes * 2);
    if (!buf.ok()) return buf.status();
    batch_ints_ = std::move(*buf);
    batch_ints_capacity_ = bytes * 2;
  }
  std::vector<int32_t> host(words);
  size_t at = 0;
  auto put = [&](const void* src, size_t n_bytes) {
    if (n_bytes == 0) return;  // an empty vector's data() may be null
    std::memcpy(host.data() + at, src, n_bytes);
    at += n_bytes / sizeof(int32_t);
  };
  put(b.slot_mapping.data(), b.slot_mapping.size() * sizeof(int64_t));
  put(b.token_ids.data(), b.token_ids.size() * sizeof(int32_t));
  put(b.positions.data(), b.positions.size() * sizeof(int32_t));
  put(b.q_indptr.data(), b.q_indptr.size() * sizeof(int32_t));
  put(b.kv_indptr.data(), b.kv_indptr.size() * sizeof(int32_t));
  put(b.kv_indices.data(), b.kv_indices.size() * sizeof(int32_t));
  put(b.kv_last_block_len.data(), b.kv_last_block_len.size() * sizeof(int32_t));
  put(b.logit_rows.data(), b.logit_rows.size() * sizeof(int32_t));
  return backend_->CopyToDevice(batch_ints_.data(), host.data(), bytes);
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, absl::Span<const KvCacheView> layers,
                                 std::vector<float>* logits) {
  auto device_logits = ForwardToDevice(batch, layers);
  if (!device_logits.ok()) return device_logits.status();
  logits->assign(batch.logit_rows.size() * static_cast<size_t>(spec_.vocab_size), 0.0f);
  if (!logits->empty()) {
    KVD_RETURN_IF_ERROR(
        backend_->CopyToHost(logits->data(), *device_logits, logits->size() * sizeof(float)));
  }
  return backend_->Synchronize();
}

absl::Status LlamaModel::ForwardAndSample(const ForwardBatch& batch,
                                          absl::Span<const KvCacheView> layers,
                                          absl::Span<const SamplingRow> rows,
                                          std::vector<int32_t>* tokens) {
  if (rows.size() != batch.logit_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", rows.size(), " sampling rows for ",
                                                   batch.logit_rows.size(), " logit rows"));
  }
  tokens->assign(rows.size(), 0);
  // One buffer for the options going up and the ids coming back. The options go up first:
  // a copy to the device waits for the queue, which is idle before the forward pass.
  const size_t row_bytes = rows.size() * sizeof(SamplingRow);
  const size_t token_offset = (row_bytes + 15) / 16 * 16;
  const size_t bytes = token_offset + rows.size() * sizeof(int32_t);
  if (bytes > sample_io_capacity_) {
    auto buffer = backend_->Allocate(bytes);
    if (!buffer.ok()) return buffer.status();
    sample_io_ = std::move(*buffer);
    sample_io_capacity_ = bytes;
  }
  char* io = sample_io_.as<char>();
  if (!rows.empty()) KVD_RETURN_IF_ERROR(backend_->CopyToDevice(io, rows.data(), row_bytes));
  auto device_logits = ForwardToDevice(batch, layers);
  if (!device_logits.ok()) return device_logits.status();
  if (rows.empty()) return backend_->Synchronize();
  int32_t* out_tokens = reinterpret_cast<int32_t*>(io + token_offset);
  KVD_RETURN_IF_ERROR(backend_->Sample({.logits = *device_logits,
                                        .row_stride = spec_.vocab_size,
                                        .num_rows = static_cast<int32_t>(rows.size()),
                                        .vocab_size = spec_.vocab_size,
                                        .rows = reinterpret_cast<const SamplingRow*>(io),
                                        .out_tokens = out_tokens}));
  KVD_RETURN_IF_ERROR(
      backend_->CopyToHost(tokens->data(), out_tokens, rows.size() * sizeof(int32_t)));
  return backend_->Synchronize();
}

absl::StatusOr<const float*> LlamaModel::ForwardToDevice(const ForwardBatch& batch,
                                                         absl::Span<const KvCacheView> layers) {
  const ModelSpec& s = spec_;
  if (static_cast<int32_t>(layers.size()) != s.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: ", layers.size(), " KV layer views for ", s.num_layers, " layers"));
  }
  const int32_t block_size = layers[0].block_size;
  for (size_t l = 0; l < layers.size(); ++l) {
    const KvCacheView& v = layers[l];
    if (v.num_kv_heads != s.num_kv_heads || v.head_dim != s.head_dim ||
        v.block_size != block_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward: layer ", l, "'s KV view has ", v.num_kv_heads, " KV heads, head_dim ",
          v.head_dim, " and block_size ", v.block_size, "; the model has ", s.num_kv_heads,
          " KV heads and head_dim ", s.head_dim, ", and layer 0's view block_size ", block_size));
    }
  }
  KVD_RETURN_IF_ERROR(batch.Validate(s.vocab_size, block_size));
  // Graphs need scratch for the largest bucket up front (growing it later would move what
  // they read). Where the device cannot hold that, this step runs uncaptured in scratch for
  // its own rows, and a later step tries again.
  if (recorder_ != nullptr && IsGraphableDecode(batch) &&
      EnsureScratch(max_bucket_, max_bucket_).ok()) {
    KVD_RETURN_IF_ERROR(ForwardDecodeGraph(batch, layers));
    return logits_.as<const float>();
  }
  const int32_t t = batch.num_tokens();
  const int32_t rows = static_cast<int32_t>(batch.logit_rows.size());
  KVD_RETURN_IF_ERROR(EnsureScratch(std::max(t, 1), std::max(rows, 1)));
  if (t == 0) return logits_.as<const float>();
  KVD_RETURN_IF_ERROR(UploadBatch(batch));

  // Device views of the packed batch (same order as UploadBatch).
  const int32_t* base = batch_ints_.as<const int32_t>();
  DeviceBatch d;
  d.slot_mapping = reinterpret_cast<const int64_t*>(base);
  d.token_ids = base + 2 * batch.slot_mapping.size();
  d.positions = d.token_ids + batch.token_ids.size();
  d.q_indptr = d.positions + batch.positions.size();
  d.kv_indptr = d.q_indptr + batch.q_indptr.size();
  d.kv_indices = d.kv_indptr + batch.kv_indptr.size();
  d.kv_last = d.kv_indices + batch.kv_indices.size();
  d.logit_rows = d.kv_last + batch.kv_last_block_len.size();
  d.num_tokens = t;
  d.num_seqs = batch.num_seqs();
  for (int32_t i = 0; i < batch.num_seqs(); ++i) {
    d.max_q_len = std::max(d.max_q_len, batch.q_indptr[i + 1] - batch.q_indptr[i]);
  }
  d.max_kv_len = batch.MaxKvLen(layers[0].block_size);
  d.num_logit_rows = rows;
  KVD_RETURN_IF_ERROR(Enqueue(d, layers));
  return logits_.as<const float>();
}

absl::Status LlamaModel::Enqueue(const DeviceBatch& b, absl::Span<const KvCacheView> layers) {
  const ModelSpec& s = spec_;
  const int32_t t = b.num_tokens;
  const int32_t rows = b.num_logit_rows;
  const int64_t* slot_mapping = b.slot_mapping;
  const int32_t* token_ids = b.token_ids;
  const int32_t* positions = b.positions;
  const int32_t* q_indptr = b.q_indptr;
  const int32_t* kv_indptr = b.kv_indptr;
  const int32_t* kv_indices = b.kv_indices;
  const int32_t* kv_last = b.kv_last;
  const int32_t* logit_rows = b.logit_rows;

  const int32_t q_dim = s.num_heads * s.head_dim;
  const int32_t kv_dim = s.num_kv_heads * s.head_dim;
  const int32_t qkv_dim = q_dim + 2 * kv_dim;
  float* x = x_.as<float>();
  float* qkv = qkv_.as<float>();
  float* attn = attn_.as<float>();
  float* h13 = h13_.as<float>();
  // Prefill rows over a bf16 cache read Q in bf16 where the backend can: RoPE writes it.
  void* q_bf16 = nullptr;
  if (b.max_q_len > 1 && !layers.empty() && layers[0].dtype == DType::kBF16 &&
      backend_->ReadsBf16Q(s.head_dim)) {
    if (t > q_bf16_tokens_) {
      auto buf = backend_->Allocate(size_t{2} * t * q_dim);
      if (!buf.ok()) return buf.status();
      q_bf16_ = *std::move(buf);
      q_bf16_tokens_ = t;
    }
    q_bf16 = q_bf16_.data();
  }

  KVD_RETURN_IF_ERROR(backend_->Embedding({.out = x,
                                           .table = token_embedding_.data(),
                                           .table_dtype = weight_dtype_,
                                           .token_ids = token_ids,
                                           .num_tokens = t,
                                           .dim = s.dim,
                                           .vocab_size = s.vocab_size}));
  for (int32_t l = 0; l < s.num_layers; ++l) {
    const Layer& w = layers_[l];
    // The norms and SiLU ride on the products after them (MatmulPrologue).
    KVD_RETURN_IF_ERROR(backend_->Matmul({.out = qkv,
                                          .in = x,
                                          .weight = w.wqkv.data(),
                                          .weight_dtype = weight_dtype_,
                                          .m = t,
                                          .n = qkv_dim,
                                          .k = s.dim,
                                          .prologue = MatmulPrologue::kRmsNorm,
                                          .norm_weight = w.attn_norm.data(),
                                          .norm_dtype = weight_dtype_,
                                          .norm_eps = s.norm_eps}));
    float* q = qkv;
    float* k = qkv + q_dim;
    float* v = qkv + q_dim + kv_dim;
    KVD_RETURN_IF_ERROR(backend_->Rope({.q = q,
                                        .k = k,
                                        .positions = positions,
                                        .num_tokens = t,
                                        .num_q_heads = s.num_heads,
                                        .num_kv_heads = s.num_kv_heads,
                                        .head_dim = s.head_dim,
                                        .q_stride = qkv_dim,
                                        .k_stride = qkv_dim,
                                        .theta = s.rope_theta,
                                        .style = s.rope_style,
                                        .q_bf16 = q_bf16,
                                        .q_bf16_stride = q_dim,
                                        // This step's K (rotated) and V into the cache.
                                        .append_kv = true,
                                        .cache = layers[l],
                                        .v = v,
                                        .slot_mapping = slot_mapping,
                                        .v_stride = qkv_dim}));
    KVD_RETURN_IF_ERROR(
        backend_->PagedAttention({.out = attn,
                                  .q = q,
                                  .q_bf16 = q_bf16,
                                  .q_bf16_stride = q_dim,
                                  .q_indptr = q_indptr,
                                  .cache = layers[l],
                                  .blocks = {.indptr = kv_indptr,
                                             .indices = kv_indices,
                                             .last_block_len = kv_last,
                                             .num_seqs = b.num_seqs},
                                  .num_q_heads = s.num_heads,
                                  .q_stride = qkv_dim,
                                  .out_stride = q_dim,
                                  .sm_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim)),
                                  .causal = true,
                                  .max_q_len = b.max_q_len,
                                  .max_kv_len = b.max_kv_len}));
    // Residual adds ride on the output projections (accumulate into x).
    KVD_RETURN_IF_ERROR(backend_->Matmul({.out = x,
                                          .in = attn,
                                          .weight = w.wo.data(),
                                          .weight_dtype = weight_dtype_,
                                          .m = t,
                                          .n = s.dim,
                                          .k = q_dim,
                                          .accumulate = true}));
    KVD_RETURN_IF_ERROR(backend_->Matmul({.out = h13,
                                          .in = x,
                                          .weight = w.w13.data(),
                                          .weight_dtype = weight_dtype_,
                                          .m = t,
                                          .n = 2 * s.hidden_dim,
                                          .k = s.dim,
                                          .prologue = MatmulPrologue::kRmsNorm,
                                          .norm_weight = w.ffn_norm.data(),
                                          .norm_dtype = weight_dtype_,
                                          .norm_eps = s.norm_eps}));
    KVD_RETURN_IF_ERROR(backend_->Matmul({.out = x,
                                          .in = h13,  // gate | up halves of each row
                                          .weight = w.w2.data(),
                                          .weight_dtype = weight_dtype_,
                                          .m = t,
                                          .n = s.dim,
                                          .k = s.hidden_dim,
                                          .accumulate = true,
                                          .prologue = MatmulPrologue::kSiluMul,
                                          .in_stride = 2 * s.hidden_dim,
                                          .up = h13 + s.hidden_dim,
                                          .up_stride = 2 * s.hidden_dim}));
  }
  if (rows == 0) return absl::OkStatus();

  // Only the sampled rows go through the final norm and the classifier.
  float* gathered = logit_in_.as<float>();
  KVD_RETURN_IF_ERROR(backend_->Embedding({.out = gathered,
                                           .table = x,
                                           .table_dtype = DType::kF32,
                                           .token_ids = logit_rows,
                                           .num_tokens = rows,
                                           .dim = s.dim,
                                           .vocab_size = t}));
  const DeviceBuffer& cls = s.shared_classifier ? token_embedding_ : classifier_;
  KVD_RETURN_IF_ERROR(backend_->Matmul({.out = logits_.as<float>(),
                                        .in = gathered,
                                        .weight = cls.data(),
                                        .weight_dtype = weight_dtype_,
                                        .m = rows,
                                        .n = s.vocab_size,
                                        .k = s.dim,
                                        .prologue = MatmulPrologue::kRmsNorm,
                                        .norm_weight = final_norm_.data(),
                                        .norm_dtype = weight_dtype_,
                                        .norm_eps = s.norm_eps}));
  return absl::OkStatus();
}
}  // namespace kvd
