#include "tools/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

FlagSet Flags() {
  FlagSet f("test");
  f.AddString("model", "model path");
  f.AddInt("max-tokens", "limit", 256);
  f.AddFloat("temperature", "temp", 1.0);
  f.AddBool("json", "json output");
  return f;
}

TEST(FlagSetTest, ParsesBothSpellingsAndDefaults) {
  FlagSet f = Flags();
  ASSERT_TRUE(f.Parse({"--model", "a.bin", "--temperature=0.5", "--json"}).ok());
  EXPECT_EQ(f.GetString("model"), "a.bin");
  EXPECT_DOUBLE_EQ(f.GetFloat("temperature"), 0.5);
  EXPECT_EQ(f.GetInt("max-tokens"), 256);
  EXPECT_TRUE(f.GetBool("json"));
  EXPECT_FALSE(f.help());
}

TEST(FlagSetTest, ErrorsNameTheFlagAndValue) {
  EXPECT_THAT(Flags().Parse({"--bogus", "1"}).message(), HasSubstr("--bogus"));
  EXPECT_THAT(Flags().Parse({"--max-tokens", "ten"}).message(), HasSubstr("'ten'"));
  EXPECT_THAT(Flags().Parse({"--temperature", "hot"}).message(), HasSubstr("'hot'"));
  EXPECT_THAT(Flags().Parse({"--model"}).message(), HasSubstr("needs a value"));
  EXPECT_THAT(Flags().Parse({"stray"}).message(), HasSubstr("'stray'"));
  EXPECT_THAT(Flags().Parse({"--json=yes"}).message(), HasSubstr("takes no value"));
}

TEST(FlagSetTest, IntegersOutsideTheirRangeAreRefusedNeverWrapped) {
  FlagSet f("test");
  f.AddInt("max-tokens", "limit", 256, IntRange{0, 2147483647});
  f.AddInt("offset", "any int64");
  f.AddUint64("seed", "seed", 0);
  // Each would once have been cut to 32 bits (5, -2147483648) or wrapped (2^64 - 1).
  for (const char* value : {"4294967301", "2147483648", "-1", "99999999999999999999"}) {
    const absl::Status s = f.Parse({"--max-tokens", value});
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("--max-tokens: ", value, " is outside [0, 2147483647]")));
  }
  EXPECT_THAT(f.Parse({"--offset=9223372036854775808"}).message(),
              HasSubstr("--offset: 9223372036854775808 is outside [-9223372036854775808, "
                        "9223372036854775807]"));
  for (const char* value : {"-1", "18446744073709551616"}) {
    EXPECT_THAT(
        f.Parse({"--seed", value}).message(),
        HasSubstr(absl::StrCat("--seed: ", value, " is outside [0, 18446744073709551615]")));
  }
  EXPECT_THAT(f.Parse({"--seed", "1e3"}).message(), HasSubstr("wants an integer, got '1e3'"));
  ASSERT_TRUE(f.Parse({"--max-tokens", "2147483647", "--offset", "-9223372036854775808", "--seed",
                       "18446744073709551615"})
                  .ok());
  EXPECT_EQ(f.GetInt("max-tokens"), 2147483647);
  EXPECT_EQ(f.GetInt("offset"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.GetUint64("seed"), std::numeric_limits<uint64_t>::max());
  const std::string usage = f.Usage();
  EXPECT_THAT(usage, HasSubstr("(default 256; range [0, 2147483647])"));
  EXPECT_THAT(usage, HasSubstr("(default 0; range [0, 18446744073709551615])"));
}

// `--config a.yaml --config b.yaml` would serve b.yaml and ignore a.yaml without a word.
TEST(FlagSetTest, AValueFlagGivenTwiceIsAnErrorNamingBothValues) {
  const absl::Status s = Flags().Parse({"--model", "a.bin", "--model=b.bin"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("--model"), HasSubstr("'a.bin'"), HasSubstr("'b.bin'")));
  EXPECT_TRUE(Flags().Parse({"--json", "--json"}).ok());  // a switch twice is still on
}

// Stop strings: each --stop adds one, in order; an empty value is a value too.
TEST(FlagSetTest, AListFlagKeepsEveryValueInOrder) {
  FlagSet f = Flags();
  f.AddStringList("stop", "stop string");
  ASSERT_TRUE(f.Parse({"--stop", "a", "--model", "m", "--stop=", "--stop=--b"}).ok());
  EXPECT_THAT(f.GetStrings("stop"), ::testing::ElementsAre("a", "", "--b"));
  EXPECT_TRUE(f.Has("stop"));
  FlagSet none = Flags();
  none.AddStringList("stop", "stop string");
  ASSERT_TRUE(none.Parse({}).ok());
  EXPECT_TRUE(none.GetStrings("stop").empty());
  EXPECT_FALSE(none.Has("stop"));
  EXPECT_THAT(none.Usage(), HasSubstr("(repeatable)"));
}

// `--prompt --json` once made the prompt "--json" (and dropped the switch).
TEST(FlagSetTest, AValueStartingWithDashDashIsTakenOnlyAfterEquals) {
  FlagSet f = Flags();
  const absl::Status s = f.Parse({"--model", "--json"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--model needs a value; to pass one starting with --, write "
                                     "--model=VALUE"));
  EXPECT_FALSE(Flags().Parse({"--max-tokens", "--json"}).ok());
  FlagSet g = Flags();
  ASSERT_TRUE(g.Parse({"--model=--json", "--max-tokens", "-5"}).ok());
  EXPECT_EQ(g.GetString("model"), "--json");
  EXPECT_FALSE(g.GetBool("json"));
  EXPECT_EQ(g.GetInt("max-tokens"), -5);  // one dash is a value
}

TEST(FlagSetTest, RequireAndUsage) {
  FlagSet f = Flags();
  ASSERT_TRUE(f.Parse({"--help"}).ok());
  EXPECT_TRUE(f.help());
  EXPECT_THAT(f.Require({"model"}).message(), HasSubstr("--model"));
  const std::string usage = f.Usage();
  for (const char* name : {"--model", "--max-tokens", "--temperature", "--json", "--help"}) {
    EXPECT_THAT(usage, HasSubstr(name));
  }
  EXPECT_THAT(usage, HasSubstr("(default 256)"));
}

}  // namespace
}  // namespace kvd
