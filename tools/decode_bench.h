#ifndef KVD_TOOLS_DECODE_BENCH_H_
#define KVD_TOOLS_DECODE_BENCH_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/llama_model.h"

namespace kvd {

// The measurement behind `kvd bench` (bench_command.cc, which parses flags and prints the
// table): greedy decode steps of the whole engine path (batch upload, LlamaModel forward,
// Backend::Sample on the device, KV bookkeeping) over a KV cache filled at random, beside
//   roofline step = (weight bytes read + KV bytes read) / measured copy bandwidth.

// One BATCHxCONTEXT shape: `batch` sequences decoding together, each with `context` tokens
// of KV before the first step.
struct DecodeBenchCase {
  int32_t batch = 0;
  int32_t context = 0;
};

// `--cases`: one or more BATCHxCONTEXT, comma-separated (empty items skipped), each number
// at least 1. InvalidArgument naming the item that is not one, or the text when none is.
absl::StatusOr<std::vector<DecodeBenchCase>> ParseDecodeBenchCases(const std::string& text);

// The backend's copy bandwidth in GB/s, counting bytes read plus bytes written (as gpu_bench
// and torch_peers.py do): median of 10 device copies of 2 GiB on CUDA (after one untimed),
// of 5 memcpy of 256 MiB on the CPU. The CUDA error of any failed call; Internal for a
// median of 0 ms (never an infinite bandwidth).
absl::StatusOr<double> MeasureCopyBandwidth(Backend* backend);

struct DecodeBenchOptions {
  int32_t block_size = 16;  // tokens per KV block
  int32_t warmup = 4;       // untimed steps first
  int32_t steps = 32;       // timed steps
  uint64_t seed = 1;        // of the random KV and prompts
  double weight_bytes = 0;  // weight bytes a step reads (for the roofline)
  double copy_gbps = 0;     // MeasureCopyBandwidth's figure (for the roofline)
  // CUDA, graphs off: `steps` more steps with GPU time per op.
  bool profile = false;
};

struct DecodeBenchResult {
  DecodeBenchCase shape;
  bool graphs = false;
  DecodeGraphStats graph_stats;  // this case's captures and replays
  double step_ms = 0;            // mean over the timed steps that recorded no graph
  double min_step_ms = 0;        // fastest of them
  int32_t replayed_steps = 0;    // timed steps run by replaying a graph
  int32_t recorded_steps = 0;    // timed steps that recorded a graph (not in step_ms)
  double recorded_step_ms = 0;   // their mean
  double kv_gb = 0;              // KV bytes read per step (mean context), GB
  double roofline_ms = 0;
  // The last step's first logit row is finite and every sampled id is in the vocabulary.
  bool finite = true;
  // --profile (CUDA, graphs off): GPU time per op and step over `steps` extra steps, and
  // the wall time of those steps.
  std::vector<std::pair<std::string, double>> op_ms;
  double profiled_step_ms = 0;
};

// Runs one case on `model` (whose backend is `backend`): a cache sized for it, KV filled with
// seeded random values and `context` distinct pseudo-random tokens per sequence marked
// computed (no prefill), then warmup + timed greedy decode steps of every sequence
// together, as CUDA graphs when `graphs` (the model must then be able to record them). A
// step that records a graph is timed apart from the others. InvalidArgument when context,
// steps and warm-up exceed the model's context; the cache's, model's or backend's error.
absl::StatusOr<DecodeBenchResult> RunDecodeBenchCase(const DecodeBenchCase& c, bool graphs,
                                                     const DecodeBenchOptions& options,
                                                     LlamaModel* model, Backend* backend);

}  // namespace kvd

#endif  // KVD_TOOLS_DECODE_BENCH_H_
