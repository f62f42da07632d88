#include "tools/flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd {

void FlagSet::AddString(std::string name, std::string help, std::optional<std::string> def) {
  order_.push_back(name);
  flags_[name] = {Kind::kString, std::move(help), std::move(def)};
}

void FlagSet::AddInt(std::string name, std::string help, std::optional<int64_t> def) {
  order_.push_back(name);
  flags_[name] = {Kind::kInt, std::move(help),
                  def ? std::optional<std::string>(absl::StrCat(*def)) : std::nullopt};
}

void FlagSet::AddFloat(std::string name, std::string help, std::optional<double> def) {
  order_.push_back(name);
  flags_[name] = {Kind::kFloat, std::move(help),
                  def ? std::optional<std::string>(absl::StrCat(*def)) : std::nullopt};
}

void FlagSet::AddBool(std::string name, std::string help) {
  order_.push_back(name);
  flags_[name] = {Kind::kBool, std::move(help), std::nullopt};
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
      value = args[++i];
    }
    if (flag.kind == Kind::kInt) {
      int64_t v;
      if (!absl::SimpleAtoi(*value, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " wants an integer, got '", *value, "'"));
      }
    } else if (flag.kind == Kind::kFloat) {
      double v;
      if (!absl::SimpleAtod(*value, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " wants a number, got '", *value, "'"));
      }
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

double FlagSet::GetFloat(const std::string& name) const {
  double v = 0;
  (void)absl::SimpleAtod(GetString(name), &v);
  return v;
}

absl::Status FlagSet::Require(const std::vector<std::string>& names) const {
  for (const std::string& name : names) {
    if (!Has(name)) return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", usage_, "\n\nflags:\n");
  for (const std::string& name : order_) {
    const Flag& flag = flags_.at(name);
    std::string left = absl::StrCat("  --", name);
    if (flag.kind == Kind::kString) absl::StrAppend(&left, " TEXT");
    if (flag.kind == Kind::kInt) absl::StrAppend(&left, " N");
    if (flag.kind == Kind::kFloat) absl::StrAppend(&left, " X");
    absl::StrAppend(&out, absl::StrFormat("%-28s %s", left, flag.help));
    if (flag.def) absl::StrAppend(&out, " (default ", *flag.def, ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, absl::StrFormat("%-28s %s\n", "  --help", "print this help"));
  return out;
}

}  // namespace kvd
