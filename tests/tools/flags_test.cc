#include "tools/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvd {
namespace {

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
