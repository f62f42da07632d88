#ifndef KVD_KERNELS_PARAMS_H_
#define KVD_KERNELS_PARAMS_H_

// Plain parameter structs shared by every backend. Pointers are backend memory (host
// memory on the CPU backend, device memory on CUDA). Shapes are in comments as
// [dim0][dim1]...; "stride" is in elements between consecutive rows.

#include <cstdint>

#include "kernels/dtype.h"

namespace kvd {

// One layer's view of the paged KV arena.
//
// The arena is a list of chunks (separate allocations, grown and shrunk by the block
// pool). Every chunk holds the same number of blocks, a power of two, for all layers:
//
//   chunk c:  | L0 K | L0 V | L1 K | L1 V | ... | L(n-1) V |
//   region "Ll K": [blocks_per_chunk] blocks of block_bytes
//   block:  [num_kv_heads][block_size][head_dim] of `dtype`, then, for a quantized dtype,
//           their scales at scale_offset_bytes (cache/kv_layout.h); int8: one fp32 scale per
//           KV head and token, [num_kv_heads][block_size], value = int8 * scale
//
// Block id b lives in chunk (b >> chunk_shift) at slot (b & ((1 << chunk_shift) - 1)), so
// one block id indexes the same slot in every layer's K and V region, and one head of
// one block is contiguous. A chunk's address table may contain nullptr for released
// chunks; no block table may then name a block in them.
struct KvCacheView {
  void* const* chunks = nullptr;  // [num_chunks] chunk base addresses
  int32_t num_chunks = 0;
  int32_t chunk_shift = 0;     // log2(blocks per chunk)
  int64_t k_offset_bytes = 0;  // this layer's K region inside a chunk
  int64_t v_offset_bytes = 0;  // this layer's V region inside a chunk
  int64_t block_bytes = 0;     // one block of one region: elements, scales, padding
  int64_t scale_offset_bytes = 0;  // quantized dtypes: where a block's scales start in it
  DType dtype = DType::kF32;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;
};

// A batch of sequences' block tables in CSR form (FlashInfer's paged layout):
// sequence s owns blocks indices[indptr[s] .. indptr[s+1]) in order, and its last block
// holds last_block_len[s] tokens (1..block_size), so its KV length is
// (indptr[s+1] - indptr[s] - 1) * block_size + last_block_len[s].
struct BlockTableView {
  const int32_t* indptr = nullptr;          // [num_seqs + 1]
  const int32_t* indices = nullptr;         // [indptr[num_seqs]] block ids
  const int32_t* last_block_len = nullptr;  // [num_seqs]
  int32_t num_seqs = 0;
};

// out[r][i] = in[r][i] / rms(in[r]) * weight[i],  rms = sqrt(mean(in[r]^2) + eps)
struct RmsNormParams {
  float* out = nullptr;          // [num_rows][dim]
  const float* in = nullptr;     // [num_rows][dim]
  const void* weight = nullptr;  // [dim] of weight_dtype
  DType weight_dtype = DType::kF32;
  int32_t num_rows = 0;
  int32_t dim = 0;
  float eps = 1e-5f;
};

// What a Matmul multiplies: `in` itself, or a row-wise op of `in` that the backend runs as
// part of the product (the op a model would otherwise run just before it). Its rows are never
// the caller's to read, so a backend writes them as its product wants them (the CUDA
// backend: in bf16 for cuBLAS) or not at all.
enum class MatmulPrologue : int32_t {
  kNone = 0,
  // RmsNorm of in's rows: RmsNormParams{.in = in, .weight = norm_weight, .weight_dtype =
  // norm_dtype, .dim = k, .eps = norm_eps}.
  kRmsNorm = 1,
  // SiluMul of gate = in and up: SiluMulParams{.gate = in, .up = up, .dim = k,
  // .gate_stride = in_stride, .up_stride = up_stride}.
  kSiluMul = 2,
};

// out[m][n] = x[m][:] . weight[n][:]  (+ out[m][n] when accumulate: residual add), where
// x = prologue(in). Weight rows are output features, as in llama2.c and PyTorch's nn.Linear.
struct MatmulParams {
  float* out = nullptr;          // [m][n]; overlaps none of the inputs
  const float* in = nullptr;     // [m][in_stride]
  const void* weight = nullptr;  // [n][k] of weight_dtype
  DType weight_dtype = DType::kF32;
  int32_t m = 0;
  int32_t n = 0;
  int32_t k = 0;
  bool accumulate = false;
  MatmulPrologue prologue = MatmulPrologue::kNone;
  int32_t in_stride = 0;  // elements from one row of `in` to the next; 0 means k
  // kRmsNorm: the norm's weight ([k] of norm_dtype) and epsilon.
  const void* norm_weight = nullptr;
  DType norm_dtype = DType::kF32;
  float norm_eps = 1e-5f;
  // kSiluMul: up's rows ([m][up_stride]; 0 means k).
  const float* up = nullptr;
  int32_t up_stride = 0;
};

enum class RopeStyle : int32_t {
  kInterleaved = 0,  // rotate pairs (2i, 2i+1): llama2.c, GGUF llama
  kHalf = 1,         // rotate (i, i + head_dim/2): HF transformers
};

// Rotary embedding in place on q and k. Pair i of a head (0 <= i < head_dim/2) turns by
// position * theta^(-2i/head_dim).
struct RopeParams {
  float* q = nullptr;                  // [num_tokens][q_stride], num_q_heads*head_dim used
  float* k = nullptr;                  // [num_tokens][k_stride], num_kv_heads*head_dim used
  const int32_t* positions = nullptr;  // [num_tokens]
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t q_stride = 0;
  int32_t k_stride = 0;
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::kInterleaved;
  // Optional: also the rotated q rows rounded to bf16, [num_tokens][q_bf16_stride]
  // (PagedAttentionParams::q_bf16).
  void* q_bf16 = nullptr;
  int32_t q_bf16_stride = 0;
  // Optional: also this step's K and V into the KV cache, as AppendKv with these fields, k and
  // k_stride would do right after this op (the rotated k rows, and v's rows, at
  // slot_mapping), in the same pass: a decode step's append is then no launch of its own.
  // cache.num_kv_heads and cache.head_dim must be num_kv_heads and head_dim.
  bool append_kv = false;
  KvCacheView cache = {};
  const float* v = nullptr;               // [num_tokens][v_stride]
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; kNoSlot: not written
  int32_t v_stride = 0;
};

// out[r][i] = silu(gate[r][i]) * up[r][i],  silu(x) = x / (1 + exp(-x)). `out` may be gate
// or up itself when that input's stride is dim; no other overlap (ValidateSiluMul).
struct SiluMulParams {
  float* out = nullptr;         // [num_rows][dim]
  const float* gate = nullptr;  // [num_rows][gate_stride]
  const float* up = nullptr;    // [num_rows][up_stride]
  int32_t num_rows = 0;
  int32_t dim = 0;
  int32_t gate_stride = 0;
  int32_t up_stride = 0;
};

// out[t][:] = table[token_ids[t]][:]
struct EmbeddingParams {
  float* out = nullptr;         // [num_tokens][dim]
  const void* table = nullptr;  // [vocab_size][dim] of table_dtype
  DType table_dtype = DType::kF32;
  const int32_t* token_ids = nullptr;  // [num_tokens], each in [0, vocab_size)
  int32_t num_tokens = 0;
  int32_t dim = 0;
  int32_t vocab_size = 0;
};

// A slot_mapping entry for a token whose K and V are not written: the padding rows of a
// recorded decode graph's batch (LlamaModel). Every backend skips such a token.
inline constexpr int64_t kNoSlot = -1;

// Writes new tokens' K and V into the arena. Slot = block_id * block_size + offset, or
// kNoSlot (nothing written for that token).
// REQUIRES: no slot other than kNoSlot appears twice (tokens are written in parallel, so which of
// two writes to one slot lands is not defined).
struct AppendKvParams {
  KvCacheView cache;
  const float* k = nullptr;               // [num_tokens][k_stride], num_kv_heads*head_dim used
  const float* v = nullptr;               // [num_tokens][v_stride]
  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  int32_t num_tokens = 0;
  int32_t k_stride = 0;
  int32_t v_stride = 0;
};

// Paged attention for a batch mixing prefill chunks and decodes. Sequence s has
// q_len = q_indptr[s+1] - q_indptr[s] query rows (1 for a decode) and kv_len keys (its
// block table, already holding this step's K/V). With causal, query row j of s sits at
// position kv_len - q_len + j and sees keys 0..that position. GQA: query head h reads
// KV head h / (num_q_heads / num_kv_heads).
struct PagedAttentionParams {
  float* out = nullptr;      // [q_indptr[num_seqs]][out_stride]
  const float* q = nullptr;  // [q_indptr[num_seqs]][q_stride], head-major
  // Optional: q's rows again as bf16, each value q's rounded to nearest, [rows][q_bf16_stride].
  // A kernel that rounds Q to bf16 anyway may read these for prefill rows instead (half the
  // bytes, no conversion): the CUDA backend's Hopper prefill, where they are 16-byte aligned
  // (prefill_attention_mma.h); every other reader uses q.
  const void* q_bf16 = nullptr;
  int32_t q_bf16_stride = 0;
  const int32_t* q_indptr = nullptr;  // [num_seqs + 1]
  KvCacheView cache;
  BlockTableView blocks;
  int32_t num_q_heads = 0;
  int32_t q_stride = 0;
  int32_t out_stride = 0;
  float sm_scale = 1.0f;  // usually 1/sqrt(head_dim)
  bool causal = true;
  // A promise about the batch, known on the host: no sequence has more than max_q_len
  // query rows (0 = no promise). max_q_len == 1 (pure decode) lets a backend skip its
  // prefill work, with the same results. Otherwise it is a hint that may change results
  // within a backend's stated precision, not exactly: the CUDA backend picks the precision
  // of prefill rows over a bf16 cache from it and the rest of the batch's shape (see
  // "Batch invariance" in kernels/cuda/cuda_backend.h); the CPU backend computes the same
  // with or without it, and refuses a batch that breaks it.
  int32_t max_q_len = 0;
  // A promise about the batch, known on the host: no sequence with query rows has more than
  // max_kv_len keys (0 = no promise). The CUDA backend launches only the decode split slices
  // contexts that long use (DecodeLaunchSlices in kernels/cuda/decode_attention.h), with the
  // same results; a batch that broke it would still be computed in full there, its longer
  // contexts in at most as many splits. The CPU backend refuses a batch that breaks it.
  int32_t max_kv_len = 0;
};

// Copies whole blocks (every layer, K and V) src[i] -> dst[i], for defragmentation and
// copy-on-write. REQUIRES: no block appears both as a source and a destination, and no
// destination twice.
struct CopyBlocksParams {
  void* const* chunks = nullptr;  // arena chunk table, as in KvCacheView
  int32_t chunk_shift = 0;
  int64_t chunk_region_bytes = 0;  // bytes of one region (one layer's K or V) in a chunk
  int32_t num_regions = 0;         // 2 * num_layers
  int64_t block_bytes = 0;         // bytes of one block in one region
  const int32_t* src = nullptr;    // [num_pairs]
  const int32_t* dst = nullptr;    // [num_pairs]
  int32_t num_pairs = 0;
};

// One request's sampling options for one step (the host's SamplingParams plus the step's
// uniform draw). The procedure they drive is documented in kernels/cpu_sampling.h.
struct SamplingRow {
  float temperature = 1.0f;  // 0 = greedy (argmax, lowest id on ties); else finite and > 0
  int32_t top_k = 0;         // 0 = off; else keep the k most probable tokens
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  float min_p = 0.0f;        // in [0, 1]; 0 = off
  // Uniform draw in [0, 1) for this step, drawn on the host from the request's own seeded
  // Rng on every step (greedy included), so a seed gives the same stream on any backend
  // and the stream position depends only on the number of steps.
  float u = 0.0f;
};

// Picks one token per row: out_tokens[r] = the token row r's options select from
// logits[r][0 .. vocab_size). Rows are independent (a row's token does not depend on the
// other rows of the batch). Every pointer is backend memory (device memory on CUDA,
// SamplingRow array included); a backend that samples on the device copies back only the
// [num_rows] token ids.
struct SampleParams {
  const float* logits = nullptr;      // [num_rows][row_stride], vocab_size used per row
  int64_t row_stride = 0;             // >= vocab_size
  int32_t num_rows = 0;               // 0 is a no-op
  int32_t vocab_size = 0;             // > 0
  const SamplingRow* rows = nullptr;  // [num_rows]
  int32_t* out_tokens = nullptr;      // [num_rows], each in [0, vocab_size)
};

}  // namespace kvd

#endif  // KVD_KERNELS_PARAMS_H_
