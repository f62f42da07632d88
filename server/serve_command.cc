#include "server/serve_command.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "cache/kv_layout.h"
#include "config/config_enums.h"
#include "config/config_loader.h"
#include "config/inference_config.h"
#include "kernels/status_macros.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "model/tokenizer.h"
#include "scheduler/engine_loop.h"
#include "server/http_server.h"
#include "server/inference_service.h"
#include "server/metrics_exporter.h"
#include "server/request_validator.h"
#include "server/serve_options.h"
#include "server/termination_signals.h"
#include "tools/device.h"
#include "tools/flags.h"
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

constexpr char kUsage[] =
    "kvd serve [--config FILE] [--model PATH] [--device auto|cpu|cuda]\n"
    "          [--grpc-address HOST:PORT] [--metrics-address HOST:PORT]\n"
    "          [--cuda-graphs on|off] [--set key=value ...]\n"
    "\n"
    "Serves the kvd.v1.Inference gRPC API (plus grpc.health.v1.Health and reflection) and\n"
    "Prometheus metrics at /metrics. Settings come from FILE (config/README.md lists every\n"
    "key), then each --set dotted.key=value in order, then the flags below. Port 0 picks a\n"
    "free port. SIGTERM/SIGINT drain: accepted requests finish (server.drain_timeout), then\n"
    "the daemon exits 0; a second SIGTERM/SIGINT during the drain ends it at once (requests\n"
    "still running end with finish reason aborted) and the daemon exits 0. One that comes\n"
    "during startup (reading the config, loading the model) exits 0 at once. A backend\n"
    "that fails for good (a device fault) aborts every request and the daemon exits 1.\n"
    "On cuda the weights and the KV cache are bf16, synthetic models are generated in\n"
    "device memory from model.seed, and decode steps replay CUDA graphs.";

// How long gRPC may take to finish calls still open after the engine has stopped.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

// How often the drain looks for a second termination signal while requests run on.
constexpr absl::Duration kDrainSignalPoll = absl::Milliseconds(50);

// How often a serving daemon looks whether its backend has failed for good.
constexpr absl::Duration kFailurePoll = absl::Milliseconds(200);

FlagSet MakeFlags() {
  FlagSet f(kUsage);
  f.AddString("config", "inference_config.yaml; default: built-in defaults");
  f.AddString("model", "overrides model.path (llama2.c .bin or synthetic:<preset>)");
  f.AddString("device", "overrides model.device: auto (cuda when a GPU is visible), cpu, cuda");
  f.AddString("grpc-address", "overrides server.grpc_address (host:port or unix:/path)");
  f.AddString("metrics-address", "overrides server.metrics_address; empty = no metrics");
  f.AddString("cuda-graphs", "on or off: replay decode steps as CUDA graphs (cuda only)", "on");
  f.AddString("set", "dotted.key=value, repeatable: overrides one config key");
  return f;
}

// The llama2.c tokenizer beside the model whose vocabulary matches the model's.
absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerBeside(const std::string& model_path,
                                                           int32_t vocab_size) {
  auto tokenizer = Tokenizer::FindBesideModel(model_path, vocab_size);
  if (tokenizer.ok()) return tokenizer;
  return absl::NotFoundError(absl::StrCat("model.tokenizer is empty and ",
                                          tokenizer.status().message(), "; set model.tokenizer"));
}

// What BuildConfig decided: the validated config and the device it runs on.
struct ServeSetup {
  InferenceConfig config;
  Device device = Device::kCpu;
  const char* device_source = "model.device";  // or "--device": what device errors name
};

absl::StatusOr<ServeSetup> BuildConfig(const FlagSet& flags, const std::vector<std::string>& sets) {
  std::vector<std::string> overrides = sets;
  for (const auto& [flag, key] : {std::pair<const char*, const char*>{"model", "model.path"},
                                  {"device", "model.device"},
                                  {"grpc-address", "server.grpc_address"},
                                  {"metrics-address", "server.metrics_address"}}) {
    if (flags.Has(flag)) overrides.push_back(absl::StrCat(key, "=", flags.GetString(flag)));
  }
  // Validated once, on the file and the overrides together (config/README.md).
  absl::StatusOr<InferenceConfig> loaded = LoadConfig(
      flags.Has("config") ? std::optional<std::string>(flags.GetString("config")) : std::nullopt,
      overrides);
  if (!loaded.ok()) return loaded.status();
  InferenceConfig config = *std::move(loaded);
  const char* device_source = flags.Has("device") ? "--device" : "model.device";
  auto device = ResolveDevice(Name(config.model.device));
  if (!device.ok()) {
    return Prefixed(device_source, device.status());
  }
  if (absl::Status st = CheckServable(config, *device); !st.ok()) return st;
  return ServeSetup{std::move(config), *device, device_source};
}

const char* SignalName(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

// Everything the daemon runs on, in construction order (destroyed in reverse).
struct Daemon {
  RealClock clock;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvCacheManager> cache;
  std::unique_ptr<EngineLoop> engine;
  std::unique_ptr<InferenceService> service;
  std::unique_ptr<MetricsExporter> metrics;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<HttpServer> http_server;
};

// The model on `backend`. A synthetic model on CUDA is generated in device memory
// (random_model.h: no host fp32 copy, so llama3-8b fits); on the CPU, and for checkpoints,
// weights are loaded on the host and uploaded, as before.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModelOn(const std::string& model_path,
                                                        uint64_t seed, Device device,
                                                        Backend* backend) {
  if (device == Device::kCuda && absl::StartsWith(model_path, "synthetic:")) {
    auto spec = LoadModelSpec(model_path);
    if (!spec.ok()) return spec.status();
    return CreateRandomModel(*spec, seed, backend);
  }
  auto weights = LoadModel(model_path, seed);
  if (!weights.ok()) return weights.status();
  return LlamaModel::Create(*std::move(weights), backend);  // frees host tensors as it goes
}

// Loads everything, then calls `about_to_listen` and starts the gRPC and metrics servers.
absl::Status Start(const ServeSetup& setup, bool cuda_graphs, Daemon& d, std::ostream& out,
                   absl::FunctionRef<void()> about_to_listen) {
  const InferenceConfig& config = setup.config;
  std::string model_path = config.model.path;
  if (model_path.empty()) {
    auto path = DefaultModelPath();
    if (!path.ok()) return path.status();
    model_path = *path;
  }
  int threads = config.server.num_threads;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto backend = MakeBackend(setup.device, threads);
  if (!backend.ok()) {
    return Prefixed(setup.device_source, backend.status());
  }
  d.backend = *std::move(backend);
  // Every cheap check before the weights load (minutes for a large checkpoint): the spec from
  // the header, the tokenizer, the pool's size.
  const std::string model_field = absl::StrCat("model.path '", model_path, "'");
  auto header_spec = LoadModelSpec(model_path);
  if (!header_spec.ok()) {
    return Prefixed(model_field, header_spec.status());
  }
  const ModelSpec& spec = *header_spec;

  if (!config.model.tokenizer.empty()) {
    auto tokenizer = Tokenizer::LoadLlama2c(config.model.tokenizer, spec.vocab_size);
    if (!tokenizer.ok()) {
      return Prefixed("model.tokenizer", tokenizer.status());
    }
    d.tokenizer = *std::move(tokenizer);
  } else if (!absl::StartsWith(model_path, "synthetic:")) {
    auto tokenizer = TokenizerBeside(model_path, spec.vocab_size);
    if (!tokenizer.ok()) return tokenizer.status();
    d.tokenizer = *std::move(tokenizer);
  }  // a synthetic model without a tokenizer serves prompt_token_ids only

  const KvShape shape{spec.num_layers, spec.num_kv_heads, spec.head_dim};
  const KvCacheOptions cache_options =
      CacheOptionsFrom(config.kv_cache, DefaultKvDtype(*d.backend), shape);
  if (absl::Status s = CheckPoolSize(config.kv_cache, cache_options, shape); !s.ok()) return s;

  auto model = LoadModelOn(model_path, config.model.seed, setup.device, d.backend.get());
  if (!model.ok()) {
    return Prefixed(model_field, model.status());
  }
  d.model = *std::move(model);
  const bool graphs = cuda_graphs && setup.device == Device::kCuda;
  if (graphs) {
    d.model->SetDecodeGraphs(MakeOpGraphRecorder(d.backend.get()), config.kv_cache.max_batch_size);
  }
  auto cache = KvCacheManager::Create(cache_options, shape, d.backend.get(), &d.clock);
  if (!cache.ok()) {
    return Prefixed("kv_cache_config", cache.status());
  }
  d.cache = *std::move(cache);

  d.engine = std::make_unique<EngineLoop>(EngineOptionsFrom(config), d.model.get(), d.cache.get(),
                                          d.tokenizer.get(), &d.clock);
  d.engine->Start();

  RequestLimits limits;
  limits.vocab_size = spec.vocab_size;
  limits.max_context_tokens = std::min(spec.max_context_tokens, config.kv_cache.max_seq_length);
  limits.pool_tokens = d.cache->stats().max_blocks * int64_t{cache_options.block_size};
  limits.default_seed = config.model.seed;
  limits.default_stop_token_ids = {spec.StopTokenId()};
  ServedModelInfo info;
  info.spec = spec;
  info.backend = std::string(d.backend->name());
  info.kv_dtype = std::string(DTypeName(cache_options.kv_dtype));
  info.block_size = cache_options.block_size;
  info.max_context_tokens = limits.max_context_tokens;
  d.service = std::make_unique<InferenceService>(d.engine.get(),
                                                 RequestValidator(limits, d.tokenizer.get()), info);

  about_to_listen();
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
  d.grpc_server = builder.BuildAndStart();
  const bool is_unix = absl::StartsWith(config.server.grpc_address, "unix:");
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
    metrics_info.num_blocks = d.cache->stats().max_blocks;
    EngineLoop* engine = d.engine.get();
    d.metrics =
        std::make_unique<MetricsExporter>(metrics_info, [engine] { return engine->Stats(); });
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
      << " layers, vocab " << spec.vocab_size << ", context " << limits.max_context_tokens
      << " tokens; backend " << info.backend << " ("
      << (setup.device == Device::kCuda
              ? absl::StrCat("GPU 0, decode graphs ", graphs ? "on" : "off")
              : absl::StrCat(threads, " threads"))
      << "), kv " << info.kv_dtype << ", block size " << cache_options.block_size << ", "
      << d.cache->stats().max_blocks << " blocks\n";
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

}  // namespace

int RunServeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  TerminationSignals signals;  // before any thread starts
  // A daemon whose stdout reader went away must still drain and exit 0, not die of SIGPIPE
  // on its next status line (sockets use MSG_NOSIGNAL already).
  std::signal(SIGPIPE, SIG_IGN);

  // --set may repeat; FlagSet keeps one value per flag, so collect them first.
  std::vector<std::string> sets;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--set" && i + 1 < args.size()) {
      sets.push_back(args[++i]);
    } else if (absl::StartsWith(args[i], "--set=")) {
      sets.push_back(args[i].substr(6));
    } else {
      rest.push_back(args[i]);
    }
  }
  FlagSet flags = MakeFlags();
  if (absl::Status s = flags.Parse(rest); !s.ok()) {
    err << "kvd serve: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  if (flags.help()) {
    out << flags.Usage();
    return 0;
  }
  const std::string graphs_flag = flags.GetString("cuda-graphs");
  if (graphs_flag != "on" && graphs_flag != "off") {
    err << "kvd serve: --cuda-graphs '" << graphs_flag << "' is not one of on, off\n\n"
        << flags.Usage();
    return 2;
  }
  // Startup (reading the config, which may be a pipe, and loading the weights, minutes for a
  // large checkpoint) runs on its own thread, so that a termination signal meanwhile is
  // answered at once. Nothing can interrupt a load half way and nothing listens yet, so the
  // process then exits 0 on the spot instead of unwinding under the loading thread. Once the
  // servers are about to start, a signal waits for startup to end and drains as usual:
  // `listening` under `listen_mu` decides which, so the two cannot cross.
  absl::StatusOr<ServeSetup> setup = absl::UnknownError("not started");
  Daemon d;
  absl::Status started;
  absl::Notification start_done;
  absl::Mutex listen_mu;
  bool listening = false;
  std::thread starter([&] {
    setup = BuildConfig(flags, sets);
    started = setup.ok() ? Start(*setup, graphs_flag == "on", d, out,
                                 [&] {
                                   absl::MutexLock lock(&listen_mu);
                                   listening = true;
                                 })
                         : setup.status();
    start_done.Notify();
  });
  int signal = 0;
  while (signal == 0 && !start_done.HasBeenNotified()) {
    signal = signals.Wait(kDrainSignalPoll);
    if (signal != 0) {
      absl::MutexLock lock(&listen_mu);  // held to the exit: the starter cannot begin listening
      if (!listening) {
        out << "kvd: " << SignalName(signal) << " before serving started: exiting\n" << std::flush;
        err << std::flush;
        std::_Exit(0);
      }
    }
  }
  starter.join();
  if (!started.ok()) {
    err << "kvd serve: " << started.message() << "\n";
    return 1;
  }
  const InferenceConfig* config = &setup->config;

  // Serves until a signal (else it came as startup ended: drain now), or until the backend
  // fails for good: then every request has been aborted and nothing more can run, so the
  // daemon stops reporting SERVING and exits 1 for its supervisor to restart it.
  while (signal == 0 && d.engine->Failure().ok()) signal = signals.Wait(kFailurePoll);
  // Refuse new work before saying so: once a line is out, every new call is refused.
  d.grpc_server->GetHealthCheckService()->SetServingStatus(false);
  d.service->BeginDrain();
  d.engine->BeginDrain();
  if (signal != 0) {
    const absl::Duration drain = config->server.drain_timeout;
    out << "kvd: " << SignalName(signal) << ": draining (up to " << absl::FormatDuration(drain)
        << ")\n"
        << std::flush;
    // Waits for the engine to go idle, in slices, so that a second signal (an operator who
    // wants the process gone now) cuts the drain short instead of waiting out drain_timeout.
    const absl::Time drain_end = absl::Now() + drain;
    bool idle = false;
    int second_signal = 0;
    while (true) {
      idle = d.engine->WaitIdle(std::min(kDrainSignalPoll, drain_end - absl::Now()));
      if (idle || absl::Now() >= drain_end) break;
      second_signal = signals.Wait(absl::ZeroDuration());
      if (second_signal != 0) break;
    }
    if (!idle) {
      const EngineStats stats = d.engine->Stats();
      out << "kvd: "
          << (second_signal == 0 ? std::string("drain timeout")
                                 : absl::StrCat("second ", SignalName(second_signal)))
          << ": aborting " << stats.requests_running + stats.requests_waiting << " requests\n";
    }
  }
  d.engine->Stop();  // anything left gets its final (aborted) event
  d.grpc_server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  if (d.http_server) d.http_server->Stop();
  // The backend failed for good, while serving or during the drain (every request was
  // aborted then).
  if (absl::Status failure = d.engine->Failure(); !failure.ok()) {
    err << "kvd serve: the backend failed, exiting: " << failure.message() << "\n" << std::flush;
    return 1;
  }
  out << "kvd: stopped\n" << std::flush;
  return 0;
}

}  // namespace kvd
