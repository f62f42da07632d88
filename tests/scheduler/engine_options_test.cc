// EngineOptions::Validate: the engine's limits, each refused naming the field, its value and
// what is allowed; an engine given options outside them stops the process before any step.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cache/clock.h"
#include "scheduler/engine_loop.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

TEST(EngineOptionsTest, TheDefaultsAreValid) {
  EXPECT_TRUE(EngineOptions{}.Validate().ok()) << EngineOptions{}.Validate();
}

TEST(EngineOptionsTest, TheEdgesOfEveryRangeAreValid) {
  EngineOptions o;
  o.max_batch_size = 1;
  o.max_num_batched_tokens = 1;  // == max_batch_size
  o.prefill_chunk_tokens = 1;
  o.max_waiting_requests = 1;
  o.predictor_quantile = 0.0;
  o.predictor_default_tokens = 1;
  o.idle_tick = absl::ZeroDuration();  // steps back to back
  o.max_context_tokens = 0;            // the model's context
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  o.predictor_quantile = 1.0;
  o.max_waiting_requests = std::numeric_limits<int32_t>::max();  // the offline Generator's
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
}

TEST(EngineOptionsTest, EachFieldOutsideItsRangeIsNamedWithItsValue) {
  struct Case {
    std::function<void(EngineOptions&)> set;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {[](EngineOptions& o) { o.max_batch_size = 0; },
       {"EngineOptions.max_batch_size = 0", ">= 1"}},
      {[](EngineOptions& o) { o.max_num_batched_tokens = 63; },  // below 64 sequences
       {"EngineOptions.max_num_batched_tokens = 63", ">= max_batch_size, which is 64"}},
      {[](EngineOptions& o) { o.prefill_chunk_tokens = 0; },
       {"EngineOptions.prefill_chunk_tokens = 0", ">= 1"}},
      {[](EngineOptions& o) { o.max_waiting_requests = -5; },
       {"EngineOptions.max_waiting_requests = -5", ">= 1"}},
      {[](EngineOptions& o) { o.predictor_quantile = 1.5; },
       {"EngineOptions.predictor_quantile = 1.5", "[0, 1]"}},
      {[](EngineOptions& o) { o.predictor_quantile = std::numeric_limits<double>::quiet_NaN(); },
       {"EngineOptions.predictor_quantile = nan", "[0, 1]"}},
      {[](EngineOptions& o) { o.predictor_default_tokens = 0; },
       {"EngineOptions.predictor_default_tokens = 0", ">= 1"}},
      {[](EngineOptions& o) { o.max_context_tokens = -1; },
       {"EngineOptions.max_context_tokens = -1", ">= 0 (0 = the model's context)"}},
      {[](EngineOptions& o) { o.idle_tick = absl::Milliseconds(-3); },
       {"EngineOptions.idle_tick = -3ms", ">= 0"}},
  };
  for (const Case& c : cases) {
    EngineOptions o;
    c.set(o);
    const absl::Status status = o.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message[0];
    for (const std::string& part : c.message) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(part));
    }
  }
}

// A step of no tokens would spin forever: the engine refuses such options at construction,
// before it touches the model or the cache (none is given here).
TEST(EngineOptionsDeathTest, AnEngineGivenInvalidOptionsStopsNamingTheField) {
  EngineOptions o;
  o.prefill_chunk_tokens = 0;
  FakeClock clock;
  EXPECT_DEATH(EngineLoop(o, nullptr, nullptr, nullptr, &clock),
               "invalid EngineOptions: .*EngineOptions.prefill_chunk_tokens = 0");
}

}  // namespace
}  // namespace kvd
