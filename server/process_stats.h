#ifndef KVD_SERVER_PROCESS_STATS_H_
#define KVD_SERVER_PROCESS_STATS_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvd {

// The figures Prometheus client libraries publish as their standard process collector
// (process_cpu_seconds_total, process_resident_memory_bytes, ...), plus the thread count, read
// from /proc (Linux). On the CPU backend the resident set is where the KV pool's committed
// pages show: the pool is reserved at its size but committed as blocks are first written.
struct ProcessStats {
  double cpu_seconds = 0;  // user + system time since the process started
  int64_t resident_bytes = 0;
  int64_t virtual_bytes = 0;
  double start_time_seconds = 0;  // since the Unix epoch
  int64_t threads = 0;
  int64_t open_fds = -1;  // -1 when /proc/self/fd could not be read
  int64_t max_fds = 0;  // the soft RLIMIT_NOFILE; 0 when unlimited or unknown
};

// What /proc/self/stat says (`stat`, its whole text), with the page size, clock ticks a second
// and the boot time (seconds since the epoch: /proc/stat's btime) it is read with; open_fds
// (-1) and max_fds (0) are left unknown. nullopt when the text is not a stat line (no ")" after the
// command name, fewer fields, or a field that is not a number).
std::optional<ProcessStats> ParseProcSelfStat(std::string_view stat, int64_t page_bytes,
                                              int64_t ticks_per_second, int64_t boot_time_seconds);

// This process's figures now; nullopt when /proc cannot be read (then the scrape has no
// process_* series). Thread safe.
std::optional<ProcessStats> ReadProcessStats();

}  // namespace kvd

#endif  // KVD_SERVER_PROCESS_STATS_H_
