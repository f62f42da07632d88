#include "server/serve_command.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "config/config_loader.h"
#include "config/inference_config.h"
#include "kernels/status_macros.h"
#include "scheduler/engine_stats.h"
#include "server/daemon.h"
#include "server/exit_watchdog.h"
#include "server/growth_failure_log.h"
#include "server/serve_options.h"
#include "server/termination_signals.h"
#include "tools/device.h"
#include "tools/flags.h"

namespace kvd {
namespace {

constexpr char kUsage[] =
    "kvd serve [--config FILE] [--model PATH] [--device auto|cpu|cuda]\n"
    "          [--grpc-address HOST:PORT] [--metrics-address HOST:PORT]\n"
    "          [--cuda-graphs on|off] [--set key=value ...]\n"
    "\n"
    "Serves the kvd.v1.Inference gRPC API (plus grpc.health.v1.Health and reflection) and\n"
    "Prometheus metrics at /metrics. Settings come from FILE (config/README.md lists every\n"
    "key), then each --set dotted.key=value in order, then the flags below. Port 0 picks a\n"
    "free port. SIGTERM, SIGINT and SIGHUP drain (SIGHUP reloads nothing, and under nohup\n"
    "stays ignored): accepted requests finish (server.drain_timeout), then the daemon exits\n"
    "0; a second signal during the drain ends it at once (requests still running end with\n"
    "finish reason aborted) and the daemon exits 0. One that comes during startup (reading\n"
    "the config, loading the model) exits 0 at once. A backend that fails for good (a device\n"
    "fault) aborts every request and the daemon exits 1.\n"
    "Synthetic models are generated from model.seed (the same weights on every device, as\n"
    "`kvd generate --seed` makes them; in device memory on cuda). On cuda the weights and\n"
    "the KV cache are bf16 and decode steps replay CUDA graphs.";

// How long gRPC may take to finish calls still open after the engine has stopped.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);
// What destroying the daemon (`d`, on return) may take before the process exits anyway.
constexpr absl::Duration kTeardownLimit = absl::Seconds(10);

// How often the drain looks for a second termination signal while requests run on.
constexpr absl::Duration kDrainSignalPoll = absl::Milliseconds(50);

// How often a serving daemon looks whether its backend has failed for good.
constexpr absl::Duration kFailurePoll = absl::Milliseconds(200);

FlagSet MakeFlags() {
  FlagSet f(kUsage);
  f.AddString("config", "inference_config.yaml; default: built-in defaults");
  f.AddString("model",
              "overrides model.path (.gguf, Hugging Face directory, llama2.c .bin or "
              "synthetic:<preset>)");
  f.AddString("device",
              absl::StrCat("overrides model.device: auto (", kAutoPicksCuda, "), cpu, cuda"));
  f.AddString("grpc-address", "overrides server.grpc_address (host:port or unix:/path)");
  f.AddString("metrics-address", "overrides server.metrics_address; empty = no metrics");
  f.AddString("cuda-graphs", "on or off: replay decode steps as CUDA graphs (cuda only)", "on");
  f.AddStringList("set", "dotted.key=value: overrides one config key");
  return f;
}

// The flags that set one config key each, applied after the file and every --set.
constexpr std::pair<const char*, const char*> kKeyFlags[] = {
    {"model", "model.path"},
    {"device", "model.device"},
    {"grpc-address", "server.grpc_address"},
    {"metrics-address", "server.metrics_address"}};

// Each key flag's value through its key's own check (the checks between keys come later, on
// the whole config): a bad value is a usage error naming the flag, before anything is read.
absl::Status CheckKeyFlags(const FlagSet& flags) {
  for (const auto& [flag, key] : kKeyFlags) {
    if (!flags.Has(flag)) continue;
    InferenceConfig scratch;
    if (absl::Status s = ApplyOverride(scratch, key, flags.GetString(flag)); !s.ok()) {
      return Prefixed(absl::StrCat("--", flag), s);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ServeSetup> BuildConfig(const FlagSet& flags) {
  std::vector<std::string> overrides = flags.GetStrings("set");
  for (const auto& [flag, key] : kKeyFlags) {
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
  if (absl::Status st = CheckServable(config, device->device); !st.ok()) return st;
  // StartDaemon fits the device to the model once it has read its header (FitDeviceToModel).
  return ServeSetup{std::move(config), *std::move(device), device_source};
}

const char* SignalName(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "SIGTERM";
  }
}

}  // namespace

int RunServeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  TerminationSignals signals;  // before any thread starts
  // A daemon whose stdout reader went away must still drain and exit 0, not die of SIGPIPE
  // on its next status line (sockets use MSG_NOSIGNAL already).
  std::signal(SIGPIPE, SIG_IGN);

  FlagSet flags = MakeFlags();
  if (absl::Status s = flags.Parse(args); !s.ok()) {
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
  if (absl::Status s = CheckKeyFlags(flags); !s.ok()) {
    err << "kvd serve: " << s.message() << "\n\n" << flags.Usage();
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
    setup = BuildConfig(flags);
    started = setup.ok() ? StartDaemon(*setup, graphs_flag == "on", d, out, err,
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
  GrowthFailureLog growth_failures;
  while (signal == 0 && d.engine->Failure().ok()) {
    signal = signals.Wait(kFailurePoll);
    growth_failures.Check(d.engine->Stats().cache, err);
  }
  // Refuse new work before saying so: once a line is out, every new call is refused.
  d.grpc_server->GetHealthCheckService()->SetServingStatus(false);
  d.service->BeginDrain();
  d.engine->BeginDrain();
  if (signal != 0) {
    const absl::Duration drain = config->server.drain_timeout;
    out << "kvd: " << SignalName(signal) << ": draining (up to " << absl::FormatDuration(drain)
        << ")"
        // A terminal's hangup, or a service manager's reload by habit: say what it is not.
        << (signal == SIGHUP ? "; kvd does not reload its config on SIGHUP, it stops" : "") << "\n"
        << std::flush;
    // Waits for the engine to go idle, in slices, so that a second signal (an operator who
    // wants the process gone now) cuts the drain short instead of waiting out drain_timeout.
    // Timed on the daemon's monotonic clock, as the engine's timeouts are.
    const absl::Time drain_end = d.clock.Now() + drain;
    bool idle = false;
    int second_signal = 0;
    while (true) {
      idle = d.engine->WaitIdle(std::min(kDrainSignalPoll, drain_end - d.clock.Now()));
      if (idle || d.clock.Now() >= drain_end) break;
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
  // Each handler now writes its stream's final message and returns. The gRPC server's
  // shutdown starts once they have, so that its GOAWAY follows every stream's last bytes:
  // started earlier, it closes a connection as soon as its last stream's status is written,
  // and a client frame arriving then is answered with a reset that can cost the client what
  // it had not yet received (drain_test saw a stream lose its final message so, once).
  if (!d.service->WaitForCallsToEnd(kShutdownGrace)) {
    out << "kvd: " << d.service->open_calls() << " calls still open after "
        << absl::FormatDuration(kShutdownGrace) << "; shutting down anyway\n"
        << std::flush;
  }
  d.grpc_server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  if (d.http_server) d.http_server->Stop();
  // The backend failed for good, while serving or during the drain (every request was
  // aborted then).
  if (absl::Status failure = d.engine->Failure(); !failure.ok()) {
    err << "kvd serve: the backend failed, exiting: " << failure.message() << "\n" << std::flush;
    ExitIfTeardownHangs(kTeardownLimit, 1);
    return 1;
  }
  out << "kvd: stopped\n" << std::flush;
  ExitIfTeardownHangs(kTeardownLimit, 0);
  return 0;
}

}  // namespace kvd
