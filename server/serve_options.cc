#include "server/serve_options.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "config/byte_size.h"
#include "config/config_enums.h"

namespace kvd {

absl::Status CheckServable(const InferenceConfig& config, Device device) {
  // A refusal also says what the other device runs, which may be the fix (--device).
  const bool cuda = device == Device::kCuda;
  const absl::Span<const KvQuantization> on_cpu = KvQuantizationsOn(Device::kCpu),
                                         on_cuda = KvQuantizationsOn(Device::kCuda);
  if (absl::Status s = CheckQuantizationSupported(
          config.kv_cache, cuda ? "cuda" : "cpu", cuda ? on_cuda : on_cpu,
          absl::StrCat(" (on ", cuda ? "cpu" : "cuda", ": ",
                       QuantizationNames(cuda ? on_cpu : on_cuda), ")"));
      !s.ok()) {
    return s;
  }
  if (config.kv_cache.sliding_window.window_tokens != 0) {
    return absl::UnimplementedError(
        absl::StrCat("kv_cache_config.sliding_window.window_tokens: ",
                     config.kv_cache.sliding_window.window_tokens,
                     " is not supported by the engine yet; allowed: 0 (off)"));
  }
  return absl::OkStatus();
}

KvCacheOptions CacheOptionsFrom(const KvCacheConfig& kv, DType native_kv_dtype,
                                const KvShape& shape) {
  KvCacheOptions options;
  options.block_size = kv.block_size;
  const DType kv_dtype = KvDtypeFor(kv.quantization, native_kv_dtype);
  options.kv_dtype = kv_dtype;
  options.max_pool_bytes = kv.memory_pool.max_size_bytes;
  // The chunk is not a config key (no error may hinge on it): KvPoolGeometry::ChunkBytesFor
  // picks it from max_size and the block, as `kvd estimate --budget` does. An initial size
  // of 0 still reserves the first chunk.
  if (auto layout = KvLayout::Create(shape, kv_dtype, kv.block_size); layout.ok()) {
    options.chunk_bytes =
        KvPoolGeometry::ChunkBytesFor(options.max_pool_bytes, layout->block_bytes());
  }  // else KvCacheManager::Create reports the bad shape
  options.initial_pool_bytes = std::max<int64_t>(kv.memory_pool.initial_size_bytes, 1);
  options.device_headroom_bytes = kv.memory_pool.device_headroom_bytes;
  options.growth_retry_interval = kv.memory_pool.growth_retry_interval == absl::ZeroDuration()
                                      ? absl::InfiniteDuration()
                                      : kv.memory_pool.growth_retry_interval;
  options.enable_prefix_caching = kv.enable_prefix_caching;
  options.eviction_policy = std::string(Name(kv.eviction_policy));
  options.session_idle_timeout = kv.session.idle_timeout;
  options.max_pinned_fraction = kv.session.max_pinned_fraction;
  options.enable_defrag = kv.defrag.enabled;
  options.defrag_max_moves_per_step = kv.defrag.max_moves_per_step;
  options.defrag_interval = kv.defrag.interval;
  options.defrag_max_pause = kv.defrag.max_pause;
  return options;
}

EngineOptions EngineOptionsFrom(const InferenceConfig& config) {
  EngineOptions options;
  options.max_batch_size = config.kv_cache.max_batch_size;
  options.max_num_batched_tokens = config.scheduler.max_num_batched_tokens;
  options.prefill_chunk_tokens = config.scheduler.prefill_chunk_tokens;
  options.max_waiting_requests = config.server.max_waiting_requests;
  options.predictor_quantile = config.scheduler.predictor_quantile;
  options.max_context_tokens = config.kv_cache.max_seq_length;
  switch (config.scheduler.admission_policy) {
    case AdmissionPolicyKind::kPredicted:
      options.admission = AdmissionMode::kPredicted;
      break;
    case AdmissionPolicyKind::kReserveMax:
      options.admission = AdmissionMode::kReserveMax;
      break;
    case AdmissionPolicyKind::kOptimistic:
      options.admission = AdmissionMode::kOptimistic;
      break;
  }
  return options;
}

absl::Status CheckPoolSize(const KvCacheConfig& kv, const KvCacheOptions& options,
                           const KvShape& shape) {
  auto layout = KvLayout::Create(shape, options.kv_dtype, options.block_size);
  if (!layout.ok()) return absl::OkStatus();  // KvCacheManager::Create reports it
  const int64_t max_bytes = kv.memory_pool.max_size_bytes;
  const int64_t block_bytes = layout->block_bytes();
  if (max_bytes < block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_config.memory_pool.max_size: ", FormatByteSize(max_bytes),
        " is smaller than one KV block of this model (", block_bytes,
        " bytes: ", layout->DebugString(), "); allowed: at least ", FormatByteSize(block_bytes)));
  }
  // At most kMaxBlocks blocks. The chunk limit never binds here: ChunkBytesFor sized the
  // chunks for it.
  if (max_bytes / block_bytes > KvPoolGeometry::kMaxBlocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_config.memory_pool.max_size: ", FormatByteSize(max_bytes),
                     " holds more than ", KvPoolGeometry::kMaxBlocks, " KV blocks of this model (",
                     block_bytes, " bytes each: ", layout->DebugString(), "); allowed: at most ",
                     FormatByteSize(block_bytes * KvPoolGeometry::kMaxBlocks),
                     " (or a larger kv_cache_config.block_size)"));
  }
  return absl::OkStatus();
}

}  // namespace kvd
