#ifndef KVD_TOOLS_FLAGS_H_
#define KVD_TOOLS_FLAGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvd {

// The closed range [min, max] an integer flag accepts; with power_of_two, only the powers of
// two in it (block sizes, as the config's kv_cache_config.block_size).
struct IntRange {
  int64_t min;
  int64_t max;
  bool power_of_two = false;
};

// A subcommand's flags: declared once with their help text, then parsed from argv.
// `--name value` and `--name=value` both work; boolean flags take no value (`=true` is
// allowed). Integers are decimal digits with an optional sign and ASCII whitespace around them
// (absl::SimpleAtoi's syntax), floats absl::SimpleAtod's. A value that starts with "--" is
// taken only as `--name=--value`: `--prompt --json` is a missing value, not the prompt
// "--json". Unknown flags, missing values, malformed numbers, integers outside their flag's
// range and a flag with a value given twice are errors that name the flag and the value as
// typed (and the range): a number is never wrapped or clamped, and no value silently replaces
// another (only a list flag, AddStringList, takes a value each time it is given).
class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}

  void AddString(std::string name, std::string help, std::optional<std::string> def = {});
  // An int64 flag; with `range`, Parse refuses values outside it, so a caller may narrow the
  // value to any type that holds the range. Usage() shows the range.
  // REQUIRES: range->min <= *def <= range->max when both are given.
  void AddInt(std::string name, std::string help, std::optional<int64_t> def = {},
              std::optional<IntRange> range = {});
  // A uint64 flag (seeds): 0 .. 18446744073709551615; a value with a minus sign is out of
  // range, -0 too.
  void AddUint64(std::string name, std::string help, std::optional<uint64_t> def = {});
  void AddFloat(std::string name, std::string help, std::optional<double> def = {});
  // A number the caller stores in a float: Parse also refuses a finite value that overflows a
  // float (above about 3.4028e38, FLT_MAX) or that is not 0 but rounds to 0 as a float
  // (|x| <= 2^-150, about 7.006e-46: half the smallest float, 1.4e-45), rather than let it
  // turn into inf or 0. NaN and infinities typed as such are the caller's to check.
  void AddFloat32(std::string name, std::string help, std::optional<double> def = {});
  void AddBool(std::string name, std::string help);
  // A string flag that may be given any number of times, each value kept in order (stop
  // strings). GetStrings reads them.
  void AddStringList(std::string name, std::string help);

  // Parses args (without the program and subcommand names). `--help` sets help().
  absl::Status Parse(const std::vector<std::string>& args);

  bool help() const { return help_; }
  bool Has(const std::string& name) const { return values_.contains(name); }
  std::string GetString(const std::string& name) const;
  // REQUIRES: `name` was added with AddInt.
  int64_t GetInt(const std::string& name) const;
  // REQUIRES: `name` was added with AddUint64.
  uint64_t GetUint64(const std::string& name) const;
  double GetFloat(const std::string& name) const;
  // Every value given, in order; empty when none. REQUIRES: added with AddStringList.
  std::vector<std::string> GetStrings(const std::string& name) const;
  bool GetBool(const std::string& name) const { return Has(name); }
  // Fails naming the first missing required flag.
  absl::Status Require(const std::vector<std::string>& names) const;

  // Usage line, then one line per flag with its help and default.
  std::string Usage() const;

 private:
  enum class Kind { kString, kInt, kUint64, kFloat, kFloat32, kBool, kStringList };
  struct Flag {
    Kind kind;
    std::string help;
    std::optional<std::string> def;
    std::optional<IntRange> range;  // kInt only; none = all of int64
  };
  // "[min, max]": the values an integer flag accepts.
  static std::string RangeText(const Flag& flag);

  std::string usage_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, std::string> values_;              // the last value given
  std::map<std::string, std::vector<std::string>> lists_;  // kStringList: every value given
  bool help_ = false;
};

}  // namespace kvd

#endif  // KVD_TOOLS_FLAGS_H_
