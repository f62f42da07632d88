#include "server/call_limit.h"

#include <grpcpp/resource_quota.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>

namespace kvd {

int32_t MaxConcurrentCalls(const InferenceConfig& config) {
  if (config.server.max_concurrent_calls > 0) return config.server.max_concurrent_calls;
  return config.kv_cache.max_batch_size + config.server.max_waiting_requests + kSpareCalls;
}

void LimitConcurrentCalls(int32_t max_calls, grpc::ServerBuilder* builder) {
  if (max_calls < 1) {
    std::cerr << "LimitConcurrentCalls: max_calls " << max_calls << " is not >= 1\n";
    std::abort();
  }
  // The quota counts every thread of the synchronous server, those handling a call and those
  // polling for the next. With one completion queue and one poller kept, a poller that
  // takes a call while the quota is spent has no thread to leave polling, and gRPC refuses
  // the call: max_calls threads handle calls and one polls.
  builder->SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder->SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  grpc::ResourceQuota quota("kvd_calls");
  quota.SetMaxThreads(max_calls + 1);
  builder->SetResourceQuota(quota);
}

}  // namespace kvd
