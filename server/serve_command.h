#ifndef KVD_SERVER_SERVE_COMMAND_H_
#define KVD_SERVER_SERVE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

namespace kvd {

// `kvd serve --config FILE [--model PATH] [--device auto|cpu|cuda] [--grpc-address HOST:PORT]
//            [--metrics-address HOST:PORT] [--cuda-graphs on|off] [--set key=value ...]`
//
// Loads the config (built-in defaults without --config), applies --set overrides in order,
// then the dedicated flags, validates, resolves model.device (auto = cuda when this build
// has CUDA, a GPU is visible and cuBLAS loads; else the CPU, saying why where a GPU is
// visible), refuses what that device cannot run (KV quantization
// other than `none` on the CPU; other than `none`/`bf16` on CUDA), loads the model (a
// synthetic one is generated in backend memory from model.seed, the same weights on every
// device; on the CPU only if host memory holds them) and its tokenizer
// (a synthetic model has none: only prompt_token_ids are served), builds the backend (CPU
// reference with fp32 KV, or GPU 0 with bf16 weights and KV and, unless --cuda-graphs off,
// decode steps replayed as CUDA graphs), the KV cache and the engine, and serves
// kvd.v1.Inference, grpc.health.v1.Health and server reflection over gRPC, and Prometheus
// metrics at /metrics. Once listening it prints one line per listener to `out`:
//   kvd: serving gRPC on 127.0.0.1:50051
//   kvd: serving metrics on http://127.0.0.1:50052/metrics
// (port 0 in an address picks a free port; the line shows the real one).
// On SIGTERM, SIGINT or SIGHUP: health turns NOT_SERVING, new Generate calls get UNAVAILABLE,
// accepted requests finish (bounded by server.drain_timeout, then they are aborted; a
// second signal aborts them at once), and the command returns 0. A signal during startup
// (before the servers start) exits the process 0 at once. A backend that fails for good
// aborts every request, turns health NOT_SERVING and returns 1. Exit codes: 0 after a
// drain, 1 for a startup failure (the reason on `err`, naming the key or file) or a failed
// backend (named on `err`), 2 for bad flags. Startup itself is StartDaemon (daemon.h).
//
// REQUIRES: called before the process starts any thread (see TerminationSignals).
int RunServeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kvd

#endif  // KVD_SERVER_SERVE_COMMAND_H_
