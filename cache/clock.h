#ifndef KVD_CACHE_CLOCK_H_
#define KVD_CACHE_CLOCK_H_

#include <chrono>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvd {

// Source of time, injected wherever a component makes time-based decisions (session idle
// timeouts, defragmentation pacing, request deadlines and timings) so that tests can drive
// time by hand. Implementations are thread safe. Not owned by its users: whoever builds the
// component keeps it alive longer.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The system clock's time at construction, advanced by the monotonic clock
// (std::chrono::steady_clock): it never steps back or jumps when the system time is set (an
// NTP step, an operator), so timeouts and pacing measure the time that really passed. It
// strays from the system clock by those steps; times from the system clock (gRPC deadlines)
// are converted as the time left (InferenceService).
class RealClock final : public Clock {
 public:
  RealClock() : wall_start_(absl::Now()), steady_start_(std::chrono::steady_clock::now()) {}
  absl::Time Now() const override {
    return wall_start_ + absl::FromChrono(std::chrono::steady_clock::now() - steady_start_);
  }

 private:
  absl::Time wall_start_;
  std::chrono::steady_clock::time_point steady_start_;
};

// A clock that only moves when told to. Starts at `start` (the Unix epoch by default).
// Thread safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  // REQUIRES: d >= absl::ZeroDuration() (time never goes back).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    if (d > absl::ZeroDuration()) now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd

#endif  // KVD_CACHE_CLOCK_H_
