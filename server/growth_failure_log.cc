#include "server/growth_failure_log.h"

namespace kvd {

void GrowthFailureLog::Check(const KvCacheStats& stats, std::ostream& err) {
  if (stats.chunk_growth_failures < next_report_) return;
  err << "kvd: warning: the KV pool could not grow past " << stats.num_chunks << " of "
      << stats.max_chunks << " chunks (" << stats.total_blocks << " of " << stats.max_blocks
      << " blocks): " << stats.last_growth_error
      << "; it serves within them, evicting cached blocks, and tries one chunk again after "
         "memory_pool.growth_retry_interval, or grows once a chunk is released ("
      << stats.chunk_growth_failures
      << (stats.chunk_growth_failures == 1 ? " failure" : " failures")
      << " so far: kvd_kv_pool_growth_failures_total)\n"
      << std::flush;
  while (next_report_ <= stats.chunk_growth_failures) next_report_ *= 2;
}

}  // namespace kvd
