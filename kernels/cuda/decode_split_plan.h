#ifndef KVD_KERNELS_CUDA_DECODE_SPLIT_PLAN_H_
#define KVD_KERNELS_CUDA_DECODE_SPLIT_PLAN_H_

// How the decode kernels cut one sequence's context into splits (decode_attention.h), as
// every CTA of the sequence computes it on the device; host code (the tests) computes the
// same. No CUDA headers.

#if defined(__CUDACC__)
#define KVD_SPLIT_PLAN_FN __host__ __device__ __forceinline__
#else
#define KVD_SPLIT_PLAN_FN inline
#endif

namespace kvd::cuda::decode {

// Splits the merge reads per L2 round trip (MergeGroup).
inline constexpr int kMergeBatch = 16;
// Keys the splits of a context cut into more than kMergeBatch of them hold on average, at
// least: more splits cost the merge another round trip, worth it only for long splits. On an H200
// (gpu_bench sweep, back to back in a graph) 1 x 4k read 0.389 of copy in 16 splits of 256
// keys and 0.353 in 32 of 128; 1 x 32k 0.71 in 32 splits of 1024 and 0.65 in 16 of 2048.
inline constexpr int kManySplitKeys = 512;

// Contexts PlanSplits takes are shorter than this, so that no split's end passes INT_MAX.
inline constexpr int kMaxPlannedKeys = 1 << 30;

// A context's cut: num_splits ranges in order, the first main_splits of main_len keys, then
// tail splits of tail_len keys (DecodeWorkspace::tail_splits); the last one ends at the
// context's end, possibly short. Lengths are whole granules.
struct SplitPlan {
  int num_splits;
  int main_splits;
  int main_len;
  int tail_len;
  // First key of split `split` (< num_splits).
  KVD_SPLIT_PLAN_FN int Begin(int split) const {
    return split < main_splits ? split * main_len
                               : main_splits * main_len + (split - main_splits) * tail_len;
  }
  // Keys of split `split` before the context's end cuts the last one.
  KVD_SPLIT_PLAN_FN int Len(int split) const { return split < main_splits ? main_len : tail_len; }
};

// ceil(a / b) for a >= 0, b >= 1, in one division and without the overflow of
// (a + b - 1) / b near INT_MAX.
KVD_SPLIT_PLAN_FN int SplitCeilDiv(int a, int b) { return a == 0 ? 0 : (a - 1) / b + 1; }
KVD_SPLIT_PLAN_FN int SplitMax(int a, int b) { return a > b ? a : b; }
KVD_SPLIT_PLAN_FN int SplitMin(int a, int b) { return a < b ? a : b; }

// The main splits PlanSplits aims for (below), from which it cuts the context: the cap on
// main splits, or as many as the context has runs of min_granules granules, whichever is
// fewer. The plan may make fewer (splits of whole granules cover the context sooner). Never
// fewer for a longer context: both bounds grow with kv_len.
// REQUIRES: as PlanSplits.
KVD_SPLIT_PLAN_FN int WantedMainSplits(int kv_len, int max_splits, int granule, int min_granules,
                                       int tail_splits = 0) {
  const int main_max = SplitMax(1, max_splits - SplitMax(0, tail_splits));
  const int cap = SplitMin(main_max, SplitMax(kMergeBatch, kv_len / kManySplitKeys));
  return SplitMax(1, SplitMin(cap, SplitCeilDiv(kv_len, SplitMax(1, min_granules) * granule)));
}

// The cut of a context of kv_len keys into at most max_splits splits, shared by every CTA of
// a sequence so that all see the same: splits start at multiples of `granule` keys
// (DecodeShape::kSplitGranule, one iteration of every warp of a CTA) and hold at least
// `min_granules` granules unless the context is shorter; more than kMergeBatch main splits
// only where they average kManySplitKeys keys or more. With tail_splits > 0, and main splits
// that would average tail_min_keys keys or more, up to max_splits - tail_splits main splits
// are followed by up to tail_splits tails of ceil(main / tail_divisor) granules, the mains
// the shortest that leave the tails enough.
// REQUIRES: 0 <= kv_len < kMaxPlannedKeys, max_splits >= 1, granule >= 1, tail_divisor >= 1.
KVD_SPLIT_PLAN_FN SplitPlan PlanSplits(int kv_len, int max_splits, int granule, int min_granules,
                                       int tail_splits = 0, int tail_divisor = 1,
                                       int tail_min_keys = 0) {
  const int min_g = SplitMax(1, min_granules);
  const int wanted = WantedMainSplits(kv_len, max_splits, granule, min_granules, tail_splits);
  if (tail_splits <= 0 || SplitCeilDiv(kv_len, wanted) < tail_min_keys) {
    const int len = SplitMax(1, SplitCeilDiv(SplitCeilDiv(kv_len, wanted), granule)) * granule;
    const int n = SplitMax(1, SplitCeilDiv(kv_len, len));
    return {n, n, len, len};
  }
  // m granules a main split: the least with wanted * m + tail_splits * m / divisor >= the
  // context's granules (so that ceil(m / divisor)-granule tails cover the rest).
  const int granules = SplitCeilDiv(kv_len, granule);
  const long long parts = static_cast<long long>(wanted) * tail_divisor + tail_splits;
  const int main_g = SplitMax(
      min_g,
      static_cast<int>((static_cast<long long>(granules) * tail_divisor + parts - 1) / parts));
  const int tail_g = SplitCeilDiv(main_g, tail_divisor);
  if (wanted * main_g >= granules) {  // the mains cover it (min_granules, or a short context)
    const int n = SplitMax(1, SplitCeilDiv(granules, main_g));
    return {n, n, main_g * granule, tail_g * granule};
  }
  const int tails = SplitCeilDiv(granules - wanted * main_g, tail_g);
  return {wanted + tails, wanted, main_g * granule, tail_g * granule};
}

// Split slices to launch for contexts of at most max_kv_len keys: `slices` in all, the last
// `tail_slices` of them for tails.
struct PromisedSlices {
  int slices;
  int tail_slices;
};

// The slices of a grid of main_splits main and tail_splits tail slices (PlanSplits' max_splits
// = main_splits + tail_splits) that contexts of at most max_kv_len keys use, cut with these
// parameters: all of them where the longest context's cut goes into the tail branch (it ends in
// tails, or could); otherwise that context's wanted main splits (WantedMainSplits, not its cut's
// count, which can be fewer than a shorter context's) and no tail slice. Every context as long
// or shorter wants as many main splits or fewer, so PlanSplits cuts it over these slices as over
// the full grid, provided it does not go into the tail branch where the longest does not: a
// context does so only where its main splits average tail_min_keys keys or more, which below the
// cap on main splits (WantedMainSplits) they never do while tail_min_keys exceeds both 1024 and
// min_granules granules, and at the cap they grow with the context. (The decode kernels' are
// 8192 keys and granules of 32 or 64 keys; tests check this by brute force up to granules of
// 128.) A longer context, breaking the promise, is cut into at most as many splits.
// REQUIRES: 0 < max_kv_len < kMaxPlannedKeys, main_splits >= 1, tail_splits >= 0, granule >= 1.
KVD_SPLIT_PLAN_FN PromisedSlices SlicesForContexts(int max_kv_len, int main_splits, int tail_splits,
                                                   int granule, int min_granules,
                                                   int tail_min_keys) {
  const int max_splits = main_splits + tail_splits;
  const int wanted = WantedMainSplits(max_kv_len, max_splits, granule, min_granules, tail_splits);
  if (tail_splits > 0 && SplitCeilDiv(max_kv_len, wanted) >= tail_min_keys) {
    return {max_splits, tail_splits};
  }
  return {wanted, 0};
}

}  // namespace kvd::cuda::decode

#undef KVD_SPLIT_PLAN_FN

#endif  // KVD_KERNELS_CUDA_DECODE_SPLIT_PLAN_H_
