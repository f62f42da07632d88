// `kvd client`'s flags: exactly one prompt form, token ids parsed strictly. (Talking to a
// daemon is covered by serve_synthetic_test.cc and tests/gpu/serve_check.sh.)

#include "server/client_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace kvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result Client(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunClientCommand(args, out, err);
  return {code, out.str(), err.str()};
}

TEST(ClientCommandTest, HelpListsTokenIdPrompts) {
  const Result r = Client({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--prompt-token-ids"));
  EXPECT_THAT(r.out, HasSubstr("--ignore-eos"));
}

TEST(ClientCommandTest, NeedsExactlyOnePromptForm) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{},
        std::vector<std::string>{"--prompt", "hi", "--prompt-token-ids", "1,2"}}) {
    const Result r = Client(args);
    EXPECT_EQ(r.code, 2);
    EXPECT_THAT(r.err, HasSubstr("exactly one of --prompt and --prompt-token-ids"));
  }
}

TEST(ClientCommandTest, MalformedTokenIdIsAUsageErrorNamingIt) {
  for (const char* ids : {"1,x,3", "1,,3", "-4", ""}) {
    const Result r = Client({"--prompt-token-ids", ids, "--address", "127.0.0.1:1"});
    EXPECT_EQ(r.code, 2) << ids;
    EXPECT_THAT(r.err, HasSubstr("--prompt-token-ids")) << ids;
  }
}

// The request's fields are uint32, float and uint64: a number they cannot hold is refused
// before any call, naming the flag and the value, rather than sent wrapped (4294967299 -> 3,
// -1 -> 4294967295) or turned into an undefined deadline.
TEST(ClientCommandTest, OutOfRangeNumbersAreUsageErrorsNamingFlagAndValue) {
  for (const auto& [flag, value, range] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--max-tokens", "4294967299", "[0, 4294967295]"},
           {"--max-tokens", "-1", "[0, 4294967295]"},
           {"--top-k", "-1", "[0, 4294967295]"},
           {"--top-k", "4294967296", "[0, 4294967295]"},
           {"--seed", "-1", "[0, 18446744073709551615]"},
           {"--seed", "18446744073709551616", "[0, 18446744073709551615]"}}) {
    const Result r = Client({"--prompt", "hi", "--address", "127.0.0.1:1", flag, value});
    EXPECT_EQ(r.code, 2) << flag << " " << value << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(flag + ": " + value + " is outside " + range));
  }
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--temperature", "1e300"},
                                                        {"--temperature", "nan"},
                                                        {"--top-p", "inf"},
                                                        {"--timeout", "inf"},
                                                        {"--timeout", "1e300"},
                                                        {"--timeout", "nan"},
                                                        {"--timeout", "-1"}}) {
    const Result r = Client({"--prompt", "hi", "--address", "127.0.0.1:1", flag, value});
    EXPECT_EQ(r.code, 2) << flag << " " << value << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(flag + ": " + value + " is out of range; allowed: "));
  }
}

// The request's floats: 1e-50 was once sent as 0 (greedy temperature, unset top-p).
TEST(ClientCommandTest, SamplingFloatsThatRoundToZeroAreUsageErrors) {
  for (const char* flag : {"--temperature", "--top-p"}) {
    const Result r =
        Client({"--prompt", "hi", "--address", "127.0.0.1:1", "--timeout", "1", flag, "1e-50"});
    EXPECT_EQ(r.code, 2) << flag << ": " << r.err;
    EXPECT_THAT(r.err,
                HasSubstr(std::string(flag) + ": 1e-50 is not 0 but rounds to 0 as a float"));
  }
}

// gRPC's resolver once logged raw lines and failed with "UNKNOWN: Failed to create secure
// client channel", which names no flag.
TEST(ClientCommandTest, EmptyAddressIsAUsageErrorNamingIt) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--prompt", "hi", "--address", ""},
        std::vector<std::string>{"--prompt", "hi", "--address="}}) {
    const Result r = Client(args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("kvd client: --address is empty"));
    EXPECT_THAT(r.err, Not(HasSubstr("UNKNOWN")));
    EXPECT_EQ(r.out, "");
  }
}

// A call that fails before any text streams leaves stdout empty, not one bare newline.
TEST(ClientCommandTest, FailedCallPrintsNothingToStdout) {
  for (const char* prompt_flag : {"--prompt", "--prompt-token-ids"}) {
    const Result r = Client({prompt_flag, "1", "--address", "127.0.0.1:1", "--timeout", "1"});
    EXPECT_EQ(r.code, 1) << r.err;  // nothing listens
    EXPECT_EQ(r.out, "") << prompt_flag;
    EXPECT_THAT(r.err, HasSubstr("kvd client: UNAVAILABLE"));
  }
}

// The request's seed is a uint64, as the config's model.seed: the largest is sent, not refused.
TEST(ClientCommandTest, SeedTakesTheWholeUint64Range) {
  const Result r = Client({"--prompt", "hi", "--address", "127.0.0.1:1", "--timeout", "1", "--seed",
                           "18446744073709551615"});
  EXPECT_NE(r.code, 2) << r.err;  // the call fails (nothing listens), not the usage
  EXPECT_THAT(r.err, Not(HasSubstr("--seed")));
}

TEST(ClientCommandTest, HelpStatesTheRanges) {
  const Result r = Client({"--help"});
  EXPECT_THAT(r.out, HasSubstr("[0, 4294967295]"));
  EXPECT_THAT(r.out, HasSubstr("0 .. 315360000"));
}

}  // namespace
}  // namespace kvd
