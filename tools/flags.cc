#include "tools/flags.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kvd {

namespace {

// True when `text` is a decimal integer as absl::SimpleAtoi reads it (surrounding whitespace,
// an optional sign, digits) of any size: SimpleAtoi failing on such text means out of range.
bool IsDecimalInteger(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) text.remove_prefix(1);
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return absl::ascii_isdigit(c); });
}

constexpr IntRange kAllInt64 = {std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max()};

}  // namespace

void FlagSet::AddString(std::string name, std::string help, std::optional<std::string> def) {
  order_.push_back(name);
  flags_[name] = {Kind::kString, std::move(help), std::move(def), std::nullopt};
}

void FlagSet::AddInt(std::string name, std::string help, std::optional<int64_t> def,
                     std::optional<IntRange> range) {
  order_.push_back(name);
  flags_[name] = {Kind::kInt, std::move(help),
                  def ? std::optional<std::string>(absl::StrCat(*def)) : std::nullopt, range};
}

void FlagSet::AddUint64(std::string name, std::string help, std::optional<uint64_t> def) {
  order_.push_back(name);
  flags_[name] = {Kind::kUint64, std::move(help),
                  def ? std::optional<std::string>(absl::StrCat(*def)) : std::nullopt,
                  std::nullopt};
}

void FlagSet::AddFloat(std::string name, std::string help, std::optional<double> def) {
  order_.push_back(name);
  flags_[name] = {Kind::kFloat, std::move(help),
                  def ? std::optional<std::string>(absl::StrCat(*def)) : std::nullopt,
                  std::nullopt};
}

void FlagSet::AddFloat32(std::string name, std::string help, std::optional<double> def) {
  AddFloat(name, std::move(help), def);
  flags_[name].kind = Kind::kFloat32;
}

void FlagSet::AddBool(std::string name, std::string help) {
  order_.push_back(name);
  flags_[name] = {Kind::kBool, std::move(help), std::nullopt, std::nullopt};
}

void FlagSet::AddStringList(std::string name, std::string help) {
  order_.push_back(name);
  flags_[name] = {Kind::kStringList, std::move(help), std::nullopt, std::nullopt};
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    const Flag& flag = it->second;
    if (flag.kind == Kind::kBool) {
      if (value && *value != "true") {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " takes no value, got '", *value, "'"));
      }
      values_[name] = "true";
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      // `--prompt --json` is a forgotten value far more often than a prompt of "--json".
      if (args[i + 1].rfind("--", 0) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value; to pass one starting with --, write --",
                         name, "=VALUE"));
      }
      value = args[++i];
    }
    if (flag.kind == Kind::kInt || flag.kind == Kind::kUint64) {
      if (!IsDecimalInteger(*value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " wants an integer, got '", *value, "'"));
      }
      bool in_range;
      if (flag.kind == Kind::kUint64) {
        uint64_t v;
        in_range = absl::SimpleAtoi(*value, &v);  // refuses a sign of '-'
      } else {
        int64_t v;
        const IntRange range = flag.range.value_or(kAllInt64);
        in_range = absl::SimpleAtoi(*value, &v) && v >= range.min && v <= range.max &&
                   (!range.power_of_two || (v > 0 && (v & (v - 1)) == 0));
      }
      if (!in_range) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, ": ", *value, " is outside ", RangeText(flag)));
      }
    } else if (flag.kind == Kind::kFloat || flag.kind == Kind::kFloat32) {
      double v;
      if (!absl::SimpleAtod(*value, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " wants a number, got '", *value, "'"));
      }
      if (flag.kind == Kind::kFloat32 && std::isfinite(v)) {
        const float narrowed = static_cast<float>(v);
        if (std::isinf(narrowed)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "flag --", name, ": ", *value,
              " is out of range; allowed: a number a float holds (|x| <= about 3.4028e38)"));
        }
        if (narrowed == 0 && v != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("flag --", name, ": ", *value,
                           " is not 0 but rounds to 0 as a float; allowed: 0 or |x| > 7.006e-46 "
                           "(half the smallest float, 1.4e-45)"));
        }
      }
    }
    if (flag.kind == Kind::kStringList) {
      lists_[name].push_back(*value);
      values_[name] = *value;
      continue;
    }
    // Given twice, one value would silently win (`--config a.yaml --config b.yaml`).
    if (auto given = values_.find(name); given != values_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " is given twice ('",
                                                     given->second, "', then '", *value,
                                                     "'); give it once"));
    }
    values_[name] = *value;
  }
  return absl::OkStatus();
}

std::string FlagSet::GetString(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  const Flag& flag = flags_.at(name);
  return flag.def.value_or("");
}

int64_t FlagSet::GetInt(const std::string& name) const {
  int64_t v = 0;
  (void)absl::SimpleAtoi(GetString(name), &v);
  return v;
}

uint64_t FlagSet::GetUint64(const std::string& name) const {
  uint64_t v = 0;
  (void)absl::SimpleAtoi(GetString(name), &v);
  return v;
}

double FlagSet::GetFloat(const std::string& name) const {
  double v = 0;
  (void)absl::SimpleAtod(GetString(name), &v);
  return v;
}

std::vector<std::string> FlagSet::GetStrings(const std::string& name) const {
  auto it = lists_.find(name);
  return it == lists_.end() ? std::vector<std::string>{} : it->second;
}

absl::Status FlagSet::Require(const std::vector<std::string>& names) const {
  for (const std::string& name : names) {
    if (!Has(name)) {
      return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
    }
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", usage_, "\n\nflags:\n");
  for (const std::string& name : order_) {
    const Flag& flag = flags_.at(name);
    std::string left = absl::StrCat("  --", name);
    if (flag.kind == Kind::kString || flag.kind == Kind::kStringList) {
      absl::StrAppend(&left, " TEXT");
    }
    if (flag.kind == Kind::kInt || flag.kind == Kind::kUint64) absl::StrAppend(&left, " N");
    if (flag.kind == Kind::kFloat || flag.kind == Kind::kFloat32) absl::StrAppend(&left, " X");
    absl::StrAppend(&out, absl::StrFormat("%-28s %s", left, flag.help));
    std::vector<std::string> notes;
    if (flag.def) notes.push_back(absl::StrCat("default ", *flag.def));
    if (flag.kind == Kind::kStringList) notes.push_back("repeatable");
    if (flag.range || flag.kind == Kind::kUint64) {
      notes.push_back(absl::StrCat("range ", RangeText(flag)));
    }
    if (!notes.empty()) absl::StrAppend(&out, " (", absl::StrJoin(notes, "; "), ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, absl::StrFormat("%-28s %s\n", "  --help", "print this help"));
  return out;
}

std::string FlagSet::RangeText(const Flag& flag) {
  if (flag.kind == Kind::kUint64) {
    return absl::StrCat("[0, ", std::numeric_limits<uint64_t>::max(), "]");
  }
  const IntRange range = flag.range.value_or(kAllInt64);
  return absl::StrCat(range.power_of_two ? "a power of two in " : "", "[", range.min, ", ",
                      range.max, "]");
}

}  // namespace kvd
