#include "cache/defragmenter.h"

#include <algorithm>
#include <utility>

namespace kvd {

Defragmenter::Defragmenter(const DefragOptions& options) : options_(options) {
  if (options_.background_planning) planner_ = std::thread([this] { PlannerLoop(); });
}

Defragmenter::~Defragmenter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (planner_.joinable()) planner_.join();
}

std::vector<BlockMove> Defragmenter::Plan(const DefragSnapshot& snapshot) {
  std::vector<BlockMove> moves;
  if (snapshot.num_chunks <= 1) return moves;
  const BlockId top_begin = (snapshot.num_chunks - 1) << snapshot.chunk_shift;
  const BlockId top_end = snapshot.num_chunks << snapshot.chunk_shift;
  std::vector<BlockId> sources;
  for (BlockId b = top_begin; b < top_end; ++b) {
    if (snapshot.state[b] == BlockState::kUsed) sources.push_back(b);
  }
  if (sources.empty()) return moves;
  // Destinations: in the chunks to keep, then in the rest below the top, free slots lowest
  // first and then cached ones. A block placed above the kept chunks would move again when
  // its chunk drains, and the cached blocks there go with it anyway.
  const int32_t keep = snapshot.keep_chunks > 0
                           ? std::min(snapshot.keep_chunks, snapshot.num_chunks - 1)
                           : snapshot.num_chunks - 1;
  const BlockId keep_end = keep << snapshot.chunk_shift;
  std::vector<BlockId> dests;
  for (const auto& [begin, end] : {std::pair{0, keep_end}, std::pair{keep_end, top_begin}}) {
    for (BlockState wanted : {BlockState::kFree, BlockState::kCached}) {
      for (BlockId b = begin; b < end && dests.size() < sources.size(); ++b) {
        if (snapshot.state[b] == wanted) dests.push_back(b);
      }
    }
  }
  if (dests.size() < sources.size()) return moves;  // the top chunk cannot be emptied
  moves.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) moves.push_back({sources[i], dests[i]});
  return moves;
}

void Defragmenter::Submit(DefragSnapshot snapshot) {
  if (!options_.background_planning) {
    absl::MutexLock lock(&mu_);
    if (pending_.has_value() || plan_.has_value()) return;
    if (options_.before_plan) options_.before_plan();
    plan_ = Plan(snapshot);
    return;
  }
  absl::MutexLock lock(&mu_);
  if (pending_.has_value() || plan_.has_value()) return;
  pending_ = std::move(snapshot);
}

void Defragmenter::PlannerLoop() {
  while (true) {
    DefragSnapshot snapshot;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || pending_.has_value(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      snapshot = *std::move(pending_);
    }
    if (options_.before_plan) options_.before_plan();
    std::vector<BlockMove> plan = Plan(snapshot);
    absl::MutexLock lock(&mu_);
    pending_.reset();
    plan_ = std::move(plan);
  }
}

std::optional<std::vector<BlockMove>> Defragmenter::TakePlan() {
  absl::MutexLock lock(&mu_);
  std::optional<std::vector<BlockMove>> out = std::move(plan_);
  plan_.reset();
  return out;
}

bool Defragmenter::busy() const {
  absl::MutexLock lock(&mu_);
  return pending_.has_value() || plan_.has_value();
}

void Defragmenter::WaitForPlan() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_.has_value(); };
  mu_.Await(absl::Condition(&done));
}

void Defragmenter::RecordPause(absl::Duration pause, int32_t num_moves) {
  ++stats_.num_pauses;
  stats_.num_moves += num_moves;
  stats_.total += pause;
  stats_.max = std::max(stats_.max, pause);
  const double seconds = absl::ToDoubleSeconds(pause);
  const auto bucket = std::lower_bound(kDefragPauseBoundsSeconds.begin(),
                                       kDefragPauseBoundsSeconds.end(), seconds);
  ++stats_.bucket_counts[bucket - kDefragPauseBoundsSeconds.begin()];
  if (static_cast<int32_t>(recent_pauses_.size()) < kPauseWindow) {
    recent_pauses_.push_back(pause);
  } else {
    recent_pauses_[next_pause_slot_ % kPauseWindow] = pause;
  }
  ++next_pause_slot_;
}

DefragPauseQuantiles Defragmenter::RecentPauseQuantiles() const {
  DefragPauseQuantiles q;
  if (recent_pauses_.empty()) return q;
  std::vector<absl::Duration> pauses = recent_pauses_;
  const auto nth = [&pauses](size_t rank) {
    std::nth_element(pauses.begin(), pauses.begin() + rank, pauses.end());
    return pauses[rank];
  };
  const size_t last = pauses.size() - 1;
  q.p99 = nth(last * 99 / 100);
  q.p50 = nth(last / 2);
  return q;
}

}  // namespace kvd
