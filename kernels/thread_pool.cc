#include "kernels/thread_pool.h"

#include <algorithm>

namespace kvd {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerMain(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t num_chunks = (n - 1) / grain + 1;
  if (workers_.empty() || num_chunks == 1) {
    for (int64_t begin = 0; begin < n; begin += grain) fn(begin, std::min(n, begin + grain));
    return;
  }

  absl::MutexLock call_lock(&call_mu_);
  Loop loop{&fn, n, grain, num_chunks, /*next_chunk=*/0, /*done_chunks=*/0, /*error=*/nullptr};
  absl::MutexLock lock(&mu_);
  loop_ = &loop;
  work_cv_.SignalAll();
  while (loop.next_chunk < loop.num_chunks) RunOneChunk();
  while (loop.done_chunks < loop.num_chunks) done_cv_.Wait(&mu_);
  loop_ = nullptr;
  if (loop.error) std::rethrow_exception(loop.error);  // no worker sees the loop any more
}

void ThreadPool::RunOneChunk() {
  Loop* loop = loop_;
  const int64_t begin = loop->next_chunk++ * loop->grain;
  const int64_t end = std::min(loop->n, begin + loop->grain);
  // After a failed call the rest are skipped. An exception must not leave here: on a worker
  // it would end the process, and on the caller it would leave with mu_ not held.
  std::exception_ptr error;
  if (!loop->error) {
    mu_.Unlock();
    try {
      (*loop->fn)(begin, end);
    } catch (...) {
      error = std::current_exception();
    }
    mu_.Lock();
  }
  if (error && !loop->error) loop->error = error;
  // The loop stays alive until done_chunks reaches num_chunks, which needs this increment.
  if (++loop->done_chunks == loop->num_chunks) done_cv_.SignalAll();
}

void ThreadPool::WorkerMain() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && (loop_ == nullptr || loop_->next_chunk >= loop_->num_chunks)) {
      work_cv_.Wait(&mu_);
    }
    if (stop_) return;
    RunOneChunk();
  }
}

}  // namespace kvd
