#ifndef KVD_CONFIG_INFERENCE_CONFIG_H_
#define KVD_CONFIG_INFERENCE_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "config/config_enums.h"

namespace kvd {

// Everything `kvd serve` reads from inference_config.yaml and its command-line overrides.
// Plain aggregates: every field has the documented default (config/README.md lists each key,
// its default and what is allowed), so `InferenceConfig{}` is a valid configuration. Nothing
// here is checked on assignment: call Validate() once after building or editing one.
// Values are immutable in practice once the daemon starts; copies are cheap and independent.

// `model:` - what to serve and where.
struct ModelConfig {
  std::string path;       // empty = the default model (server/daemon.h: DefaultModelPath)
  std::string tokenizer;  // empty = beside the model
  DeviceKind device = DeviceKind::kAuto;
  uint64_t seed = 0;  // sampling seed for requests without one; synthetic weights

  bool operator==(const ModelConfig&) const = default;
};

// `server:` - listeners and ingress limits.
struct ServerConfig {
  std::string grpc_address = "0.0.0.0:50051";    // host:port or unix:/path; port 0 = any free
  std::string metrics_address = "0.0.0.0:50052";  // same forms; empty = no metrics listener
  absl::Duration drain_timeout = absl::Seconds(30);
  int32_t max_waiting_requests = 256;  // beyond this, Generate fails RESOURCE_EXHAUSTED
  // gRPC calls handled at once, beyond which gRPC refuses them RESOURCE_EXHAUSTED; 0 = the
  // batch and the queue plus spare calls (server/call_limit.h).
  int32_t max_concurrent_calls = 0;
  int32_t num_threads = 0;             // CPU backend threads; 0 = UsableCpus()

  bool operator==(const ServerConfig&) const = default;
};

// `kv_cache_config.memory_pool:` - the KV arena grows in chunks from initial to max.
struct MemoryPoolConfig {
  int64_t initial_size_bytes = int64_t{1} << 30;  // 1GiB
  int64_t max_size_bytes = int64_t{8} << 30;      // 8GiB
  // Device memory the arena's growth leaves free for the engine's buffers (GPU backends).
  int64_t device_headroom_bytes = int64_t{1} << 30;  // 1GiB
  // After a failed growth, how long until the arena tries one chunk again (a release lifts
  // the stop sooner); 0 = no tries, only a release.
  absl::Duration growth_retry_interval = absl::Seconds(10);

  bool operator==(const MemoryPoolConfig&) const = default;
};

// `kv_cache_config.session:` - block chains pinned between turns of a conversation.
struct SessionConfig {
  absl::Duration idle_timeout = absl::Seconds(30);
  double max_pinned_fraction = 0.5;  // of the pool's blocks

  bool operator==(const SessionConfig&) const = default;
};

// `kv_cache_config.defrag:` - bounded compaction between engine steps.
struct DefragConfig {
  bool enabled = true;
  absl::Duration interval = absl::Seconds(1);
  absl::Duration max_pause = absl::Milliseconds(2);
  int32_t max_moves_per_step = 64;

  bool operator==(const DefragConfig&) const = default;
};

// `kv_cache_config.sliding_window:` - optional attention sinks + recent window.
struct SlidingWindowConfig {
  int32_t window_tokens = 0;  // 0 = off (full attention)
  int32_t sink_tokens = 4;    // kept forever when the window is on

  bool operator==(const SlidingWindowConfig&) const = default;
};

// `kv_cache_config:` - the paged KV cache (the seeds' section name, kept verbatim).
struct KvCacheConfig {
  int32_t max_batch_size = 8;     // sequences in one engine step
  int32_t max_seq_length = 4096;  // prompt + output tokens of one sequence
  int32_t block_size = 16;        // tokens per block; a power of two
  KvQuantization quantization = KvQuantization::kNone;
  MemoryPoolConfig memory_pool;
  EvictionPolicyKind eviction_policy = EvictionPolicyKind::kLru;
  bool enable_prefix_caching = true;
  SessionConfig session;
  DefragConfig defrag;
  SlidingWindowConfig sliding_window;

  bool operator==(const KvCacheConfig&) const = default;
};

// `scheduler:` - step budgets and admission.
struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;  // tokens in one engine step
  AdmissionPolicyKind admission_policy = AdmissionPolicyKind::kPredicted;
  double predictor_quantile = 0.9;     // of observed output lengths
  int32_t prefill_chunk_tokens = 512;  // effective chunk: min(this, max_num_batched_tokens)

  bool operator==(const SchedulerConfig&) const = default;
};

struct InferenceConfig {
  ModelConfig model;
  ServerConfig server;
  KvCacheConfig kv_cache;  // YAML section `kv_cache_config`
  SchedulerConfig scheduler;

  // OK, or InvalidArgument for the first bad value: the message names the key path (e.g.
  // `kv_cache_config.block_size`), the value and what is allowed. Checks every key's own
  // rule and the rules between keys (initial_size <= max_size, max_batch_size <=
  // max_num_batched_tokens, window_tokens > sink_tokens when the window is on).
  absl::Status Validate() const;

  bool operator==(const InferenceConfig&) const = default;
};

// OK when `supported`, the quantizations the device named `device` runs, contains
// config.quantization; otherwise Unimplemented with a message that names the key, the
// configured value, the device and what it supports (QuantizationNames), then `elsewhere`
// (e.g. what another device would run). The engine calls this at startup so that an
// unsupported quantization is refused, never silently replaced.
absl::Status CheckQuantizationSupported(const KvCacheConfig& config, absl::string_view device,
                                        absl::Span<const KvQuantization> supported,
                                        absl::string_view elsewhere = "");

// The names of `quantizations` (Name(KvQuantization)), comma-separated; "(nothing)" for none.
std::string QuantizationNames(absl::Span<const KvQuantization> quantizations);

}  // namespace kvd

#endif  // KVD_CONFIG_INFERENCE_CONFIG_H_
