#ifndef KVD_SERVER_DAEMON_H_
#define KVD_SERVER_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <ostream>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "config/inference_config.h"
#include "kernels/backend.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "scheduler/engine_loop.h"
#include "server/http_server.h"
#include "server/inference_service.h"
#include "server/metrics_exporter.h"
#include "tools/device.h"

namespace kvd {

// What `kvd serve` decided before loading anything: the validated config and the device
// (StartDaemon fits it to the model, FitDeviceToModel, and says why "auto" runs on the CPU
// where it does).
struct ServeSetup {
  InferenceConfig config;
  DeviceChoice device;
  const char* device_source = "model.device";  // or "--device": what device errors name
};

// Everything a serving daemon runs on, in construction order (destroyed in reverse).
// StartDaemon fills it; serve_command.cc runs it and stops it.
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

// Builds `d` from `setup`: the backend, the tokenizer (model.tokenizer, else the one beside
// the model; a synthetic model may have none), the model (a synthetic one on CUDA generated
// in device memory), decode graphs when `cuda_graphs` and the device is CUDA, the KV cache
// and the running engine. Every cheap check (the model's header, the tokenizer, the pool's
// size) comes before the weights load. Then calls `about_to_listen`, starts the gRPC server
// (health SERVING) and the metrics server, and prints the model line, the KV pool's line
// (DescribePool) and one line per listener to `out`, and the pool's warnings to `err`. On
// error `d` holds what was built so far (destroying it stops that) and the status names the
// key or file at fault.
absl::Status StartDaemon(const ServeSetup& setup, bool cuda_graphs, Daemon& d, std::ostream& out,
                         std::ostream& err, absl::FunctionRef<void()> about_to_listen);

// The model `kvd serve` runs when model.path is empty: stories260K.bin in ../shared/models
// (the development copy beside a checkout, relative to the working directory), else in the
// folder $KVD_MODEL_CACHE names (default ~/.cache/kvd: where scripts/fetch-model puts it;
// the container image sets it to /opt/kvd/models). NotFound listing the places otherwise.
absl::StatusOr<std::string> DefaultModelPath();

}  // namespace kvd

#endif  // KVD_SERVER_DAEMON_H_
