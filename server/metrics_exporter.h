#ifndef KVD_SERVER_METRICS_EXPORTER_H_
#define KVD_SERVER_METRICS_EXPORTER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "kernels/backend.h"
#include "scheduler/engine_stats.h"
#include "server/process_stats.h"

namespace kvd {

// Facts about the deployment that never change while the daemon runs.
struct MetricsInfo {
  std::string model;     // ModelSpec::name
  std::string backend;   // "cpu", "cuda"
  std::string kv_dtype;  // "f32", ...
  int32_t block_size = 0;
  int64_t num_blocks = 0;      // capacity: the pool's blocks at max_size
  bool prefix_caching = true;  // kv_cache_config.enable_prefix_caching
  absl::Duration defrag_max_pause = absl::Milliseconds(2);  // kv_cache_config.defrag.max_pause
};

// What a scrape reads besides the engine's snapshot; each absent one publishes no series.
struct ScrapeFacts {
  std::optional<Backend::DeviceMemory> device;  // kvd_device_memory_bytes (CUDA)
  std::optional<ProcessStats> process;          // process_* and kvd_process_threads
};

// Publishes EngineStats as Prometheus metrics (text format 0.0.4, see PrometheusWriter).
// Every series is named `kvd_*` and says its unit, but for the standard process collector's
// (process_cpu_seconds_total, process_resident_memory_bytes, ...), named as every Prometheus
// client library names them. The series the Kubernetes Gateway API
// Inference Extension's model-server protocol reads are:
//   kvd_num_requests_waiting   (queued requests)
//   kvd_num_requests_running   (running requests)
//   kvd_kv_cache_usage_ratio   (KV utilization, 0..1)
// server/README.md lists every series.
//
// Thread safe when the sources are (EngineLoop::Stats and Backend::QueryDeviceMemory are).
// Does not own what the sources read; it must outlive the exporter.
class MetricsExporter {
 public:
  using StatsSource = std::function<EngineStats()>;
  // The device's memory at each scrape; null, or nullopt from it, publishes no device series.
  using DeviceMemorySource = std::function<std::optional<Backend::DeviceMemory>()>;

  MetricsExporter(MetricsInfo info, StatsSource source, DeviceMemorySource device = nullptr);

  // One scrape: takes a snapshot, the device's memory and this process's figures
  // (ReadProcessStats), and renders them.
  std::string Scrape() const;

  // The rendering alone (what Scrape does with what it read).
  static std::string Render(const EngineStats& stats, const MetricsInfo& info,
                            const ScrapeFacts& facts = {});

 private:
  MetricsInfo info_;
  StatsSource source_;
  DeviceMemorySource device_;
};

}  // namespace kvd

#endif  // KVD_SERVER_METRICS_EXPORTER_H_
