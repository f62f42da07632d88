#include "server/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kvd {

std::optional<ProcessStats> ParseProcSelfStat(std::string_view stat, int64_t page_bytes,
                                              int64_t ticks_per_second, int64_t boot_time_seconds) {
  // "pid (comm) state ppid ...": the command name may hold spaces and parentheses, so the
  // fields start after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || ticks_per_second <= 0) return std::nullopt;
  const absl::string_view fields(stat.data() + close + 1, stat.size() - close - 1);
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::StripAsciiWhitespace(fields), ' ', absl::SkipEmpty());
  // f[0] is field 3 of proc(5) (state), so field n is f[n - 3].
  constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kThreads = 20 - 3, kStart = 22 - 3,
                   kVsize = 23 - 3, kRss = 24 - 3;
  if (f.size() <= kRss) return std::nullopt;
  uint64_t utime = 0, stime = 0, start = 0, vsize = 0;
  int64_t threads = 0, rss = 0;
  if (!absl::SimpleAtoi(f[kUtime], &utime) || !absl::SimpleAtoi(f[kStime], &stime) ||
      !absl::SimpleAtoi(f[kThreads], &threads) || !absl::SimpleAtoi(f[kStart], &start) ||
      !absl::SimpleAtoi(f[kVsize], &vsize) || !absl::SimpleAtoi(f[kRss], &rss)) {
    return std::nullopt;
  }
  const double ticks = static_cast<double>(ticks_per_second);
  ProcessStats p;
  p.cpu_seconds = static_cast<double>(utime + stime) / ticks;
  p.resident_bytes = rss * page_bytes;
  p.virtual_bytes = static_cast<int64_t>(vsize);
  p.start_time_seconds =
      static_cast<double>(boot_time_seconds) + static_cast<double>(start) / ticks;
  p.threads = threads;
  return p;
}

namespace {

std::string ReadAll(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// /proc/stat's "btime N" line: when the system booted, in seconds since the epoch.
std::optional<int64_t> BootTime() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    int64_t btime = 0;
    if (absl::ConsumePrefix(&rest, "btime ") && absl::SimpleAtoi(rest, &btime)) return btime;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ProcessStats> ReadProcessStats() {
  const std::optional<int64_t> boot = BootTime();
  if (!boot.has_value()) return std::nullopt;
  std::optional<ProcessStats> p = ParseProcSelfStat(
      ReadAll("/proc/self/stat"), sysconf(_SC_PAGESIZE), sysconf(_SC_CLK_TCK), *boot);
  if (!p.has_value()) return std::nullopt;
  std::error_code error;
  int64_t fds = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end;
       it.increment(error)) {
    ++fds;
  }
  // Less the descriptor that read the directory; a listing cut short says nothing.
  if (!error && fds > 0) p->open_fds = fds - 1;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    p->max_fds = static_cast<int64_t>(limit.rlim_cur);
  }
  return p;
}

}  // namespace kvd
