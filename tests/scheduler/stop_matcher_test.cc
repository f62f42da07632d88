#include "scheduler/stop_matcher.h"

#include <gtest/gtest.h>

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

TEST(StopMatcherTest, EarliestMatchWinsAndFlushReturnsTheRest) {
  StopMatcher m({"b", "abc"});
  EXPECT_EQ(m.Push("xxabc"), "xx");  // "abc" starts before "b"
  StopMatcher n({"zz"});
  EXPECT_EQ(n.Push("az"), "a");
  EXPECT_EQ(n.Flush(), "z");
  StopMatcher none({});
  EXPECT_EQ(none.Push("abc"), "abc");
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
