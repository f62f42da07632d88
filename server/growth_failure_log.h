#ifndef KVD_SERVER_GROWTH_FAILURE_LOG_H_
#define KVD_SERVER_GROWTH_FAILURE_LOG_H_

#include <cstdint>
#include <ostream>

#include "cache/kv_cache_stats.h"

namespace kvd {

// Tells the operator when the KV arena could not grow (device or host memory ran out below
// memory_pool.max_size): the pool then serves within the chunks it has, evicting cached
// blocks, which the capacity metrics (at max_size) would not show. Reports the first failure
// and then the 2nd, 4th, 8th, ... (a pool that fails again at each growth_retry_interval, or
// each time a chunk comes and goes, must not flood the log), each with the arena's error. Not
// thread safe; the serve loop calls Check with each stats snapshot it polls.
class GrowthFailureLog {
 public:
  // Writes one line to `err` when `stats` has reached the next count to report.
  void Check(const KvCacheStats& stats, std::ostream& err);

 private:
  int64_t next_report_ = 1;
};

}  // namespace kvd

#endif  // KVD_SERVER_GROWTH_FAILURE_LOG_H_
