#include "server/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/kv_layout.h"
#include "config/config_enums.h"
#include "kernels/status_macros.h"
#include "model/model_loader.h"
#include "server/call_limit.h"
#include "server/memory_report.h"
#include "server/pool_report.h"
#include "server/request_validator.h"
#include "server/serve_options.h"
#include "server/unix_socket.h"
#include "tools/cpu_count.h"
#include "tools/random_model.h"

namespace kvd {

absl::StatusOr<std::string> DefaultModelPath() {
  std::vector<std::string> candidates = {"../shared/models/stories260K.bin"};
  // Where scripts/fetch-model puts it: $KVD_MODEL_CACHE, else ~/.cache/kvd.
  if (const char* cache = std::getenv("KVD_MODEL_CACHE"); cache != nullptr && *cache != '\0') {
    candidates.push_back(absl::StrCat(cache, "/stories260K.bin"));
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    candidates.push_back(absl::StrCat(home, "/.cache/kvd/stories260K.bin"));
  }
  for (const std::string& path : candidates) {
    std::error_code error;  // an unreadable or looping $KVD_MODEL_CACHE is just "not there"
    if (std::filesystem::exists(path, error)) return path;
  }
  return absl::NotFoundError(absl::StrCat(
      "model.path is empty and the default model stories260K.bin is not in ",
      absl::StrJoin(candidates, " or "),
      "; pass --model PATH, or set KVD_MODEL_CACHE to the folder that holds it (default "
      "~/.cache/kvd; scripts/fetch-model, which `make serve` runs, downloads it there)"));
}

namespace {

// The model on `backend`. A synthetic model is generated in backend memory (random_model.h:
// no host fp32 copy, so llama3-8b fits a GPU) with the same weights on every device, as
// `kvd generate` makes it; a checkpoint is loaded on the host and uploaded.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModelOn(const std::string& model_path,
                                                        uint64_t seed, Device device,
                                                        Backend* backend) {
  if (absl::StartsWith(model_path, "synthetic:")) {
    auto spec = LoadModelSpec(model_path);
    if (!spec.ok()) return spec.status();
    // The CPU backend's weights are host memory.
    return CreateRandomModel(*spec, seed, backend,
                             device == Device::kCpu ? AvailableHostBytes() : std::nullopt);
  }
  auto weights = LoadModel(model_path, seed);
  if (!weights.ok()) return weights.status();
  return LlamaModel::Create(*std::move(weights), backend);  // frees host tensors as it goes
}

}  // namespace

absl::Status StartDaemon(const ServeSetup& setup, bool cuda_graphs, Daemon& d, std::ostream& out,
                         std::ostream& err, absl::FunctionRef<void()> about_to_listen) {
  const InferenceConfig& config = setup.config;
  std::string model_path = config.model.path;
  if (model_path.empty()) {
    auto path = DefaultModelPath();
    if (!path.ok()) return path.status();
    model_path = *path;
  }
  int threads = config.server.num_threads;
  if (threads <= 0) threads = UsableCpus();
  // Every cheap check before the weights load (minutes for a large checkpoint): the spec from
  // the header (also before the backend is made, for the device to fit the model), the
  // tokenizer, the pool's size.
  const std::string model_field = absl::StrCat("model.path '", model_path, "'");
  auto header_spec = LoadModelSpec(model_path);
  if (!header_spec.ok()) {
    return Prefixed(model_field, header_spec.status());
  }
  const ModelSpec& spec = *header_spec;
  auto fitted = FitDeviceToModel(setup.device, spec.head_dim);
  if (!fitted.ok()) return Prefixed(setup.device_source, fitted.status());
  const Device device = fitted->device;
  if (device != setup.device.device) {  // the CPU, for "auto": what it supports
    if (absl::Status s = CheckServable(config, device); !s.ok()) return s;
  }
  if (!fitted->fallback_reason.empty()) {
    out << "kvd: " << setup.device_source << " auto runs on the CPU: " << fitted->fallback_reason
        << "\n";
  }
  auto backend = MakeBackend(device, threads);
  if (!backend.ok()) {
    return Prefixed(setup.device_source, backend.status());
  }
  d.backend = *std::move(backend);

  if (!config.model.tokenizer.empty()) {
    auto tokenizer = LoadTokenizerFile(config.model.tokenizer, spec.vocab_size);
    if (!tokenizer.ok()) {
      return Prefixed("model.tokenizer", tokenizer.status());
    }
    d.tokenizer = *std::move(tokenizer);
  } else if (!absl::StartsWith(model_path, "synthetic:")) {
    // A GGUF file's own, a Hugging Face directory's tokenizer.model, or the llama2.c
    // tokenizer beside a checkpoint.
    auto tokenizer = LoadModelTokenizer(model_path, spec.vocab_size);
    if (absl::IsUnimplemented(tokenizer.status())) {
      // A model whose tokenizer kvd's cannot stand in for (e.g. Llama 3's byte-level BPE, in
      // a GGUF file or a tokenizer.json) still serves token ids, as a synthetic model does.
      out << "kvd: " << tokenizer.status().message()
          << ": serving prompt_token_ids only (text prompts and stop strings are refused)\n";
    } else if (!tokenizer.ok()) {
      return absl::Status(tokenizer.status().code(),
                          absl::StrCat("model.tokenizer is empty and ",
                                       tokenizer.status().message(), "; set model.tokenizer"));
    } else {
      d.tokenizer = *std::move(tokenizer);
    }
  }  // a synthetic model without a tokenizer serves prompt_token_ids only

  const KvShape shape{spec.num_layers, spec.num_kv_heads, spec.head_dim};
  const KvCacheOptions cache_options =
      CacheOptionsFrom(config.kv_cache, DefaultKvDtype(*d.backend), shape);
  if (absl::Status s = CheckPoolSize(config.kv_cache, cache_options, shape); !s.ok()) return s;

  auto model = LoadModelOn(model_path, config.model.seed, device, d.backend.get());
  if (!model.ok()) {
    return Prefixed(model_field, model.status());
  }
  d.model = *std::move(model);
  const bool graphs = cuda_graphs && device == Device::kCuda;
  if (graphs) {
    d.model->SetDecodeGraphs(MakeOpGraphRecorder(d.backend.get()), config.kv_cache.max_batch_size);
  }
  if (device == Device::kCuda) {
    // Before the KV pool's chunks: the pool grows into the device memory left beside them, and
    // would otherwise take what a full step's activations need later (aborting that step).
    // The CPU backend grows them as the steps come, in host memory committed as it is used.
    if (absl::Status s = d.model->ReserveActivations(config.scheduler.max_num_batched_tokens,
                                                     config.kv_cache.max_batch_size);
        !s.ok()) {
      return Prefixed("scheduler.max_num_batched_tokens and kv_cache_config.max_batch_size",
                      absl::Status(s.code(), absl::StrCat(s.message(),
                                                          "; allowed: a step whose activations "
                                                          "fit the device's free memory")));
    }
  }
  auto cache = KvCacheManager::Create(cache_options, shape, d.backend.get(), &d.clock);
  if (!cache.ok()) {
    return Prefixed("kv_cache_config", cache.status());
  }
  d.cache = *std::move(cache);
  // Read here, before the engine thread starts: from then on the cache is that thread's alone.
  const int64_t max_blocks = d.cache->geometry().max_blocks();
  const int32_t context_tokens = std::min(spec.max_context_tokens, config.kv_cache.max_seq_length);
  const PoolReport pool_report =
      DescribePool(d.cache->geometry(), d.cache->layout().block_bytes(), cache_options.block_size,
                   context_tokens, device == Device::kCpu ? AvailableHostBytes() : std::nullopt);
  // The pool holds its initial chunks now; the device says what is left beside them.
  std::optional<std::string> device_room_warning;
  if (const std::optional<Backend::DeviceMemory> memory = d.backend->QueryDeviceMemory()) {
    const KvPoolGeometry& g = d.cache->geometry();
    device_room_warning = DeviceRoomWarning(
        int64_t{g.max_chunks} * g.chunk_bytes, int64_t{g.initial_chunks} * g.chunk_bytes,
        memory->free_bytes, cache_options.device_headroom_bytes);
  }

  d.engine = std::make_unique<EngineLoop>(EngineOptionsFrom(config), d.model.get(), d.cache.get(),
                                          d.tokenizer.get(), &d.clock);
  d.engine->Start();

  RequestLimits limits;
  limits.vocab_size = spec.vocab_size;
  limits.max_context_tokens = context_tokens;
  limits.model_context_tokens = spec.max_context_tokens;
  limits.pool_tokens = max_blocks * int64_t{cache_options.block_size};
  limits.default_seed = config.model.seed;
  limits.default_stop_token_ids = spec.StopTokenIds();
  ServedModelInfo info;
  info.spec = spec;
  info.backend = std::string(d.backend->name());
  info.kv_dtype = std::string(DTypeName(cache_options.kv_dtype));
  info.block_size = cache_options.block_size;
  info.max_context_tokens = limits.max_context_tokens;
  d.service = std::make_unique<InferenceService>(d.engine.get(),
                                                 RequestValidator(limits, d.tokenizer.get()), info);

  about_to_listen();
  const bool is_unix = absl::StartsWith(config.server.grpc_address, "unix:");
  if (is_unix) {
    const std::string& address = config.server.grpc_address;
    if (absl::Status s = FreeUnixSocketPath(UnixSocketPath(address), address); !s.ok()) {
      return Prefixed("server.grpc_address", s);
    }
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, so a second daemon on the same port would bind too and
  // split the connections with the first; refusing makes "address in use" a startup error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int grpc_port = 0;
  builder.AddListeningPort(config.server.grpc_address, grpc::InsecureServerCredentials(),
                           &grpc_port);
  builder.RegisterService(d.service.get());
  LimitConcurrentCalls(MaxConcurrentCalls(config), &builder);
  d.grpc_server = builder.BuildAndStart();
  if (d.grpc_server == nullptr || (!is_unix && grpc_port == 0)) {
    return absl::UnavailableError(absl::StrCat("server.grpc_address: cannot listen on '",
                                               config.server.grpc_address,
                                               "' (address in use, or not an address of this "
                                               "host); allowed: a free host:port or unix:/path"));
  }
  // Overall ("") and per service; SetServingStatus(false) on drain flips both.
  d.grpc_server->GetHealthCheckService()->SetServingStatus(true);
  d.grpc_server->GetHealthCheckService()->SetServingStatus(
      std::string(v1::Inference::service_full_name()), true);
  std::string grpc_address = config.server.grpc_address;
  if (!is_unix) {
    grpc_address = absl::StrCat(grpc_address.substr(0, grpc_address.rfind(':')), ":", grpc_port);
  }

  if (!config.server.metrics_address.empty()) {
    MetricsInfo metrics_info;
    metrics_info.model = spec.name;
    metrics_info.backend = info.backend;
    metrics_info.kv_dtype = info.kv_dtype;
    metrics_info.block_size = cache_options.block_size;
    metrics_info.num_blocks = max_blocks;
    metrics_info.prefix_caching = config.kv_cache.enable_prefix_caching;
    metrics_info.defrag_max_pause = config.kv_cache.defrag.max_pause;
    EngineLoop* engine = d.engine.get();
    const Backend* backend = d.backend.get();
    d.metrics = std::make_unique<MetricsExporter>(
        metrics_info, [engine] { return engine->Stats(); },
        [backend] { return backend->QueryDeviceMemory(); });
    MetricsExporter* metrics = d.metrics.get();
    auto http =
        HttpServer::Start(config.server.metrics_address,
                          {{"/metrics", [metrics] {
                              return HttpServer::Response{
                                  "text/plain; version=0.0.4; charset=utf-8", metrics->Scrape()};
                            }}});
    if (!http.ok()) {
      return Prefixed("server.metrics_address", http.status());
    }
    d.http_server = *std::move(http);
  }

  out << "kvd: model " << spec.name << " (" << model_path << "), " << spec.num_layers
      << " layers, vocab " << spec.vocab_size << ", context " << context_tokens << " tokens"
      << ContextCapNote(context_tokens, spec.max_context_tokens) << "; backend " << info.backend
      << " ("
      << (device == Device::kCuda ? absl::StrCat("GPU 0, decode graphs ", graphs ? "on" : "off")
                                  : absl::StrCat(threads, " threads"))
      << "), kv " << info.kv_dtype << ", block size " << cache_options.block_size << ", "
      << max_blocks << " blocks\n";
  out << pool_report.line << "\n";
  out << DescribeMemory(d.engine->Stats().memory, d.backend->QueryDeviceMemory(),
                        /*activations_reserved=*/device == Device::kCuda)
      << "\n";
  for (const std::string& warning : pool_report.warnings) err << warning << "\n";
  if (device_room_warning.has_value()) err << *device_room_warning << "\n";
  if (device == Device::kCuda && cache_options.kv_dtype == DType::kInt8) {
    err << "kvd: warning: kv_cache_config.quantization int8 halves the KV bytes of bf16, but no "
           "fast CUDA attention kernel reads int8 yet: the simple one that does makes steps "
           "several times slower (Llama-3-8B, 2000-token context, H100: 72 ms a decode step "
           "against bf16's 5.3 ms)\n";
  }
  out << "kvd: serving gRPC on " << grpc_address << "\n";
  if (d.http_server) {
    // A URL where there is one; curl reaches a unix socket with --unix-socket PATH.
    const std::string& address = d.http_server->address();
    if (absl::StartsWith(address, "unix:")) {
      out << "kvd: serving metrics on " << address << " (HTTP GET /metrics)\n";
    } else {
      out << "kvd: serving metrics on http://" << address << "/metrics\n";
    }
  }
  out << std::flush;
  return absl::OkStatus();
}

}  // namespace kvd
