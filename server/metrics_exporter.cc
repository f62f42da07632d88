#include "server/metrics_exporter.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/prometheus_writer.h"

namespace kvd {

namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

MetricsExporter::MetricsExporter(MetricsInfo info, StatsSource source, DeviceMemorySource device)
    : info_(std::move(info)), source_(std::move(source)), device_(std::move(device)) {}

std::string MetricsExporter::Scrape() const {
  ScrapeFacts facts;
  if (device_) facts.device = device_();
  facts.process = ReadProcessStats();
  return Render(source_(), info_, facts);
}

std::string MetricsExporter::Render(const EngineStats& s, const MetricsInfo& info,
                                    const ScrapeFacts& facts) {
  const KvCacheStats& c = s.cache;
  PrometheusWriter w;

  // Deployment.
  w.Gauges("kvd_cache_config_info", "KV cache configuration (value is always 1).",
           {{{{"block_size", std::to_string(info.block_size)},
              {"num_blocks", std::to_string(info.num_blocks)},
              {"kv_dtype", info.kv_dtype},
              {"prefix_caching", info.prefix_caching ? "true" : "false"}},
             1.0}});
  w.Gauges("kvd_model_info", "Served model and backend (value is always 1).",
           {{{{"model", info.model}, {"backend", info.backend}}, 1.0}});

  // Requests (Gateway API Inference Extension: queued and running requests).
  w.Gauge("kvd_num_requests_waiting", "Requests queued for admission.", s.requests_waiting);
  w.Gauge("kvd_num_requests_running", "Requests admitted and not yet finished.",
          s.requests_running);
  std::vector<std::pair<MetricLabels, double>> finished;
  for (int r = 0; r < kNumFinishReasons; ++r) {
    finished.push_back({{{"reason", std::string(FinishReasonName(static_cast<FinishReason>(r)))}},
                        static_cast<double>(s.requests_finished_by_reason[r])});
  }
  w.Counters("kvd_requests_finished",
             "Requests that reached a final event, by finish reason (cancelled: the client "
             "cancelled or went away; deadline: its deadline passed; aborted: drain timeout or "
             "a failed backend).",
             finished);
  w.Counter("kvd_admission_rejections",
            "Requests refused with RESOURCE_EXHAUSTED (queue full, or prompt + max_tokens larger "
            "than the whole pool).",
            static_cast<double>(s.requests_rejected));
  w.Counter("kvd_preemptions", "Running requests preempted (blocks freed, recomputed later).",
            static_cast<double>(s.preemptions));
  w.Counter("kvd_engine_steps", "Engine steps (forward passes) run.", static_cast<double>(s.steps));

  // Tokens.
  w.Counter("kvd_prompt_tokens", "Prompt tokens received (tokens in).",
            static_cast<double>(s.prompt_tokens));
  w.Counter("kvd_prompt_tokens_computed",
            "Prompt tokens prefilled at each request's first admission (the rest came from the "
            "prefix or session cache; recomputing after a preemption is not counted).",
            static_cast<double>(s.computed_prompt_tokens));
  w.Counter("kvd_generation_tokens", "Tokens generated (tokens out).",
            static_cast<double>(s.generated_tokens));

  // KV utilization (Gateway API Inference Extension: KV cache utilization).
  const double usage = c.max_blocks > 0
                           ? static_cast<double>(c.used_blocks) / static_cast<double>(c.max_blocks)
                           : 0.0;
  w.Gauge("kvd_kv_cache_usage_ratio",
          "Fraction of the KV pool's capacity (blocks at max_size) referenced by sequences or "
          "sessions, 0..1 (where the arena failed to grow, kvd_kv_pool_growth_failures_total, "
          "the pool is full below 1; idle sessions' pins count as used, though a request may "
          "have them: kvd_kv_cache_obtainable_blocks).",
          usage);
  w.Gauges("kvd_kv_cache_blocks",
           "KV blocks by state: free + used + cached = allocated; pinned is the part of used "
           "held by idle sessions.",
           {{{{"state", "free"}}, static_cast<double>(c.free_blocks)},
            {{{"state", "used"}}, static_cast<double>(c.used_blocks)},
            {{{"state", "cached"}}, static_cast<double>(c.cached_blocks)},
            {{{"state", "pinned"}}, static_cast<double>(c.pinned_blocks)}});
  w.Gauge("kvd_kv_cache_block_references",
          "KV blocks as their holders see them: every running sequence's block table and idle "
          "session's chain counted. Minus the used blocks (kvd_kv_cache_block_references - "
          "ignoring(state) kvd_kv_cache_blocks{state=\"used\"}): the copies that sharing "
          "avoids (prefix hits, and idle sessions' pins, which are released under pressure "
          "rather than copied, so an upper bound on what running requests save).",
          static_cast<double>(c.block_references));
  w.Gauge("kvd_kv_cache_obtainable_blocks",
          "KV blocks a request could get now: free, cached and evictable, room for the arena "
          "to grow, and those only idle sessions pin (released for room). The headroom "
          "kvd_kv_cache_usage_ratio does not show, since it counts idle pins as used.",
          static_cast<double>(c.obtainable_blocks));
  w.Gauge("kvd_kv_cache_shared_blocks", "Used KV blocks with two holders or more.",
          static_cast<double>(c.shared_blocks));
  w.Gauge("kvd_kv_cache_allocated_blocks", "KV blocks in the chunks allocated now.",
          static_cast<double>(c.total_blocks));
  w.Gauge("kvd_kv_cache_capacity_blocks", "KV blocks the pool may grow to (max_size).",
          static_cast<double>(c.max_blocks));
  w.Gauge("kvd_kv_cache_block_bytes", "Bytes of one KV block (all layers, K and V).",
          static_cast<double>(c.block_bytes));
  w.Gauge("kvd_kv_pool_reserved_bytes", "Bytes of KV arena reserved (allocated chunks).",
          static_cast<double>(c.total_bytes));
  w.Gauge("kvd_kv_pool_used_bytes", "Bytes of KV arena in referenced blocks.",
          static_cast<double>(c.used_bytes));
  w.Gauge("kvd_kv_pool_cached_bytes", "Bytes of KV arena in cached, evictable blocks.",
          static_cast<double>(c.cached_bytes));
  w.Gauge("kvd_kv_pool_max_bytes", "Most bytes the KV arena may grow to.",
          static_cast<double>(c.max_bytes));
  w.Gauge("kvd_kv_pool_chunks", "KV arena chunks allocated now.", c.num_chunks);
  w.Counter("kvd_kv_pool_chunks_grown",
            "KV arena chunks allocated since start beyond the initial ones (initial_size).",
            static_cast<double>(c.chunks_grown));
  w.Counter("kvd_kv_pool_chunks_released", "KV arena chunks returned since start.",
            static_cast<double>(c.chunks_released));
  w.Counter("kvd_kv_pool_growth_failures",
            "KV arena chunks that failed to allocate below max_size (device or host memory ran "
            "out, or on a GPU the chunk would have left less than memory_pool.device_headroom "
            "free): the pool then serves within kvd_kv_cache_allocated_blocks, evicting, and tries "
            "one chunk again after memory_pool.growth_retry_interval (each try that fails counts "
            "here) or grows once a chunk is released (the daemon logs the error).",
            static_cast<double>(c.chunk_growth_failures));
  w.Gauge("kvd_kv_pool_growth_stopped",
          "1 while the KV arena adds no chunk after a failed growth below max_size (until a "
          "retry adds one or a chunk is released), else 0. The state to alert on: "
          "kvd_kv_pool_growth_failures_total rises again at each retry that fails.",
          c.chunk_growth_stopped ? 1.0 : 0.0);
  // Where the backend's memory went.
  const MemoryStats& m = s.memory;
  w.Gauges("kvd_memory_bytes",
           "Backend memory kvd holds (device memory on CUDA, host memory on the CPU), by what "
           "holds it: weights; kv_pool, the KV arena's chunks (kvd_kv_pool_reserved_bytes); "
           "activations, every other buffer (activations: on CUDA those of the largest step, "
           "held from the start, on the CPU grown to the largest batch so far; "
           "batch metadata, decode-graph and sampling buffers, the KV arena's chunk table and "
           "block-copy list); workspace, the backend's own (CUDA op scratch and cuBLASLt "
           "workspace). As of the engine's last step.",
           {{{{"component", "weights"}}, static_cast<double>(m.weights_bytes)},
            {{{"component", "kv_pool"}}, static_cast<double>(m.kv_pool_bytes)},
            {{{"component", "activations"}}, static_cast<double>(m.activation_bytes)},
            {{{"component", "workspace"}}, static_cast<double>(m.workspace_bytes)}});
  if (const std::optional<Backend::DeviceMemory>& device = facts.device; device.has_value()) {
    w.Gauges("kvd_device_memory_bytes",
             "The GPU's memory as its driver reports it at the scrape, every process's use "
             "included: total, and free (the part of total - free that kvd_memory_bytes does "
             "not count is the CUDA context, cuBLAS's handles, recorded graphs and other "
             "processes, give or take what changed since the engine's last step).",
             {{{{"state", "total"}}, static_cast<double>(device->total_bytes)},
              {{{"state", "free"}}, static_cast<double>(device->free_bytes)}});
  }
  w.Gauge("kvd_kv_cache_sequences", "Sequences holding KV blocks.", c.num_sequences);
  w.Gauge("kvd_prefix_cache_keys", "Blocks registered in the prefix index.",
          static_cast<double>(c.num_prefix_keys));

  // Prefix cache and sessions.
  w.Counter("kvd_prefix_cache_query_tokens",
            "Prompt tokens looked up in the prefix cache, once a request (not again when a "
            "preempted request is recomputed); counted with prefix caching off too "
            "(kvd_cache_config_info's prefix_caching label), when only sessions can hit.",
            static_cast<double>(c.prefix_query_tokens));
  w.Counter("kvd_prefix_cache_hit_tokens",
            "Prompt tokens found already computed in the prefix index.",
            static_cast<double>(c.prefix_hit_tokens));
  w.Counter("kvd_session_cache_hit_tokens",
            "Prompt tokens found already computed in a session's pinned blocks.",
            static_cast<double>(c.session_hit_tokens));
  w.Counter("kvd_kv_cache_evicted_blocks",
            "Cached blocks evicted: for room, or by defragmentation and the release of the top "
            "chunk.",
            static_cast<double>(c.evictions));
  w.Gauge("kvd_sessions_active", "Sessions known to the cache.", c.num_sessions);
  w.Counters("kvd_sessions_released", "Sessions whose pins were released, by reason.",
             {{{{"reason", "idle"}}, static_cast<double>(c.session_releases_idle)},
              {{{"reason", "pin_cap"}}, static_cast<double>(c.session_releases_pin_cap)},
              {{{"reason", "closed"}}, static_cast<double>(c.session_releases_closed)},
              {{{"reason", "pressure"}}, static_cast<double>(c.session_releases_pressure)}});

  // Defragmentation.
  w.Counter("kvd_defrag_moved_blocks", "KV blocks moved by the defragmenter.",
            static_cast<double>(c.defrag_moves));
  const DefragPauseStats& d = c.defrag_pauses;
  Histogram pauses(
      std::vector<double>(kDefragPauseBoundsSeconds.begin(), kDefragPauseBoundsSeconds.end()));
  pauses.counts.assign(d.bucket_counts.begin(), d.bucket_counts.end());
  pauses.sum = Seconds(d.total);
  pauses.count = d.num_pauses;
  w.HistogramFamily("kvd_defrag_pause_seconds",
                    absl::StrCat("Engine pauses spent defragmenting: copying blocks down and "
                                 "returning the emptied chunk to the device (the copies' budget, "
                                 "kv_cache_config.defrag.max_pause: ",
                                 absl::FormatDuration(info.defrag_max_pause), ")."),
                    pauses);
  w.Gauge("kvd_defrag_pause_max_seconds", "Longest defragmentation pause so far.", Seconds(d.max));

  // Output length prediction.
  w.Gauge("kvd_output_length_predicted_tokens",
          "The admission predictor's current output length (a quantile of observed lengths).",
          s.predicted_output_tokens);
  w.HistogramFamily("kvd_output_length_tokens", "Output tokens of finished requests.",
                    s.output_length);
  w.HistogramFamily("kvd_output_length_prediction_error_tokens",
                    "Actual minus predicted output tokens of finished requests.",
                    s.prediction_error);

  // Latency.
  w.HistogramFamily("kvd_time_to_first_token_seconds", "Submit to first token.",
                    s.time_to_first_token);
  w.HistogramFamily("kvd_inter_token_latency_seconds", "Time between consecutive tokens.",
                    s.inter_token_latency);
  w.HistogramFamily("kvd_request_latency_seconds", "Submit to final event (end to end).",
                    s.end_to_end_latency);

  // The process, as Prometheus client libraries' standard collector names it.
  if (const std::optional<ProcessStats>& p = facts.process; p.has_value()) {
    w.Counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.",
              p->cpu_seconds);
    w.Gauge("process_resident_memory_bytes",
            "Resident memory size in bytes (on the CPU backend the KV pool's committed pages "
            "are part of it).",
            static_cast<double>(p->resident_bytes));
    w.Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.",
            static_cast<double>(p->virtual_bytes));
    w.Gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
            p->start_time_seconds);
    if (p->open_fds >= 0) {
      w.Gauge("process_open_fds", "Number of open file descriptors.",
              static_cast<double>(p->open_fds));
    }
    if (p->max_fds > 0) {
      w.Gauge("process_max_fds", "Maximum number of open file descriptors.",
              static_cast<double>(p->max_fds));
    }
    w.Gauge("kvd_process_threads",
            "OS threads of the daemon (the gRPC server holds one for each open stream).",
            static_cast<double>(p->threads));
  }
  return w.text();
}

}  // namespace kvd
