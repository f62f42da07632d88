#include "kernels/cpu_sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"

namespace kvd {
namespace {

// Selection sorts only one bucket of candidates; below this size it sorts them all.
constexpr size_t kSortThreshold = 64;
// Buckets over the logit range: 0 holds +inf, kNumBuckets - 1 holds -inf.
constexpr int kNumBuckets = 2048;

template <typename T>
bool Before(const T& a, const T& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Maps a logit to a bucket so that Before(a, b) implies bucket(a) <= bucket(b): +inf to 0,
// finite logits by their distance below the largest finite one into [1, kNumBuckets - 2],
// -inf to kNumBuckets - 1. Buckets are how selection avoids sorting or partitioning
// (unpredictable branches) on a whole vocabulary.
class LogitBuckets {
 public:
  template <typename T>
  explicit LogitBuckets(absl::Span<const T> c) {
    // Locals and ternaries keep the loop in registers (std::max returns a reference).
    float max_finite = -INFINITY;
    float min_finite = INFINITY;
    for (const T& x : c) {
      const bool finite = std::isfinite(x.logit);
      max_finite = finite && x.logit > max_finite ? x.logit : max_finite;
      min_finite = finite && x.logit < min_finite ? x.logit : min_finite;
    }
    max_finite_ = max_finite;
    min_finite_ = min_finite;
    // In double: the distance between two finite floats can overflow a float (3e38 and
    // -3e38), and inf * 0 would be a NaN bucket.
    const double range = static_cast<double>(max_finite_) - min_finite_;
    scale_ = range > 0.0 ? (kNumBuckets - 3) / range : 0.0;
  }

  int operator()(float logit) const {
    if (logit > max_finite_) return 0;
    if (logit < min_finite_) return kNumBuckets - 1;
    const double distance = static_cast<double>(max_finite_) - logit;
    return 1 + std::min(kNumBuckets - 3, static_cast<int>(distance * scale_));
  }

 private:
  float max_finite_ = -INFINITY;
  float min_finite_ = INFINITY;
  double scale_ = 0.0;
};

// Rearranges c and returns the index r of the first element, in Before order, whose
// cumulative weight (itself included) reaches target: >= when inclusive, else >. On return
// c[0, r) are exactly the elements ordered before c[r]. If rounding means no element
// reaches target, r is the last element in order. scratch is working memory.
// Cost: two passes over c, then the same over the bucket holding the cut while it holds
// more than kSortThreshold elements of more than one logit (each round narrows the logit
// range at least 2045-fold, so a few rounds at most: one logit far from the rest, such as
// a -FLT_MAX mask, no longer leaves every other logit in one bucket to sort), then a sort
// of what is left (the whole of c when all logits are equal, which is then already in id
// order if c was).
// REQUIRES: !c.empty(); weight(x) > 0; target > 0 when inclusive, target >= 0 otherwise.
template <typename WeightFn>
size_t SelectByMass(std::vector<SampleCandidate>& c, SampleScratch& s, double target,
                    bool inclusive, WeightFn weight) {
  std::vector<SampleCandidate>& scratch = s.buffer;
  auto reached = [&](double mass) { return inclusive ? mass >= target : mass > target; };
  size_t begin = 0;
  size_t end = c.size();
  double mass_before = 0.0;  // weight of c[0, begin), all ordered before c[begin, end)
  while (end - begin > kSortThreshold) {
    const absl::Span<const SampleCandidate> range(c.data() + begin, end - begin);
    const LogitBuckets bucket_of(range);
    std::vector<double>& mass = s.bucket_mass;
    std::vector<size_t>& count = s.bucket_count;
    mass.assign(kNumBuckets, 0.0);
    count.assign(kNumBuckets, 0);
    for (const SampleCandidate& x : range) {
      const int b = bucket_of(x.logit);
      mass[b] += weight(x);
      ++count[b];
    }
    int chosen = -1;
    int last_nonempty = 0;
    for (int b = 0; b < kNumBuckets; ++b) {
      if (count[b] == 0) continue;
      last_nonempty = b;
      if (reached(mass_before + mass[b])) {
        chosen = b;
        break;
      }
      mass_before += mass[b];
    }
    if (chosen < 0) {  // rounding: walk the last bucket, which returns its last element
      chosen = last_nonempty;
      mass_before -= mass[chosen];
    }
    if (count[chosen] == range.size()) break;  // one logit (or one infinity) throughout
    size_t num_before = 0;
    for (int b = 0; b < chosen; ++b) num_before += count[b];
    // Stable scatter: buckets before `chosen`, then `chosen`, then the rest.
    size_t cursor[3] = {0, num_before, num_before + count[chosen]};
    scratch.resize(range.size());
    for (const SampleCandidate& x : range) {
      const int b = bucket_of(x.logit);
      scratch[cursor[(b >= chosen) + (b > chosen)]++] = x;
    }
    if (range.size() == c.size()) {
      c.swap(scratch);
    } else {
      std::copy(scratch.begin(), scratch.end(), c.begin() + begin);
    }
    end = begin + num_before + count[chosen];
    begin += num_before;
  }
  auto before = [](const SampleCandidate& a, const SampleCandidate& b) { return Before(a, b); };
  if (!std::is_sorted(c.begin() + begin, c.begin() + end, before)) {
    std::sort(c.begin() + begin, c.begin() + end, before);
  }
  for (size_t i = begin; i < end; ++i) {
    mass_before += weight(c[i]);
    if (reached(mass_before)) return i;
  }
  return end - 1;
}

int32_t Argmax(absl::Span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best < 0 ? 0 : best;
}

// Rows per parallel chunk: sampling a row is a few passes over the vocabulary, so one row
// per chunk already amortises the hand-off.
constexpr int64_t kRowsPerChunk = 1;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("Sample: ", what));
}

}  // namespace

absl::Status ValidateSamplingRow(const SamplingRow& row, absl::string_view field_prefix) {
  if (!(std::isfinite(row.temperature) && row.temperature >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%stemperature = %g is out of range; allowed: finite and >= 0 (0 = greedy)",
                        field_prefix, row.temperature));
  }
  if (row.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%stop_k = %d is out of range; allowed: >= 0 (0 = off)", field_prefix, row.top_k));
  }
  if (!(row.top_p > 0.0f && row.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%stop_p = %g is out of range; allowed: 0 < top_p <= 1 (1 = off)",
                        field_prefix, row.top_p));
  }
  if (!(row.min_p >= 0.0f && row.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%smin_p = %g is out of range; allowed: 0 <= min_p <= 1 (0 = off)",
                        field_prefix, row.min_p));
  }
  if (!(row.u >= 0.0f && row.u < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%su = %g is out of range; allowed: 0 <= u < 1", field_prefix, row.u));
  }
  return absl::OkStatus();
}

int32_t SampleRow(const SamplingRow& row, absl::Span<const float> logits, SampleScratch* scratch) {
  if (row.temperature == 0.0f) return Argmax(logits);

  std::vector<SampleCandidate>& c = scratch->candidates;
  // Branch-free fill: a NaN is written but not counted, so the next logit overwrites it.
  c.resize(logits.size());
  size_t num_candidates = 0;
  float max_logit = -INFINITY;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float logit = logits[i];
    c[num_candidates] = {logit, static_cast<int32_t>(i), 0.0f};
    num_candidates += !std::isnan(logit);
    max_logit = logit > max_logit ? logit : max_logit;  // NaN compares false: ignored
  }
  c.resize(num_candidates);
  if (c.empty()) return 0;  // all NaN: nothing to prefer

  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < c.size()) {
    const size_t last = SelectByMass(c, *scratch, row.top_k, /*inclusive=*/true,
                                     [](const SampleCandidate&) { return 1.0; });
    c.resize(last + 1);  // last == top_k - 1
  }

  // The maximum gets weight exactly 1 (also when it is infinite); others may underflow.
  const float inv_temperature = 1.0f / row.temperature;
  double total = 0.0;
  size_t num_kept = 0;
  for (const SampleCandidate& x : c) {
    const float w = x.logit == max_logit ? 1.0f : std::exp((x.logit - max_logit) * inv_temperature);
    if (!(w > 0.0f)) continue;
    c[num_kept++] = {x.logit, x.id, w};
    total += w;
  }
  c.resize(num_kept);  // never empty: the maximum has weight 1
  auto weight = [](const SampleCandidate& x) { return static_cast<double>(x.weight); };

  if (row.top_p < 1.0f) {
    const size_t last = SelectByMass(c, *scratch, static_cast<double>(row.top_p) * total,
                                     /*inclusive=*/true, weight);
    c.resize(last + 1);
    total = 0.0;
    for (const SampleCandidate& x : c) total += x.weight;
  }
  if (row.min_p > 0.0f) {
    // p < min_p * p_max  <=>  w < min_p, since the kept maximum has w == 1.
    const double min_weight = row.min_p;
    std::erase_if(c, [min_weight](const SampleCandidate& x) { return x.weight < min_weight; });
    total = 0.0;
    for (const SampleCandidate& x : c) total += x.weight;
  }
  return c[SelectByMass(c, *scratch, static_cast<double>(row.u) * total, /*inclusive=*/false,
                        weight)]
      .id;
}

absl::Status CpuSample(const SampleParams& p, ThreadPool& pool) {
  if (p.num_rows < 0) return Invalid(absl::StrCat("num_rows must be >= 0, got ", p.num_rows));
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.vocab_size <= 0) {
    return Invalid(absl::StrCat("vocab_size must be positive, got ", p.vocab_size));
  }
  if (p.row_stride < p.vocab_size) {
    return Invalid(
        absl::StrCat("row_stride ", p.row_stride, " is less than vocab_size ", p.vocab_size));
  }
  if (p.logits == nullptr) return Invalid("logits is null");
  if (p.rows == nullptr) return Invalid("rows is null");
  if (p.out_tokens == nullptr) return Invalid("out_tokens is null");
  for (int32_t r = 0; r < p.num_rows; ++r) {
    KVD_RETURN_IF_ERROR(ValidateSamplingRow(p.rows[r], absl::StrCat("Sample: rows[", r, "].")));
  }
  pool.ParallelFor(p.num_rows, kRowsPerChunk, [&p](int64_t begin, int64_t end) {
    // One a thread, kept from call to call: a fresh one for every row reallocated (and glibc
    // returned to the system and faulted in again) about 3 MB a row at a 128k vocabulary.
    thread_local SampleScratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      const absl::Span<const float> logits(p.logits + r * p.row_stride,
                                           static_cast<size_t>(p.vocab_size));
      p.out_tokens[r] = SampleRow(p.rows[r], logits, &scratch);
    }
  });
  return absl::OkStatus();
}

}  // namespace kvd
