#ifndef KVD_TOOLS_ENGINE_SETUP_H_
#define KVD_TOOLS_ENGINE_SETUP_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "model/model_spec.h"

namespace kvd {

// How much KV an offline tool or benchmark needs; it knows its load up front (the daemon
// sizes its pool from the config instead). Plain aggregate.
struct CacheSizing {
  int32_t block_size = 16;
  int32_t num_sequences = 1;
  int32_t tokens_per_sequence = 0;  // 0: the model's full context
  DType kv_dtype = DType::kF32;
  bool enable_prefix_caching = true;
};

// A KV cache whose whole pool is allocated up front: num_sequences x (blocks for
// tokens_per_sequence, plus one for alignment). Chunks hold a power-of-two number of
// blocks, at most 1 GiB (or one block) each, so a 34 GB GPU pool is 34 chunks rather than
// one 64 GiB power of two. No defragmentation. InvalidArgument for sizes < 1.
absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateCache(const ModelSpec& spec, Backend* backend,
                                                            Clock* clock,
                                                            const CacheSizing& sizing);

// CreateCache for `num_sequences` sequences of the model's full context, with the KV dtype
// the engine uses on `backend` (DefaultKvDtype: f32 on the CPU, bf16 on CUDA).
absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateCacheForSequences(
    const ModelSpec& spec, Backend* backend, Clock* clock, int32_t block_size,
    int32_t num_sequences, bool enable_prefix_caching = true);

}  // namespace kvd

#endif  // KVD_TOOLS_ENGINE_SETUP_H_
