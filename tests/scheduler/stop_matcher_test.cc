#include "scheduler/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "scheduler/output_length_predictor.h"

namespace kvd {
namespace {

TEST(StopMatcherTest, HoldsBackPossiblePrefixesAndCutsAtTheMatch) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.Push("hello E"), "hello ");  // "E" may start "END"
  EXPECT_EQ(m.Push("x"), "Ex");
  EXPECT_EQ(m.Push(" EN"), " ");
  EXPECT_EQ(m.Push("D tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, FirstToCompleteWinsAndFlushReturnsTheRest) {
  StopMatcher m({"b", "abc"});
  EXPECT_EQ(m.Push("xxabc"), "xxa");  // "b" completes before "abc", though it starts later
  StopMatcher longest({"bc", "abc", "c"});
  EXPECT_EQ(longest.Push("xxabcd"), "xx");  // all three complete at the "c": the longest
  StopMatcher n({"zz"});
  EXPECT_EQ(n.Push("az"), "a");
  EXPECT_EQ(n.Flush(), "z");
  StopMatcher none({});
  EXPECT_EQ(none.Push("abc"), "abc");
}

// The same text gives the same output and stop however it is split into deltas: every split
// of each text into up to three pieces against stop sets where strings overlap, nest or
// share prefixes.
TEST(StopMatcherTest, TheResultDoesNotDependOnHowTheTextIsSplit) {
  const std::vector<std::vector<std::string>> stop_sets = {
      {"b", "abc"}, {"abcd", "bc"}, {"aab", "ab", "b"}, {"END", "\n\n"}, {"abab", "bab"}};
  const std::vector<std::string> texts = {"xxabcd", "aaabab", "ab\n\nEND", "ababab", "zzz"};
  for (const auto& stops : stop_sets) {
    for (const std::string& text : texts) {
      auto run = [&](const std::vector<std::string>& pieces) {
        StopMatcher m(stops);
        std::string out;
        for (const std::string& p : pieces) out += m.Push(p);
        const bool stopped = m.stopped();
        out += m.Flush();
        return std::make_pair(out, stopped);
      };
      const auto whole = run({text});
      for (size_t i = 0; i <= text.size(); ++i) {
        for (size_t j = i; j <= text.size(); ++j) {
          EXPECT_EQ(run({text.substr(0, i), text.substr(i, j - i), text.substr(j)}), whole)
              << "text " << text << " split at " << i << ", " << j;
        }
      }
    }
  }
}

TEST(OutputLengthPredictorTest, TracksTheQuantileOfRecentLengths) {
  OutputLengthPredictor p(0.9, 128, 10);
  EXPECT_EQ(p.Predict(), 128);
  for (int i = 1; i <= 10; ++i) p.Observe(i * 10);
  EXPECT_EQ(p.Predict(), 90);
  for (int i = 0; i < 10; ++i) p.Observe(5);  // the window forgets old lengths
  EXPECT_EQ(p.Predict(), 5);
}

}  // namespace
}  // namespace kvd
