// Fuzz target: StopMatcher over any stop strings and any split of the generated text.
//
// Invariants, after every Push: once a stop string occurs in the text so far, what has been
// streamed is exactly the text up to the match that byte-at-a-time generation would stop at
// (the shortest prefix of the text that ends with a stop string; of the stop strings it ends
// with, the longest starts the cut), then stopped() is true and nothing more comes. With no
// occurrence yet, it is the text so far less its longest tail that is a proper prefix of
// some stop string (the held-back part, which Flush() returns). The reference below rescans
// the whole text each time; the matcher must agree with it, however the text was split.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/stop_matcher.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvd::fuzz::Require;

// The longest tail of `text` that is a proper, non-empty prefix of a stop string.
size_t HeldBack(std::string_view text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& stop : stops) {
    for (size_t n = 1; n < stop.size() && n <= text.size(); ++n) {
      if (text.substr(text.size() - n) == std::string_view(stop).substr(0, n) && n > held) {
        held = n;
      }
    }
  }
  return held;
}

// Where byte-at-a-time generation of `text` would cut it for a stop string (npos: none
// occurs): at the first end of a stop string, less the longest one ending there.
size_t CutAt(std::string_view text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t longest = 0;
    for (const std::string& stop : stops) {
      if (stop.size() <= end && text.substr(end - stop.size(), stop.size()) == stop) {
        longest = std::max(longest, stop.size());
      }
    }
    if (longest > 0) return end - longest;
  }
  return std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // the reference is quadratic
  kvd::fuzz::InputReader input(data, size);
  std::vector<std::string> stops(input.Byte() % 5);
  for (std::string& stop : stops) stop = std::string(input.Bytes(input.Byte() % 8));
  std::vector<std::string> nonempty_stops;
  for (const std::string& stop : stops) {
    if (!stop.empty()) nonempty_stops.push_back(stop);
  }

  kvd::StopMatcher matcher(stops);
  std::string text;      // every delta pushed
  std::string streamed;  // everything the matcher returned
  while (!input.empty()) {
    const std::string delta(input.Bytes(input.Byte() % 16));
    const bool was_stopped = matcher.stopped();
    const std::string out = matcher.Push(delta);
    if (was_stopped) {
      Require(out.empty() && matcher.stopped(), "text after a stop");
      continue;
    }
    text += delta;
    streamed += out;
    const size_t match = CutAt(text, nonempty_stops);
    if (match != std::string_view::npos) {
      Require(matcher.stopped(), "a stop string went by unnoticed");
      Require(streamed == text.substr(0, match), "stopped at the wrong place");
    } else {
      Require(!matcher.stopped(), "stopped without a stop string");
      Require(streamed == text.substr(0, text.size() - HeldBack(text, nonempty_stops)),
              "held back the wrong text");
    }
  }
  const std::string rest = matcher.Flush();
  if (matcher.stopped()) {
    Require(rest.empty(), "Flush() after a stop returned text");
  } else {
    Require(streamed + rest == text, "Flush() did not return the held-back text");
  }
  return 0;
}
