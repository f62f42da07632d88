#include "server/inference_service.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/clock.h"
#include "kernels/cpu_backend.h"
#include "kvd/v1/kvd.grpc.pb.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "model/tokenizer.h"
#include "scheduler/engine_loop.h"
#include "tools/engine_setup.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The real service over the real engine on stories260K, in process, on a free port.
class InferenceServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = LoadModel(KVD_SHARED_DIR "/models/stories260K.bin");
    ASSERT_TRUE(weights.ok()) << weights.status();
    spec_ = weights->spec;
    auto tok = Tokenizer::LoadLlama2c(KVD_SHARED_DIR "/models/tok512.bin", spec_.vocab_size);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    backend_ = std::make_unique<CpuBackend>(1);
    auto model = LlamaModel::Create(*weights, backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    auto cache = CreateCacheForSequences(spec_, backend_.get(), &clock_, 16, 4);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    engine_ = std::make_unique<EngineLoop>(EngineOptions{}, model_.get(), cache_.get(),
                                           tokenizer_.get(), &clock_);
    engine_->Start();

    RequestLimits limits;
    limits.vocab_size = spec_.vocab_size;
    limits.max_context_tokens = spec_.max_context_tokens;
    limits.default_stop_token_ids = {spec_.bos_token_id};
    ServedModelInfo info;
    info.spec = spec_;
    info.backend = "cpu";
    info.kv_dtype = "f32";
    info.block_size = 16;
    info.max_context_tokens = spec_.max_context_tokens;
    service_ = std::make_unique<InferenceService>(engine_.get(),
                                                  RequestValidator(limits, tokenizer_.get()), info);

    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel_);
  }

  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (engine_) engine_->Stop();
  }

  struct Stream {
    std::vector<uint32_t> tokens;
    std::string text;
    v1::GenerateResponse last;
    grpc::Status status;
  };

  Stream Generate(const v1::GenerateRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->Generate(&context, request);
    Stream s;
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      s.tokens.insert(s.tokens.end(), r.token_ids().begin(), r.token_ids().end());
      s.text += r.text();
      s.last = r;
    }
    s.status = reader->Finish();
    return s;
  }

  // Sends `wire` as the request of `method` and returns the call's status (raw bytes, since
  // protobuf will not build a message whose string field is not UTF-8).
  grpc::Status RawCall(const std::string& method, const std::string& wire) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    grpc::Slice slice(wire);
    grpc::ByteBuffer request(&slice, 1);
    grpc::CompletionQueue cq;
    // Send the bytes, half-close, read until the status: works for unary and streaming.
    auto call = generic.PrepareCall(&context, method, &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    EXPECT_TRUE(cq.Next(&tag, &ok) && ok);
    call->Write(request, reinterpret_cast<void*>(2));
    EXPECT_TRUE(cq.Next(&tag, &ok));
    call->WritesDone(reinterpret_cast<void*>(3));
    EXPECT_TRUE(cq.Next(&tag, &ok));
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return status;
  }

  // Waits until the engine holds no request and no KV block.
  bool WaitForIdleCache() {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (absl::Now() < end) {
      const EngineStats s = engine_->Stats();
      if (s.requests_running == 0 && s.requests_waiting == 0 && s.cache.used_blocks == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // Real time, but 40 years ahead of the system clock, as the daemon's monotonic clock may
  // stray from it: a deadline must carry over as the time left (a gRPC deadline taken as a
  // time on this clock would have passed long ago).
  class FarAheadClock final : public Clock {
   public:
    absl::Time Now() const override { return real_.Now() + absl::Hours(40 * 365 * 24); }

   private:
    RealClock real_;
  };
  FarAheadClock clock_;
  ModelSpec spec_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCacheManager> cache_;
  std::unique_ptr<EngineLoop> engine_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

// Every golden case, up to the full 512-token context, through the whole gRPC path.
TEST_F(InferenceServiceTest, GreedyStreamsEqualTheGoldenOutputs) {
  std::ifstream golden(KVD_SHARED_DIR "/models/golden/stories260K_greedy.jsonl");
  std::string line;
  int cases = 0;
  while (std::getline(golden, line)) {
    const nlohmann::json want = nlohmann::json::parse(line);
    SCOPED_TRACE(line.substr(0, 80));
    v1::GenerateRequest request;
    request.set_prompt(want["prompt"].get<std::string>());
    request.set_max_tokens(want["max_new_tokens"].get<uint32_t>());
    const Stream s = Generate(request);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.tokens, want["output_tokens"].get<std::vector<uint32_t>>());
    EXPECT_EQ(s.text, want["completion_text"].get<std::string>());
    EXPECT_EQ(s.last.finish_reason(), want["stop"] == "length" ? "length" : "stop");
    EXPECT_EQ(s.last.usage().prompt_tokens(), want["prompt_tokens"].size());
    EXPECT_EQ(s.last.usage().completion_tokens(), s.tokens.size());
    EXPECT_THAT(s.last.request_id(), StartsWith("kvd-"));
    ++cases;
  }
  EXPECT_GE(cases, 10);
}

TEST_F(InferenceServiceTest, BadRequestIsInvalidArgumentAndServingContinues) {
  v1::GenerateRequest bad;
  bad.set_prompt("Once");
  bad.set_top_p(2.0f);
  const Stream s = Generate(bad);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.status.error_message(), StartsWith("top_p:"));

  v1::GenerateRequest good;
  good.set_prompt("Once");
  good.set_max_tokens(3);
  good.set_request_id("mine");
  const Stream ok = Generate(good);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.last.request_id(), "mine");
}

TEST_F(InferenceServiceTest, InvalidUtf8IsInvalidArgumentNamingTheField) {
  const std::string wire(
      "\x0a\x02"
      "a\xff",
      4);  // prompt = "a\xff"
  const grpc::Status status = RawCall("/kvd.v1.Inference/Generate", wire);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), StartsWith("prompt: is not valid UTF-8"));
}

TEST_F(InferenceServiceTest, CloseSessionWithInvalidUtf8IdIsInvalidArgumentNamingTheField) {
  const std::string wire(
      "\x0a\x02"
      "\xff\xfe",
      4);  // session_id = "\xff\xfe"
  const grpc::Status status = RawCall("/kvd.v1.Inference/CloseSession", wire);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), StartsWith("session_id: is not valid UTF-8"));

  // An id past the limit says how long it is.
  grpc::ClientContext long_context;
  v1::CloseSessionRequest long_id;
  long_id.set_session_id(std::string(300, 's'));
  v1::CloseSessionResponse long_response;
  const grpc::Status too_long = stub_->CloseSession(&long_context, long_id, &long_response);
  EXPECT_EQ(too_long.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_long.error_message(), HasSubstr("session_id: is 300 bytes long; allowed: 1 to"));

  // Nor can an id Generate would refuse (a control character, none at all) name a session to
  // close: refused as Generate refuses it, not answered NOT_FOUND.
  for (const std::string& bad : {std::string("s\x01"), std::string()}) {
    grpc::ClientContext bad_context;
    v1::CloseSessionRequest bad_id;
    bad_id.set_session_id(bad);
    v1::CloseSessionResponse bad_response;
    const grpc::Status refused = stub_->CloseSession(&bad_context, bad_id, &bad_response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.size();
    EXPECT_THAT(
        refused.error_message(),
        StartsWith(bad.empty() ? "session_id: is empty" : "session_id: contains a control"));
  }

  // Malformed bytes name the message type; a well-formed close still answers.
  const grpc::Status garbage = RawCall("/kvd.v1.Inference/CloseSession", "\xff\xff\xff");
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(garbage.error_message(), HasSubstr("kvd.v1.CloseSessionRequest"));
  grpc::ClientContext context;
  v1::CloseSessionRequest close;
  close.set_session_id("never-opened");
  v1::CloseSessionResponse closed;
  EXPECT_EQ(stub_->CloseSession(&context, close, &closed).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(InferenceServiceTest, ClientCancelFreesTheRequestsBlocks) {
  grpc::ClientContext context;
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_max_tokens(500);
  request.set_ignore_eos(true);
  auto reader = stub_->Generate(&context, request);
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  context.TryCancel();
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForIdleCache());
  // The client's library says CANCELLED whatever the server does, and the request would
  // free its blocks by itself once done: that the engine stopped it shows in what it made.
  EXPECT_LT(engine_->Stats().generated_tokens, 500);
}

TEST_F(InferenceServiceTest, PassedDeadlineIsDeadlineExceededAndLeaksNothing) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(5));
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_max_tokens(500);
  request.set_ignore_eos(true);
  auto reader = stub_->Generate(&context, request);
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitForIdleCache());
  EXPECT_LT(engine_->Stats().generated_tokens, 500);  // stopped, as for a cancel
}

// What the drain timeout does to a request still running: the engine stops, and the client
// still gets a final message (finish reason "aborted", usage counting every token it was
// sent, the text flushed so far), then UNAVAILABLE.
TEST_F(InferenceServiceTest, EngineStopEndsAStreamWithAnAbortedFinalMessageThenUnavailable) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_max_tokens(507);  // the whole context: long enough to be running at Stop()
  request.set_ignore_eos(true);
  auto reader = stub_->Generate(&context, request);
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  uint32_t tokens = r.token_ids_size();
  engine_->Stop();
  v1::GenerateResponse last = r;
  while (reader->Read(&r)) {
    tokens += r.token_ids_size();
    last = r;
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(last.finish_reason(), "aborted");
  EXPECT_EQ(last.usage().completion_tokens(), tokens);
  EXPECT_LT(tokens, 507u);
  EXPECT_EQ(last.usage().prompt_tokens(), 5u);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("the server is shutting down"));
}

// A stream's handler counts as open until it has written the final message: the daemon
// waits for that (WaitForCallsToEnd) before shutting the gRPC server down.
TEST_F(InferenceServiceTest, WaitForCallsToEndWaitsForEveryStreamsFinalMessage) {
  EXPECT_EQ(service_->open_calls(), 0);
  EXPECT_TRUE(service_->WaitForCallsToEnd(absl::ZeroDuration()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_max_tokens(507);  // the whole context: still running at the checks below
  request.set_ignore_eos(true);
  auto reader = stub_->Generate(&context, request);
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(service_->open_calls(), 1);
  EXPECT_FALSE(service_->WaitForCallsToEnd(absl::Milliseconds(1)));
  engine_->Stop();
  EXPECT_TRUE(service_->WaitForCallsToEnd(absl::Seconds(10)));
  EXPECT_EQ(service_->open_calls(), 0);
  // The handler returned after writing the final message, which is there to read.
  v1::GenerateResponse last = r;
  while (reader->Read(&r)) last = r;
  EXPECT_EQ(last.finish_reason(), "aborted");
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(InferenceServiceTest, DrainingRefusesNewCallsWithUnavailable) {
  service_->BeginDrain();
  v1::GenerateRequest request;
  request.set_prompt("Once");
  const Stream s = Generate(request);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

// The name is the model file's stem, which need not be UTF-8; a proto3 string must be.
TEST_F(InferenceServiceTest, ModelNamesThatAreNotUtf8AreRepaired) {
  ServedModelInfo served;
  served.spec = spec_;
  served.spec.name = "caf\xe9";
  InferenceService service(engine_.get(), RequestValidator(RequestLimits{}, nullptr), served);
  v1::ModelInfo info;
  ASSERT_TRUE(service.GetModelInfo(nullptr, nullptr, &info).ok());
  EXPECT_EQ(info.name(), "caf\uFFFD");
}

TEST_F(InferenceServiceTest, UnaryMethods) {
  grpc::ClientContext c1;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&c1, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.name(), spec_.name);
  EXPECT_EQ(info.vocab_size(), 512u);
  EXPECT_EQ(info.num_kv_heads(), 4u);
  EXPECT_EQ(info.max_context_tokens(), 512u);
  EXPECT_EQ(info.block_size(), 16u);

  grpc::ClientContext c2;
  v1::CacheStats stats;
  ASSERT_TRUE(stub_->GetCacheStats(&c2, v1::GetCacheStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.block_size(), 16u);
  EXPECT_GT(stats.total_blocks(), 0u);
  EXPECT_EQ(stats.free_blocks() + stats.used_blocks() + stats.cached_blocks(),
            stats.total_blocks());
  // Where the memory is: the model's fp32 parameters, and the buffers beside the KV pool.
  EXPECT_EQ(stats.weights_bytes(), static_cast<uint64_t>(spec_.NumParameters()) * 4);
  EXPECT_GT(stats.activation_bytes(), 0u);  // the arena's chunk table at least
  EXPECT_EQ(stats.workspace_bytes(), 0u);   // the CPU backend keeps none

  grpc::ClientContext c3;
  v1::CloseSessionRequest close;
  close.set_session_id("never-opened");
  v1::CloseSessionResponse closed;
  EXPECT_EQ(stub_->CloseSession(&c3, close, &closed).error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext c4;
  close.set_session_id("");
  EXPECT_EQ(stub_->CloseSession(&c4, close, &closed).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace kvd
