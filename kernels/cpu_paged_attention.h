#ifndef KVD_KERNELS_CPU_PAGED_ATTENTION_H_
#define KVD_KERNELS_CPU_PAGED_ATTENTION_H_

#include "absl/status/status.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvd {

// The CPU backend's paged attention (PagedAttentionParams): for every query row and query
// head, softmax(sm_scale * q . K^T) V over the keys the row may see, reading K and V
// through the sequence's CSR block table and the KvCacheView chunk addressing.
//
// Each (query row, KV head) pair is one independent work item: the query heads of that KV
// head's GQA group, each K and V row read once for all of them. Every query head is computed
// by the same code, whatever its group: fp32 scores in key order, a max-subtracted
// (numerically stable) softmax, then the weighted sum of V rows in key order, normalized at
// the end. The softmax sum and the V sum are fp32 over tiles of 64 keys or more and fp64
// across tiles, so accuracy holds at long contexts (under 5e-8 relative over 32k and 128k
// keys of offset values, where one running fp32 sum drifted to 1.4e-5). Items run in
// parallel on `pool`, so the output is bitwise independent of the thread count and of the
// rest of the batch.
//
// Validation (InvalidArgument naming the field, nothing written): null pointers, a
// non-positive head count or head_dim, num_kv_heads not dividing num_q_heads, strides
// narrower than the heads, decreasing indptr, a sequence with queries but no blocks,
// last_block_len outside [1, block_size], causal q_len > kv_len, a block id outside the
// arena or in a null chunk, a sequence beyond the batch's max_q_len or max_kv_len promise.
// An int8 cache's rows are dequantized (kernels/kv_quant.h) and then attended exactly as an
// f32 cache holding the dequantized values would be. Unimplemented for a cache dtype other
// than f32 and int8. num_seqs == 0 is a no-op. Thread safe if `pool` is.
absl::Status CpuPagedAttention(const PagedAttentionParams& p, ThreadPool& pool);

}  // namespace kvd

#endif  // KVD_KERNELS_CPU_PAGED_ATTENTION_H_
