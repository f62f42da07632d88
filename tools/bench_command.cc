// `kvd bench` (bench_command.h): its flags and table; the measurement is decode_bench.h's.
// Time per decode step of the whole engine path (batch upload, LlamaModel forward through the
// backend, greedy Backend::Sample, KV bookkeeping) on a synthetic model or a checkpoint, beside
// the memory roofline of the same run:
//
//   roofline step = (weight bytes read + KV bytes read) / measured device copy bandwidth
//
// The KV cache is filled to the context with seeded random values (no prefill), then
// `--steps` greedy decode steps are timed after `--warmup` untimed ones, with the decode
// steps replayed as CUDA graphs and without (`--graphs both|on|off`; graphs exist on CUDA
// only; the first step of a graphed run records the graph, and a timed step that records or
// re-records one is left out of the step times and reported apart). A synthetic model's
// weights are made on the device (tools/random_model.h), so llama3-8b needs no host copy; a
// checkpoint's are loaded on the host and uploaded, as `kvd generate` does. A benchmark, not a
// test: it prints a table (and JSON lines to $OUT/kvd_bench.jsonl when OUT is set). It exits
// 2 on a usage error (a flag value outside its range, a malformed or empty --cases, a case
// longer than the model's context), refused before anything is built, and 1 when the device,
// the engine or the copy bandwidth measurement fails, a case produces non-finite logits, or a
// graphed case's timed steps were not replayed from graphs (GRAPHS NOT REPLAYED); never on a
// time.
//
// On a CPU-only machine, `--device cpu --model synthetic:tiny --cases 1x64,4x128` runs the
// same code path in seconds.

#include "tools/bench_command.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "tools/cpu_count.h"
#include "tools/decode_bench.h"
#include "tools/device.h"
#include "tools/engine_setup.h"
#include "tools/flags.h"
#include "tools/random_model.h"

namespace kvd {
namespace {

using SteadyClock = std::chrono::steady_clock;

double Ms(SteadyClock::time_point start, SteadyClock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

// Flag ranges: --threads as the config's server.num_threads (kMaxCpuThreads, as `kvd
// generate`); --steps and --warmup as the int32 counts RunDecodeBenchCase takes (the model's
// context bounds them further); --block-size as kv_cache_config.block_size.
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

}  // namespace

int RunBenchCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  FlagSet flags(
      "kvd bench [--model synthetic:llama3-8b] [--device auto] [--cases 1x512,...]\n"
      "                 [--steps N] [--warmup W] [--block-size B] [--seed S] [--threads N]\n"
      "                 [--graphs both|on|off] [--profile]\n"
      "\n"
      "Time per greedy decode step of the whole engine path on a model (synthetic, a GGUF\n"
      "file, a Hugging Face directory or a llama2.c checkpoint), KV filled at random to each\n"
      "case's context, beside the memory roofline of the same run. A number outside its\n"
      "flag's range (below), a malformed --cases or --graphs, and a case whose context,\n"
      "warm-up and steps exceed the model's context are usage errors, refused before\n"
      "anything is built.");
  flags.AddString("model",
                  "synthetic:<preset> (weights made on the device from --seed), a GGUF file, a "
                  "Hugging Face directory or a llama2.c checkpoint",
                  "synthetic:llama3-8b");
  flags.AddString("device", absl::StrCat("cuda, cpu, or auto (", kAutoPicksCuda, ")"), "auto");
  flags.AddString("cases", "comma-separated BATCHxCONTEXT, at least one",
                  "1x512,1x4096,64x1024,64x4096");
  flags.AddInt("steps", "timed decode steps per case", 32, IntRange{1, kMaxInt32});
  flags.AddInt("warmup", "untimed decode steps before them", 4, IntRange{0, kMaxInt32});
  flags.AddInt("block-size", "tokens per KV block, as kv_cache_config.block_size", 16,
               IntRange{1, 256, /*power_of_two=*/true});
  flags.AddUint64("seed", "seed of the synthetic weights and of the KV", 1);
  flags.AddInt("threads", "CPU threads for --device cpu; 0 = the CPUs this process may use", 0,
               IntRange{0, kMaxCpuThreads});
  flags.AddString("graphs", "both, on or off: decode steps as CUDA graphs (cuda only)", "both");
  flags.AddBool("profile",
                "cuda: after each uncaptured case, GPU time per op and step over --steps more "
                "steps");
  auto fail = [&err](const absl::Status& s) {
    err << "kvd bench: " << s.message() << "\n";
    return 1;
  };
  auto usage_error = [&flags, &err](const absl::Status& s) {
    err << "kvd bench: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  };
  if (auto s = flags.Parse(args); !s.ok()) return usage_error(s);
  if (flags.help()) {
    out << flags.Usage();
    return 0;
  }
  // Every flag value is judged here, before the backend and the model exist: a typo must not
  // cost a model build (seconds to minutes) and then read as a failed measurement.
  auto cases = ParseDecodeBenchCases(flags.GetString("cases"));
  if (!cases.ok()) return usage_error(cases.status());
  const std::string model_ref = flags.GetString("model");
  const bool synthetic = model_ref.rfind("synthetic:", 0) == 0;
  auto spec = LoadModelSpec(model_ref);  // a checkpoint's header alone
  if (!spec.ok()) return usage_error(Prefixed("--model", spec.status()));
  const std::string graphs_flag = flags.GetString("graphs");
  if (graphs_flag != "both" && graphs_flag != "on" && graphs_flag != "off") {
    return usage_error(absl::InvalidArgumentError(
        absl::StrCat("--graphs: '", graphs_flag, "' is not one of both, on, off")));
  }
  const std::string device_flag = absl::AsciiStrToLower(flags.GetString("device"));
  if (device_flag != "auto" && device_flag != "cpu" && device_flag != "cuda") {
    return usage_error(Prefixed("--device", ResolveDevice(flags.GetString("device")).status()));
  }
  // Parse has held these to their ranges, so the casts keep every value.
  const int32_t steps = static_cast<int32_t>(flags.GetInt("steps"));
  const int32_t warmup = static_cast<int32_t>(flags.GetInt("warmup"));
  const int32_t block_size = static_cast<int32_t>(flags.GetInt("block-size"));
  const uint64_t seed = flags.GetUint64("seed");
  const bool profile = flags.GetBool("profile");
  // The most steps a case runs (RunDecodeBenchCase: --profile adds --steps to an uncaptured
  // case, which --graphs on runs none of). Each step computes one position's KV.
  const bool profiled = profile && graphs_flag != "on";
  const int64_t case_steps = int64_t{warmup} + steps + (profiled ? steps : 0);
  for (const DecodeBenchCase& c : *cases) {
    if (c.context + case_steps > spec->max_context_tokens) {
      return usage_error(absl::InvalidArgumentError(absl::StrCat(
          "--cases: ", c.batch, "x", c.context, " with ", warmup, " warm-up and ", steps,
          " timed steps", profiled ? " (twice, for --profile)" : "", " needs ",
          c.context + case_steps, " positions; ", spec->name, " has ", spec->max_context_tokens)));
    }
  }
  auto resolved = ResolveDevice(flags.GetString("device"));
  if (!resolved.ok()) {
    return fail(Prefixed("--device", resolved.status()));
  }
  auto choice = FitDeviceToModel(*resolved, spec->head_dim);
  if (!choice.ok()) {
    return fail(Prefixed("--device", choice.status()));
  }
  if (!choice->fallback_reason.empty()) {
    err << "kvd bench: --device auto runs on the CPU: " << choice->fallback_reason << "\n";
  }
  const Device device = choice->device;
  auto backend = MakeBackend(device, static_cast<int>(flags.GetInt("threads")));
  if (!backend.ok()) return fail(backend.status());
  // Graph modes to run per case: only the uncaptured path where the backend cannot record.
  std::vector<bool> graph_modes;
  const bool can_record = MakeOpGraphRecorder(backend->get()) != nullptr;
  if (graphs_flag != "on" || !can_record) graph_modes.push_back(false);
  if (graphs_flag != "off" && can_record) graph_modes.push_back(true);

  // The CPU backend keeps fp32 weights in host memory: refuse what would swap the machine.
  constexpr double kMaxCpuWeightBytes = 4e9;
  if (device == Device::kCpu && spec->NumParameters() * 4.0 > kMaxCpuWeightBytes) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        spec->name, " needs ", spec->NumParameters() * 4.0 / 1e9,
        " GB of fp32 weights on the CPU; use --device cuda, or --model synthetic:tiny")));
  }
  auto copy_gbps = MeasureCopyBandwidth(backend->get());
  if (!copy_gbps.ok()) return fail(copy_gbps.status());
  const auto init_start = SteadyClock::now();
  auto model = [&]() -> absl::StatusOr<std::unique_ptr<LlamaModel>> {
    if (synthetic) return CreateRandomModel(*spec, seed, backend->get());
    auto weights = LoadModel(model_ref);
    if (!weights.ok()) return weights.status();
    return LlamaModel::Create(*std::move(weights), backend->get());
  }();
  if (!model.ok()) return fail(model.status());
  const double init_ms = Ms(init_start, SteadyClock::now());

  // Bytes a decode step reads: every weight except the embedding table (only the batch's
  // rows are gathered), which counts once as the classifier when shared.
  const double weight_elem_bytes = DTypeBits((*backend)->weight_dtype()) / 8.0;
  const double embedding_params = static_cast<double>(spec->vocab_size) * spec->dim;
  const double weight_bytes = (static_cast<double>(spec->NumParameters()) -
                               (spec->shared_classifier ? 0 : embedding_params)) *
                              weight_elem_bytes;
  const DecodeBenchOptions options{.block_size = block_size,
                                   .warmup = warmup,
                                   .steps = steps,
                                   .seed = seed,
                                   .weight_bytes = weight_bytes,
                                   .copy_gbps = *copy_gbps,
                                   .profile = profile};

  out << absl::StrFormat(
      "kvd end-to-end decode, %s on %s: %.3f GB of %s weights read per step "
      "(%s in %.0f ms), KV %s, block %d\n",
      spec->name, DeviceName(device), weight_bytes / 1e9, DTypeName((*backend)->weight_dtype()),
      synthetic ? "made in backend memory" : "loaded and uploaded", init_ms,
      DTypeName(DefaultKvDtype(**backend)), block_size);
  out << absl::StrFormat(
      "measured copy bandwidth (read + write): %.1f GB/s; %d timed steps after %d "
      "warm-up steps; greedy Backend::Sample in backend memory; graphs: %s\n\n",
      *copy_gbps, steps, warmup,
      can_record ? "decode steps uncaptured (off) and replayed as CUDA graphs (on)"
                 : "none (this backend cannot record them)");
  out << absl::StrFormat("%6s %8s %6s %10s %10s %10s %10s %12s %9s %s\n", "batch", "context",
                         "graphs", "step ms", "min ms", "tokens/s", "KV GB", "roofline ms", "ratio",
                         "check");

  FILE* json = nullptr;
  if (const char* out_dir = std::getenv("OUT"); out_dir != nullptr && *out_dir != '\0') {
    json = std::fopen((std::string(out_dir) + "/kvd_bench.jsonl").c_str(), "w");
  }
  int status = 0;
  for (const DecodeBenchCase& c : *cases) {
    for (const bool graphs : graph_modes) {
      auto r = RunDecodeBenchCase(c, graphs, options, model->get(), backend->get());
      const char* mode = graphs ? "on" : "off";
      if (!r.ok()) {
        out << absl::StrFormat("%6d %8d %6s  FAILED: %s\n", c.batch, c.context, mode,
                               r.status().message());
        out.flush();
        status = 1;
        continue;
      }
      const double tokens_per_s = c.batch * 1000.0 / r->step_ms;
      const double ratio = r->step_ms / r->roofline_ms;
      // A graphed run whose timed steps did not all replay (or record) a graph measured the
      // uncaptured path again: report it as a failure.
      const bool replayed =
          !graphs || (r->replayed_steps > 0 && r->replayed_steps + r->recorded_steps == steps);
      out << absl::StrFormat("%6d %8d %6s %10.3f %10.3f %10.1f %10.3f %12.3f %8.2fx %s\n", c.batch,
                             c.context, mode, r->step_ms, r->min_step_ms, tokens_per_s, r->kv_gb,
                             r->roofline_ms, ratio,
                             !r->finite ? "NON-FINITE LOGITS"
                             : replayed ? "ok"
                                        : "GRAPHS NOT REPLAYED");
      out.flush();
      if (!r->finite || !replayed) status = 1;
      if (!r->op_ms.empty()) {
        double gpu_ms = 0;
        for (const auto& [op, ms] : r->op_ms) gpu_ms += ms;
        out << absl::StrFormat(
            "       profile (%.3f ms a step with timing, %.3f ms of it in ops):\n",
            r->profiled_step_ms, gpu_ms);
        for (const auto& [op, ms] : r->op_ms) {
          out << absl::StrFormat("         %-24s %8.4f ms %5.1f%%\n", op, ms,
                                 100.0 * ms / r->profiled_step_ms);
        }
      }
      if (r->recorded_steps > 0) {
        out << absl::StrFormat(
            "       %d timed steps recorded a graph (%.3f ms each), left out of step ms\n",
            r->recorded_steps, r->recorded_step_ms);
      }
      if (r->graph_stats.capture_failures > 0) {
        out << "       graph recording failed: " << r->graph_stats.last_failure << "\n";
      }
      if (json != nullptr) {
        std::fprintf(
            json,
            "{\"model\": \"%s\", \"device\": \"%s\", \"graphs\": %s, \"batch\": %d, "
            "\"context\": %d, "
            "\"step_ms\": %.4f, \"min_step_ms\": %.4f, \"tokens_per_s\": %.1f, "
            "\"weight_gb\": %.4f, \"kv_gb\": %.4f, \"copy_gbps\": %.1f, "
            "\"roofline_ms\": %.4f, \"ratio_to_roofline\": %.4f, \"finite\": %s, "
            "\"replayed_steps\": %d, \"recorded_steps\": %d, \"recorded_step_ms\": %.4f}\n",
            spec->name.c_str(), std::string(DeviceName(device)).c_str(), graphs ? "true" : "false",
            c.batch, c.context, r->step_ms, r->min_step_ms, tokens_per_s, weight_bytes / 1e9,
            r->kv_gb, *copy_gbps, r->roofline_ms, ratio, r->finite ? "true" : "false",
            r->replayed_steps, r->recorded_steps, r->recorded_step_ms);
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  out << "\nratio = measured step / roofline step (1.00x is the memory bound; the issue's "
         "target is <= 1.3x at batch 1 and at 64 x 4096)\n";
  return status;
}

}  // namespace kvd
