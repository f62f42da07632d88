#include "config/quantity.h"

#include <cstddef>
#include <limits>

#include "absl/status/status.h"

namespace kvd {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the run of characters at the start of `s` that satisfy `pred`.
template <typename Pred>
size_t RunLength(std::string_view s, Pred pred) {
  size_t n = 0;
  while (n < s.size() && pred(s[n])) ++n;
  return n;
}

}  // namespace

absl::StatusOr<Quantity> SplitQuantity(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return absl::InvalidArgumentError("empty value");
  if (s.front() == '-') return absl::InvalidArgumentError("must not be negative");
  if (s.front() == '+') return absl::InvalidArgumentError("write the number without a sign");
  Quantity q;
  size_t n = RunLength(s, IsDigit);
  q.whole = s.substr(0, n);
  s.remove_prefix(n);
  if (!s.empty() && s.front() == '.') {
    s.remove_prefix(1);
    n = RunLength(s, IsDigit);
    q.fraction = s.substr(0, n);
    s.remove_prefix(n);
  }
  if (q.whole.empty() && q.fraction.empty()) {
    return absl::InvalidArgumentError("expected a number");
  }
  s.remove_prefix(RunLength(s, IsSpace));
  n = RunLength(s, IsLetter);
  q.unit = s.substr(0, n);
  if (n != s.size()) return absl::InvalidArgumentError("unexpected characters after the number");
  return q;
}

std::optional<int64_t> ScaleQuantity(const Quantity& q, int64_t multiplier, bool* exact) {
  using u128 = unsigned __int128;
  constexpr u128 kMax = static_cast<u128>(std::numeric_limits<int64_t>::max());
  *exact = true;
  u128 whole = 0;
  for (char c : q.whole) {
    whole = whole * 10 + static_cast<u128>(c - '0');
    if (whole > kMax) return std::nullopt;
  }
  u128 total = whole * static_cast<u128>(multiplier);
  if (total > kMax) return std::nullopt;
  // 0.d1d2...dn * multiplier by long multiplication from the last digit: each step's low
  // decimal digit is a digit of the product's fraction (all 0 when exact) and the carry, at
  // most 9 * multiplier, stays below 2^128; the last carry is the whole part. Exact for any
  // number of digits.
  u128 carry = 0;
  for (size_t i = q.fraction.size(); i-- > 0;) {
    const u128 t = static_cast<u128>(q.fraction[i] - '0') * static_cast<u128>(multiplier) + carry;
    if (t % 10 != 0) *exact = false;
    carry = t / 10;
  }
  total += carry;
  if (total > kMax) return std::nullopt;
  return static_cast<int64_t>(total);
}

}  // namespace kvd
