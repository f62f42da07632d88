#ifndef KVD_CACHE_MEMORY_ESTIMATOR_H_
#define KVD_CACHE_MEMORY_ESTIMATOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace kvd {

// What to size: a model's attention shape, the KV storage and a workload.
struct MemoryEstimateRequest {
  int32_t num_layers = 0;
  int32_t d_model = 0;  // only for the seeds' formula
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType kv_dtype = DType::kBF16;
  int32_t block_size = 16;
  int64_t batch = 1;         // sequences
  int64_t seq_len = 0;       // tokens per sequence
  int64_t budget_bytes = 0;  // KV memory to fit into, as memory_pool.max_size; 0: no budget
};

// KV memory of a workload, exact and by the seeds' formula.
struct MemoryEstimate {
  // Exact: 2 * layers * kv_heads * head_dim * bytes(dtype) per token (element data).
  int64_t bytes_per_token = 0;
  // A block's arena bytes per token: element data plus quantization scales and their padding.
  double bytes_per_token_with_scales = 0;
  int64_t bytes_per_block = 0;  // with scales
  int64_t blocks_per_sequence = 0;
  int64_t bytes_per_sequence = 0;  // paged: whole blocks
  int64_t batch_bytes = 0;         // token-exact: batch * seq_len * bytes_per_token (+ scales)
  int64_t batch_bytes_paged = 0;   // batch * blocks_per_sequence * bytes_per_block
  // The seeds' formula: 2 * layers * d_model * bytes(dtype) per token. Equals the exact
  // one only for multi-head attention (kv_heads * head_dim == d_model).
  int64_t seed_bytes_per_token = 0;
  int64_t seed_batch_bytes = 0;
  double seed_over_exact = 0;  // how much the seeds' formula overstates
  // With a budget, -1 without. The pool `kvd serve` builds with memory_pool.max_size =
  // budget_bytes (KvPoolGeometry::ChunkBytesFor, then Compute): whole chunks of a
  // power-of-two number of blocks, counted in arena bytes (a quantized dtype's scales
  // included: each block carries its own), so pool_bytes <= budget_bytes
  // (kvd_kv_pool_max_bytes).
  int64_t pool_chunk_bytes = -1;
  int64_t pool_chunks = -1;
  int64_t pool_blocks = -1;
  int64_t pool_bytes = -1;
  // ...and the whole sequences of seq_len (paged) and the tokens that fit in its blocks.
  int64_t sequences_in_budget = -1;
  int64_t tokens_in_budget = -1;
};

// MemoryEstimator sizes KV memory for capacity planning (`kvd estimate`) with the same
// arithmetic as the cache itself (KvLayout). Stateless; thread safe.
class MemoryEstimator {
 public:
  // InvalidArgument for a non-positive shape, block size, batch or sequence length, for
  // a workload or model whose byte counts do not fit in int64 (naming batch and seq_len, or
  // num_layers and d_model, and the product), and for a budget that `kvd serve` refuses as
  // max_size: less than one KV block or more than KvPoolGeometry::kMaxBlocks of them.
  static absl::StatusOr<MemoryEstimate> Estimate(const MemoryEstimateRequest& request);
  // A human-readable table of the estimate, exact beside the seeds' formula.
  static std::string Format(const MemoryEstimateRequest& request, const MemoryEstimate& estimate);
};

}  // namespace kvd

#endif  // KVD_CACHE_MEMORY_ESTIMATOR_H_
