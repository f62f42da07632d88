#include "cache/prefix_index.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvd {
namespace {

TEST(PrefixIndexTest, KeysChainSoEqualBlocksUnderDifferentParentsDiffer) {
  PrefixIndex index(4, /*extra_key=*/7, /*secret=*/0);
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  const uint64_t ka = index.ChildKey(index.root_key(), a);
  const uint64_t kb = index.ChildKey(index.root_key(), b);
  EXPECT_NE(index.ChildKey(ka, b), index.ChildKey(kb, b));
  EXPECT_NE(index.ChildKey(ka, b), kb);
  EXPECT_EQ(index.ChildKey(ka, b), index.ChildKey(ka, b));
  PrefixIndex other_model(4, /*extra_key=*/8, /*secret=*/0);
  EXPECT_NE(other_model.ChildKey(other_model.root_key(), a), ka);
}

TEST(PrefixIndexTest, FindVerifiesParentAndTokens) {
  PrefixIndex index(4, 0, 0);
  const std::vector<int32_t> a = {1, 2, 3, 4};
  const uint64_t k = index.ChildKey(index.root_key(), a);
  ASSERT_TRUE(index.Insert(9, k, index.root_key(), a));
  EXPECT_EQ(index.Find(k, index.root_key(), a), 9);
  // A forged collision: same key, other tokens or other parent, is not a hit.
  EXPECT_FALSE(index.Find(k, index.root_key(), std::vector<int32_t>{1, 2, 3, 5}).has_value());
  EXPECT_FALSE(index.Find(k, 12345, a).has_value());
  EXPECT_TRUE(index.CheckInvariants().ok());
}

TEST(PrefixIndexTest, KeysAreWriteOnce) {
  PrefixIndex index(4, 0, 0);
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {4, 3, 2, 1};
  const uint64_t ka = index.ChildKey(index.root_key(), a);
  const uint64_t kb = index.ChildKey(index.root_key(), b);
  ASSERT_TRUE(index.Insert(1, ka, index.root_key(), a));
  EXPECT_FALSE(index.Insert(2, ka, index.root_key(), a));  // key taken by block 1
  EXPECT_FALSE(index.Insert(1, kb, index.root_key(), b));  // block 1 already keyed
  EXPECT_EQ(index.Find(ka, index.root_key(), a), 1);
  EXPECT_FALSE(index.HasKey(2));
  EXPECT_EQ(index.size(), 1);
}

TEST(PrefixIndexTest, RemoveAndRebindFollowTheBlock) {
  PrefixIndex index(2, 0, 0);
  const std::vector<int32_t> a = {1, 2};
  const uint64_t k = index.ChildKey(index.root_key(), a);
  ASSERT_TRUE(index.Insert(100, k, index.root_key(), a));
  index.Rebind(100, 3);
  EXPECT_FALSE(index.HasKey(100));
  EXPECT_EQ(index.Find(k, index.root_key(), a), 3);
  EXPECT_TRUE(index.CheckInvariants().ok());
  index.Remove(3);
  EXPECT_FALSE(index.Find(k, index.root_key(), a).has_value());
  EXPECT_EQ(index.size(), 0);
  ASSERT_TRUE(index.Insert(5, k, index.root_key(), a));  // the key is free again
}

}  // namespace
}  // namespace kvd
