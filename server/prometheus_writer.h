#ifndef KVD_SERVER_PROMETHEUS_WRITER_H_
#define KVD_SERVER_PROMETHEUS_WRITER_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvd {

struct Histogram;  // scheduler/engine_stats.h

// A label set, in output order: {{"state", "free"}, ...}.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Builds one scrape in the Prometheus text exposition format, version 0.0.4: for every
// metric family a `# HELP` and a `# TYPE` line, then its samples, one per line:
//   name{label="value",...} value
// Values are printed exactly (integers as integers, other numbers in the shortest form that
// reads back to the same double, +Inf/-Inf/NaN spelled as Prometheus does); label values are
// escaped (\\, \", \n).
//
// Invariants the writer keeps (CHECK-fails otherwise, since they are programming errors):
// names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*, and each family
// name is used once. Counter names are given without `_total`, which the writer appends.
// Not thread safe; one writer per scrape.
class PrometheusWriter {
 public:
  void Gauge(absl::string_view name, absl::string_view help, double value);
  // Several samples of one gauge family, told apart by labels.
  void Gauges(absl::string_view name, absl::string_view help,
              const std::vector<std::pair<MetricLabels, double>>& samples);
  void Counter(absl::string_view name, absl::string_view help, double value);
  void Counters(absl::string_view name, absl::string_view help,
                const std::vector<std::pair<MetricLabels, double>>& samples);
  // `name_bucket{le="..."}` (cumulative, ending with le="+Inf" == count), `name_sum`,
  // `name_count` (== the +Inf bucket). Counts beyond the bounds go to +Inf; missing
  // counts read as 0.
  void HistogramFamily(absl::string_view name, absl::string_view help, const Histogram& histogram);
  // A summary from precomputed quantiles: name{quantile="q"}, name_sum, name_count.
  void Summary(absl::string_view name, absl::string_view help,
               const std::vector<std::pair<double, double>>& quantiles, double sum, int64_t count);

  const std::string& text() const { return text_; }

  // How a sample value is printed ("42", "0.25", "+Inf", "NaN").
  static std::string FormatValue(double value);
  // `value` with \\, \" and \n escaped, and each invalid UTF-8 run replaced by U+FFFD.
  static std::string EscapeLabelValue(absl::string_view value);

 private:
  void Header(absl::string_view name, absl::string_view help, absl::string_view type);
  void Sample(absl::string_view name, const MetricLabels& labels, double value);

  std::string text_;
  std::set<std::string> families_;
};

}  // namespace kvd

#endif  // KVD_SERVER_PROMETHEUS_WRITER_H_
