#ifndef KVD_TOOLS_FLAGS_H_
#define KVD_TOOLS_FLAGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvd {

// A subcommand's flags: declared once with their help text, then parsed from argv.
// `--name value` and `--name=value` both work; boolean flags take no value. Unknown flags,
// missing values and malformed numbers are errors that name the flag and the value.
class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}

  void AddString(std::string name, std::string help, std::optional<std::string> def = {});
  void AddInt(std::string name, std::string help, std::optional<int64_t> def = {});
  void AddFloat(std::string name, std::string help, std::optional<double> def = {});
  void AddBool(std::string name, std::string help);

  // Parses args (without the program and subcommand names). `--help` sets help().
  absl::Status Parse(const std::vector<std::string>& args);

  bool help() const { return help_; }
  bool Has(const std::string& name) const { return values_.contains(name); }
  std::string GetString(const std::string& name) const;
  int64_t GetInt(const std::string& name) const;
  double GetFloat(const std::string& name) const;
  bool GetBool(const std::string& name) const { return Has(name); }
  // Fails naming the first missing required flag.
  absl::Status Require(const std::vector<std::string>& names) const;

  // Usage line, then one line per flag with its help and default.
  std::string Usage() const;

 private:
  enum class Kind { kString, kInt, kFloat, kBool };
  struct Flag {
    Kind kind;
    std::string help;
    std::optional<std::string> def;
  };
  std::string usage_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

}  // namespace kvd

#endif  // KVD_TOOLS_FLAGS_H_
