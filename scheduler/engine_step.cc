// One engine step: drain the ingress, admit by predicted KV growth, plan prefill chunks
// and decodes under the budgets (preempting when the pool runs short), run the model,
// sample, stream and retire. Engine thread only.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/engine_loop_impl.h"

namespace kvd {

namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Waiting order: higher priority first, then first come first served.
bool RunsBefore(const Sequence& a, const Sequence& b) {
  if (a.request.priority != b.request.priority) return a.request.priority > b.request.priority;
  return a.handle < b.handle;
}

}  // namespace

void EngineLoop::Impl::InsertWaiting(SeqPtr s) {
  auto at = std::upper_bound(waiting_.begin(), waiting_.end(), s,
                             [](const SeqPtr& a, const SeqPtr& b) { return RunsBefore(*a, *b); });
  waiting_.insert(at, std::move(s));
}

void EngineLoop::Impl::DrainIngress() {
  std::vector<SeqPtr> incoming;
  std::vector<uint64_t> cancels;
  std::vector<SessionClose> closes;
  {
    absl::MutexLock lock(&mu_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
    closes.swap(closes_);
    // Still waiting, for Submit's limit and Stats(), though no longer incoming.
    PublishQueueLocked(static_cast<int32_t>(incoming.size()));
    // The engine holds these requests now, and not idle: a step that ended after they were
    // submitted but before this intake may have said so (PublishStats).
    if (!incoming.empty()) idle_ = false;
  }
  for (SeqPtr& s : incoming) {
    stats_.prompt_tokens += static_cast<int64_t>(s->request.prompt.size());
    InsertWaiting(std::move(s));
  }
  for (uint64_t handle : cancels) {
    for (auto* list : {&waiting_, &running_}) {
      for (SeqPtr& s : *list) {
        if (s->handle == handle) Finish(*s, FinishReason::kCancelled);
      }
    }
  }
  for (SessionClose& c : closes) {
    // The intake above moved every turn to waiting_.
    *c.result = CloseSessionNow(c.session_id, c.submitted_before);
    c.done->Notify();
  }
}

absl::Status EngineLoop::Impl::CloseSessionNow(const std::string& session_id,
                                               uint64_t submitted_before,
                                               absl::Span<const SeqPtr> queued) {
  bool had_turns = false;
  auto detach = [&](const SeqPtr& s) {
    // A turn scheduled before was preempted: the cache holds its session for it.
    if (s->handle < submitted_before && !s->scheduled_once && s->request.session_id == session_id) {
      s->request.session_id.clear();
      had_turns = true;
    }
  };
  for (const SeqPtr& s : queued) detach(s);
  for (const SeqPtr& s : waiting_) detach(s);
  absl::Status closed = cache_->CloseSession(session_id);
  if (had_turns && absl::IsNotFound(closed)) return absl::OkStatus();
  return closed;
}

void EngineLoop::Impl::ExpireDeadlines() {
  const absl::Time now = clock_->Now();
  for (auto* list : {&waiting_, &running_}) {
    for (SeqPtr& s : *list) {
      if (now >= s->request.deadline) Finish(*s, FinishReason::kDeadline);
    }
  }
}

int64_t EngineLoop::Impl::TargetBlocks(const Sequence& s) const {
  const int64_t prompt = static_cast<int64_t>(s.request.prompt.size());
  int64_t target = static_cast<int64_t>(s.tokens.size());
  switch (options_.admission) {
    case AdmissionMode::kReserveMax:
      target = MaxKvTokens(s.request);
      break;
    case AdmissionMode::kPredicted:
      // A request that ends on a stop token has fed back its last output token (the stop
      // token, not an output token, came from its logits): predicted_output tokens take up
      // to prompt + predicted_output KV tokens, MaxKvTokens' one fewer only at max_tokens.
      target = std::max<int64_t>(
          target, std::min<int64_t>(prompt + s.predicted_output, MaxKvTokens(s.request)));
      break;
    case AdmissionMode::kOptimistic:
      break;
  }
  target = std::min<int64_t>(target, context_tokens_);
  return cache_->layout().BlocksForTokens(target);
}

int64_t EngineLoop::Impl::BlocksToCome(const Sequence& s) const {
  const int64_t held = static_cast<int64_t>(cache_->BlockIds(s.handle).size());
  return std::max<int64_t>(0, TargetBlocks(s) - held);
}

bool EngineLoop::Impl::Admissible(const Sequence& candidate, int64_t committed) const {
  if (running_.empty()) return true;  // Submit checked that it fits the pool alone
  // The candidate's cached prefix (its session's chain, then the prefix index) takes the
  // place of new blocks; but the evictable and the idly pinned ones among it are counted as
  // obtainable, and holding them takes them out of the obtainable pool. Other sessions'
  // idle pins are obtainable: Reserve releases them when a sequence needs their room.
  const KvCacheManager::PrefixProbe prefix = cache_->ProbePrefixBlocks(
      candidate.tokens, candidate.request.session_id, static_cast<SeqId>(candidate.handle));
  return committed + TargetBlocks(candidate) - prefix.matched_blocks + prefix.evictable_blocks +
             prefix.releasable_pinned_blocks <=
         cache_->NumObtainableBlocks();
}

EngineLoop::Impl::AdmitResult EngineLoop::Impl::Admit(Sequence& s, int32_t budget, int32_t& n) {
  // A sequence back from a preemption (scheduled before) recomputes: its lookup is no prompt
  // lookup to count.
  absl::StatusOr<int32_t> cached = cache_->AddSequence(
      static_cast<SeqId>(s.handle), s.tokens, s.request.session_id,
      s.scheduled_once ? KvCacheManager::Admission::kRecompute : KvCacheManager::Admission::kFirst);
  if (!cached.ok()) {
    Finish(s, FinishReason::kAborted, cached.status());
    return AdmitResult::kFailed;
  }
  s.num_computed = *cached;
  n = std::min({s.pending(), budget, options_.prefill_chunk_tokens});
  if (!cache_->Reserve(static_cast<SeqId>(s.handle), n)) {
    cache_->Abandon(static_cast<SeqId>(s.handle));  // its session as before, if it had one
    s.num_computed = 0;
    return AdmitResult::kNoRoom;
  }
  s.in_cache = true;
  s.admit_order = ++admit_counter_;
  if (!s.scheduled_once) {
    s.scheduled_once = true;
    s.usage.cached_prompt_tokens = std::min<int32_t>(*cached, s.usage.prompt_tokens);
    s.usage.queue_time = clock_->Now() - s.submit_time;
    // As cached_prompt_tokens: the recompute after a preemption is not counted again.
    stats_.computed_prompt_tokens += s.usage.prompt_tokens - s.usage.cached_prompt_tokens;
  }
  return AdmitResult::kAdmitted;
}

void EngineLoop::Impl::Preempt(Sequence* victim) {
  // All its blocks return to the pool; its session waits for it, holding nothing.
  cache_->FreeForRecompute(static_cast<SeqId>(victim->handle));
  victim->in_cache = false;
  victim->num_computed = 0;
  ++victim->usage.num_preemptions;
  ++stats_.preemptions;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [victim](const SeqPtr& p) { return p.get() == victim; });
  SeqPtr owned = std::move(*it);
  running_.erase(it);
  InsertWaiting(std::move(owned));
  absl::MutexLock lock(&mu_);
  PublishQueueLocked(0);
}

bool EngineLoop::Impl::Step() {
  DrainIngress();
  ExpireDeadlines();
  RemoveFinished();
  // Until its first admission a request's prediction follows the predictor, which may have
  // learned from requests that finished while it waited; and a session with a turn waiting is
  // not idle (its pins neither expire nor go before other idle sessions' while it waits).
  for (SeqPtr& s : waiting_) {
    if (!s->scheduled_once) {
      const int32_t hint = s->request.expected_output_tokens;
      // No more than the context leaves: a prediction past it is no prediction of this
      // request (admission caps its KV there too; the error histogram would not).
      const int32_t room = context_tokens_ + 1 - static_cast<int32_t>(s->request.prompt.size());
      s->predicted_output =
          std::min({s->request.max_tokens, hint > 0 ? hint : predictor_.Predict(), room});
      cache_->TouchSession(s->request.session_id);
    }
  }

  const int32_t block_size = cache_->block_size();
  const ModelSpec& spec = model_->spec();
  ForwardBatch batch;
  std::vector<std::pair<Sequence*, int32_t>> plan;  // (sequence, tokens fed this step)
  int32_t budget = options_.max_num_batched_tokens;

  // Running sequences first, highest priority first, then oldest admission. A sequence that
  // cannot get its slots preempts the lowest-priority, most recently admitted one not yet
  // planned: in this order, the last one.
  std::stable_sort(running_.begin(), running_.end(), [](const SeqPtr& a, const SeqPtr& b) {
    if (a->request.priority != b->request.priority) {
      return a->request.priority > b->request.priority;
    }
    return a->admit_order < b->admit_order;
  });
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i].get();
    const int32_t n = std::min({s->pending(), budget, options_.prefill_chunk_tokens});
    bool reserved = cache_->Reserve(static_cast<SeqId>(s->handle), n);
    while (!reserved) {
      Sequence* victim = s;
      for (size_t j = i + 1; j < running_.size(); ++j) {
        Sequence* c = running_[j].get();
        if (c->request.priority < victim->request.priority ||
            (c->request.priority == victim->request.priority &&
             c->admit_order > victim->admit_order)) {
          victim = c;
        }
      }
      if (victim == s && i == 0 && plan.empty() && running_.size() == 1) {
        Finish(*s, FinishReason::kAborted,
               absl::ResourceExhaustedError("the KV pool cannot hold this request alone"));
        break;
      }
      Preempt(victim);
      if (victim == s) break;
      reserved = cache_->Reserve(static_cast<SeqId>(s->handle), n);
    }
    if (!reserved) {
      if (s->finished()) ++i;  // aborted above; removed after the step
      continue;                // s was preempted: running_[i] is now the next one
    }
    plan.emplace_back(s, n);
    budget -= n;
    ++i;
  }

  // Then waiting requests in their order, as admission allows: the first that does not fit
  // ends admission (nothing jumps the queue for memory), but one whose session is busy with
  // another turn (running, or preempted and waiting) keeps its place and lets the ones
  // behind it by.
  RemoveFinished();
  // What the running sequences are still expected to take, summed once; each admission adds
  // its own (admitting one changes no other sequence's blocks).
  int64_t committed = 0;
  for (const SeqPtr& s : running_) committed += BlocksToCome(*s);
  Sequence* does_not_fit = nullptr;
  for (size_t k = 0; k < waiting_.size() && budget > 0 &&
                     static_cast<int32_t>(running_.size()) < options_.max_batch_size;) {
    Sequence& s = *waiting_[k];
    // Before the room check: a turn that must wait for its session anyway stops no one.
    if (cache_->SessionBusy(static_cast<SeqId>(s.handle), s.request.session_id)) {
      ++k;
      continue;
    }
    if (!Admissible(s, committed)) {
      does_not_fit = &s;
      break;
    }
    int32_t n = 0;
    const AdmitResult admitted = Admit(s, budget, n);
    if (admitted == AdmitResult::kFailed) {
      ++k;  // finished, removed after the step
      continue;
    }
    if (admitted == AdmitResult::kNoRoom) {
      does_not_fit = &s;
      break;
    }
    committed += BlocksToCome(s);
    running_.push_back(std::move(waiting_[k]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(k));
    plan.emplace_back(&s, n);
    budget -= n;
  }
  if (does_not_fit != nullptr && running_.empty() && plan.empty()) {
    // Nothing runs and it cannot be admitted: it would wait forever. (Not the queue's head,
    // which may be a turn waiting for its session's preempted turn: this one.)
    Finish(*does_not_fit, FinishReason::kAborted,
           absl::ResourceExhaustedError("the KV pool cannot hold this request"));
  }
  {
    absl::MutexLock lock(&mu_);
    PublishQueueLocked(0);  // before the stream callbacks below
  }

  if (!plan.empty()) {
    // Sequences whose prompt is complete after this step sample a token, on the backend:
    // each draws its row (its uniform included) in batch order.
    std::vector<SamplingRow> rows;
    for (auto& [s, n] : plan) {
      const SeqId id = static_cast<SeqId>(s->handle);
      const bool samples = n == s->pending();
      batch.AddSequence(absl::MakeConstSpan(s->tokens).subspan(s->num_computed, n), s->num_computed,
                        cache_->BlockIds(id), block_size, samples);
      if (samples) rows.push_back(s->sampler->NextRow());
    }
    std::vector<KvCacheView> views(spec.num_layers);
    for (int32_t l = 0; l < spec.num_layers; ++l) views[l] = cache_->LayerView(l);
    const absl::Status status = model_->ForwardAndSample(batch, views, rows, &sampled_);
    ++stats_.steps;
    if (status.code() == absl::StatusCode::kDataLoss) {
      Fail(status);  // the backend is gone: nothing can run, now or later
      return false;
    }
    size_t row = 0;
    for (auto& [s, n] : plan) {
      if (!status.ok()) {
        Finish(*s, FinishReason::kAborted, status);
        continue;
      }
      cache_->MarkComputed(static_cast<SeqId>(s->handle), n);
      s->num_computed += n;
      if (s->pending() > 0) continue;
      HandleToken(*s, sampled_[row++]);
    }
  }
  RemoveFinished();
  cache_->Tick();
  PublishStats();
  // Each step with requests in hand runs a batch or finishes one (the head it cannot admit
  // alone), so holding any means there is more to do.
  return !plan.empty() || !waiting_.empty() || !running_.empty();
}

void EngineLoop::Impl::HandleToken(Sequence& s, int32_t token) {
  const Request& r = s.request;
  const absl::Time now = clock_->Now();
  if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
      r.stop_token_ids.end()) {
    Finish(s, FinishReason::kStop);
    return;
  }
  s.tokens.push_back(token);
  ++s.num_generated;
  ++stats_.generated_tokens;
  cache_->AppendTokens(static_cast<SeqId>(s.handle), {token});
  if (s.num_generated == 1) {
    s.usage.time_to_first_token = now - s.submit_time;
    stats_.time_to_first_token.Observe(Seconds(s.usage.time_to_first_token));
  } else {
    stats_.inter_token_latency.Observe(Seconds(now - s.last_token_time));
  }
  s.last_token_time = now;
  s.unsent_tokens.push_back(token);
  if (s.decoder) s.unsent_text += s.stop->Push(s.decoder->Push(token));
  if (s.stop->stopped()) {
    Finish(s, FinishReason::kStop);
  } else if (s.num_generated >= r.max_tokens) {
    Finish(s, FinishReason::kLength);
  } else if (static_cast<int32_t>(s.tokens.size()) > context_tokens_) {
    // The new token would sit past the last position: nothing can attend to it.
    Finish(s, FinishReason::kContextLimit);
  } else {
    Emit(s, /*final_event=*/false, FinishReason::kLength, absl::OkStatus());
  }
}

void EngineLoop::Impl::Finish(Sequence& s, FinishReason reason, absl::Status error) {
  if (s.finished()) return;
  if (s.decoder && !s.stop->stopped()) {
    // In this order: the held partial character comes after the text the matcher holds.
    s.unsent_text += s.stop->Push(s.decoder->Flush());
    s.unsent_text += s.stop->Flush();
  }
  if (s.in_cache) {
    cache_->Free(static_cast<SeqId>(s.handle));
    s.in_cache = false;
  } else if (s.usage.num_preemptions > 0) {
    cache_->EndPreempted(static_cast<SeqId>(s.handle));  // its session waited for it
  }
  const absl::Time now = clock_->Now();
  s.usage.completion_tokens = s.num_generated;
  s.usage.total_time = now - s.submit_time;
  // Ended before it was ever scheduled (cancelled, past its deadline or aborted while waiting):
  // it spent its whole life in the queue.
  if (!s.scheduled_once) s.usage.queue_time = s.usage.total_time;
  ++stats_.requests_finished;
  ++stats_.requests_finished_by_reason[static_cast<int>(reason)];
  stats_.end_to_end_latency.Observe(Seconds(s.usage.total_time));
  if (reason == FinishReason::kLength || reason == FinishReason::kStop ||
      reason == FinishReason::kContextLimit) {
    predictor_.Observe(s.num_generated);
    stats_.output_length.Observe(s.num_generated);
    stats_.prediction_error.Observe(s.num_generated - s.predicted_output);
    stats_.predicted_output_tokens = predictor_.Predict();
  }
  Emit(s, /*final_event=*/true, reason, error);
  s.finish_reason = reason;
}

void EngineLoop::Impl::Emit(Sequence& s, bool final_event, FinishReason reason,
                            const absl::Status& error) {
  if (!final_event && s.unsent_tokens.empty() && s.unsent_text.empty()) return;
  StreamEvent e;
  e.token_ids.swap(s.unsent_tokens);
  e.text.swap(s.unsent_text);
  e.finished = final_event;
  if (final_event) {
    e.finish_reason = reason;
    e.usage = s.usage;
    e.error = error;
  }
  if (s.on_event) s.on_event(e);
}

void EngineLoop::Impl::RemoveFinished() {
  for (auto* list : {&waiting_, &running_}) {
    list->erase(
        std::remove_if(list->begin(), list->end(), [](const SeqPtr& s) { return s->finished(); }),
        list->end());
  }
}

void EngineLoop::Impl::PublishQueueLocked(int32_t drained) {
  auto unfinished = [](const std::vector<SeqPtr>& list) {
    return static_cast<int32_t>(
        std::count_if(list.begin(), list.end(), [](const SeqPtr& s) { return !s->finished(); }));
  };
  published_.requests_waiting = unfinished(waiting_) + drained;
  published_.requests_running = unfinished(running_);
}

MemoryStats EngineLoop::Impl::MemoryNow() const {
  MemoryStats m;
  const Backend* backend = model_->backend();
  m.weights_bytes = model_->weight_bytes();
  const KvArena* arena = cache_->arena();
  if (arena != nullptr && arena->backend() == backend) m.kv_pool_bytes = arena->bytes();
  // The remainder is kvd's other buffers where the model's and the arena's come from `backend`
  // itself, as with the daemon's; a wrapper handing out another backend's buffers (a test's
  // failing backend) counts none of them, and this stays 0 rather than going negative.
  m.activation_bytes =
      std::max<int64_t>(0, backend->allocated_bytes() - m.weights_bytes - m.kv_pool_bytes);
  m.workspace_bytes = backend->workspace_bytes();
  return m;
}

void EngineLoop::Impl::PublishStats() {
  stats_.requests_waiting = static_cast<int32_t>(waiting_.size());
  stats_.requests_running = static_cast<int32_t>(running_.size());
  stats_.cache = cache_->stats();
  stats_.memory = MemoryNow();
  absl::MutexLock lock(&mu_);
  const int64_t rejected = published_.requests_rejected;
  published_ = stats_;
  published_.requests_rejected = rejected;
  idle_ = waiting_.empty() && running_.empty();
}

void EngineLoop::Impl::AbortAll(const absl::Status& error) {
  DrainIngress();
  for (auto* list : {&waiting_, &running_}) {
    for (SeqPtr& s : *list) {
      Finish(*s, FinishReason::kAborted, error);
    }
  }
  RemoveFinished();
  PublishStats();
}

void EngineLoop::Impl::Fail(const absl::Status& cause) {
  {
    absl::MutexLock lock(&mu_);
    failure_ = cause;  // from here on Submit and CloseSession refuse; AbortAll takes the rest
  }
  AbortAll(FailedEngineError(cause));
}

}  // namespace kvd
