#include "server/prometheus_writer.h"

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "config/value_codec.h"
#include "scheduler/engine_stats.h"
#include "server/utf8.h"

namespace kvd {

namespace {

bool IsMetricName(absl::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

void Check(bool ok, absl::string_view what, absl::string_view name) {
  if (ok) return;
  std::cerr << "PrometheusWriter: " << what << ": '" << name << "'\n";
  std::abort();
}

// Help text may not contain raw newlines or backslashes.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string PrometheusWriter::FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Counts read as integers ("1000000", where the shortest form would be "1e+06").
  if (value == std::trunc(value) && std::fabs(value) < 9.007199254740992e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  // The shortest text that reads back to the same double: bucket bounds such as 0.1 print
  // as "0.1", not "0.10000000000000001", so `le` labels match what dashboards query.
  static const ValueCodec<double> kNumber = NumberCodec();
  return kNumber.format(value);
}

std::string PrometheusWriter::EscapeLabelValue(absl::string_view value) {
  std::string out;
  // The format is UTF-8: one stray byte (a model file named in Latin-1) would make
  // Prometheus reject the whole scrape.
  for (char c : ToValidUtf8(value)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PrometheusWriter::Header(absl::string_view name, absl::string_view help,
                              absl::string_view type) {
  Check(IsMetricName(name, /*allow_colon=*/true), "bad metric name", name);
  Check(families_.insert(std::string(name)).second, "metric family written twice", name);
  absl::StrAppend(&text_, "# HELP ", name, " ", EscapeHelp(help), "\n");
  absl::StrAppend(&text_, "# TYPE ", name, " ", type, "\n");
}

void PrometheusWriter::Sample(absl::string_view name, const MetricLabels& labels, double value) {
  text_.append(name.data(), name.size());
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      Check(IsMetricName(labels[i].first, /*allow_colon=*/false), "bad label name",
            labels[i].first);
      absl::StrAppend(&text_, i > 0 ? "," : "", labels[i].first, "=\"",
                      EscapeLabelValue(labels[i].second), "\"");
    }
    text_ += '}';
  }
  absl::StrAppend(&text_, " ", FormatValue(value), "\n");
}

void PrometheusWriter::Gauge(absl::string_view name, absl::string_view help, double value) {
  Gauges(name, help, {{MetricLabels{}, value}});
}

void PrometheusWriter::Gauges(absl::string_view name, absl::string_view help,
                              const std::vector<std::pair<MetricLabels, double>>& samples) {
  Header(name, help, "gauge");
  for (const auto& [labels, value] : samples) Sample(name, labels, value);
}

void PrometheusWriter::Counter(absl::string_view name, absl::string_view help, double value) {
  Counters(name, help, {{MetricLabels{}, value}});
}

void PrometheusWriter::Counters(absl::string_view name, absl::string_view help,
                                const std::vector<std::pair<MetricLabels, double>>& samples) {
  // In format 0.0.4 the family is named with the suffix, so that HELP/TYPE and the samples
  // agree for every parser.
  const std::string full = absl::StrCat(name, "_total");
  Header(full, help, "counter");
  for (const auto& [labels, value] : samples) Sample(full, labels, value);
}

void PrometheusWriter::HistogramFamily(absl::string_view name, absl::string_view help,
                                       const Histogram& h) {
  Header(name, help, "histogram");
  const std::string bucket = absl::StrCat(name, "_bucket");
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    if (i < h.counts.size()) cumulative += h.counts[i];
    Sample(bucket, {{"le", FormatValue(h.bounds[i])}}, static_cast<double>(cumulative));
  }
  // A scrape must never take the daemon down: a histogram whose counts are short (e.g.
  // default-constructed) reads as zeros; anything past the bounds lands in +Inf.
  for (size_t i = h.bounds.size(); i < h.counts.size(); ++i) cumulative += h.counts[i];
  Sample(bucket, {{"le", "+Inf"}}, static_cast<double>(cumulative));
  Sample(absl::StrCat(name, "_sum"), {}, h.sum);
  Sample(absl::StrCat(name, "_count"), {}, static_cast<double>(cumulative));
}

void PrometheusWriter::Summary(absl::string_view name, absl::string_view help,
                               const std::vector<std::pair<double, double>>& quantiles, double sum,
                               int64_t count) {
  Header(name, help, "summary");
  for (const auto& [q, value] : quantiles) {
    Sample(name, {{"quantile", FormatValue(q)}}, value);
  }
  Sample(absl::StrCat(name, "_sum"), {}, sum);
  Sample(absl::StrCat(name, "_count"), {}, static_cast<double>(count));
}

}  // namespace kvd
