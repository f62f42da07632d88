#include "tools/cpu_count.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvd {
namespace {

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::optional<int> CpusFromQuota(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<int>(std::max<int64_t>(1, (quota + period - 1) / period));
}

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The tightest cpu.max from the process's cgroup up to the root of the v2 hierarchy (a
// container sees its own cgroup as the root; on a host, a systemd slice's limit sits above).
std::optional<int> CgroupV2Limit() {
  const std::optional<std::string> self = ReadSmallFile("/proc/self/cgroup");
  if (!self) return std::nullopt;
  std::string path;
  for (absl::string_view line : absl::StrSplit(*self, '\n')) {
    if (absl::ConsumePrefix(&line, "0::")) path = std::string(line);
  }
  if (path.empty() || path[0] != '/') return std::nullopt;
  std::optional<int> limit;
  while (true) {
    const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
    if (const std::optional<std::string> max = ReadSmallFile(dir + "/cpu.max")) {
      if (const std::optional<int> cpus = CpusFromCgroupV2Max(*max)) {
        limit = limit ? std::min(*limit, *cpus) : *cpus;
      }
    }
    if (path == "/") break;
    path = path.substr(0, std::max<size_t>(1, path.rfind('/')));
  }
  return limit;
}

std::optional<int> CgroupV1Limit() {
  const std::optional<std::string> quota = ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const std::optional<std::string> period = ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  return CpusFromCgroupV1(*quota, *period);
}

}  // namespace

std::optional<int> CpusFromCgroupV2Max(std::string_view cpu_max) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(AsAbsl(cpu_max)), ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period)) {
    return std::nullopt;  // "max 100000" (no limit) or not a cpu.max line
  }
  return CpusFromQuota(quota, period);
}

std::optional<int> CpusFromCgroupV1(std::string_view quota_us, std::string_view period_us) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(AsAbsl(quota_us)), &quota) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(AsAbsl(period_us)), &period)) {
    return std::nullopt;
  }
  return CpusFromQuota(quota, period);  // -1: no limit
}

int UsableCpus() {
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  std::optional<int> quota = CgroupV2Limit();
  if (!quota) quota = CgroupV1Limit();
  if (quota) cpus = std::min(cpus, *quota);
  return std::max(1, cpus);
}

}  // namespace kvd
