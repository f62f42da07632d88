#ifndef KVD_SCHEDULER_OUTPUT_LENGTH_PREDICTOR_H_
#define KVD_SCHEDULER_OUTPUT_LENGTH_PREDICTOR_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvd {

// Predicts how many tokens a request will generate: the `quantile` of the output lengths
// of the last `window` finished requests (or `default_tokens` before any finished).
// Admission reserves KV for min(max_tokens, prediction). Not thread safe.
class OutputLengthPredictor {
 public:
  // REQUIRES: 0 <= quantile <= 1 (0: the shortest length seen), window >= 1,
  // default_tokens >= 1.
  OutputLengthPredictor(double quantile, int32_t default_tokens, int32_t window = 512);

  void Observe(int32_t output_tokens);
  int32_t Predict() const { return prediction_; }

 private:
  void Recompute();

  double quantile_;
  int32_t prediction_;
  size_t window_;
  size_t next_ = 0;              // ring position
  std::vector<int32_t> recent_;  // [min(observed, window)]
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_OUTPUT_LENGTH_PREDICTOR_H_
