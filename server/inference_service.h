#ifndef KVD_SERVER_INFERENCE_SERVICE_H_
#define KVD_SERVER_INFERENCE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvd/v1/kvd.grpc.pb.h"
#include "model/model_spec.h"
#include "scheduler/engine_loop.h"
#include "server/request_validator.h"

namespace kvd {

// What GetModelInfo reports beyond the ModelSpec.
struct ServedModelInfo {
  ModelSpec spec;
  std::string backend;   // "cpu"
  std::string kv_dtype;  // "f32"
  int32_t block_size = 0;
  int32_t max_context_tokens = 0;  // min(model context, max_seq_length)
};

// The kvd.v1.Inference gRPC service (synchronous API: one handler thread per call).
//
// Generate validates the request (RequestValidator), submits it to the EngineLoop and
// relays the engine's StreamEvents to the client as they arrive, through a small per-call
// queue that the engine thread fills and the handler thread drains. While waiting it polls
// ServerContext::IsCancelled() every kPollInterval: a client that cancels or disconnects,
// or whose deadline passes, gets its request cancelled through EngineLoop::Cancel (its
// blocks are freed within one engine step). Statuses: INVALID_ARGUMENT for bad fields
// (naming the field), RESOURCE_EXHAUSTED / UNAVAILABLE from admission, CANCELLED,
// DEADLINE_EXCEEDED; after BeginDrain() new calls get UNAVAILABLE at once. A request the
// engine ends with an error (stopped at the drain timeout: UNAVAILABLE; the KV pool cannot
// hold it: RESOURCE_EXHAUSTED) still gets its final message (finish reason `aborted`, usage,
// the last text) before that status.
//
// Generate and CloseSession read their requests as raw bytes (the methods are registered
// "streamed", see InferenceService()), so that a string field that is not UTF-8 is
// INVALID_ARGUMENT naming the field rather than protobuf's anonymous parse failure. On the
// wire they are the ordinary server-streaming Generate and unary CloseSession.
//
// Thread safe: gRPC calls the handlers concurrently. Does not own the engine (nor the
// validator's tokenizer); they must outlive the gRPC server this service is registered with.
class InferenceService final : public v1::Inference::Service {
 public:
  static constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
  // How long a cancelled call waits for the engine's final event before returning anyway.
  static constexpr absl::Duration kCancelGrace = absl::Seconds(5);

  InferenceService(EngineLoop* engine, RequestValidator validator, ServedModelInfo model);

  // New Generate calls fail with UNAVAILABLE from now on; calls in flight run on.
  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // Generate and CloseSession calls whose handlers are running.
  int open_calls() const;
  // Blocks until no Generate or CloseSession handler runs, or `timeout` passes; false on the
  // timeout. Once the engine has stopped, every stream has its final event and its handler
  // only writes it and returns: the daemon waits for that before the gRPC server shuts down,
  // so that each stream's last message and status go out before the server's GOAWAY and no
  // connection is closed straight after a stream's last bytes.
  bool WaitForCallsToEnd(absl::Duration timeout);

  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* response) override;
  grpc::Status GetCacheStats(grpc::ServerContext* context, const v1::GetCacheStatsRequest* request,
                             v1::CacheStats* response) override;

 private:
  // The Generate handler, on raw bytes (see the class comment).
  grpc::Status GenerateRaw(grpc::ServerContext* context,
                           grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  // The CloseSession handler, on raw bytes; parses, then calls CloseSessionParsed.
  grpc::Status CloseSessionRaw(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  grpc::Status CloseSessionParsed(const v1::CloseSessionRequest& request);

  // Counts a handler in open_calls_ for its lifetime.
  class OpenCall {
   public:
    explicit OpenCall(InferenceService* service);
    ~OpenCall();
    OpenCall(const OpenCall&) = delete;
    OpenCall& operator=(const OpenCall&) = delete;

   private:
    InferenceService* const service_;
  };

  EngineLoop* const engine_;
  const RequestValidator validator_;
  const ServedModelInfo model_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_request_id_{1};
  mutable absl::Mutex calls_mu_;
  int open_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

}  // namespace kvd

#endif  // KVD_SERVER_INFERENCE_SERVICE_H_
