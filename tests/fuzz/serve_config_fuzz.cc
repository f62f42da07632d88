// Fuzz target: what `kvd serve` makes of a config that loads (any `--set` overrides, any
// model shape): the KV cache's options and pool geometry.
//
// Invariant: a config that passes Validate(), CheckServable for a device and CheckPoolSize
// for a model's KV shape gives cache options that KvCacheManager::Create takes: they pass
// KvCacheOptions::Validate() and, for a shape that has a layout, KvPoolGeometry::Compute
// finds a geometry that fits in max_size. serve_options.h promises it; a gap would be a
// daemon that refuses to start with an error naming options the operator never wrote.

#include <cstdint>
#include <string>
#include <string_view>

#include "cache/kv_cache_options.h"
#include "cache/kv_layout.h"
#include "config/config_key.h"
#include "config/config_loader.h"
#include "config/inference_config.h"
#include "server/serve_options.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvd::fuzz::Require;

void CheckDevice(const kvd::InferenceConfig& config, kvd::Device device,
                 const kvd::KvShape& shape) {
  if (!kvd::CheckServable(config, device).ok()) return;
  const kvd::DType native = device == kvd::Device::kCuda ? kvd::DType::kBF16 : kvd::DType::kF32;
  const kvd::KvCacheOptions options = kvd::CacheOptionsFrom(config.kv_cache, native, shape);
  const kvd::DType kv_dtype = options.kv_dtype;  // the quantization's
  if (!kvd::CheckPoolSize(config.kv_cache, options, shape).ok()) return;
  Require(options.Validate().ok(), "a served config gives cache options that do not validate");
  const absl::StatusOr<kvd::KvLayout> layout =
      kvd::KvLayout::Create(shape, kv_dtype, options.block_size);
  if (!layout.ok()) return;  // a shape no block can have: KvCacheManager::Create names it
  const absl::StatusOr<kvd::KvPoolGeometry> geometry =
      kvd::KvPoolGeometry::Compute(options, *layout);
  Require(geometry.ok(), "a pool CheckPoolSize accepts has no geometry");
  Require(geometry->max_blocks() >= 1, "a pool of no blocks");
  Require(geometry->initial_chunks >= 1 && geometry->initial_chunks <= geometry->max_chunks,
          "initial chunks outside [1, max_chunks]");
  Require(
      geometry->max_chunks * geometry->chunk_bytes <= config.kv_cache.memory_pool.max_size_bytes,
      "the pool is larger than max_size");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::fuzz::InputReader input(data, size);
  // A Llama-like KV shape: up to 128 layers, 64 KV heads, head_dim up to 512 (even).
  const kvd::KvShape shape{1 + input.Byte() % 128, 1 + input.Byte() % 64,
                           2 * (1 + input.Byte() % 256)};
  // Then overrides, each a key (by its index in the table) and a value.
  const std::vector<kvd::ConfigKey>& keys = kvd::ConfigKeys();
  kvd::InferenceConfig config;
  while (!input.empty()) {
    const kvd::ConfigKey& key = keys[input.Byte() % keys.size()];
    const std::string_view value = input.Bytes(input.Byte() % 24);
    if (!kvd::ApplyOverride(config, key.path, value).ok()) return 0;
  }
  if (!config.Validate().ok()) return 0;
  CheckDevice(config, kvd::Device::kCpu, shape);
  CheckDevice(config, kvd::Device::kCuda, shape);
  return 0;
}
