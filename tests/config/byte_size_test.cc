#include "config/byte_size.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

int64_t MustParse(std::string_view text) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(text);
  EXPECT_TRUE(bytes.ok()) << text << ": " << bytes.status();
  return bytes.value_or(-1);
}

TEST(ParseByteSizeTest, DecimalUnitsArePowersOfOneThousand) {
  EXPECT_EQ(MustParse("16GB"), 16'000'000'000);
  EXPECT_EQ(MustParse("32GB"), 32'000'000'000);
  EXPECT_EQ(MustParse("1KB"), 1'000);
  EXPECT_EQ(MustParse("3MB"), 3'000'000);
  EXPECT_EQ(MustParse("2TB"), 2'000'000'000'000);
}

TEST(ParseByteSizeTest, BinaryUnitsArePowersOf1024) {
  EXPECT_EQ(MustParse("1KiB"), 1024);
  EXPECT_EQ(MustParse("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(MustParse("16GiB"), int64_t{16} << 30);
  EXPECT_EQ(MustParse("1TiB"), int64_t{1} << 40);
}

TEST(ParseByteSizeTest, PlainNumbersAreBytesAndUnitsAreCaseInsensitive) {
  EXPECT_EQ(MustParse("4096"), 4096);
  EXPECT_EQ(MustParse("0"), 0);
  EXPECT_EQ(MustParse("7B"), 7);
  EXPECT_EQ(MustParse("16gb"), 16'000'000'000);
  EXPECT_EQ(MustParse("2gib"), int64_t{2} << 30);
  EXPECT_EQ(MustParse("16 GB"), 16'000'000'000);
  EXPECT_EQ(MustParse("  8MiB  "), int64_t{8} << 20);
}

TEST(ParseByteSizeTest, FractionsMustGiveWholeBytes) {
  EXPECT_EQ(MustParse("1.5KiB"), 1536);
  EXPECT_EQ(MustParse("0.5GB"), 500'000'000);
  EXPECT_EQ(MustParse(".25KB"), 250);
  EXPECT_THAT(ParseByteSize("1.5B").status().message(), HasSubstr("whole number"));
  EXPECT_THAT(ParseByteSize("0.0001KB").status().message(), HasSubstr("whole number"));
  // However many digits the fraction has: 2^-20 MiB is one byte (20 decimal places), and
  // trailing zeros change nothing; a digit past them that leaves a part byte still refuses.
  EXPECT_EQ(MustParse("0.00000095367431640625MiB"), 1);
  EXPECT_EQ(MustParse("3.00000000000000000000000000000000000000000000KiB"), 3072);
  EXPECT_EQ(MustParse("0.0000000000000000000000000000000000000000000000000000000000000TiB"), 0);
  EXPECT_THAT(ParseByteSize("0.000000953674316406251MiB").status().message(),
              HasSubstr("whole number"));
  EXPECT_THAT(ParseByteSize("1.00000000000000000000000001KiB").status().message(),
              HasSubstr("whole number"));
}

TEST(ParseByteSizeTest, RefusesNegativeUnknownAndMalformed) {
  EXPECT_THAT(ParseByteSize("-1GB").status().message(), HasSubstr("negative"));
  EXPECT_THAT(ParseByteSize("16XB").status().message(), HasSubstr("unknown unit 'XB'"));
  EXPECT_THAT(ParseByteSize("16 G B").status().message(), HasSubstr("unexpected"));
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("GB").ok());
  EXPECT_FALSE(ParseByteSize("1e9").ok());
  EXPECT_FALSE(ParseByteSize("+5").ok());
  EXPECT_FALSE(ParseByteSize("1..5GB").ok());
}

TEST(ParseByteSizeTest, RefusesValuesBeyondInt64) {
  EXPECT_EQ(MustParse("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_THAT(ParseByteSize("9223372036854775808").status().message(), HasSubstr("too large"));
  EXPECT_THAT(ParseByteSize("10000000TB").status().message(), HasSubstr("too large"));
  EXPECT_THAT(ParseByteSize("99999999999999999999999GiB").status().message(),
              HasSubstr("too large"));
}

TEST(FormatByteSizeTest, PicksTheShortestExactSpelling) {
  EXPECT_EQ(FormatByteSize(0), "0B");
  EXPECT_EQ(FormatByteSize(123), "123B");
  EXPECT_EQ(FormatByteSize(1000), "1KB");
  EXPECT_EQ(FormatByteSize(1024), "1KiB");
  EXPECT_EQ(FormatByteSize(16'000'000'000), "16GB");
  EXPECT_EQ(FormatByteSize(int64_t{1} << 30), "1GiB");
  EXPECT_EQ(FormatByteSize(1536), "1536B");
}

TEST(FormatByteSizeTest, RoundTripsThroughParse) {
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{1536}, int64_t{1} << 40,
                        int64_t{3'000'000'000}, std::numeric_limits<int64_t>::max()}) {
    EXPECT_EQ(MustParse(FormatByteSize(bytes)), bytes) << FormatByteSize(bytes);
  }
}

}  // namespace
}  // namespace kvd
