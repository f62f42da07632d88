#ifndef KVD_TOOLS_CPU_COUNT_H_
#define KVD_TOOLS_CPU_COUNT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvd {

// The most CPU threads a --threads flag may ask for, as the config's server.num_threads.
inline constexpr int64_t kMaxCpuThreads = 1024;

// The CPUs this process may use: the calling thread's CPU affinity (the process's, unless
// a thread changed its own: taskset, a cpuset), capped by a cgroup CPU quota (docker
// --cpus, a Kubernetes CPU limit) rounded up; at least 1. What "all cores" means for the CPU
// backend's threads: std::thread::hardware_concurrency() counts the host's CPUs, so a container
// limited to 2 CPUs on a 128-core host would start 128 threads that the quota then throttles. Reads
// /proc/self/cgroup and /sys/fs/cgroup; a limit it cannot read counts as none.
int UsableCpus();

// The CPUs a cgroup v2 `cpu.max` file allows ("200000 100000" -> 2, "150000 100000" -> 2,
// "max 100000" -> no limit), or nullopt for no limit or text that is not such a line.
std::optional<int> CpusFromCgroupV2Max(std::string_view cpu_max);
// The same for cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us ("-1": no limit).
std::optional<int> CpusFromCgroupV1(std::string_view quota_us, std::string_view period_us);

// The tightest CPU quota on a process's cgroup and its ancestors, nullopt for none.
// `self_cgroup` is the process's /proc/self/cgroup, `root` the cgroup mount (/sys/fs/cgroup).
// v2 (the "0::PATH" line): cpu.max in root/PATH and each parent up to root. Where v2 sets
// none, v1 (the line whose controllers include cpu): cpu.cfs_quota_us and cpu.cfs_period_us
// in root/cpu/PATH (or root/cpu,cpuacct/PATH) and each parent.
std::optional<int> CgroupCpuLimit(std::string_view self_cgroup, const std::string& root);

}  // namespace kvd

#endif  // KVD_TOOLS_CPU_COUNT_H_
