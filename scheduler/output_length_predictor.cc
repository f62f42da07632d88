#include "scheduler/output_length_predictor.h"

#include <algorithm>
#include <cmath>

namespace kvd {

OutputLengthPredictor::OutputLengthPredictor(double quantile, int32_t default_tokens,
                                             int32_t window)
    : quantile_(quantile),
      prediction_(std::max(1, default_tokens)),
      window_(static_cast<size_t>(std::max(1, window))) {}

void OutputLengthPredictor::Observe(int32_t output_tokens) {
  output_tokens = std::max(output_tokens, 1);
  if (recent_.size() < window_) {
    recent_.push_back(output_tokens);
  } else {
    recent_[next_] = output_tokens;
    next_ = (next_ + 1) % window_;
  }
  Recompute();
}

void OutputLengthPredictor::Recompute() {
  // Nearest-rank quantile over at most `window_` values: cheap enough per finished request.
  std::vector<int32_t> sorted = recent_;
  const size_t rank = static_cast<size_t>(
      std::ceil(quantile_ * static_cast<double>(sorted.size())));
  const size_t k = std::clamp<size_t>(rank, 1, sorted.size()) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end());
  prediction_ = sorted[k];
}

}  // namespace kvd
