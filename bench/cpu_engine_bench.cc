// CPU engine benchmark: prefill and single-stream decode throughput of the reference
// backend on stories260K, plus batched decode. Decode rows time the decode phase alone
// (from the first generated token on), not the prefill before it. A program, not a test: it
// prints a table, exits 2 on a usage error (a flag value outside its range, refused before
// the model loads) and 1 when the model, the prompt file or a measurement cannot be had.
//
//   kvd_cpu_bench [--model PATH] [--threads N] [--repeats R]
//
// Prompts are slices of ../shared/models/golden/stories260K_stream.json (llama2.c's sampled
// stories); without that file every prompt is token 300 repeated, said on stderr.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cache/clock.h"
#include "kernels/cpu_backend.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "scheduler/generator.h"
#include "tools/cpu_count.h"
#include "tools/engine_setup.h"
#include "tools/flags.h"

namespace kvd {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Tokens the stream must hold: the prompts read up to offset 2000 + 40 * 15 + 15 (the
// batched rows); 4096 leaves room.
constexpr size_t kMinStreamTokens = 4096;
// Flag ranges: --threads as the config's server.num_threads (kMaxCpuThreads, as `kvd
// generate`); --repeats is a loop count kept in an int.
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// Real token ids from llama2.c's sampled stories at `path` (a JSON object whose "tokens" is
// an array of ids), so prompts look like real text; nothing when the file does not exist.
// A file that is there but unreadable or malformed is an error naming it: a benchmark on
// other prompts than it says must not run.
absl::StatusOr<std::optional<std::vector<int32_t>>> StreamTokens(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error) && !error) return std::nullopt;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  // nlohmann::json throws on malformed text and on a missing or mistyped "tokens": caught
  // here, at the edge, so that the message names the file.
  try {
    return nlohmann::json::parse(in).at("tokens").get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a JSON object with a \"tokens\" array of ids: ", e.what()));
  }
}

struct Row {
  std::string name;
  int64_t tokens;
  double seconds;
};

int Main(int argc, char** argv) {
  FlagSet flags(
      "kvd_cpu_bench [--model PATH] [--threads N] [--repeats R]\n"
      "\n"
      "Prefill and decode throughput of the CPU reference backend. A number outside its\n"
      "flag's range (below) is a usage error, refused before the model loads.");
  flags.AddString("model", "llama2.c checkpoint",
                  std::string(KVD_SHARED_DIR) + "/models/stories260K.bin");
  flags.AddInt("threads", "CPU threads; 0 = the CPUs this process may use", 0,
               IntRange{0, kMaxCpuThreads});
  flags.AddInt("repeats", "repetitions of each measurement (best is reported)", 3,
               IntRange{1, kMaxInt32});
  // Every message names the program: the benchmarks run one after another in scripts.
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "kvd_cpu_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  if (auto s = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "kvd_cpu_bench: %s\n\n%s", std::string(s.message()).c_str(),
                 flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  // The prompts first: a broken file must not cost a model load.
  const std::string stream_path =
      std::string(KVD_SHARED_DIR) + "/models/golden/stories260K_stream.json";
  auto stream_file = StreamTokens(stream_path);
  if (!stream_file.ok()) return fail(stream_file.status());
  std::vector<int32_t> stream = stream_file->value_or(std::vector<int32_t>());
  if (stream.size() < kMinStreamTokens) {
    const std::string why =
        stream_file->has_value()
            ? absl::StrCat("has ", stream.size(), " tokens, fewer than ", kMinStreamTokens)
            : "does not exist";
    std::fprintf(stderr, "kvd_cpu_bench: note: %s %s; every prompt is token 300 repeated instead\n",
                 stream_path.c_str(), why.c_str());
    stream.assign(kMinStreamTokens, 300);
  }
  auto weights = LoadModel(flags.GetString("model"));
  if (!weights.ok()) return fail(weights.status());
  const ModelSpec& spec = weights->spec;
  int threads = static_cast<int>(flags.GetInt("threads"));
  if (threads == 0) threads = UsableCpus();
  const int repeats = static_cast<int>(flags.GetInt("repeats"));
  CpuBackend backend(threads);
  auto model = LlamaModel::Create(*std::move(weights), &backend);
  if (!model.ok()) return fail(model.status());
  RealClock clock;

  auto prompt = [&](int32_t offset, int32_t len) {
    std::vector<int32_t> p{spec.bos_token_id};
    p.insert(p.end(), stream.begin() + offset, stream.begin() + offset + len - 1);
    return p;
  };

  std::vector<Row> rows;
  // What a measurement counts and times: the whole Run() (prefill: the prompt's tokens), or
  // only its decode phase (the tokens generated after each request's first one, and the time
  // from the last request's first token, which ends its prefill, to the last token).
  enum class Phase { kWhole, kDecode };
  // Measures Run() on `requests`; best of `repeats`, each on a fresh cache with prefix caching
  // off so nothing is reused between repeats. False (with the reason on stderr) when a cache
  // cannot be made or the run fails: a row is never silently missing.
  auto measure = [&](const std::string& name, const std::vector<GenerationRequest>& requests,
                     Phase phase) {
    double best = 1e30;
    int64_t tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      auto cache = CreateCacheForSequences(spec, &backend, &clock, 16,
                                           static_cast<int32_t>(requests.size()), false);
      if (!cache.ok()) {
        std::fprintf(stderr, "%s: cannot make the KV cache: %s\n", name.c_str(),
                     std::string(cache.status().message()).c_str());
        return false;
      }
      Generator gen(model->get(), cache->get(),
                    {.max_batch_size = 256, .max_num_batched_tokens = 4096});
      // Decode phase: tokens after the last request's first one, and when that came.
      std::vector<bool> started(requests.size(), false);
      size_t num_started = 0;
      int64_t decode_tokens = 0;
      std::chrono::steady_clock::time_point decode_start, last_token;
      auto on_token = [&](size_t i, int32_t) {
        last_token = std::chrono::steady_clock::now();
        if (num_started == requests.size()) {
          ++decode_tokens;
        } else if (!started[i]) {
          started[i] = true;
          if (++num_started == requests.size()) decode_start = last_token;
        }
      };
      const auto start = std::chrono::steady_clock::now();
      auto results = gen.Run(requests, on_token);
      double s = Seconds(start);
      if (!results.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(),
                     std::string(results.status().message()).c_str());
        return false;
      }
      if (phase == Phase::kDecode) {
        if (decode_tokens == 0) {
          std::fprintf(stderr, "%s: no token generated after the prefill\n", name.c_str());
          return false;
        }
        s = std::chrono::duration<double>(last_token - decode_start).count();
        tokens = decode_tokens;
      } else {
        tokens = 0;
        for (const GenerationRequest& q : requests) tokens += static_cast<int64_t>(q.prompt.size());
      }
      best = std::min(best, s);
    }
    rows.push_back({name, tokens, best});
    return true;
  };

  // Prefill: a 448-token prompt, one output token, so the time is the prompt's.
  {
    GenerationRequest r;
    r.prompt = prompt(0, 448);
    r.max_new_tokens = 1;
    r.sampling.temperature = 0;
    if (!measure("prefill, 1 x 448-token prompt", {r}, Phase::kWhole)) return 1;
  }
  // Single-stream decode: a 16- or 256-token prompt, then greedy tokens up to 511 positions
  // (495 or 255 of them; no stop token), timed from the first generated token.
  for (int32_t len : {16, 256}) {
    GenerationRequest r;
    r.prompt = prompt(1000, len);
    r.max_new_tokens = 511 - len;
    r.sampling.temperature = 0;
    if (!measure("decode, 1 stream, " + std::to_string(len) + "-token prompt", {r},
                 Phase::kDecode)) {
      return 1;
    }
  }
  // Batched decode: 16 streams with different 16-token prompts, 240 greedy tokens each,
  // timed once every stream has its first token (their prefills share one step).
  {
    std::vector<GenerationRequest> rs;
    for (int i = 0; i < 16; ++i) {
      GenerationRequest r;
      r.prompt = prompt(2000 + 40 * i, 16);
      r.max_new_tokens = 240;
      r.sampling.temperature = 0;
      rs.push_back(r);
    }
    if (!measure("decode, 16 streams, 16-token prompts", rs, Phase::kDecode)) return 1;
  }

  // Checkpoint files carry no model name: name the file.
  const std::string model_path = flags.GetString("model");
  const std::string model_name =
      !spec.name.empty() ? spec.name : model_path.substr(model_path.find_last_of('/') + 1);
  std::printf("kvd CPU engine, %s (%lld parameters), %d threads, best of %d\n", model_name.c_str(),
              static_cast<long long>(spec.NumParameters()), threads, repeats);
  std::printf(
      "prefill rows: prompt tokens over the whole run; decode rows: tokens after each "
      "stream's first, over the time after the last stream's first token\n\n");
  std::printf("%-40s %10s %10s %12s\n", "measurement", "tokens", "seconds", "tokens/s");
  for (const Row& r : rows) {
    std::printf("%-40s %10lld %10.4f %12.0f\n", r.name.c_str(), static_cast<long long>(r.tokens),
                r.seconds, r.tokens / r.seconds);
  }
  return 0;
}

}  // namespace
}  // namespace kvd

int main(int argc, char** argv) { return kvd::Main(argc, argv); }
