#ifndef KVD_KERNELS_THREAD_POOL_H_
#define KVD_KERNELS_THREAD_POOL_H_

#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace kvd {

// A fixed-size pool of worker threads for data-parallel loops on the CPU backend.
//
// ParallelFor splits [0, n) into consecutive chunks of `grain` indices (the last may be
// shorter) and runs each chunk exactly once, on a worker or on the calling thread, which
// takes part as one of the `num_threads`. The chunk boundaries depend only on n and grain,
// never on the thread count or on timing, so a caller that makes each output depend only
// on its chunk's indices gets results that are independent of the thread count.
//
// Thread safety: ParallelFor may be called from several threads; calls are serialized.
// REQUIRES (not checked): `fn` does not call ParallelFor on the same pool (it would
// deadlock). Ownership: the pool owns its threads and joins them in the destructor.
class ThreadPool {
 public:
  // num_threads <= 1 creates no threads: every loop runs inline on the caller.
  explicit ThreadPool(int num_threads);
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  // Threads that run a loop, counting the caller (at least 1).
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) for consecutive chunks covering [0, n) and blocks until every
  // call has returned. n <= 0 calls nothing; grain <= 0 is treated as 1. An exception from
  // fn (std::bad_alloc, say) reaches the caller once the calls under way have returned; the
  // chunks not yet started are skipped, and the pool stays usable.
  void ParallelFor(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  // One ParallelFor in flight; lives on the caller's stack while workers may see it.
  struct Loop {
    absl::FunctionRef<void(int64_t, int64_t)>* fn;
    int64_t n;
    int64_t grain;
    int64_t num_chunks;
    int64_t next_chunk;   // next chunk to hand out
    int64_t done_chunks;  // chunks whose call has returned (or was skipped)
    std::exception_ptr error;  // the first exception a call threw
  };

  void WorkerMain();
  // Takes the next unclaimed chunk of loop_ and runs it with mu_ released.
  // REQUIRES: mu_ held, loop_ != nullptr and loop_ has an unclaimed chunk.
  void RunOneChunk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex call_mu_;  // serializes ParallelFor callers
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // signaled when a loop starts or the pool stops
  absl::CondVar done_cv_;  // signaled when the last chunk of a loop finishes
  Loop* loop_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvd

#endif  // KVD_KERNELS_THREAD_POOL_H_
