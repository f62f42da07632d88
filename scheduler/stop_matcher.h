#ifndef KVD_SCHEDULER_STOP_MATCHER_H_
#define KVD_SCHEDULER_STOP_MATCHER_H_

#include <string>
#include <vector>

namespace kvd {

// Holds back generated text that could still become a stop string, so a client never
// sees part of one. Feed it each text delta; it returns the text that is safe to stream.
// Not thread safe.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends `delta`; returns newly safe text. After a match, returns the text before it
  // and stopped() turns true; further input is ignored. Where several stop strings occur,
  // the one that completes first is the match (of those, the longest), so that the result
  // is the same however the text is split into deltas.
  std::string Push(const std::string& delta);
  // The text held back (at the end of a stream that stopped for another reason).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet streamed
  bool stopped_ = false;
};

}  // namespace kvd

#endif  // KVD_SCHEDULER_STOP_MATCHER_H_
