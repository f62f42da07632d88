#ifndef KVD_CACHE_DEFRAGMENTER_H_
#define KVD_CACHE_DEFRAGMENTER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/block_links.h"

namespace kvd {

struct DefragOptions {
  // Block moves applied at one step boundary, bounding the pause.
  int32_t max_moves_per_step = 32;
  // Shrinking starts when used blocks <= low_water * (blocks in the chunks below the top).
  double low_water = 0.5;
  // Plan on the defragmenter's own thread (true) or inline in Submit() (deterministic;
  // for tests).
  bool background_planning = true;
  // Tests: called on the thread that plans, right before each plan.
  std::function<void()> before_plan;
};

// What a block is at a snapshot.
enum class BlockState : uint8_t { kFree = 0, kCached = 1, kUsed = 2 };

// A copy of the pool's block states taken at a step boundary; the planner reads nothing
// else, so it never touches engine state.
struct DefragSnapshot {
  int32_t chunk_shift = 0;
  int32_t num_chunks = 0;
  std::vector<BlockState> state;  // [num_chunks << chunk_shift]
  // Chunks the pool is expected to shrink to (the lowest ones): the planner fills their
  // slots first, cached ones included, so that a block moves once and not again as the
  // chunks above them drain in turn. 0 (or num_chunks or more): the chunks below the top.
  int32_t keep_chunks = 0;
};

struct BlockMove {
  BlockId src = kNoBlock;
  BlockId dst = kNoBlock;
};

// Upper bounds of the pause histogram's buckets, in seconds (the goal is under 2 ms).
inline constexpr std::array<double, 10> kDefragPauseBoundsSeconds = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 100e-3};

// Distribution of the step-boundary pauses: each step that copied blocks (applied moves, or
// a copy that failed) or returned the top chunk, timed whole. Counters only, cheap to copy:
// the engine takes them with the cache's stats after every step.
struct DefragPauseStats {
  int64_t num_pauses = 0;
  int64_t num_moves = 0;
  absl::Duration total;
  absl::Duration max;
  // Pauses per bucket of kDefragPauseBoundsSeconds (not cumulative); the last bucket holds
  // pauses above every bound.
  std::array<int64_t, kDefragPauseBoundsSeconds.size() + 1> bucket_counts{};
};

// Exact quantiles of the last Defragmenter::kPauseWindow pauses (zero before the first).
struct DefragPauseQuantiles {
  absl::Duration p50;
  absl::Duration p99;
};

// Defragmenter plans how to empty the arena's top chunk: every used block there moves to
// a slot in a lower chunk: in the chunks the pool is to keep (DefragSnapshot::keep_chunks)
// free slots, then slots of cached blocks (evicted to make room; were the pool to shrink
// that far, the block would move there in the end anyway), then the same in the chunks
// above those, lowest ids first each time. Planning runs on its own thread from a
// snapshot; KvCacheManager applies the plan at step boundaries, at most max_moves_per_step
// moves each, re-checking every move against the pool's state then (it may have changed),
// and records each pause here.
//
// Thread safety: Submit/TakePlan/busy/WaitForPlan may be called from any one thread (the
// engine thread) concurrently with the planner thread; RecordPause/pause_stats/
// RecentPauseQuantiles are engine thread only.
class Defragmenter {
 public:
  static constexpr int32_t kPauseWindow = 4096;

  explicit Defragmenter(const DefragOptions& options);
  ~Defragmenter();  // stops and joins the planner thread
  Defragmenter(const Defragmenter&) = delete;
  Defragmenter& operator=(const Defragmenter&) = delete;

  const DefragOptions& options() const { return options_; }

  // Moves that empty the top chunk of `snapshot`; empty when it has one chunk or the
  // chunks below cannot take all of the top chunk's used blocks. Pure.
  static std::vector<BlockMove> Plan(const DefragSnapshot& snapshot);

  // Hands a snapshot to the planner. Ignored while busy().
  void Submit(DefragSnapshot snapshot);
  // The finished plan, moved out; nullopt when none is ready.
  std::optional<std::vector<BlockMove>> TakePlan();
  // A snapshot was submitted and its plan not yet taken.
  bool busy() const;
  // Blocks until the submitted snapshot has been planned (tests).
  void WaitForPlan();

  void RecordPause(absl::Duration pause, int32_t num_moves);
  const DefragPauseStats& pause_stats() const { return stats_; }
  // Selects over the whole window (up to kPauseWindow pauses) each call: for benchmarks and
  // tests, not for every step.
  DefragPauseQuantiles RecentPauseQuantiles() const;

 private:
  void PlannerLoop();

  const DefragOptions options_;
  mutable absl::Mutex mu_;
  std::optional<DefragSnapshot> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<BlockMove>> plan_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread planner_;

  // Engine thread only.
  DefragPauseStats stats_;
  std::vector<absl::Duration> recent_pauses_;  // ring of the last kPauseWindow
  int64_t next_pause_slot_ = 0;
};

}  // namespace kvd

#endif  // KVD_CACHE_DEFRAGMENTER_H_
