#ifndef KVD_SCHEDULER_ENGINE_LOOP_IMPL_H_
#define KVD_SCHEDULER_ENGINE_LOOP_IMPL_H_

// Private to scheduler/: EngineLoop's state. engine_loop.cc holds the thread-safe
// ingress and thread control; engine_step.cc holds one engine step (admission, planning,
// preemption, commit), which runs on the engine thread only.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "scheduler/engine_loop.h"
#include "scheduler/output_length_predictor.h"
#include "scheduler/sequence.h"

namespace kvd {

// What Submit, CloseSession and every request still held get once the backend has failed
// for good (EngineLoop::Failure).
inline absl::Status FailedEngineError(const absl::Status& cause) {
  return absl::UnavailableError(absl::StrCat("the backend failed and the engine stopped (",
                                             cause.message(), "); retry on another server"));
}

class EngineLoop::Impl {
 public:
  Impl(const EngineOptions& options, LlamaModel* model, KvCacheManager* cache,
       const Tokenizer* tokenizer, Clock* clock);

  // Thread safe.
  absl::StatusOr<uint64_t> Submit(Request request, StreamCallback on_event);
  void Cancel(uint64_t handle);
  absl::Status CloseSession(const std::string& session_id);
  void BeginDrain();
  bool WaitIdle(absl::Duration timeout);
  EngineStats Stats() const;
  absl::Status Failure() const;
  const Clock& clock() const { return *clock_; }
  void Start();
  void Stop();
  void RunUntilIdle();

 private:
  struct SessionClose {
    std::string session_id;
    uint64_t submitted_before;  // next_handle_ at the close: earlier turns have lower handles
    absl::Status* result;
    absl::Notification* done;
  };
  using SeqPtr = std::unique_ptr<Sequence>;

  void ThreadMain();
  // --- engine thread (engine_step.cc) ---
  // One step; false when the engine holds no request (nothing ran and nothing is left).
  bool Step();
  void DrainIngress();
  // Closes a session for the client. Its turns submitted before the close (handles below
  // `submitted_before`) that have not run yet, in `queued` or in waiting_, go on without it,
  // so that none re-creates it (a running or preempted turn's session the cache forgets at
  // once); later turns keep it and start it afresh. Then the cache releases its pins.
  // NotFound when neither the cache nor such a turn knew the id.
  absl::Status CloseSessionNow(const std::string& session_id, uint64_t submitted_before,
                               absl::Span<const SeqPtr> queued = {});
  void ExpireDeadlines();
  // Blocks s is still expected to take: TargetBlocks(s) less what it holds (0 if more).
  int64_t BlocksToCome(const Sequence& s) const;
  // Whether the candidate fits beside the running sequences, which are still expected to
  // take `committed` blocks (the sum of their BlocksToCome).
  bool Admissible(const Sequence& candidate, int64_t committed) const;
  int64_t TargetBlocks(const Sequence& s) const;
  // KV positions `r` can need at most: its prompt and all its output but the last token,
  // within the context (context_tokens_).
  int64_t MaxKvTokens(const Request& r) const;
  enum class AdmitResult { kAdmitted, kNoRoom, kFailed };
  // Starts s in the cache and reserves its first chunk, n tokens (at most `budget`); on
  // kNoRoom nothing of it stays in the cache (a preempted s's session stays attached to it);
  // kFailed: the cache refused it, and s is finished with that error. REQUIRES: its session
  // is not busy with another turn (KvCacheManager::SessionBusy).
  AdmitResult Admit(Sequence& s, int32_t budget, int32_t& n);
  // Frees the victim's blocks and requeues it for recompute.
  void Preempt(Sequence* victim);
  void HandleToken(Sequence& s, int32_t token);
  void Finish(Sequence& s, FinishReason reason, absl::Status error = absl::OkStatus());
  void Emit(Sequence& s, bool final_event, FinishReason reason, const absl::Status& error);
  void RemoveFinished();
  void InsertWaiting(SeqPtr s);
  // Publishes how many requests wait (plus `drained`, taken from incoming_ but not yet in
  // waiting_) and run, unfinished, so that Submit's limit and Stats() hold mid-step too:
  // a stream callback, or another thread, may look. Called where requests join waiting_
  // (intake, preemption) and after admission, before the step's token callbacks; a request
  // that finishes (also one that expires or fails admission earlier in the step) counts
  // until the next call, so the limit errs toward refusing.
  void PublishQueueLocked(int32_t drained) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step's end: all of stats_.
  void PublishStats();
  // The model backend's memory now (EngineStats::memory).
  MemoryStats MemoryNow() const;
  // Finishes every request the engine holds or has been handed (kAborted, `error`).
  void AbortAll(const absl::Status& error);
  // The backend failed for good: records `cause` for Failure() and aborts everything.
  void Fail(const absl::Status& cause);

  const EngineOptions options_;
  LlamaModel* const model_;
  KvCacheManager* const cache_;
  const Tokenizer* const tokenizer_;
  Clock* const clock_;
  const int64_t max_blocks_;      // the whole pool at max size
  const int32_t context_tokens_;  // positions a sequence may fill (EngineOptions)

  // Ingress: the only state shared with other threads.
  mutable absl::Mutex mu_;
  std::vector<SeqPtr> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<SessionClose> closes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Stop has aborted every request
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // set once, by Fail
  // Nothing waiting or running: false from a request's submission, through its intake, until
  // a step ends with nothing left (WaitIdle also waits for incoming_ to empty).
  bool idle_ ABSL_GUARDED_BY(mu_) = true;
  // requests_waiting and requests_running are current (PublishQueueLocked); the rest as of
  // the last step's end (PublishStats). requests_waiting does not count incoming_.
  EngineStats published_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;

  // Engine thread only.
  std::vector<SeqPtr> waiting_;  // priority desc, then handle asc (FCFS)
  std::vector<SeqPtr> running_;  // priority desc, then admission order (sorted each step)
  OutputLengthPredictor predictor_;
  EngineStats stats_;
  int64_t admit_counter_ = 0;
  std::vector<int32_t> sampled_;  // the step's sampled tokens, in logit-row order
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_ENGINE_LOOP_IMPL_H_
