#ifndef KVD_SERVER_SERVE_OPTIONS_H_
#define KVD_SERVER_SERVE_OPTIONS_H_

// What `kvd serve` makes of a validated InferenceConfig: the options of the KV cache and the
// engine it builds, and the checks that depend on the device or the model rather than on
// the config alone (so their errors can still name the key the user set).

#include "absl/status/status.h"
#include "cache/kv_cache_options.h"
#include "cache/kv_layout.h"
#include "config/inference_config.h"
#include "kernels/dtype.h"
#include "scheduler/engine_loop.h"
#include "tools/device.h"

namespace kvd {

// OK when the engine on `device` runs this config: its KV quantization (KvQuantizationsOn)
// and no sliding window (not implemented). Otherwise the error names the key and what is allowed.
absl::Status CheckServable(const InferenceConfig& config, Device device);

// The cache's options for a model whose KV has `shape`, on a backend whose native KV dtype is
// `native_kv_dtype`; the cache stores KvDtypeFor(kv.quantization, native_kv_dtype)
// (tools/device.h). The chunk size,
// which is not a config key, is KvPoolGeometry::ChunkBytesFor's for max_size: at most 16 MiB and
// 1/16 of the pool (so rounding max_size down to whole chunks loses under 1/16 of it, or under one
// block when a block is larger), at least one KV block, and within KvPoolGeometry::kMaxChunks
// chunks, so that any pool CheckPoolSize accepts has a geometry.
KvCacheOptions CacheOptionsFrom(const KvCacheConfig& kv, DType native_kv_dtype,
                                const KvShape& shape);

EngineOptions EngineOptionsFrom(const InferenceConfig& config);

// InvalidArgument naming kv_cache_config.memory_pool.max_size, with the size allowed, when
// the pool cannot hold one KV block of `shape` or would hold more than
// KvPoolGeometry::kMaxBlocks of them (the cache's own errors name its internal options).
absl::Status CheckPoolSize(const KvCacheConfig& kv, const KvCacheOptions& options,
                           const KvShape& shape);

}  // namespace kvd

#endif  // KVD_SERVER_SERVE_OPTIONS_H_
