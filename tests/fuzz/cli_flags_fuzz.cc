// Fuzz target: command lines. The first byte picks one of two:
// - FlagSet (tools/flags.h), which every kvd subcommand parses its flags with, on any
//   arguments for a set with one flag of each kind, against a model of the contract its
//   header states: `--name value` and `--name=value`, boolean flags without a value (or
//   `=true`), a value starting with "--" only after '=', unknown flags, missing values,
//   integers in SimpleAtoi's syntax (ASCII whitespace around a sign and decimal digits; no
//   minus sign for uint64, not even -0) and within their range, never wrapped or clamped, a
//   second value for a flag an error (but for list flags, which keep every value), `--help`
//   and `-h` anywhere. Where the header leaves it open the model follows the parser: the
//   first error in argument order, its wording, and `--help=x` being an unknown flag.
//   Float syntax is SimpleAtod's, taken from the parser's plain float flag; a float32 flag
//   must refuse exactly the finite numbers a float turns into inf or into 0.
//   Invariants: the same verdict; an error names the flag (or the argument) and, for a bad
//   number, the value as typed; an accepted line's values read back as given.
// - `kvd estimate` (RunEstimateCommand) end to end on any flags, with synthetic presets and
//   stories260K's header as models. Invariants: exit 0, 1 or 2; 2 prints the error and the
//   usage, 1 the error alone, 0 nothing on stderr; 1 only where every flag's value was good
//   and the model did not load or the estimate refused the budget or overflowed; 0 only on a
//   model that loads, within its context; its JSON is one object that echoes the request
//   (batch, sequence length, block size, KV type, budget, the model's shape) and whose numbers
//   agree (blocks per sequence, block bytes at least the tokens', token-exact bytes within the
//   paged ones, paged bytes, the pool within the budget and what fits in it).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "config/byte_size.h"
#include "kernels/dtype.h"
#include "model/model_loader.h"
#include "tests/fuzz/fuzz_check.h"
#include "tools/estimate_command.h"
#include "tools/flags.h"

namespace {

using kvd::fuzz::InputReader;
using kvd::fuzz::Require;

// Values that sit on the edges of what the parsers take.
constexpr std::string_view kValues[] = {"0",
                                        "-0",
                                        "+7",
                                        " 12 ",
                                        "\t-3\n",
                                        "- 5",
                                        "007",
                                        "",
                                        "1.5",
                                        "16",
                                        "64",
                                        "256",
                                        "1000",
                                        "1001",
                                        "-1",
                                        "1e3",
                                        "0x10",
                                        "1_0",
                                        "true",
                                        "--x",
                                        "nan",
                                        "-inf",
                                        "1e39",
                                        "1e-46",
                                        "3e38",
                                        "1e-300",
                                        "80GB",
                                        "64GiB",
                                        "1KB",
                                        "0B",
                                        "9EB",
                                        "bf16",
                                        "INT4",
                                        "none",
                                        "f32",
                                        "fp8",
                                        "int8",
                                        "-",
                                        "+",
                                        "synthetic:tiny",
                                        "synthetic:llama3-8b",
                                        "synthetic:nope",
                                        KVD_SHARED_DIR "/models/stories260K.bin",
                                        "9223372036854775807",
                                        "9223372036854775808",
                                        "-9223372036854775808",
                                        "-9223372036854775809",
                                        "18446744073709551615",
                                        "18446744073709551616",
                                        "99999999999999999999999999"};

// An argument: a flag of `names` (or an unknown one), with or without "=value", a value
// from kValues, or any bytes.
std::string Argument(InputReader& input, const std::vector<std::string>& names) {
  const unsigned char b = input.Byte();
  const std::string name =
      b / 8 % (names.size() + 1) < names.size() ? names[b / 8 % (names.size() + 1)] : "nope";
  auto value = [&input]() -> std::string {
    const unsigned char v = input.Byte();
    if (v < 240) return std::string(kValues[v % std::size(kValues)]);
    return std::string(input.Bytes(v - 240));
  };
  switch (b % 8) {
    case 0:
    case 1:
    case 2:
      return "--" + name;
    case 3:
    case 4:
      return "--" + name + "=" + value();
    case 5:
      return b & 64 ? "--help" : "-h";
    default:
      return value();
  }
}

enum class Kind { kString, kInt, kUint64, kFloat, kFloat32, kBool, kList };

struct ModelFlag {
  Kind kind;
  int64_t min = 0;
  int64_t max = 0;
  bool power_of_two = false;
};

const std::map<std::string, ModelFlag>& ModelFlags() {
  static const auto* flags = new std::map<std::string, ModelFlag>{
      {"str", {Kind::kString}},
      {"int",
       {Kind::kInt, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}},
      {"pow", {Kind::kInt, 1, 256, true}},
      {"ranged", {Kind::kInt, -5, 1000}},
      {"u64", {Kind::kUint64}},
      {"f", {Kind::kFloat}},
      {"f32", {Kind::kFloat32}},
      {"b", {Kind::kBool}},
      {"list", {Kind::kList}},
  };
  return *flags;
}

// The set of flags the FlagSet half parses with, from ModelFlags: one of each kind.
kvd::FlagSet MakeFlags() {
  kvd::FlagSet f("fuzz");
  for (const auto& [name, flag] : ModelFlags()) {
    switch (flag.kind) {
      case Kind::kString:
        f.AddString(name, "a string", std::string("dflt"));
        break;
      case Kind::kInt:
        f.AddInt(name, "an integer", std::nullopt,
                 kvd::IntRange{flag.min, flag.max, flag.power_of_two});
        break;
      case Kind::kUint64:
        f.AddUint64(name, "a uint64", 7);
        break;
      case Kind::kFloat:
        f.AddFloat(name, "a double", 0.5);
        break;
      case Kind::kFloat32:
        f.AddFloat32(name, "a float");
        break;
      case Kind::kBool:
        f.AddBool(name, "a boolean");
        break;
      case Kind::kList:
        f.AddStringList(name, "any number of strings");
        break;
    }
  }
  return f;
}

// An integer as the header says the flags take it: ASCII whitespace around an optional sign
// and decimal digits; nullopt for anything else. `*negative` is the sign; the magnitude is
// capped just past 2^64 (then nothing is in range).
std::optional<unsigned __int128> Magnitude(absl::string_view text, bool* negative) {
  text = absl::StripAsciiWhitespace(text);
  *negative = false;
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
    *negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  unsigned __int128 m = 0;
  const unsigned __int128 cap = (static_cast<unsigned __int128>(1) << 64) + 1;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    m = m * 10 + static_cast<unsigned>(c - '0');
    if (m > cap) m = cap;
  }
  return m;
}

// The model's verdict: the error's start (empty when the line is accepted) and, when
// accepted, the values each flag got.
struct Verdict {
  std::string error_prefix;
  bool help = false;
  std::map<std::string, std::string> last;
  std::map<std::string, std::vector<std::string>> lists;
};

Verdict Model(const std::vector<std::string>& args) {
  Verdict v;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      v.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--") || arg == "--") {
      v.error_prefix = absl::StrCat("unexpected argument '", arg, "'");
      return v;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const auto it = ModelFlags().find(name);
    if (it == ModelFlags().end()) {
      v.error_prefix = absl::StrCat("unknown flag --", name);
      return v;
    }
    const ModelFlag& flag = it->second;
    const std::string named = absl::StrCat("flag --", name);
    if (flag.kind == Kind::kBool) {
      if (value.has_value() && *value != "true") {
        v.error_prefix = absl::StrCat(named, " takes no value");
        return v;
      }
      v.last[name] = "true";
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 == args.size() || absl::StartsWith(args[i + 1], "--")) {
        v.error_prefix = absl::StrCat(named, " needs a value");
        return v;
      }
      value = args[++i];
    }
    if (flag.kind == Kind::kInt || flag.kind == Kind::kUint64) {
      bool negative;
      const std::optional<unsigned __int128> m = Magnitude(*value, &negative);
      if (!m.has_value()) {
        v.error_prefix = absl::StrCat(named, " wants an integer, got '", *value, "'");
        return v;
      }
      bool in_range;
      if (flag.kind == Kind::kUint64) {
        in_range = !negative && *m <= std::numeric_limits<uint64_t>::max();
      } else {
        const __int128 x = negative ? -static_cast<__int128>(*m) : static_cast<__int128>(*m);
        in_range =
            x >= flag.min && x <= flag.max && (!flag.power_of_two || (x > 0 && (x & (x - 1)) == 0));
      }
      if (!in_range) {
        v.error_prefix = absl::StrCat(named, ": ", *value, " is outside ");
        return v;
      }
    } else if (flag.kind == Kind::kFloat || flag.kind == Kind::kFloat32) {
      // The number syntax is absl::SimpleAtod's: the plain float flag's verdict on this
      // value stands in for the model's; a float32 flag then refuses what a float cannot hold.
      kvd::FlagSet one = MakeFlags();
      const absl::Status s = one.Parse({absl::StrCat("--f=", *value)});
      if (!s.ok()) {
        Require(absl::StartsWith(s.message(), "flag --f wants a number"),
                "a float refused for another reason than its syntax");
        v.error_prefix = absl::StrCat(named, " wants a number, got '", *value, "'");
        return v;
      }
      const double x = one.GetFloat("f");
      if (flag.kind == Kind::kFloat32 && std::isfinite(x)) {
        const float narrowed = static_cast<float>(x);
        if (std::isinf(narrowed)) {
          v.error_prefix = absl::StrCat(named, ": ", *value, " is out of range");
          return v;
        }
        if (narrowed == 0 && x != 0) {
          v.error_prefix = absl::StrCat(named, ": ", *value, " is not 0 but rounds to 0");
          return v;
        }
      }
    }
    if (flag.kind == Kind::kList) {
      v.lists[name].push_back(*value);
      v.last[name] = *value;
      continue;
    }
    if (v.last.contains(name)) {
      v.error_prefix = absl::StrCat(named, " is given twice");
      return v;
    }
    v.last[name] = *value;
  }
  return v;
}

void FuzzFlagSet(InputReader& input) {
  std::vector<std::string> names;
  for (const auto& [name, flag] : ModelFlags()) names.push_back(name);
  std::vector<std::string> args;
  for (int n = input.Byte() % 12; n > 0 && !input.empty(); --n) {
    args.push_back(Argument(input, names));
  }
  kvd::FlagSet flags = MakeFlags();
  const absl::Status s = flags.Parse(args);
  const Verdict want = Model(args);
  if (!want.error_prefix.empty()) {
    Require(!s.ok(), absl::StrCat("accepted, but the contract says: ", want.error_prefix));
    Require(absl::StartsWith(s.message(), want.error_prefix),
            absl::StrCat("error '", s.message(), "', the contract's: '", want.error_prefix, "'"));
    return;
  }
  Require(s.ok(), absl::StrCat("refused a line the contract accepts: ", s.message()));
  Require(flags.help() == want.help, "--help not seen as given");
  for (const auto& [name, flag] : ModelFlags()) {
    const auto given = want.last.find(name);
    Require(flags.Has(name) == (given != want.last.end()), absl::StrCat("--", name, " Has()"));
    if (given == want.last.end()) continue;
    Require(flags.GetString(name) == given->second, absl::StrCat("--", name, " reads back"));
    bool negative;
    if (flag.kind == Kind::kInt) {
      const unsigned __int128 m = *Magnitude(given->second, &negative);
      const __int128 x = negative ? -static_cast<__int128>(m) : static_cast<__int128>(m);
      Require(flags.GetInt(name) == x, absl::StrCat("--", name, " is not the integer given"));
    }
    if (flag.kind == Kind::kUint64) {
      Require(flags.GetUint64(name) == *Magnitude(given->second, &negative),
              absl::StrCat("--", name, " is not the integer given"));
    }
  }
  Require(flags.GetStrings("list") ==
              (want.lists.contains("list") ? want.lists.at("list") : std::vector<std::string>{}),
          "--list does not keep every value in order");
}

// The value each flag was given in `args`, a line FlagSet accepted for `kvd estimate`
// without --help (that prints the usage): by the syntax its header states, `--name=value`,
// or `--name value` for all but the boolean --json. None of the estimate's flags is a list,
// so each appears at most once.
std::map<std::string, std::string> GivenValues(const std::vector<std::string>& args) {
  std::map<std::string, std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!absl::StartsWith(args[i], "--")) continue;
    const size_t eq = args[i].find('=');
    if (eq != std::string::npos) {
      given[args[i].substr(2, eq - 2)] = args[i].substr(eq + 1);
    } else if (args[i] == "--json") {
      given["json"] = "true";
    } else if (i + 1 < args.size()) {
      given[args[i].substr(2)] = args[i + 1];
      ++i;
    }
  }
  return given;
}

// The integer FlagSet reads from `text` (SimpleAtoi's syntax).
int64_t IntOf(const std::string& text) {
  int64_t x = 0;
  Require(absl::SimpleAtoi(text, &x), absl::StrCat("an accepted integer '", text, "' unread"));
  return x;
}

void FuzzEstimate(InputReader& input) {
  static const std::vector<std::string> kNames = {"model",      "batch",  "seq-len", "kv-dtype",
                                                  "block-size", "budget", "json"};
  std::vector<std::string> args;
  for (int n = input.Byte() % 14; n > 0 && !input.empty(); --n) {
    args.push_back(Argument(input, kNames));
  }
  std::ostringstream out, err;
  const int rc = kvd::RunEstimateCommand(args, out, err);
  Require(rc == 0 || rc == 1 || rc == 2, "an exit code other than 0, 1 and 2");
  if (rc == 2) {
    Require(absl::StartsWith(err.str(), "kvd estimate: ") &&
                absl::StrContains(err.str(), "\n\nusage: kvd estimate"),
            "a usage error without its message and the usage");
    Require(out.str().empty(), "a usage error printed to stdout");
    return;
  }
  const std::string& text = out.str();
  if (rc == 0 && absl::StartsWith(text, "usage: kvd estimate")) {
    Require(err.str().empty(), "--help printed to stderr");
    Require(std::find(args.begin(), args.end(), "--help") != args.end() ||
                std::find(args.begin(), args.end(), "-h") != args.end(),
            "the usage printed without --help or -h");
    return;
  }
  // FlagSet accepted the line, and the flag values it cannot judge alone were judged good
  // (else the exit code would be 2): the model given, a known KV type (any case, but not the
  // config's "none"), a budget that is a byte size > 0.
  std::map<std::string, std::string> given = GivenValues(args);
  Require(given.contains("model") && given.contains("batch") && given.contains("seq-len"),
          "ran without a required flag");
  const std::string dtype_name =
      absl::AsciiStrToLower(given.contains("kv-dtype") ? given["kv-dtype"] : std::string("bf16"));
  const std::optional<kvd::DType> dtype = kvd::ParseDType(dtype_name);
  Require(dtype.has_value(), "ran with an unknown --kv-dtype");  // ParseDType refuses "none"
  std::optional<int64_t> budget;
  if (given.contains("budget")) {
    const absl::StatusOr<int64_t> bytes = kvd::ParseByteSize(given["budget"]);
    Require(bytes.ok() && *bytes > 0, "ran with a --budget that is no byte size > 0");
    budget = *bytes;
  }
  const absl::StatusOr<kvd::ModelSpec> spec = kvd::LoadModelSpec(given["model"]);
  if (rc == 1) {
    // Exit code 1 is for a model that does not load and for an estimate that fails; the
    // estimate fails only on a budget the pool cannot be cut from (budget_bytes=...) or on
    // sizes that overflow 64 bits.
    Require(absl::StartsWith(err.str(), "kvd estimate: ") &&
                !absl::StrContains(err.str(), "\n\nusage: kvd estimate"),
            "a failure without its message, or with the usage");
    Require(out.str().empty(), "a failure printed to stdout");
    if (!spec.ok()) {
      // The loader's own reason, as it gave it (it names the path or what was wrong).
      Require(err.str() == absl::StrCat("kvd estimate: ", spec.status().message(), "\n"),
              absl::StrCat("a model that does not load, not reported as the loader said: ",
                           err.str()));
      return;
    }
    Require(absl::StrContains(err.str(), "budget_bytes=") ||
                absl::StrContains(err.str(), "fit in 64 bits"),
            absl::StrCat("exit code 1 for a model that loads, not for the estimate: ", err.str()));
    return;
  }
  Require(spec.ok(), "ran on a model that does not load");
  Require(err.str().empty(), "a success that printed to stderr");
  const int64_t want_batch = IntOf(given["batch"]), want_seq_len = IntOf(given["seq-len"]);
  const int64_t want_block = given.contains("block-size") ? IntOf(given["block-size"]) : 16;
  Require(spec->max_context_tokens <= 0 || want_seq_len <= spec->max_context_tokens,
          "ran with --seq-len past the model's context");
  if (!absl::StartsWith(text, "{")) {
    Require(absl::StartsWith(text, absl::StrCat("model ", spec->name, ": ")),
            "neither a table that names the model nor JSON");
    return;
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  Require(j.is_object(), "--json printed no JSON object");
  const int64_t block = j["block_size"], seq_len = j["seq_len"], batch = j["batch"];
  // The request echoed as given.
  Require(batch == want_batch && seq_len == want_seq_len && block == want_block,
          "batch, seq_len or block_size not the flags' values");
  Require(j["kv_dtype"] == std::string(kvd::DTypeName(*dtype)), "kv_dtype not --kv-dtype's");
  Require(j["model"] == spec->name && j["num_layers"] == spec->num_layers &&
              j["d_model"] == spec->dim && j["num_kv_heads"] == spec->num_kv_heads &&
              j["head_dim"] == spec->head_dim,
          "the model's shape not the model's");
  Require(j.contains("budget_bytes") == budget.has_value(), "budget_bytes without --budget");
  const int64_t blocks = j["blocks_per_sequence"], block_bytes = j["bytes_per_block"];
  Require(blocks == seq_len / block + (seq_len % block != 0), "blocks per sequence");
  Require(block_bytes >= j["bytes_per_token"].get<int64_t>() * block,
          "a block smaller than its tokens' bytes");
  Require(j["batch_bytes"].get<int64_t>() <= j["batch_bytes_paged"].get<int64_t>(),
          "token-exact bytes over the paged ones");
  Require(
      static_cast<__int128>(batch) * blocks * block_bytes == j["batch_bytes_paged"].get<int64_t>(),
      "paged bytes are not batch x blocks x block bytes");
  if (!budget.has_value()) return;
  Require(j["budget_bytes"].get<int64_t>() == *budget, "budget_bytes not --budget's");
  const int64_t pool_blocks = j["pool_blocks"], pool_bytes = j["pool_bytes"];
  Require(pool_bytes <= *budget, "a pool over the budget");
  Require(pool_bytes == j["pool_chunks"].get<int64_t>() * j["pool_chunk_bytes"].get<int64_t>(),
          "pool bytes are not chunks x chunk bytes");
  Require(j["sequences_in_budget"].get<int64_t>() == pool_blocks / blocks &&
              j["tokens_in_budget"].get<int64_t>() == pool_blocks * block,
          "what fits is not the pool's blocks");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  InputReader input(data, size);
  if (input.Byte() % 2 == 0) {
    FuzzFlagSet(input);
  } else {
    FuzzEstimate(input);
  }
  return 0;
}
