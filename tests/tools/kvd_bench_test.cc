// `kvd bench` as a user runs it: the real binary, on the CPU (its flags' refusals are in
// bench_flags_test.py).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/tools/run_kvd.h"

namespace kvd {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

const std::string kTinyBench =
    "bench --device cpu --model synthetic:tiny --threads 1 --steps 3 --warmup 1";

TEST(KvdBenchTest, KvdListsTheCommand) {
  const KvdResult r = RunKvd("--help");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("  bench      time decode steps of the whole engine"));
}

// Every case gets a row: its step time, tokens/s, the KV it read and the roofline beside it,
// and the self-check's verdict.
TEST(KvdBenchTest, TimesEveryCaseBesideItsRoofline) {
  const KvdResult r = RunKvd(kTinyBench + " --cases 1x16,3x40");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("kvd end-to-end decode, synthetic:tiny on cpu"));
  EXPECT_THAT(r.out, HasSubstr("3 timed steps after 1 warm-up steps"));
  EXPECT_THAT(r.out, ContainsRegex("\n +1 +16 +off( +[0-9.]+){5} +[0-9.]+x ok\n"));
  EXPECT_THAT(r.out, ContainsRegex("\n +3 +40 +off( +[0-9.]+){5} +[0-9.]+x ok\n"));
  EXPECT_THAT(r.out, HasSubstr("ratio = measured step / roofline step"));
}

// A checkpoint's own weights, loaded as `kvd generate` loads them.
TEST(KvdBenchTest, TimesACheckpoint) {
  const KvdResult r =
      RunKvd("bench --device cpu --threads 1 --steps 3 --warmup 1 --cases 2x32 --model " +
             std::string(KVD_SHARED_DIR) + "/models/stories260K.bin");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("kvd end-to-end decode, stories260K on cpu"));
  EXPECT_THAT(r.out, HasSubstr("(loaded and uploaded in "));
  EXPECT_THAT(r.out, ContainsRegex("\n +2 +32 +off( +[0-9.]+){5} +[0-9.]+x ok\n"));
}

// With OUT set, one JSON line a case as well, with the numbers of its row.
TEST(KvdBenchTest, WritesJsonLinesUnderOut) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvd_bench_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_EQ(setenv("OUT", dir.c_str(), 1), 0);
  const KvdResult r = RunKvd(kTinyBench + " --cases 2x24,1x8");
  unsetenv("OUT");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(dir / "kvd_bench.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  EXPECT_EQ(rows[0]["batch"], 2);
  EXPECT_EQ(rows[0]["context"], 24);
  EXPECT_EQ(rows[1]["batch"], 1);
  EXPECT_EQ(rows[1]["context"], 8);
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["model"], "synthetic:tiny");
    EXPECT_EQ(row["device"], "cpu");
    EXPECT_EQ(row["graphs"], false);
    EXPECT_EQ(row["finite"], true);
    EXPECT_GT(row["step_ms"].get<double>(), 0.0);
    EXPECT_GT(row["roofline_ms"].get<double>(), 0.0);
    // Within the rounding of the printed times (four decimals of a few hundredths of a ms).
    const double ratio = row["ratio_to_roofline"].get<double>();
    EXPECT_NEAR(ratio, row["step_ms"].get<double>() / row["roofline_ms"].get<double>(),
                0.02 * ratio);
  }
}

}  // namespace
}  // namespace kvd
