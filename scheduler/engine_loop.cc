#include "scheduler/engine_loop.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "scheduler/engine_loop_impl.h"

namespace kvd {

namespace {

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
std::vector<double> LengthBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
}
std::vector<double> ErrorBuckets() { return {-1024, -256, -64, -16, -4, 0, 4, 16, 64, 256, 1024}; }

absl::Status OutOfRange(absl::string_view field, double value, absl::string_view allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat("EngineOptions.", field, " = ", value, " is out of range; allowed: ", allowed));
}

// `options`, once Validate() has passed it: the engine's contract (a step must hold a token of
// every sequence in it and make progress), so a bad value is a caller's bug.
const EngineOptions& CheckedOptions(const EngineOptions& options) {
  if (absl::Status status = options.Validate(); !status.ok()) {
    std::fprintf(stderr, "EngineLoop: invalid EngineOptions: %s\n", status.ToString().c_str());
    std::abort();
  }
  return options;
}

}  // namespace

absl::Status EngineOptions::Validate() const {
  if (max_batch_size < 1) return OutOfRange("max_batch_size", max_batch_size, ">= 1");
  if (max_num_batched_tokens < max_batch_size) {
    return OutOfRange("max_num_batched_tokens", max_num_batched_tokens,
                      absl::StrCat(">= max_batch_size, which is ", max_batch_size,
                                   " (every sequence in a step needs a token)"));
  }
  if (prefill_chunk_tokens < 1) {
    return OutOfRange("prefill_chunk_tokens", prefill_chunk_tokens, ">= 1");
  }
  if (max_waiting_requests < 1) {
    return OutOfRange("max_waiting_requests", max_waiting_requests, ">= 1");
  }
  if (!(predictor_quantile >= 0.0 && predictor_quantile <= 1.0)) {
    return OutOfRange("predictor_quantile", predictor_quantile, "[0, 1]");
  }
  if (predictor_default_tokens < 1) {
    return OutOfRange("predictor_default_tokens", predictor_default_tokens, ">= 1");
  }
  if (max_context_tokens < 0) {
    return OutOfRange("max_context_tokens", max_context_tokens, ">= 0 (0 = the model's context)");
  }
  if (idle_tick < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EngineOptions.idle_tick = ", absl::FormatDuration(idle_tick),
                     " is out of range; allowed: >= 0"));
  }
  return absl::OkStatus();
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t i = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
  ++counts[i];
  sum += value;
  ++count;
}

EngineLoop::Impl::Impl(const EngineOptions& options, LlamaModel* model, KvCacheManager* cache,
                       const Tokenizer* tokenizer, Clock* clock)
    : options_(options),
      model_(model),
      cache_(cache),
      tokenizer_(tokenizer),
      clock_(clock),
      max_blocks_(cache->stats().max_blocks),
      context_tokens_(options.max_context_tokens > 0
                          ? std::min(options.max_context_tokens, model->spec().max_context_tokens)
                          : model->spec().max_context_tokens),
      predictor_(options.predictor_quantile, options.predictor_default_tokens) {
  stats_.time_to_first_token = Histogram(LatencyBuckets());
  stats_.inter_token_latency = Histogram(LatencyBuckets());
  stats_.end_to_end_latency = Histogram(LatencyBuckets());
  stats_.output_length = Histogram(LengthBuckets());
  stats_.prediction_error = Histogram(ErrorBuckets());
  stats_.predicted_output_tokens = predictor_.Predict();
  stats_.cache = cache->stats();
  stats_.memory = MemoryNow();
  published_ = stats_;
}

int64_t EngineLoop::Impl::MaxKvTokens(const Request& r) const {
  // The last token is emitted but never fed back, so its KV is never computed.
  return std::min<int64_t>(static_cast<int64_t>(r.prompt.size()) + r.max_tokens - 1,
                           context_tokens_);
}

absl::StatusOr<uint64_t> EngineLoop::Impl::Submit(Request request, StreamCallback on_event) {
  const ModelSpec& spec = model_->spec();
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  if (static_cast<int32_t>(request.prompt.size()) > context_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", request.prompt.size(),
                                                   " tokens, the context holds ", context_tokens_));
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= spec.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_token_ids: ", t, " is outside [0, ", spec.vocab_size, ")"));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: must be >= 1, got ", request.max_tokens));
  }
  if (absl::Status s = request.sampling.Validate(); !s.ok()) return s;
  if (tokenizer_ == nullptr && !request.stop.empty()) {
    return absl::InvalidArgumentError("stop: stop strings need a tokenizer");
  }
  // Every accepted request can run to its end alone, so none is cut short for want of
  // memory: the most KV it can need fits the whole pool.
  const int64_t kv_tokens = MaxKvTokens(request);
  if (cache_->layout().BlocksForTokens(kv_tokens) > max_blocks_) {
    absl::MutexLock lock(&mu_);
    ++published_.requests_rejected;
    const int64_t prompt = static_cast<int64_t>(request.prompt.size());
    const int64_t prompt_blocks = cache_->layout().BlocksForTokens(prompt);
    if (prompt_blocks > max_blocks_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("prompt of ", prompt, " tokens needs ", prompt_blocks,
                       " KV blocks; the whole pool has ", max_blocks_));
    }
    const int64_t pool_tokens = max_blocks_ * cache_->block_size();
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_tokens: ", request.max_tokens, " with a ", prompt, "-token prompt needs KV for up to ",
        kv_tokens, " tokens; the whole pool holds ", pool_tokens,
        " (max_tokens <= ", pool_tokens - prompt + 1, " fits)"));
  }

  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt;
  seq->sampler.emplace(request.sampling);
  if (tokenizer_ != nullptr) seq->decoder.emplace(tokenizer_, request.prompt.back());
  seq->stop.emplace(request.stop);
  seq->usage.prompt_tokens = static_cast<int32_t>(request.prompt.size());
  seq->submit_time = clock_->Now();
  seq->request = std::move(request);
  seq->on_event = std::move(on_event);

  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return FailedEngineError(failure_);
  if (draining_ || stopping_) {
    return absl::UnavailableError("the server is draining and accepts no new requests");
  }
  if (published_.requests_waiting + static_cast<int32_t>(incoming_.size()) >=
      options_.max_waiting_requests) {
    ++published_.requests_rejected;
    return absl::ResourceExhaustedError(
        absl::StrCat("the waiting queue is full (", options_.max_waiting_requests, " requests)"));
  }
  seq->handle = next_handle_++;
  const uint64_t handle = seq->handle;
  incoming_.push_back(std::move(seq));
  idle_ = false;
  return handle;
}

void EngineLoop::Impl::Cancel(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  // Stopped or failed, every request is finished or being aborted, and nothing would ever
  // drain the list.
  if (stopping_ || !failure_.ok()) return;
  cancels_.push_back(handle);
}

absl::Status EngineLoop::Impl::CloseSession(const std::string& session_id) {
  absl::Status result;
  absl::Notification done;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return FailedEngineError(failure_);
    if (stopping_) return absl::UnavailableError("the engine is stopped");
    // Offline (no engine thread): the caller is the only thread touching the cache.
    if (!started_) return CloseSessionNow(session_id, next_handle_, incoming_);
    closes_.push_back({session_id, next_handle_, &result, &done});
  }
  done.WaitForNotification();
  return result;
}

void EngineLoop::Impl::BeginDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool EngineLoop::Impl::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return idle_ && incoming_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

EngineStats EngineLoop::Impl::Stats() const {
  absl::MutexLock lock(&mu_);
  EngineStats s = published_;
  s.requests_waiting += static_cast<int32_t>(incoming_.size());
  return s;
}

absl::Status EngineLoop::Impl::Failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

void EngineLoop::Impl::Start() {
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
  }
  thread_ = std::thread([this] { ThreadMain(); });
}

void EngineLoop::Impl::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      // Another thread is stopping: return once it has (the destructor frees what its
      // AbortAll still uses).
      mu_.Await(absl::Condition(&stopped_));
      return;
    }
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  AbortAll(absl::UnavailableError(
      "the server is shutting down and stopped the request before it finished; retry on "
      "another server"));
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

void EngineLoop::Impl::RunUntilIdle() {
  while (true) {
    if (!Step()) {
      absl::MutexLock lock(&mu_);
      if (incoming_.empty() && closes_.empty() && cancels_.empty()) return;
    }
  }
}

void EngineLoop::Impl::ThreadMain() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || !failure_.ok()) break;
    }
    if (Step()) continue;
    absl::MutexLock lock(&mu_);
    auto has_work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || !incoming_.empty() || !cancels_.empty() || !closes_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&has_work), options_.idle_tick);
  }
}

EngineLoop::EngineLoop(const EngineOptions& options, LlamaModel* model, KvCacheManager* cache,
                       const Tokenizer* tokenizer, Clock* clock)
    : impl_(std::make_unique<Impl>(CheckedOptions(options), model, cache, tokenizer, clock)) {}
EngineLoop::~EngineLoop() { impl_->Stop(); }
void EngineLoop::Start() { impl_->Start(); }
void EngineLoop::Stop() { impl_->Stop(); }
void EngineLoop::RunUntilIdle() { impl_->RunUntilIdle(); }
absl::StatusOr<uint64_t> EngineLoop::Submit(Request request, StreamCallback on_event) {
  return impl_->Submit(std::move(request), std::move(on_event));
}
void EngineLoop::Cancel(uint64_t handle) { impl_->Cancel(handle); }
const Clock& EngineLoop::clock() const { return impl_->clock(); }
absl::Status EngineLoop::CloseSession(const std::string& session_id) {
  return impl_->CloseSession(session_id);
}
void EngineLoop::BeginDrain() { impl_->BeginDrain(); }
bool EngineLoop::WaitIdle(absl::Duration timeout) { return impl_->WaitIdle(timeout); }
EngineStats EngineLoop::Stats() const { return impl_->Stats(); }
absl::Status EngineLoop::Failure() const { return impl_->Failure(); }

}  // namespace kvd
