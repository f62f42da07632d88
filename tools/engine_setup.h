#ifndef KVD_TOOLS_ENGINE_SETUP_H_
#define KVD_TOOLS_ENGINE_SETUP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "kernels/backend.h"
#include "model/model_spec.h"

namespace kvd {

// A KV cache sized for `num_sequences` sequences of the model's full context (plus one
// block each for alignment), fp32 KV. Used by the offline tools and
// benchmarks, which know their load up front; the daemon sizes its pool from the config.
absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateCacheForSequences(
    const ModelSpec& spec, Backend* backend, Clock* clock, int32_t block_size,
    int32_t num_sequences, bool enable_prefix_caching = true);

}  // namespace kvd

#endif  // KVD_TOOLS_ENGINE_SETUP_H_
