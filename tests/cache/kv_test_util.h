#ifndef KVD_TESTS_CACHE_KV_TEST_UTIL_H_
#define KVD_TESTS_CACHE_KV_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "cache/kv_arena.h"
#include "cache/kv_cache_manager.h"
#include "cache/kv_cache_options.h"

namespace kvd {
namespace testing_util {

// 2 layers x 1 KV head x head_dim 4, f32: one block of one region is block_size * 16
// bytes; with block_size 4 a block is 256 bytes and a 1 KiB chunk holds 4 blocks.
inline KvShape TinyShape() { return KvShape{2, 1, 4}; }

inline KvCacheOptions TinyOptions(int32_t initial_chunks = 1, int32_t max_chunks = 4) {
  KvCacheOptions o;
  o.block_size = 4;
  o.kv_dtype = DType::kF32;
  o.chunk_bytes = 1024;
  o.initial_pool_bytes = 1024 * initial_chunks;
  o.max_pool_bytes = 1024 * max_chunks;
  o.defrag_background_planning = false;
  return o;
}

// What the "model" writes at a position: a digest of the tokens up to and including it.
// Positions whose prefixes match hold equal bytes, so sharing is observable.
inline uint64_t PrefixDigest(absl::Span<const int32_t> tokens, int32_t position, int32_t region) {
  uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(region);
  for (int32_t i = 0; i <= position; ++i) {
    h = (h ^ static_cast<uint32_t>(tokens[i])) * 0x100000001b3ULL;
  }
  return h;
}

inline uint64_t* SlotWord(const KvArena& arena, int64_t slot, int32_t region) {
  const int32_t bs = arena.layout().block_size();
  const BlockId block = static_cast<BlockId>(slot / bs);
  char* base = static_cast<char*>(arena.BlockAddress(block, region));
  // One KV head: the slot's head_dim values start at offset * head_dim elements.
  const int64_t elem = DTypeBits(arena.layout().dtype()) / 8;
  return reinterpret_cast<uint64_t*>(base + (slot % bs) * arena.layout().shape().head_dim * elem);
}

// Writes the digests of positions [from, to) of sequence `id` into its slots.
inline void WriteKv(const KvCacheManager& m, SeqId id, int32_t from, int32_t to) {
  const KvArena& arena = *m.arena();
  const absl::Span<const int32_t> tokens = m.Tokens(id);
  for (int32_t p = from; p < to; ++p) {
    for (int32_t r = 0; r < arena.layout().num_regions(); ++r) {
      *SlotWord(arena, m.SlotOf(id, p), r) = PrefixDigest(tokens, p, r);
    }
  }
}

// Number of computed positions of `id` whose bytes differ from their digest.
inline int32_t CountBadKv(const KvCacheManager& m, SeqId id) {
  const KvArena& arena = *m.arena();
  const absl::Span<const int32_t> tokens = m.Tokens(id);
  int32_t bad = 0;
  for (int32_t p = 0; p < m.NumComputed(id); ++p) {
    for (int32_t r = 0; r < arena.layout().num_regions(); ++r) {
      if (*SlotWord(arena, m.SlotOf(id, p), r) != PrefixDigest(tokens, p, r)) ++bad;
    }
  }
  return bad;
}

// Reserve + write + MarkComputed for the next n positions, as an engine step would.
inline bool Step(KvCacheManager& m, SeqId id, int32_t n) {
  if (!m.Reserve(id, n)) return false;
  const int32_t from = m.NumComputed(id);
  WriteKv(m, id, from, from + n);
  m.MarkComputed(id, n);
  return true;
}

inline std::vector<int32_t> Iota(int32_t n, int32_t start = 100) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

}  // namespace testing_util
}  // namespace kvd

#endif  // KVD_TESTS_CACHE_KV_TEST_UTIL_H_
