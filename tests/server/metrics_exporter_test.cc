#include "server/metrics_exporter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "re2/re2.h"
#include "server/prometheus_writer.h"
#include "server/utf8.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A strict reader of the text exposition format 0.0.4, enough to check our own output.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Scrape {
  std::map<std::string, std::string> type;  // family -> counter/gauge/histogram/summary
  std::vector<Sample> samples;
  std::vector<std::string> errors;

  std::vector<Sample> Find(const std::string& name) const {
    std::vector<Sample> out;
    for (const Sample& s : samples) {
      if (s.name == name) out.push_back(s);
    }
    return out;
  }
};

double ParseValue(const std::string& text) {
  if (text == "+Inf") return INFINITY;
  if (text == "-Inf") return -INFINITY;
  if (text == "NaN") return NAN;
  return std::stod(text);
}

// The family a sample belongs to, given the families declared so far.
std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& type) {
  if (type.count(name)) return name;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      auto it = type.find(base);
      if (it != type.end() &&
          (it->second == "histogram" || (it->second == "summary" && s != "_bucket"))) {
        return base;
      }
    }
  }
  return "";
}

Scrape Parse(const std::string& text) {
  // RE2 (linear time, no backtracking): FullMatch anchors at both ends, Consume at the start.
  static const RE2 kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*)");
  static const RE2 kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  static const RE2 kSample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+))");
  static const RE2 kLabel(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$))re");
  static const RE2 kNumber(R"([+-]?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|[+-]Inf|NaN)");
  Scrape out;
  std::set<std::string> helped;
  std::istringstream in(text);
  std::string line;
  std::string last_help;
  int line_no = 0;
  if (text.empty() || text.back() != '\n') out.errors.push_back("does not end in a newline");
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = "line " + std::to_string(line_no) + ": " + line;
    std::string name, kind, labels, value;
    if (RE2::FullMatch(line, kHelp, &name)) {
      if (!helped.insert(name).second) out.errors.push_back("HELP repeated: " + where);
      last_help = name;
    } else if (RE2::FullMatch(line, kType, &name, &kind)) {
      if (name != last_help) out.errors.push_back("TYPE without HELP before it: " + where);
      if (!out.type.emplace(name, kind).second) out.errors.push_back("TYPE repeated: " + where);
      if (kind == "counter" && !name.ends_with("_total")) {
        out.errors.push_back("counter not named _total: " + where);
      }
    } else if (RE2::FullMatch(line, kSample, &name, &labels, &value)) {
      Sample s;
      s.name = name;
      re2::StringPiece rest(labels);
      std::string key, label_value;
      while (!rest.empty()) {
        if (!RE2::Consume(&rest, kLabel, &key, &label_value)) {
          out.errors.push_back("bad labels: " + where);
          break;
        }
        if (!s.labels.emplace(key, label_value).second) {
          out.errors.push_back("dup label: " + where);
        }
      }
      if (!RE2::FullMatch(value, kNumber)) {
        out.errors.push_back("bad value: " + where);
        continue;
      }
      s.value = ParseValue(value);
      if (FamilyOf(s.name, out.type).empty()) {
        out.errors.push_back("sample of an undeclared family: " + where);
      }
      out.samples.push_back(s);
    } else {
      out.errors.push_back("malformed: " + where);
    }
  }
  return out;
}

// Checks every histogram: buckets cumulative, le ascending, last le="+Inf" == _count.
void CheckHistograms(const Scrape& scrape) {
  for (const auto& [family, type] : scrape.type) {
    if (type != "histogram") continue;
    SCOPED_TRACE(family);
    const std::vector<Sample> buckets = scrape.Find(family + "_bucket");
    ASSERT_FALSE(buckets.empty());
    double last_le = -INFINITY;
    double last_count = 0;
    for (const Sample& b : buckets) {
      ASSERT_TRUE(b.labels.count("le"));
      const double le = ParseValue(b.labels.at("le"));
      EXPECT_GT(le, last_le);
      EXPECT_GE(b.value, last_count);
      last_le = le;
      last_count = b.value;
    }
    EXPECT_EQ(buckets.back().labels.at("le"), "+Inf");
    const std::vector<Sample> count = scrape.Find(family + "_count");
    ASSERT_EQ(count.size(), 1u);
    EXPECT_EQ(count[0].value, buckets.back().value);
    EXPECT_EQ(scrape.Find(family + "_sum").size(), 1u);
  }
}

EngineStats BusyStats() {
  EngineStats s;
  s.requests_waiting = 3;
  s.requests_running = 5;
  s.requests_finished = 1234567890123;
  // length, stop, context_limit, cancelled, deadline, aborted
  s.requests_finished_by_reason = {1234567890000, 100, 20, 2, 1, 0};
  s.requests_rejected = 2;
  s.preemptions = 7;
  s.prompt_tokens = 1000;
  s.computed_prompt_tokens = 600;
  s.generated_tokens = 4321;
  s.predicted_output_tokens = 96.5;
  s.time_to_first_token = Histogram({0.01, 0.1, 1});
  s.time_to_first_token.counts = {1, 4, 2, 3};  // 3 above the last bound
  s.time_to_first_token.sum = 9.25;
  s.time_to_first_token.count = 10;
  s.inter_token_latency = Histogram({0.001, 0.01});
  s.end_to_end_latency = Histogram({1, 10});
  s.output_length = Histogram({16, 64, 256});
  s.prediction_error = Histogram({-64, 0, 64});
  s.prediction_error.counts = {1, 0, 2, 0};
  KvCacheStats& c = s.cache;
  c.block_size = 16;
  c.max_blocks = 1000;
  c.total_blocks = 512;
  c.free_blocks = 200;
  c.used_blocks = 250;
  c.cached_blocks = 62;
  c.pinned_blocks = 40;
  c.session_releases_idle = 4;
  c.session_releases_closed = 1;
  c.session_releases_pressure = 2;
  c.prefix_query_tokens = 900;
  c.prefix_hit_tokens = 300;
  c.defrag_pauses.num_pauses = 3;
  c.defrag_pauses.total = absl::Microseconds(1500);
  c.defrag_pauses.bucket_counts[3] = 2;  // 250-500 us
  c.defrag_pauses.bucket_counts[4] = 1;  // 500 us - 1 ms
  return s;
}

MetricsInfo Info() {
  MetricsInfo info;
  info.model = "stories260K";
  info.backend = "cpu";
  info.kv_dtype = "f32";
  info.block_size = 16;
  info.num_blocks = 1000;
  return info;
}

// The reader above is what the exporter's tests trust: it accepts the format's escapes and
// names each kind of mistake.
TEST(ExpositionReaderTest, AcceptsEscapesAndNamesEachMistake) {
  const std::string head = "# HELP kvd_x_total Help.\n# TYPE kvd_x_total counter\n";
  const Scrape good = Parse(
      head + "kvd_x_total{a=\"q\\\"x\\\\\",b=\"\"} 3\nkvd_x_total 1.5e+2\nkvd_x_total +Inf\n");
  EXPECT_THAT(good.errors, ::testing::IsEmpty());
  ASSERT_EQ(good.samples.size(), 3u);
  EXPECT_EQ(good.samples[0].labels.at("a"), "q\\\"x\\\\");
  EXPECT_EQ(good.samples[0].labels.at("b"), "");
  EXPECT_EQ(good.samples[0].value, 3);
  EXPECT_EQ(good.samples[1].value, 150);
  EXPECT_TRUE(good.samples[1].labels.empty());

  auto first_error = [](const std::string& text) {
    const Scrape s = Parse(text);
    return s.errors.empty() ? std::string("(none)") : s.errors.front();
  };
  EXPECT_THAT(first_error(head + "kvd_x_total{a=q} 1\n"), HasSubstr("bad labels"));
  EXPECT_THAT(first_error(head + "kvd_x_total{a=\"1\"b=\"2\"} 1\n"), HasSubstr("bad labels"));
  EXPECT_THAT(first_error(head + "kvd_x_total{a=\"1\",a=\"2\"} 1\n"), HasSubstr("dup label"));
  EXPECT_THAT(first_error(head + "kvd_x_total 1,5\n"), HasSubstr("bad value"));
  EXPECT_THAT(first_error(head + "kvd_y 1\n"), HasSubstr("undeclared family"));
  EXPECT_THAT(first_error("# TYPE kvd_x_total counter\n"), HasSubstr("TYPE without HELP"));
  EXPECT_THAT(first_error("# HELP kvd_x Help.\n# TYPE kvd_x counter\n"),
              HasSubstr("counter not named _total"));
  EXPECT_THAT(first_error(head + "kvd_x_total 1"), HasSubstr("newline"));
  EXPECT_THAT(first_error(head + "kvd_x_total  1\n"), HasSubstr("malformed"));
}

// Everything a scrape may read, a device's memory and this process's figures, each field a
// number of its own from `first` on: device total and free, then cpu_seconds, resident and
// virtual bytes, start time, threads, open and most fds.
ScrapeFacts NumberedFacts(int64_t first) {
  int64_t n = first;
  ScrapeFacts f;
  f.device = Backend::DeviceMemory{n, n + 1};
  n += 2;
  f.process = ProcessStats{.cpu_seconds = static_cast<double>(n),
                           .resident_bytes = n + 1,
                           .virtual_bytes = n + 2,
                           .start_time_seconds = static_cast<double>(n + 3),
                           .threads = n + 4,
                           .open_fds = n + 5,
                           .max_fds = n + 6};
  return f;
}

// The standard process collector's families keep the names every client library gives them,
// so that dashboards made for them work; every other family is kvd's.
TEST(MetricsExporterTest, OutputIsWellFormedExposition) {
  const Scrape scrape = Parse(MetricsExporter::Render(BusyStats(), Info(), NumberedFacts(1)));
  EXPECT_THAT(scrape.errors, ::testing::IsEmpty());
  CheckHistograms(scrape);
  const std::set<std::string> standard = {"process_cpu_seconds_total",
                                          "process_resident_memory_bytes",
                                          "process_virtual_memory_bytes",
                                          "process_start_time_seconds",
                                          "process_open_fds",
                                          "process_max_fds"};
  for (const auto& [family, type] : scrape.type) {
    EXPECT_TRUE(family.rfind("kvd_", 0) == 0 || standard.count(family)) << family;
  }
  for (const std::string& family : standard) EXPECT_TRUE(scrape.type.count(family)) << family;
}

TEST(MetricsExporterTest, DefaultStatsAreWellFormedToo) {
  const EngineStats empty;
  const Scrape scrape = Parse(MetricsExporter::Render(empty, MetricsInfo{}));
  EXPECT_THAT(scrape.errors, ::testing::IsEmpty());
  CheckHistograms(scrape);
}

TEST(MetricsExporterTest, CoversTheIssuesMetrics) {
  const Scrape scrape = Parse(MetricsExporter::Render(BusyStats(), Info()));
  for (const char* family : {"kvd_num_requests_waiting",
                             "kvd_num_requests_running",
                             "kvd_kv_cache_usage_ratio",
                             "kvd_kv_cache_blocks",
                             "kvd_kv_pool_reserved_bytes",
                             "kvd_kv_pool_used_bytes",
                             "kvd_prefix_cache_query_tokens_total",
                             "kvd_prefix_cache_hit_tokens_total",
                             "kvd_kv_cache_evicted_blocks_total",
                             "kvd_preemptions_total",
                             "kvd_sessions_active",
                             "kvd_sessions_released_total",
                             "kvd_defrag_moved_blocks_total",
                             "kvd_defrag_pause_seconds",
                             "kvd_admission_rejections_total",
                             "kvd_output_length_predicted_tokens",
                             "kvd_output_length_tokens",
                             "kvd_output_length_prediction_error_tokens",
                             "kvd_time_to_first_token_seconds",
                             "kvd_inter_token_latency_seconds",
                             "kvd_request_latency_seconds",
                             "kvd_prompt_tokens_total",
                             "kvd_generation_tokens_total",
                             "kvd_cache_config_info"}) {
    EXPECT_TRUE(scrape.type.count(family)) << family;
  }
}

TEST(MetricsExporterTest, ValuesComeFromTheSnapshot) {
  const Scrape scrape = Parse(MetricsExporter::Render(BusyStats(), Info()));
  EXPECT_EQ(scrape.Find("kvd_num_requests_waiting")[0].value, 3);
  EXPECT_EQ(scrape.Find("kvd_num_requests_running")[0].value, 5);
  std::map<std::string, double> finished;
  for (const Sample& s : scrape.Find("kvd_requests_finished_total")) {
    finished[s.labels.at("reason")] = s.value;
  }
  EXPECT_EQ(finished, (std::map<std::string, double>{{"length", 1234567890000.0},
                                                     {"stop", 100},
                                                     {"context_limit", 20},
                                                     {"cancelled", 2},
                                                     {"deadline", 1},
                                                     {"aborted", 0}}));
  EXPECT_DOUBLE_EQ(scrape.Find("kvd_kv_cache_usage_ratio")[0].value, 0.25);
  std::map<std::string, double> blocks;
  for (const Sample& s : scrape.Find("kvd_kv_cache_blocks")) blocks[s.labels.at("state")] = s.value;
  EXPECT_EQ(blocks, (std::map<std::string, double>{
                        {"free", 200}, {"used", 250}, {"cached", 62}, {"pinned", 40}}));
  std::map<std::string, double> released;
  for (const Sample& s : scrape.Find("kvd_sessions_released_total")) {
    released[s.labels.at("reason")] = s.value;
  }
  EXPECT_EQ(released, (std::map<std::string, double>{
                          {"idle", 4}, {"pin_cap", 0}, {"closed", 1}, {"pressure", 2}}));

  // The histogram is cumulative: 1, 1+4, 1+4+2, then +Inf holds all 10.
  std::vector<double> ttft;
  for (const Sample& s : scrape.Find("kvd_time_to_first_token_seconds_bucket")) {
    ttft.push_back(s.value);
  }
  EXPECT_EQ(ttft, (std::vector<double>{1, 5, 7, 10}));
  EXPECT_EQ(scrape.Find("kvd_time_to_first_token_seconds_sum")[0].value, 9.25);

  const std::vector<Sample> info = scrape.Find("kvd_cache_config_info");
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].value, 1);
  EXPECT_EQ(info[0].labels, (std::map<std::string, std::string>{{"block_size", "16"},
                                                                {"num_blocks", "1000"},
                                                                {"kv_dtype", "f32"},
                                                                {"prefix_caching", "true"}}));
  EXPECT_DOUBLE_EQ(scrape.Find("kvd_defrag_pause_seconds_sum")[0].value, 0.0015);
  EXPECT_DOUBLE_EQ(scrape.Find("kvd_defrag_pause_seconds_count")[0].value, 3);
}

// Every sample but the histograms' buckets (CheckHistograms, and the test above) carries the
// snapshot field it names, each field a distinct value: a swapped, dropped or mislabelled
// field, or a sample nobody listed here, fails.
TEST(MetricsExporterTest, EverySampleCarriesItsOwnField) {
  EngineStats s;
  s.requests_waiting = 11;
  s.requests_running = 12;
  s.requests_finished = 13;  // GetCacheStats' figure: the metric is by reason
  s.requests_finished_by_reason = {58, 59, 60, 61, 62, 63};
  s.requests_rejected = 14;
  s.preemptions = 15;
  s.steps = 16;
  s.prompt_tokens = 17;
  s.computed_prompt_tokens = 18;
  s.generated_tokens = 19;
  s.predicted_output_tokens = 20.5;
  auto histogram = [](double sum, int64_t count) {
    Histogram h({1});
    h.counts = {count, 0};
    h.sum = sum;
    h.count = count;
    return h;
  };
  s.output_length = histogram(21, 22);
  s.prediction_error = histogram(23, 24);
  s.time_to_first_token = histogram(25, 26);
  s.inter_token_latency = histogram(27, 28);
  s.end_to_end_latency = histogram(29, 30);
  KvCacheStats& c = s.cache;
  c.max_blocks = 400;  // usage ratio = used / max = 0.25
  c.used_blocks = 100;
  c.free_blocks = 31;
  c.cached_blocks = 32;
  c.pinned_blocks = 33;
  c.total_blocks = 34;
  c.block_bytes = 35;
  c.total_bytes = 36;
  c.used_bytes = 37;
  c.cached_bytes = 38;
  c.max_bytes = 39;
  c.num_chunks = 40;
  c.chunks_grown = 41;
  c.chunks_released = 42;
  c.num_sequences = 43;
  c.num_prefix_keys = 44;
  c.prefix_query_tokens = 45;
  c.prefix_hit_tokens = 46;
  c.session_hit_tokens = 47;
  c.evictions = 48;
  c.num_sessions = 49;
  c.session_releases_idle = 50;
  c.session_releases_pin_cap = 51;
  c.session_releases_closed = 52;
  c.session_releases_pressure = 53;
  c.defrag_moves = 54;
  c.chunk_growth_failures = 64;
  c.chunk_growth_stopped = true;
  c.block_references = 78;
  c.shared_blocks = 79;
  c.obtainable_blocks = 80;
  c.defrag_pauses.num_pauses = 55;
  c.defrag_pauses.bucket_counts.back() = 55;
  c.defrag_pauses.total = absl::Seconds(56);
  c.defrag_pauses.max = absl::Seconds(57);
  s.memory = {
      .weights_bytes = 65, .kv_pool_bytes = 66, .activation_bytes = 67, .workspace_bytes = 68};

  // name{label="value",...} -> value
  const std::map<std::string, double> want = {
      {"kvd_cache_config_info{block_size=\"16\",kv_dtype=\"f32\",num_blocks=\"1000\","
       "prefix_caching=\"true\"}",
       1},
      {"kvd_model_info{backend=\"cpu\",model=\"stories260K\"}", 1},
      {"kvd_num_requests_waiting", 11},
      {"kvd_num_requests_running", 12},
      {"kvd_requests_finished_total{reason=\"length\"}", 58},
      {"kvd_requests_finished_total{reason=\"stop\"}", 59},
      {"kvd_requests_finished_total{reason=\"context_limit\"}", 60},
      {"kvd_requests_finished_total{reason=\"cancelled\"}", 61},
      {"kvd_requests_finished_total{reason=\"deadline\"}", 62},
      {"kvd_requests_finished_total{reason=\"aborted\"}", 63},
      {"kvd_admission_rejections_total", 14},
      {"kvd_preemptions_total", 15},
      {"kvd_engine_steps_total", 16},
      {"kvd_prompt_tokens_total", 17},
      {"kvd_prompt_tokens_computed_total", 18},
      {"kvd_generation_tokens_total", 19},
      {"kvd_output_length_predicted_tokens", 20.5},
      {"kvd_output_length_tokens_sum", 21},
      {"kvd_output_length_tokens_count", 22},
      {"kvd_output_length_prediction_error_tokens_sum", 23},
      {"kvd_output_length_prediction_error_tokens_count", 24},
      {"kvd_time_to_first_token_seconds_sum", 25},
      {"kvd_time_to_first_token_seconds_count", 26},
      {"kvd_inter_token_latency_seconds_sum", 27},
      {"kvd_inter_token_latency_seconds_count", 28},
      {"kvd_request_latency_seconds_sum", 29},
      {"kvd_request_latency_seconds_count", 30},
      {"kvd_kv_cache_usage_ratio", 0.25},
      {"kvd_kv_cache_blocks{state=\"used\"}", 100},
      {"kvd_kv_cache_blocks{state=\"free\"}", 31},
      {"kvd_kv_cache_blocks{state=\"cached\"}", 32},
      {"kvd_kv_cache_blocks{state=\"pinned\"}", 33},
      {"kvd_kv_cache_allocated_blocks", 34},
      {"kvd_kv_cache_block_references", 78},
      {"kvd_kv_cache_shared_blocks", 79},
      {"kvd_kv_cache_obtainable_blocks", 80},
      {"kvd_kv_cache_capacity_blocks", 400},
      {"kvd_kv_cache_block_bytes", 35},
      {"kvd_kv_pool_reserved_bytes", 36},
      {"kvd_kv_pool_used_bytes", 37},
      {"kvd_kv_pool_cached_bytes", 38},
      {"kvd_kv_pool_max_bytes", 39},
      {"kvd_kv_pool_chunks", 40},
      {"kvd_kv_pool_chunks_grown_total", 41},
      {"kvd_kv_pool_chunks_released_total", 42},
      {"kvd_kv_cache_sequences", 43},
      {"kvd_prefix_cache_keys", 44},
      {"kvd_prefix_cache_query_tokens_total", 45},
      {"kvd_prefix_cache_hit_tokens_total", 46},
      {"kvd_session_cache_hit_tokens_total", 47},
      {"kvd_kv_cache_evicted_blocks_total", 48},
      {"kvd_sessions_active", 49},
      {"kvd_sessions_released_total{reason=\"idle\"}", 50},
      {"kvd_sessions_released_total{reason=\"pin_cap\"}", 51},
      {"kvd_sessions_released_total{reason=\"closed\"}", 52},
      {"kvd_sessions_released_total{reason=\"pressure\"}", 53},
      {"kvd_defrag_moved_blocks_total", 54},
      {"kvd_kv_pool_growth_failures_total", 64},
      {"kvd_kv_pool_growth_stopped", 1},
      {"kvd_defrag_pause_seconds_count", 55},
      {"kvd_defrag_pause_seconds_sum", 56},
      {"kvd_defrag_pause_max_seconds", 57},
      {"kvd_memory_bytes{component=\"weights\"}", 65},
      {"kvd_memory_bytes{component=\"kv_pool\"}", 66},
      {"kvd_memory_bytes{component=\"activations\"}", 67},
      {"kvd_memory_bytes{component=\"workspace\"}", 68},
      {"kvd_device_memory_bytes{state=\"total\"}", 69},
      {"kvd_device_memory_bytes{state=\"free\"}", 70},
      {"process_cpu_seconds_total", 71},
      {"process_resident_memory_bytes", 72},
      {"process_virtual_memory_bytes", 73},
      {"process_start_time_seconds", 74},
      {"kvd_process_threads", 75},
      {"process_open_fds", 76},
      {"process_max_fds", 77},
  };
  const Scrape scrape = Parse(MetricsExporter::Render(s, Info(), NumberedFacts(69)));
  ASSERT_THAT(scrape.errors, ::testing::IsEmpty());
  std::map<std::string, double> got;
  for (const Sample& sample : scrape.samples) {
    if (sample.labels.count("le")) continue;  // a bucket
    std::string key = sample.name;
    if (!sample.labels.empty()) {
      std::vector<std::string> labels;
      for (const auto& [name, value] : sample.labels) {
        labels.push_back(absl::StrCat(name, "=\"", value, "\""));
      }
      key += absl::StrCat("{", absl::StrJoin(labels, ","), "}");
    }
    EXPECT_TRUE(got.emplace(key, sample.value).second) << "twice: " << key;
  }
  EXPECT_EQ(got, want);
}

// A backend with no device of its own (the CPU), or a driver that cannot say, publishes no
// device series rather than zeros; the memory kvd holds is published either way.
TEST(MetricsExporterTest, DeviceMemoryIsPublishedOnlyWhereTheBackendKnowsIt) {
  const Scrape without = Parse(MetricsExporter::Render(BusyStats(), Info()));
  ASSERT_THAT(without.errors, ::testing::IsEmpty());
  EXPECT_TRUE(without.Find("kvd_device_memory_bytes").empty());
  EXPECT_EQ(without.Find("kvd_memory_bytes").size(), 4u);
  EXPECT_TRUE(without.Find("process_resident_memory_bytes").empty());
  // An fd count or limit /proc could not give is left out, not published as 0.
  ScrapeFacts unknown_fds = NumberedFacts(1);
  unknown_fds.process->open_fds = -1;
  unknown_fds.process->max_fds = 0;
  const Scrape partial = Parse(MetricsExporter::Render(BusyStats(), Info(), unknown_fds));
  EXPECT_TRUE(partial.Find("process_open_fds").empty());
  EXPECT_TRUE(partial.Find("process_max_fds").empty());
  EXPECT_EQ(partial.Find("process_resident_memory_bytes").size(), 1u);

  int scrapes = 0;
  MetricsExporter exporter(
      Info(), [] { return BusyStats(); },
      [&scrapes]() -> std::optional<Backend::DeviceMemory> {
        // Asked at every scrape: free memory changes between them.
        return Backend::DeviceMemory{80, 10 + scrapes++};
      });
  // A driver that cannot say (a lost context): nothing, rather than zeros.
  MetricsExporter unknown(
      Info(), [] { return BusyStats(); },
      []() -> std::optional<Backend::DeviceMemory> { return std::nullopt; });
  const Scrape unknown_scrape = Parse(unknown.Scrape());
  ASSERT_THAT(unknown_scrape.errors, ::testing::IsEmpty());
  EXPECT_TRUE(unknown_scrape.Find("kvd_device_memory_bytes").empty());

  for (int i = 0; i < 2; ++i) {
    const Scrape with = Parse(exporter.Scrape());
    ASSERT_THAT(with.errors, ::testing::IsEmpty());
    const std::vector<Sample> device = with.Find("kvd_device_memory_bytes");
    ASSERT_EQ(device.size(), 2u);
    EXPECT_EQ(device[0].labels.at("state"), "total");
    EXPECT_EQ(device[0].value, 80);
    EXPECT_EQ(device[1].labels.at("state"), "free");
    EXPECT_EQ(device[1].value, 10 + i);
  }
}

// What the config sets, the scrape says: the defragmentation pause's budget in its HELP (it
// said "goal: under 2 ms" whatever defrag.max_pause was), and whether the prefix cache is on
// (its query counter counts either way).
TEST(MetricsExporterTest, HelpAndInfoFollowTheConfig) {
  MetricsInfo info = Info();
  info.defrag_max_pause = absl::Milliseconds(20);
  info.prefix_caching = false;
  const std::string text = MetricsExporter::Render(BusyStats(), info);
  EXPECT_THAT(text, HasSubstr("kv_cache_config.defrag.max_pause: 20ms)."));
  EXPECT_THAT(text, Not(HasSubstr("2 ms")));
  const Scrape scrape = Parse(text);
  ASSERT_THAT(scrape.errors, ::testing::IsEmpty());
  EXPECT_EQ(scrape.Find("kvd_cache_config_info")[0].labels.at("prefix_caching"), "false");
}

TEST(MetricsExporterTest, ScrapeReadsTheSourceEachTime) {
  int calls = 0;
  MetricsExporter exporter(Info(), [&calls] {
    EngineStats s;
    s.requests_waiting = ++calls;
    return s;
  });
  EXPECT_THAT(exporter.Scrape(), HasSubstr("\nkvd_num_requests_waiting 1\n"));
  EXPECT_THAT(exporter.Scrape(), HasSubstr("\nkvd_num_requests_waiting 2\n"));
}

TEST(PrometheusWriterTest, FormatsValuesExactly) {
  EXPECT_EQ(PrometheusWriter::FormatValue(0), "0");
  EXPECT_EQ(PrometheusWriter::FormatValue(-3), "-3");
  EXPECT_EQ(PrometheusWriter::FormatValue(123456789012345), "123456789012345");
  EXPECT_EQ(PrometheusWriter::FormatValue(0.25), "0.25");
  EXPECT_EQ(PrometheusWriter::FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(PrometheusWriter::FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(PrometheusWriter::FormatValue(NAN), "NaN");
  EXPECT_EQ(PrometheusWriter::FormatValue(0.1), "0.1");  // the shortest text that reads back
  EXPECT_EQ(PrometheusWriter::FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(std::stod(PrometheusWriter::FormatValue(1.0 / 3)), 1.0 / 3);
  EXPECT_EQ(PrometheusWriter::FormatValue(5e-05), "5e-05");
  // %g's layout, as Go clients write bounds: fixed from 1e-4 up, not the shorter "1e-04".
  EXPECT_EQ(PrometheusWriter::FormatValue(1e-04), "0.0001");
  EXPECT_EQ(PrometheusWriter::FormatValue(5e-04), "0.0005");
  EXPECT_EQ(PrometheusWriter::FormatValue(1.5e20), "1.5e+20");
  EXPECT_EQ(PrometheusWriter::FormatValue(1234567.5), "1.2345675e+06");  // as Go's %g too
}

// `le` labels are matched as text by dashboards and alerts (le="0.1"), so a bound is spelled
// as it was written, not with 17 significant digits.
TEST(PrometheusWriterTest, HistogramBoundsAreSpelledShortest) {
  Histogram h({0.00005, 0.1, 0.25, 2.5, 100});
  h.Observe(0.05);
  PrometheusWriter w;
  w.HistogramFamily("kvd_test_seconds", "Test.", h);
  for (const char* le : {"5e-05", "0.1", "0.25", "2.5", "100", "+Inf"}) {
    EXPECT_THAT(w.text(), HasSubstr(absl::StrCat("kvd_test_seconds_bucket{le=\"", le, "\"}")));
  }
  // And so is every bucket of the real exporter.
  const std::string scrape = MetricsExporter::Render(BusyStats(), Info());
  EXPECT_FALSE(RE2::PartialMatch(scrape, R"re(le="[^"]*[0-9]{12})re"))
      << "an le label with 12+ digits in a row";
}

// server/README.md's metric table is the reference users read: it names every family.
TEST(MetricsExporterTest, ReadmeListsEveryFamily) {
  std::ifstream file(KVD_SOURCE_DIR "/server/README.md");
  std::ostringstream readme;
  readme << file.rdbuf();
  ASSERT_FALSE(readme.str().empty());
  const Scrape scrape = Parse(MetricsExporter::Render(BusyStats(), Info(), NumberedFacts(1)));
  for (const auto& [family, type] : scrape.type) {
    const bool listed = readme.str().find("`" + family + "`") != std::string::npos ||
                        readme.str().find("`" + family + "{") != std::string::npos;
    EXPECT_TRUE(listed) << "server/README.md does not list " << family << " (" << type << ")";
  }
}

TEST(PrometheusWriterTest, EscapesLabelValuesAndHelp) {
  PrometheusWriter w;
  w.Gauges("kvd_test", "a \\ help\nline", {{{{"model", "a\"b\\c\nd"}}, 1}});
  EXPECT_EQ(w.text(),
            "# HELP kvd_test a \\\\ help\\nline\n"
            "# TYPE kvd_test gauge\n"
            "kvd_test{model=\"a\\\"b\\\\c\\nd\"} 1\n");
  EXPECT_THAT(Parse(w.text()).errors, ::testing::IsEmpty());
}

// A model file named in Latin-1 ("caf\xe9.bin") must not make Prometheus reject every scrape.
TEST(PrometheusWriterTest, LabelValuesThatAreNotUtf8GetReplacementCharacters) {
  PrometheusWriter w;
  w.Gauges("kvd_test", "h", {{{{"model", "caf\xe9"}}, 1}});
  EXPECT_EQ(w.text(),
            "# HELP kvd_test h\n# TYPE kvd_test gauge\nkvd_test{model=\"caf\uFFFD\"} 1\n");
  EXPECT_TRUE(IsValidUtf8(w.text()));
}

TEST(PrometheusWriterTest, CountersGetTheTotalSuffix) {
  PrometheusWriter w;
  w.Counter("kvd_things", "Things.", 2);
  EXPECT_EQ(w.text(),
            "# HELP kvd_things_total Things.\n# TYPE kvd_things_total counter\n"
            "kvd_things_total 2\n");
}

TEST(PrometheusWriterDeathTest, AFamilyNameMayBeUsedOnce) {
  PrometheusWriter w;
  w.Gauge("kvd_x", "X.", 1);
  EXPECT_DEATH(w.Gauge("kvd_x", "X again.", 2), "written twice");
  EXPECT_DEATH(w.Gauge("9bad", "Bad.", 2), "bad metric name");
}

}  // namespace
}  // namespace kvd
