#ifndef KVD_KERNELS_CUDA_DECODE_ATTENTION_H_
#define KVD_KERNELS_CUDA_DECODE_ATTENTION_H_

// Paged decode attention: the sequences of a PagedAttentionParams batch with exactly one
// query row (others are left to the prefill kernel).
//
// One CTA serves one (KV head, sequence, split) and every query head of its GQA group (up
// to 8; larger groups take several CTAs), so each K/V byte is read once per group. A long
// context is cut into up to `max_splits` ranges of whole 64-key tiles, each at least 256
// keys; each split writes its normalized partial output and log-sum-exp to the workspace,
// and a merge kernel combines them. A sequence with one split writes `out` directly.
//
// Workspace layout (only touched when max_splits > 1):
//   partial_out: [num_seqs][max_splits][num_q_heads][head_dim] fp32
//   partial_lse: [num_seqs][max_splits][num_q_heads] fp32, base-2 log-sum-exp
//
// Supported: head_dim 64 or 128, KV dtype f32 or bf16, block_size a power of two, K/V region
// offsets, block_bytes and chunk bases multiples of 16 bytes (the kernel reads 16-byte
// vectors). The caller checks these.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/params.h"

namespace kvd::cuda {

struct DecodeWorkspace {
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int32_t max_splits = 1;
};

// Splits per sequence worth launching so that the decode grid covers about two waves of
// `num_sms` multiprocessors; 1 when the batch alone fills the device. In [1, 32].
int DecodeMaxSplits(int num_seqs, int num_kv_heads, int group_size, int num_sms);

// Elements of partial_out and partial_lse a call with these sizes needs.
int64_t DecodePartialOutSize(int num_seqs, int max_splits, int num_q_heads, int head_dim);
int64_t DecodePartialLseSize(int num_seqs, int max_splits, int num_q_heads);

// Enqueues the decode kernel and, when max_splits > 1, the merge kernel.
cudaError_t LaunchDecodeAttention(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                  cudaStream_t stream);

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_DECODE_ATTENTION_H_
