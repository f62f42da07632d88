// Decode attention: the split policy, the workspace sizes, and the choice of kernel
// (decode_kernels.h). The kernels' shared device code is in decode_common.cuh.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/decode_common.cuh"
#include "kernels/cuda/decode_kernels.h"

namespace kvd::cuda {

int DecodeMaxSplits(int num_seqs, int num_kv_heads, int group_size, int num_sms) {
  // CTAs a split takes: one per (sequence, head subgroup), as many as the merge counters.
  const int64_t ctas = DecodeArrivalCount(num_seqs, num_kv_heads, group_size);
  if (ctas <= 0) return 1;
  // Rounded down: a second, partial wave costs more than the splits gain (measured by
  // gpu_bench sweep on an H200: 32 x 4k reads 0.83 of copy bandwidth unsplit and
  // 0.79 in two splits).
  const int64_t slots = int64_t{decode::DefaultConfig::kCtasPerSm} * num_sms;
  int64_t wanted = slots / ctas;
  // More than kMergeBatch splits leave slices of the grid empty for short contexts
  // (PlanSplits); such a grid is kept one CTA short of a full wave, which ran faster for a
  // cause not found (H200, 264 slots, batch 1 x 4k in 16 splits of 256 keys, back to back in
  // a graph: 0.31 of copy with 33 splits' CTAs launched, 0.39 with 32; with 32 of the 33
  // splits used, 0.351 against 0.353).
  if (wanted > decode::kMergeBatch && wanted * ctas == slots) --wanted;
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, decode::kMaxSplits));
}

int DecodeTailSplits(int main_splits) {
  if (main_splits < 2) return 0;
  return std::max(0, std::min(main_splits, decode::kMergeBatch - main_splits));
}

DecodeSlices DecodeLaunchSlices(const PagedAttentionParams& p, int num_sms) {
  const int group = p.cache.num_kv_heads > 0 ? p.num_q_heads / p.cache.num_kv_heads : 0;
  const int main_splits = DecodeMaxSplits(p.blocks.num_seqs, p.cache.num_kv_heads, group, num_sms);
  const int tail_splits = DecodeTailSplits(main_splits);
  const DecodeSlices full{main_splits + tail_splits, tail_splits};
  const int granule = p.cache.dtype == DType::kBF16
                          ? DecodeMmaSplitGranule(p.cache.head_dim)
                          : DecodeSimtSplitGranule(p.cache.dtype, p.cache.head_dim, group);
  if (p.max_kv_len <= 0 || p.max_kv_len >= decode::kMaxPlannedKeys || granule <= 0) return full;
  const DecodeWorkspace defaults;
  const decode::PromisedSlices used =
      decode::SlicesForContexts(p.max_kv_len, main_splits, tail_splits, granule,
                                defaults.min_split_granules, defaults.tail_min_keys);
  return {used.slices, used.tail_slices};
}

int64_t DecodeArrivalCount(int num_seqs, int num_kv_heads, int group_size) {
  return int64_t{num_seqs} * num_kv_heads * decode::MergeSubgroups(group_size);
}

int64_t DecodeTraceCount(int num_seqs, int num_kv_heads, int group_size, int max_splits) {
  // A record a CTA: one a (sequence, head subgroup), as the merge counters, a split.
  return max_splits * DecodeArrivalCount(num_seqs, num_kv_heads, group_size);
}

int64_t DecodePartialOutSize(int num_seqs, int max_splits, int num_q_heads, int head_dim) {
  return int64_t{num_seqs} * max_splits * num_q_heads * head_dim;
}

int64_t DecodePartialLseSize(int num_seqs, int max_splits, int num_q_heads) {
  return int64_t{num_seqs} * max_splits * num_q_heads;
}

namespace {

bool ValidTails(const DecodeWorkspace& ws) {
  return ws.tail_splits >= 0 && ws.tail_splits < ws.max_splits && ws.tail_divisor >= 1 &&
         ws.tail_min_keys >= 0;
}

}  // namespace

cudaError_t LaunchDecodeAttentionVariant(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                         int variant, const KvRowMap* rows_map, cudaStream_t stream,
                                         const char** name) {
  if (p.cache.dtype != DType::kBF16 || p.cache.head_dim != 128 || ws.trace != nullptr ||
      p.num_q_heads != 4 * p.cache.num_kv_heads || ws.max_splits < 1 ||
      ws.max_splits > decode::kMaxSplits || (ws.max_splits > 1 && ws.arrivals == nullptr) ||
      !ValidTails(ws)) {
    return cudaErrorInvalidValue;
  }
  switch (variant) {
    case 0:  // what LaunchDecodeAttention runs
      return LaunchDecodeMmaShape(p, ws, HasRows(rows_map) ? 3 : 0, rows_map, stream, name);
    case 1:
      *name = "CUDA cores, 4 warps, 3 stages, 2 CTAs/SM";
      return LaunchDecodeSimt(p, ws, stream);
    case 2:
    case 3:
    case 4:
      return LaunchDecodeMmaShape(p, ws, variant - 2, rows_map, stream, name);
    case 5:  // variant 0's TMA kernel without its L2 warm-up
      return LaunchDecodeMmaShape(p, ws, HasRows(rows_map) ? 4 : 0, rows_map, stream, name);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchDecodeAttention(const PagedAttentionParams& p, const DecodeWorkspace& ws,
                                  cudaStream_t stream, const KvRowMap* rows_map) {
  if (p.blocks.num_seqs == 0) return cudaSuccess;
  if (ws.max_splits < 1 || ws.max_splits > decode::kMaxSplits || !ValidTails(ws)) {
    return cudaErrorInvalidValue;
  }
  if (ws.max_splits > 1 && (ws.partial_out == nullptr || ws.arrivals == nullptr)) {
    return cudaErrorInvalidValue;
  }
  // Only the TMA kernel has a traced instantiation (LaunchDecodeMma picks it).
  if (ws.trace != nullptr &&
      (p.cache.dtype != DType::kBF16 || p.cache.head_dim != 128 || !HasRows(rows_map))) {
    return cudaErrorInvalidValue;
  }
  return p.cache.dtype == DType::kBF16 ? LaunchDecodeMma(p, ws, stream, rows_map)
                                       : LaunchDecodeSimt(p, ws, stream);
}

}  // namespace kvd::cuda
