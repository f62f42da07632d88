#ifndef KVD_SERVER_CALL_LIMIT_H_
#define KVD_SERVER_CALL_LIMIT_H_

// How many gRPC calls `kvd serve` handles at once (`server.max_concurrent_calls`).
//
// gRPC's synchronous server runs every call on a thread of its own and, left alone, creates
// one for each call clients open. Streams are long (a whole generation), so a burst of
// clients, or clients that stop reading their streams, would have the daemon create threads
// without bound: each costs a stack, and they count against the process's thread limit (a
// container's pids limit), which the engine's and the metrics server's own threads share.
// LimitConcurrentCalls caps them. Past the cap gRPC answers a new call RESOURCE_EXHAUSTED
// (message "Server Threadpool Exhausted") without giving it a thread; the calls already
// running go on, and a call that ends makes room for the next. gRPC's health service
// (grpc.health.v1, Kubernetes' probes) runs on gRPC's callback threads, outside the cap, so a
// daemon at the cap still answers its probes (call_limit_test.cc checks it).

#include <grpcpp/server_builder.h>

#include <cstdint>

#include "config/inference_config.h"

namespace kvd {

// Calls beyond one stream per running and per queued request that the automatic cap
// allows: calls being refused or writing their last message, GetModelInfo, GetCacheStats,
// CloseSession and reflection.
inline constexpr int32_t kSpareCalls = 64;

// server.max_concurrent_calls, or for 0 (automatic) kv_cache_config.max_batch_size +
// server.max_waiting_requests + kSpareCalls: the engine never holds more requests than the
// batch and the queue, so the automatic cap refuses only calls the engine would refuse too,
// or calls past the spare ones.
// REQUIRES: config.Validate() is OK.
int32_t MaxConcurrentCalls(const InferenceConfig& config);

// Makes the server `builder` builds handle at most `max_calls` calls at once (the header
// comment says what happens to the others). Sets the builder's resource quota and its
// synchronous server's pollers; call before BuildAndStart.
// REQUIRES: max_calls >= 1.
void LimitConcurrentCalls(int32_t max_calls, grpc::ServerBuilder* builder);

}  // namespace kvd

#endif  // KVD_SERVER_CALL_LIMIT_H_
