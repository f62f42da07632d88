// How the decode kernels cut a context into splits (decode_split_plan.h): host-only, nothing
// is launched (ctest runs it as gpu.decode_split_policy_test).

#include "kernels/cuda/decode_split_plan.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvd::gpu_test {
namespace {

using cuda::decode::PlanSplits;
using cuda::decode::SplitPlan;

// Every key of [0, kv_len) in exactly one split, in order, each split non-empty and starting
// on a granule; the mains first, as long as any tail; no more splits than slices, the tails
// within theirs.
void ExpectValidCut(const SplitPlan& plan, int kv_len, int max_splits, int granule,
                    int tail_splits) {
  ASSERT_GE(plan.num_splits, 1);
  ASSERT_LE(plan.num_splits, max_splits);
  ASSERT_GE(plan.main_splits, 1);
  ASSERT_LE(plan.main_splits, plan.num_splits);
  EXPECT_LE(plan.num_splits - plan.main_splits, tail_splits);
  if (plan.num_splits > plan.main_splits) {
    EXPECT_LE(plan.main_splits, max_splits - tail_splits);
  }
  EXPECT_EQ(plan.main_len % granule, 0);
  EXPECT_EQ(plan.tail_len % granule, 0);
  EXPECT_GE(plan.main_len, granule);
  EXPECT_GE(plan.tail_len, granule);
  EXPECT_LE(plan.tail_len, plan.main_len);
  int next = 0;
  for (int i = 0; i < plan.num_splits; ++i) {
    EXPECT_EQ(plan.Begin(i), next) << "split " << i;
    EXPECT_EQ(plan.Begin(i) % granule, 0) << "split " << i;
    if (kv_len > 0) {
      EXPECT_LT(plan.Begin(i), kv_len) << "split " << i << " is empty";
    }
    EXPECT_EQ(plan.Len(i), i < plan.main_splits ? plan.main_len : plan.tail_len);
    next = plan.Begin(i) + plan.Len(i);
  }
  EXPECT_GE(next, kv_len) << "keys past the last split";
}

TEST(DecodeSplitPlanTest, EveryCutCoversTheContextOnceInGranules) {
  for (const int kv_len :
       {0, 1, 63, 64, 65, 300, 1029, 4100, 8191, 8192, 16385, 65537, 131072, 200003}) {
    for (const int granule : {32, 64, 128}) {
      for (const int max_splits : {1, 2, 3, 8, 16, 33, 64, 128}) {
        for (const int min_granules : {1, 4}) {
          for (const int tail_splits : {0, 1, max_splits / 2, max_splits - 1}) {
            if (tail_splits >= max_splits) continue;
            for (const int divisor : {1, 2, 8}) {
              for (const int tail_min_keys : {0, 8192}) {
                SCOPED_TRACE(testing::Message()
                             << "kv_len " << kv_len << " granule " << granule << " max_splits "
                             << max_splits << " min_granules " << min_granules << " tails "
                             << tail_splits << "/" << divisor << " min keys " << tail_min_keys);
                const SplitPlan plan = PlanSplits(kv_len, max_splits, granule, min_granules,
                                                  tail_splits, divisor, tail_min_keys);
                ExpectValidCut(plan, kv_len, max_splits, granule, tail_splits);
                if (HasFatalFailure() || HasFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

TEST(DecodeSplitPlanTest, WithoutTailsEqualSplitsOfWholeGranules) {
  // 8 x 4k at head_dim 128 (64-key granules): four splits of 1024 keys.
  SplitPlan plan = PlanSplits(4096, 4, 64, 1);
  EXPECT_EQ(plan.num_splits, 4);
  EXPECT_EQ(plan.main_splits, 4);
  EXPECT_EQ(plan.main_len, 1024);
  // Batch 1 x 4k: capped at one merge batch of 16 splits of 256 keys.
  plan = PlanSplits(4096, 32, 64, 1);
  EXPECT_EQ(plan.num_splits, 16);
  EXPECT_EQ(plan.main_len, 256);
  // 1029 keys in 3 slices: 6 granules a split, the last one short.
  plan = PlanSplits(1029, 3, 64, 1);
  EXPECT_EQ(plan.num_splits, 3);
  EXPECT_EQ(plan.main_len, 384);
}

TEST(DecodeSplitPlanTest, LongContextsEndInTailsAnEighthAsLong) {
  // 4 x 128k as the backend launches it: 8 main and 8 tail slices.
  const SplitPlan plan = PlanSplits(131072, 16, 64, 1, 8, 8, 8192);
  EXPECT_EQ(plan.main_splits, 8);
  EXPECT_EQ(plan.num_splits, 16);
  EXPECT_EQ(plan.main_len, 228 * 64);  // the least m with 8 m + 8 m / 8 >= 2048 granules
  EXPECT_EQ(plan.tail_len, 29 * 64);   // ceil(228 / 8)
  ExpectValidCut(plan, 131072, 16, 64, 8);
}

TEST(DecodeSplitPlanTest, ShortMainSplitsLeaveTheTailSlicesIdle) {
  // 8 x 4k: four mains of 1024 keys, below the 8192 a tail needs; the same cut as without.
  const SplitPlan plan = PlanSplits(4096, 8, 64, 1, 4, 8, 8192);
  EXPECT_EQ(plan.num_splits, 4);
  EXPECT_EQ(plan.main_splits, 4);
  EXPECT_EQ(plan.main_len, 1024);
  // The same context with no minimum ends in tails.
  const SplitPlan tailed = PlanSplits(4096, 8, 64, 1, 4, 8, 0);
  EXPECT_EQ(tailed.main_splits, 4);
  EXPECT_GT(tailed.num_splits, 4);
}

TEST(DecodeSplitPlanTest, LargeDivisorsAndContextsDoNotOverflow) {
  // 2^30 keys in 64-key granules times a divisor of 2^20 overflows 32 bits.
  const int kv_len = 1 << 30;
  const SplitPlan plan = PlanSplits(kv_len, 16, 64, 1, 8, 1 << 20, 0);
  EXPECT_EQ(plan.main_splits, 8);
  ExpectValidCut(plan, kv_len, 16, 64, 8);
}

TEST(DecodeSplitPlanTest, DivisorsNearIntMaxGiveOneGranuleTails) {
  // ceil(main / divisor) once overflowed to a tail of 0 or fewer keys.
  for (const int kv_len : {300, 4100, 65537, 1 << 29}) {
    SCOPED_TRACE(kv_len);
    const SplitPlan plan = PlanSplits(kv_len, 16, 64, 1, 8, 0x7fffffff, 0);
    EXPECT_EQ(plan.tail_len, 64);
    ExpectValidCut(plan, kv_len, 16, 64, 8);
  }
}

TEST(DecodeSplitPlanTest, ContextsTheMainsCoverTakeNoTail) {
  // 300 keys, 5 granules, over 2 mains with 2 tails: mains of 3 granules cover them.
  const SplitPlan plan = PlanSplits(300, 4, 64, 1, 2, 8, 0);
  EXPECT_EQ(plan.num_splits, plan.main_splits);
  ExpectValidCut(plan, 300, 4, 64, 2);
}

}  // namespace
}  // namespace kvd::gpu_test
