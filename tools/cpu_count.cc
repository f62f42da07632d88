#include "tools/cpu_count.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
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

// The tightest limit `at(dir)` finds in the cgroup directory `mount` + `path` and in each of
// its parents up to `mount`. A level whose files are missing or say "no limit" adds none: a
// container sees its own cgroup at the mount's root (v1 without a cgroup namespace still
// names the host's path, which is not there), and on a host a systemd slice's limit sits
// above the process's cgroup.
template <typename LimitAt>
std::optional<int> TightestUpTo(const std::string& mount, std::string path, LimitAt at) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  std::optional<int> limit;
  while (true) {
    if (const std::optional<int> cpus = at(mount + (path == "/" ? std::string() : path))) {
      limit = limit ? std::min(*limit, *cpus) : *cpus;
    }
    if (path == "/") break;
    path = path.substr(0, std::max<size_t>(1, path.rfind('/')));
  }
  return limit;
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

std::optional<int> CgroupCpuLimit(std::string_view self_cgroup, const std::string& root) {
  std::string v2_path, v1_path;
  for (absl::string_view line : absl::StrSplit(AsAbsl(self_cgroup), '\n')) {
    // "ID:CONTROLLERS:PATH": v2's line is "0::PATH"; v1's cpu line lists "cpu" among its
    // controllers ("4:cpu,cpuacct:/user.slice").
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) v2_path = std::string(fields[2]);
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "cpu") v1_path = std::string(fields[2]);
    }
  }
  if (std::optional<int> v2 = TightestUpTo(root, v2_path, [](const std::string& dir) {
        const std::optional<std::string> max = ReadSmallFile(dir + "/cpu.max");
        return max ? CpusFromCgroupV2Max(*max) : std::nullopt;
      })) {
    return v2;
  }
  // v1's cpu hierarchy is mounted as cpu, or as cpu,cpuacct (cpu then a link to it).
  for (const char* name : {"/cpu", "/cpu,cpuacct"}) {
    const std::string mount = root + name;
    if (!std::filesystem::is_directory(mount)) continue;
    return TightestUpTo(mount, v1_path, [](const std::string& dir) {
      const std::optional<std::string> quota = ReadSmallFile(dir + "/cpu.cfs_quota_us");
      const std::optional<std::string> period = ReadSmallFile(dir + "/cpu.cfs_period_us");
      return quota && period ? CpusFromCgroupV1(*quota, *period) : std::nullopt;
    });
  }
  return std::nullopt;
}

int UsableCpus() {
  int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  const std::optional<int> quota =
      CgroupCpuLimit(ReadSmallFile("/proc/self/cgroup").value_or(""), "/sys/fs/cgroup");
  if (quota) cpus = std::min(cpus, *quota);
  return std::max(1, cpus);
}

}  // namespace kvd
