#include "scheduler/generator.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvd {

namespace {

// Run submits every request before the engine takes any, so the waiting-queue bound (the
// daemon's back-pressure on clients) would refuse a batch larger than it.
EngineOptions Offline(EngineOptions options) {
  options.max_waiting_requests = std::numeric_limits<int32_t>::max();
  return options;
}

}  // namespace

Generator::Generator(LlamaModel* model, KvCacheManager* cache, EngineOptions options)
    : engine_(Offline(options), model, cache, /*tokenizer=*/nullptr, &clock_) {}

absl::StatusOr<std::vector<GenerationResult>> Generator::Run(
    absl::Span<const GenerationRequest> requests, const TokenCallback& on_token) {
  std::vector<GenerationResult> results(requests.size());
  std::vector<uint64_t> handles;
  absl::Status failure;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& g = requests[i];
    if (g.max_new_tokens < 0) {
      for (uint64_t h : handles) engine_.Cancel(h);
      engine_.RunUntilIdle();
      return absl::InvalidArgumentError(
          absl::StrCat("request ", i, ": max_new_tokens must be >= 0, got ", g.max_new_tokens));
    }
    if (g.max_new_tokens == 0) continue;  // nothing to generate
    Request r;
    r.request_id = absl::StrCat(i);
    r.prompt = g.prompt;
    r.max_tokens = g.max_new_tokens;
    r.sampling = g.sampling;
    r.stop_token_ids = g.stop_token_ids;
    r.session_id = g.session_id;
    auto handle = engine_.Submit(std::move(r), [&, i](const StreamEvent& e) {
      GenerationResult& result = results[i];
      for (int32_t t : e.token_ids) {
        result.output.push_back(t);
        if (on_token) on_token(i, t);
      }
      if (e.finished) {
        result.finish = e.finish_reason;
        result.usage = e.usage;
        if (!e.error.ok() && failure.ok()) failure = e.error;
      }
    });
    if (!handle.ok()) {
      for (uint64_t h : handles) engine_.Cancel(h);
      engine_.RunUntilIdle();
      return absl::Status(handle.status().code(),
                          absl::StrCat("request ", i, ": ", handle.status().message()));
    }
    handles.push_back(*handle);
  }
  engine_.RunUntilIdle();
  if (!failure.ok()) return failure;
  return results;
}

}  // namespace kvd
