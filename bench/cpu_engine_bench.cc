// CPU engine benchmark: prefill and single-stream decode throughput of the reference
// backend on stories260K, plus batched decode. Decode rows time the decode phase alone
// (from the first generated token on), not the prefill before it. A program, not a test: it
// prints a table, and exits non-zero only when a measurement cannot run.
//
//   kvd_cpu_bench [--model PATH] [--threads N] [--repeats R]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

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

// Real token ids from llama2.c's sampled stories, so prompts look like real text.
std::vector<int32_t> StreamTokens(const std::string& shared) {
  std::ifstream in(shared + "/models/golden/stories260K_stream.json");
  if (!in) return {};
  return nlohmann::json::parse(in)["tokens"].get<std::vector<int32_t>>();
}

struct Row {
  std::string name;
  int64_t tokens;
  double seconds;
};

int Main(int argc, char** argv) {
  FlagSet flags("kvd_cpu_bench [--model PATH] [--threads N] [--repeats R]");
  flags.AddString("model", "llama2.c checkpoint", std::string(KVD_SHARED_DIR) +
                                                      "/models/stories260K.bin");
  flags.AddInt("threads", "CPU threads; 0 = the CPUs this process may use", 0);
  flags.AddInt("repeats", "repetitions of each measurement (best is reported)", 3);
  if (auto s = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  auto weights = LoadModel(flags.GetString("model"));
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const ModelSpec& spec = weights->spec;
  int threads = static_cast<int>(flags.GetInt("threads"));
  if (threads <= 0) threads = UsableCpus();
  const int repeats = static_cast<int>(std::max<int64_t>(1, flags.GetInt("repeats")));
  CpuBackend backend(threads);
  auto model = LlamaModel::Create(*std::move(weights), &backend);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  RealClock clock;

  std::vector<int32_t> stream = StreamTokens(KVD_SHARED_DIR);
  if (stream.size() < 4096) stream.assign(4096, 300);
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
      Generator gen(model->get(), cache->get(), {.max_batch_size = 256,
                                                 .max_num_batched_tokens = 4096});
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
