#include "config/duration.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

absl::Duration MustParse(std::string_view text) {
  absl::StatusOr<absl::Duration> d = ParseDuration(text);
  EXPECT_TRUE(d.ok()) << text << ": " << d.status();
  return d.value_or(absl::InfiniteDuration());
}

TEST(ParseDurationTest, ReadsEveryUnit) {
  EXPECT_EQ(MustParse("30s"), absl::Seconds(30));
  EXPECT_EQ(MustParse("250ms"), absl::Milliseconds(250));
  EXPECT_EQ(MustParse("2m"), absl::Minutes(2));
  EXPECT_EQ(MustParse("1h"), absl::Hours(1));
  EXPECT_EQ(MustParse("40us"), absl::Microseconds(40));
  EXPECT_EQ(MustParse("7ns"), absl::Nanoseconds(7));
}

TEST(ParseDurationTest, PlainNumbersAreSecondsAndFractionsAreExact) {
  EXPECT_EQ(MustParse("30"), absl::Seconds(30));
  EXPECT_EQ(MustParse("0"), absl::ZeroDuration());
  EXPECT_EQ(MustParse("1.5s"), absl::Milliseconds(1500));
  EXPECT_EQ(MustParse("0.1"), absl::Milliseconds(100));
  EXPECT_EQ(MustParse("2.5ms"), absl::Microseconds(2500));
  EXPECT_EQ(MustParse(" 10 s "), absl::Seconds(10));
}

TEST(ParseDurationTest, RefusesNegativeUnknownAndMalformed) {
  EXPECT_THAT(ParseDuration("-1s").status().message(), HasSubstr("negative"));
  EXPECT_THAT(ParseDuration("5 days").status().message(), HasSubstr("unknown unit 'days'"));
  EXPECT_THAT(ParseDuration("2M").status().message(), HasSubstr("unknown unit 'M'"));
  EXPECT_FALSE(ParseDuration("").ok());
  EXPECT_FALSE(ParseDuration("s").ok());
  EXPECT_FALSE(ParseDuration("inf").ok());
  EXPECT_FALSE(ParseDuration("1m30s").ok());
  EXPECT_THAT(ParseDuration("9999999999h").status().message(), HasSubstr("too long"));
}

TEST(FormatDurationExactTest, UsesTheLargestExactUnitAndRoundTrips) {
  EXPECT_EQ(FormatDurationExact(absl::ZeroDuration()), "0s");
  EXPECT_EQ(FormatDurationExact(absl::Seconds(30)), "30s");
  EXPECT_EQ(FormatDurationExact(absl::Milliseconds(2)), "2ms");
  EXPECT_EQ(FormatDurationExact(absl::Seconds(90)), "90s");
  EXPECT_EQ(FormatDurationExact(absl::Seconds(120)), "2m");
  EXPECT_EQ(FormatDurationExact(absl::Hours(3)), "3h");
  EXPECT_EQ(FormatDurationExact(absl::Milliseconds(1500)), "1500ms");
  for (absl::Duration d : {absl::Nanoseconds(1), absl::Microseconds(1001), absl::Seconds(61),
                           absl::Hours(25), absl::Nanoseconds(123456789012)}) {
    EXPECT_EQ(MustParse(FormatDurationExact(d)), d) << FormatDurationExact(d);
  }
}

}  // namespace
}  // namespace kvd
