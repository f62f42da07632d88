#include "scheduler/stop_matcher.h"

#include <algorithm>

namespace kvd {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::Push(const std::string& delta) {
  if (stopped_) return "";
  held_ += delta;
  // The match that completes first wins (of those, the longest), as if the text had come one
  // byte at a time: the cut never depends on how the text was split into deltas. A stop
  // string's first occurrence is also where it first completes.
  size_t match = std::string::npos;
  size_t match_end = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at == std::string::npos) continue;
    const size_t end = at + s.size();
    if (end < match_end || (end == match_end && at < match)) {
      match = at;
      match_end = end;
    }
  }
  if (match != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, match);
    held_.clear();
    return out;
  }
  // Keep the longest tail of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? "" : out;
}

}  // namespace kvd
