#include "server/inference_service.h"

#include <chrono>
#include <deque>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/grpc_status.h"
#include "server/utf8.h"

namespace kvd {

namespace {

// The per-call hand-off from the engine thread (Push, quick, never blocks on the client)
// to the handler thread (PopAll). Shared by both through a shared_ptr, so a handler that
// gives up waiting never leaves the engine pushing into freed memory.
class EventQueue {
 public:
  void Push(const StreamEvent& event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
  }

  // Waits up to `timeout` for an event, then takes everything queued (maybe nothing).
  std::vector<StreamEvent> PopAll(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &EventQueue::HasEvents), timeout);
    std::vector<StreamEvent> out(std::make_move_iterator(events_.begin()),
                                 std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

 private:
  bool HasEvents() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty(); }

  absl::Mutex mu_;
  std::deque<StreamEvent> events_ ABSL_GUARDED_BY(mu_);
};

// gRPC's deadline as a time on `clock` (the engine's); "no deadline" (and anything absurdly
// far) is infinite. gRPC gives it on the system clock, which the engine's need not follow
// (the daemon's is monotonic): the time left is what carries over.
absl::Time DeadlineOf(const grpc::ServerContext& context, const Clock& clock) {
  const auto deadline = context.deadline();
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + std::chrono::hours(24 * 365)) return absl::InfiniteFuture();
  return clock.Now() + absl::FromChrono(deadline - now);
}

void FillUsage(const Usage& u, v1::Usage* out) {
  out->set_prompt_tokens(static_cast<uint32_t>(u.prompt_tokens));
  out->set_cached_prompt_tokens(static_cast<uint32_t>(u.cached_prompt_tokens));
  out->set_completion_tokens(static_cast<uint32_t>(u.completion_tokens));
  out->set_num_preemptions(static_cast<uint32_t>(u.num_preemptions));
  out->set_queue_time_seconds(absl::ToDoubleSeconds(u.queue_time));
  out->set_time_to_first_token_seconds(absl::ToDoubleSeconds(u.time_to_first_token));
  out->set_total_time_seconds(absl::ToDoubleSeconds(u.total_time));
}

bool WriteEvent(const StreamEvent& event, const std::string& request_id,
                grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  v1::GenerateResponse response;
  for (int32_t id : event.token_ids) response.add_token_ids(static_cast<uint32_t>(id));
  // The engine streams whole characters; this guards the proto3 contract regardless.
  response.set_text(ToValidUtf8(event.text));
  response.set_request_id(request_id);
  if (event.finished) {
    const std::string_view reason = FinishReasonName(event.finish_reason);
    response.set_finish_reason(std::string(reason));
    FillUsage(event.usage, response.mutable_usage());
  }
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<v1::GenerateResponse>::Serialize(response, &buffer, &own_buffer)
           .ok()) {
    return false;
  }
  return stream->Write(buffer);
}

// Reads the call's one request message as wire bytes.
absl::StatusOr<std::string> ReadRequestBytes(
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  grpc::ByteBuffer raw;
  if (!stream->Read(&raw)) return absl::InvalidArgumentError("request: no request message sent");
  std::vector<grpc::Slice> slices;
  if (!raw.Dump(&slices).ok()) return absl::InvalidArgumentError("request: unreadable message");
  std::string wire;
  for (const grpc::Slice& slice : slices) {
    wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return wire;
}

// The status a call ends with once its final event has been written.
grpc::Status StatusForFinish(FinishReason reason) {
  switch (reason) {
    case FinishReason::kCancelled:
      return grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled");
    case FinishReason::kDeadline:
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the request's deadline passed before it finished");
    case FinishReason::kAborted:  // the engine gives an aborted request its error: a fallback
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server aborted the request");
    default:
      return grpc::Status::OK;
  }
}

}  // namespace

InferenceService::InferenceService(EngineLoop* engine, RequestValidator validator,
                                   ServedModelInfo model)
    : engine_(engine), validator_(std::move(validator)), model_(std::move(model)) {
  // Generate and CloseSession (methods 0 and 1 of kvd.v1.Inference) read raw bytes: see the
  // class comment. A server-streaming or unary call is, from the server's side, a bidi stream
  // with one read.
  using RawHandler =
      grpc::internal::BidiStreamingHandler<InferenceService, grpc::ByteBuffer, grpc::ByteBuffer>;
  MarkMethodStreamed(0,
                     new RawHandler(
                         [](InferenceService* service, grpc::ServerContext* context,
                            grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                           const OpenCall open(service);
                           return service->GenerateRaw(context, stream);
                         },
                         this));
  MarkMethodStreamed(1,
                     new RawHandler(
                         [](InferenceService* service, grpc::ServerContext* context,
                            grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                           const OpenCall open(service);
                           return service->CloseSessionRaw(context, stream);
                         },
                         this));
}

InferenceService::OpenCall::OpenCall(InferenceService* service) : service_(service) {
  absl::MutexLock lock(&service_->calls_mu_);
  ++service_->open_calls_;
}

InferenceService::OpenCall::~OpenCall() {
  absl::MutexLock lock(&service_->calls_mu_);
  --service_->open_calls_;
}

int InferenceService::open_calls() const {
  absl::MutexLock lock(&calls_mu_);
  return open_calls_;
}

bool InferenceService::WaitForCallsToEnd(absl::Duration timeout) {
  absl::MutexLock lock(&calls_mu_);
  auto none_open = [this]() ABSL_SHARED_LOCKS_REQUIRED(calls_mu_) { return open_calls_ == 0; };
  return calls_mu_.AwaitWithTimeout(absl::Condition(&none_open), timeout);
}

grpc::Status InferenceService::GenerateRaw(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  absl::StatusOr<std::string> wire = ReadRequestBytes(stream);
  if (!wire.ok()) return ToGrpcStatus(wire.status());
  v1::GenerateRequest proto;
  if (absl::Status s = ParseGenerateRequest(*wire, &proto); !s.ok()) return ToGrpcStatus(s);
  if (draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is draining; retry elsewhere");
  }
  absl::StatusOr<Request> request = validator_.Validate(proto);
  if (!request.ok()) return ToGrpcStatus(request.status());
  if (request->request_id.empty()) {
    request->request_id = absl::StrCat("kvd-", next_request_id_.fetch_add(1));
  }
  request->deadline = DeadlineOf(*context, engine_->clock());
  const std::string request_id = request->request_id;

  auto queue = std::make_shared<EventQueue>();
  absl::StatusOr<uint64_t> handle =
      engine_->Submit(*std::move(request), [queue](const StreamEvent& e) { queue->Push(e); });
  if (!handle.ok()) return ToGrpcStatus(handle.status());

  bool client_gone = false;  // cancelled, disconnected, deadline passed or a write failed
  bool finished = false;
  std::chrono::steady_clock::time_point gave_up_at;
  while (!finished) {
    for (const StreamEvent& event : queue->PopAll(kPollInterval)) {
      // A final event that carries an error (the drain timeout stopped the engine, the pool
      // cannot hold the request) is still written first: the client gets its finish reason
      // (`aborted`), its usage and the text flushed at the end, then the error status.
      if (!client_gone && !WriteEvent(event, request_id, stream)) {
        client_gone = true;
        gave_up_at = std::chrono::steady_clock::now();
        engine_->Cancel(*handle);
      }
      if (event.finished) {
        if (!client_gone) {
          return event.error.ok() ? StatusForFinish(event.finish_reason)
                                  : ToGrpcStatus(event.error);
        }
        finished = true;
        break;
      }
    }
    if (finished) break;
    if (!client_gone && context->IsCancelled()) {
      client_gone = true;
      gave_up_at = std::chrono::steady_clock::now();
      engine_->Cancel(*handle);
    }
    // The engine answers a Cancel within a step; waiting for that final event keeps the
    // request's lifetime inside this call. Bounded, in case the engine is stopping.
    if (client_gone &&
        absl::FromChrono(std::chrono::steady_clock::now() - gave_up_at) > kCancelGrace) {
      break;
    }
  }
  if (std::chrono::system_clock::now() >= context->deadline()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request");
}

grpc::Status InferenceService::CloseSessionRaw(
    grpc::ServerContext*, grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  absl::StatusOr<std::string> wire = ReadRequestBytes(stream);
  if (!wire.ok()) return ToGrpcStatus(wire.status());
  v1::CloseSessionRequest request;
  if (absl::Status s = ParseRequestMessage(*wire, &request); !s.ok()) return ToGrpcStatus(s);
  if (grpc::Status status = CloseSessionParsed(request); !status.ok()) return status;
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<v1::CloseSessionResponse>::Serialize(v1::CloseSessionResponse(),
                                                                      &buffer, &own_buffer)
           .ok() ||
      !stream->Write(buffer)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  return grpc::Status::OK;
}

grpc::Status InferenceService::CloseSessionParsed(const v1::CloseSessionRequest& request) {
  const std::string& id = request.session_id();
  if (absl::Status s = validator_.ValidateSessionToClose(id); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(engine_->CloseSession(id));
}

grpc::Status InferenceService::GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                                            v1::ModelInfo* info) {
  const ModelSpec& spec = model_.spec;
  info->set_name(ToValidUtf8(spec.name));  // a file stem; proto3 strings must be UTF-8
  info->set_num_layers(static_cast<uint32_t>(spec.num_layers));
  info->set_dim(static_cast<uint32_t>(spec.dim));
  info->set_num_heads(static_cast<uint32_t>(spec.num_heads));
  info->set_num_kv_heads(static_cast<uint32_t>(spec.num_kv_heads));
  info->set_head_dim(static_cast<uint32_t>(spec.head_dim));
  info->set_vocab_size(static_cast<uint32_t>(spec.vocab_size));
  info->set_max_context_tokens(static_cast<uint32_t>(model_.max_context_tokens));
  info->set_bos_token_id(static_cast<uint32_t>(spec.bos_token_id));
  info->set_eos_token_id(static_cast<uint32_t>(spec.eos_token_id));
  info->set_backend(model_.backend);
  info->set_kv_dtype(model_.kv_dtype);
  info->set_block_size(static_cast<uint32_t>(model_.block_size));
  for (const int32_t id : spec.StopTokenIds()) info->add_end_token_ids(static_cast<uint32_t>(id));
  return grpc::Status::OK;
}

grpc::Status InferenceService::GetCacheStats(grpc::ServerContext*, const v1::GetCacheStatsRequest*,
                                             v1::CacheStats* out) {
  const EngineStats s = engine_->Stats();
  const KvCacheStats& c = s.cache;
  out->set_block_size(static_cast<uint32_t>(c.block_size));
  out->set_block_bytes(static_cast<uint64_t>(c.block_bytes));
  out->set_total_blocks(static_cast<uint64_t>(c.total_blocks));
  out->set_free_blocks(static_cast<uint64_t>(c.free_blocks));
  out->set_used_blocks(static_cast<uint64_t>(c.used_blocks));
  out->set_cached_blocks(static_cast<uint64_t>(c.cached_blocks));
  out->set_pinned_blocks(static_cast<uint64_t>(c.pinned_blocks));
  out->set_total_bytes(static_cast<uint64_t>(c.total_bytes));
  out->set_used_bytes(static_cast<uint64_t>(c.used_bytes));
  out->set_max_bytes(static_cast<uint64_t>(c.max_bytes));
  out->set_num_sequences(static_cast<uint32_t>(c.num_sequences));
  out->set_num_sessions(static_cast<uint32_t>(c.num_sessions));
  out->set_prefix_query_tokens(static_cast<uint64_t>(c.prefix_query_tokens));
  out->set_prefix_hit_tokens(static_cast<uint64_t>(c.prefix_hit_tokens));
  out->set_session_hit_tokens(static_cast<uint64_t>(c.session_hit_tokens));
  out->set_evictions(static_cast<uint64_t>(c.evictions));
  out->set_session_releases_idle(static_cast<uint64_t>(c.session_releases_idle));
  out->set_session_releases_pin_cap(static_cast<uint64_t>(c.session_releases_pin_cap));
  out->set_session_releases_closed(static_cast<uint64_t>(c.session_releases_closed));
  out->set_session_releases_pressure(static_cast<uint64_t>(c.session_releases_pressure));
  out->set_defrag_moves(static_cast<uint64_t>(c.defrag_moves));
  out->set_preemptions(static_cast<uint64_t>(s.preemptions));
  out->set_requests_waiting(static_cast<uint32_t>(s.requests_waiting));
  out->set_requests_running(static_cast<uint32_t>(s.requests_running));
  out->set_num_chunks(static_cast<uint32_t>(c.num_chunks));
  out->set_max_blocks(static_cast<uint64_t>(c.max_blocks));
  out->set_cached_bytes(static_cast<uint64_t>(c.cached_bytes));
  out->set_num_prefix_keys(static_cast<uint64_t>(c.num_prefix_keys));
  out->set_requests_finished(static_cast<uint64_t>(s.requests_finished));
  out->set_requests_rejected(static_cast<uint64_t>(s.requests_rejected));
  out->set_prompt_tokens(static_cast<uint64_t>(s.prompt_tokens));
  out->set_computed_prompt_tokens(static_cast<uint64_t>(s.computed_prompt_tokens));
  out->set_generated_tokens(static_cast<uint64_t>(s.generated_tokens));
  out->set_weights_bytes(static_cast<uint64_t>(s.memory.weights_bytes));
  out->set_activation_bytes(static_cast<uint64_t>(s.memory.activation_bytes));
  out->set_workspace_bytes(static_cast<uint64_t>(s.memory.workspace_bytes));
  out->set_block_references(static_cast<uint64_t>(c.block_references));
  out->set_shared_blocks(static_cast<uint64_t>(c.shared_blocks));
  out->set_obtainable_blocks(static_cast<uint64_t>(c.obtainable_blocks));
  return grpc::Status::OK;
}

}  // namespace kvd
