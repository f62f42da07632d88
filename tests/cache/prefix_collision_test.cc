// Prefix keys are 64-bit hashes, so two different prefixes can share a key. These tests
// pin down what the cache guarantees about that: a client cannot craft such a pair, and a
// pair found at registration never chains a sequence's deeper blocks under another prefix.

#include <memory>
#include <vector>

#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "cache/kv_layout.h"
#include "cache/prefix_index.h"
#include "gtest/gtest.h"
#include "tests/cache/cache_manager_fixture.h"
#include "tests/cache/fake_backend.h"
#include "tests/cache/kv_test_util.h"

namespace kvd {
namespace {

using testing_util::CountBadKv;
using testing_util::Iota;
using testing_util::Step;
using testing_util::TinyOptions;
using testing_util::TinyShape;

// Two 4-token blocks whose keys under the root were equal when keys were unkeyed (extra
// key = the layout fingerprint of TinyShape/TinyOptions, no secret): an attacker's forged
// block and the first block of a popular prompt. Found in 13 s on 16
// cores by a parallel rho search with distinguished points over 64 bits of token choice:
// a collision needs no inversion of the hash, only ~2^32 evaluations, at any block size.
const std::vector<int32_t> kPopular = {1454600766, 864757177, 0, 0};
const std::vector<int32_t> kForged = {522663696, 728317438, 2, 0};

uint64_t TinyFingerprint() {
  return KvLayout::Create(TinyShape(), TinyOptions().kv_dtype, TinyOptions().block_size)
      ->Fingerprint();
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

using PrefixCollisionTest = testing_util::CacheManagerTest;

using KeyClaim = PrefixIndex::KeyClaim;

TEST(PrefixKeySecretTest, TheSecretChangesEveryKeyAndIsFreshPerDraw) {
  const std::vector<int32_t> block = {1, 2, 3, 4};
  PrefixIndex a(4, /*extra_key=*/7, /*secret=*/1), b(4, 7, 2), a_again(4, 7, 1);
  EXPECT_NE(a.root_key(), b.root_key());
  // Every step is keyed, not only the root: one parent key and block, two keys.
  EXPECT_NE(a.ChildKey(a.root_key(), block), b.ChildKey(a.root_key(), block));
  EXPECT_EQ(a.ChildKey(a.root_key(), block), a_again.ChildKey(a_again.root_key(), block));
  EXPECT_NE(PrefixIndex::RandomSecret(), PrefixIndex::RandomSecret());  // fails w.p. 2^-64
}

TEST(PrefixKeySecretTest, ACollisionCraftedAgainstUnkeyedKeysMissesUnderASecret) {
  // Secret 0 gives the keys the cache used before it had a secret. If this fails, the hash
  // or the layout fingerprint changed: search a new pair, or the tests below prove nothing.
  PrefixIndex unkeyed(4, TinyFingerprint(), /*secret=*/0);
  ASSERT_NE(kPopular, kForged);
  ASSERT_EQ(unkeyed.ChildKey(unkeyed.root_key(), kPopular),
            unkeyed.ChildKey(unkeyed.root_key(), kForged));
  PrefixIndex keyed(4, TinyFingerprint(), PrefixIndex::RandomSecret());
  EXPECT_NE(keyed.ChildKey(keyed.root_key(), kPopular), keyed.ChildKey(keyed.root_key(), kForged));
}

TEST(PrefixKeySecretTest, ClaimVouchesForAKeyOnlyWhenItsHolderHasTheSamePrefix) {
  PrefixIndex index(4, TinyFingerprint(), /*secret=*/0);  // where kForged collides
  const uint64_t root = index.root_key();
  const uint64_t key = index.ChildKey(root, kPopular);
  EXPECT_EQ(index.Claim(1, key, root, kPopular), KeyClaim::kInserted);
  EXPECT_EQ(index.Claim(1, key, root, kPopular), KeyClaim::kHeld);
  EXPECT_EQ(index.Claim(2, key, root, kPopular), KeyClaim::kDuplicate);
  EXPECT_EQ(index.Claim(3, index.ChildKey(root, kForged), root, kForged), KeyClaim::kCollision);
  // A block keyed for one prefix vouches for no other.
  const std::vector<int32_t> other = {1, 2, 3, 4};
  EXPECT_EQ(index.Claim(1, index.ChildKey(root, other), root, other), KeyClaim::kCollision);
  // Only the first claim changed the index.
  EXPECT_EQ(index.size(), 1);
  EXPECT_FALSE(index.HasKey(2));
  EXPECT_FALSE(index.HasKey(3));
  EXPECT_EQ(index.Find(key, root, kPopular), 1);
  EXPECT_TRUE(index.CheckInvariants().ok());
}

// A cache made without prefix_key_secret, as the daemon makes it, draws its own: the pair
// crafted against unkeyed keys does not collide there, so the forged prompt is cached as any
// other. Under unkeyed keys its first block's key is the popular block's, and it would not be.
TEST_F(PrefixCollisionTest, ACacheDrawsASecretWhenGivenNone) {
  KvCacheOptions o = TinyOptions();
  ASSERT_FALSE(o.prefix_key_secret.has_value());
  auto m = Make(o);
  const std::vector<int32_t> forged_prompt = Concat(Concat(kForged, {5, 6, 7, 8}), {9});
  ASSERT_EQ(*m->AddSequence(1, Concat(kPopular, {9})), 0);
  ASSERT_TRUE(Step(*m, 1, 5));
  ASSERT_EQ(*m->AddSequence(2, forged_prompt), 0);
  ASSERT_TRUE(Step(*m, 2, 9));
  m->Free(2);
  EXPECT_EQ(m->ProbePrefix(forged_prompt), 8);
  ExpectValid(*m);
}

TEST_F(PrefixCollisionTest, ACraftedCollisionNeverHandsOutKvOfAnotherPrefix) {
  // Unkeyed keys, as a client who knew the secret would see them: the pair collides, and
  // only the registration rule (RegisterFullBlocks, PrefixIndex::Claim) stands between the
  // attacker's blocks and the victim's prefix.
  KvCacheOptions o = TinyOptions();
  o.prefix_key_secret = 0;
  auto m = Make(o);
  const std::vector<int32_t> tail = {5, 6, 7, 8};
  // A victim caches the popular first block.
  ASSERT_EQ(*m->AddSequence(1, Concat(kPopular, {9})), 0);
  ASSERT_TRUE(Step(*m, 1, 5));
  // The attacker's forged block shares its key; the attacker's second block, whose K/V was
  // computed after the forged one, would be keyed as a child of the popular block.
  ASSERT_EQ(*m->AddSequence(2, Concat(Concat(kForged, tail), {9})), 0);
  ASSERT_TRUE(Step(*m, 2, 9));
  ExpectValid(*m);
  // A later prompt with the popular prefix reuses the popular block and nothing of the
  // attacker's.
  ASSERT_EQ(*m->AddSequence(3, Concat(Concat(kPopular, tail), {9})), 4);
  EXPECT_EQ(m->BlockIds(3)[0], m->BlockIds(1)[0]);
  EXPECT_EQ(CountBadKv(*m, 3), 0);
  ExpectValid(*m);
}

TEST_F(PrefixCollisionTest, ASessionTurnNeverContinuesIntoAnotherPrefixsBlocks) {
  // A session's blocks are matched by their tokens, not looked up; the index must not be
  // searched on from their keys when the index gives those keys to another prefix.
  KvCacheOptions o = TinyOptions();
  o.prefix_key_secret = 0;
  auto m = Make(o);
  const std::vector<int32_t> tail = {5, 6, 7, 8};
  const std::vector<int32_t> tail2 = {10, 11, 12, 13};
  // The attacker's three blocks are cached, keyed from the forged block's key.
  ASSERT_EQ(*m->AddSequence(1, Concat(Concat(Concat(kForged, tail), tail2), {9})), 0);
  ASSERT_TRUE(Step(*m, 1, 13));
  m->Free(1);
  // The victim's first turn misses (the forged block's tokens differ) and its registration
  // stops at the collision; the session pins its two blocks.
  ASSERT_EQ(*m->AddSequence(2, Concat(Concat(kPopular, tail), {1}), "chat"), 0);
  ASSERT_TRUE(Step(*m, 2, 9));
  m->Free(2);
  ExpectValid(*m);
  // The next turn reuses its session's two blocks, and not the attacker's third block, whose
  // key and parent key its own tokens reproduce.
  EXPECT_EQ(m->ProbePrefix(Concat(Concat(Concat(kPopular, tail), tail2), {9}), "chat"), 8);
  ASSERT_EQ(*m->AddSequence(3, Concat(Concat(Concat(kPopular, tail), tail2), {9}), "chat"), 8);
  EXPECT_EQ(CountBadKv(*m, 3), 0);
  ExpectValid(*m);
}

TEST_F(PrefixCollisionTest, ASecondCopyOfAPrefixStillRegistersItsDeeperBlocks) {
  auto m = Make();
  const std::vector<int32_t> prompt = Iota(13);
  // Both sequences start before either has computed anything, so both compute block 0.
  ASSERT_EQ(*m->AddSequence(1, prompt), 0);
  ASSERT_EQ(*m->AddSequence(2, prompt), 0);
  ASSERT_TRUE(Step(*m, 1, 4));
  // Sequence 2's block 0 is a duplicate of sequence 1's (its key is taken by identical
  // tokens under the same parent), which vouches for it: blocks 1 and 2 register.
  ASSERT_TRUE(Step(*m, 2, 13));
  ASSERT_TRUE(Step(*m, 1, 9));
  ExpectValid(*m);
  ASSERT_EQ(*m->AddSequence(3, prompt), 12);
  EXPECT_EQ(m->BlockIds(3)[0], m->BlockIds(1)[0]);
  EXPECT_EQ(m->BlockIds(3)[1], m->BlockIds(2)[1]);
  EXPECT_EQ(m->BlockIds(3)[2], m->BlockIds(2)[2]);
  EXPECT_EQ(CountBadKv(*m, 3), 0);
  ExpectValid(*m);
}

}  // namespace
}  // namespace kvd
