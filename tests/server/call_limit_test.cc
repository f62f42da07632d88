// server.max_concurrent_calls: the cap the daemon puts on the gRPC calls it handles at once,
// checked on a real gRPC server whose calls block until the test lets them go.

#include "server/call_limit.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "config/inference_config.h"
#include "kvd/v1/kvd.grpc.pb.h"

namespace kvd {
namespace {

using ::testing::IsEmpty;

TEST(MaxConcurrentCallsTest, AutomaticIsTheBatchAndTheQueueWithSpareCalls) {
  InferenceConfig config;
  config.kv_cache.max_batch_size = 5;
  config.server.max_waiting_requests = 17;
  EXPECT_EQ(MaxConcurrentCalls(config), 5 + 17 + kSpareCalls);
  EXPECT_EQ(MaxConcurrentCalls(InferenceConfig{}), 8 + 256 + kSpareCalls);
}

TEST(MaxConcurrentCallsTest, ASetValueIsTakenAsItIs) {
  InferenceConfig config;
  config.server.max_concurrent_calls = 3;  // below the batch and the queue: the operator's call
  EXPECT_EQ(MaxConcurrentCalls(config), 3);
}

// GetModelInfo calls that wait, each on its own handler thread, until Release().
class BlockingService final : public v1::Inference::Service {
 public:
  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                            v1::ModelInfo*) override {
    absl::MutexLock lock(&mu_);
    ++running_;
    mu_.Await(absl::Condition(
        +[](BlockingService* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->released_ > 0; },
        this));
    --released_;
    --running_;
    return grpc::Status::OK;
  }

  int running() {
    absl::MutexLock lock(&mu_);
    return running_;
  }

  // Waits until `n` calls are in their handlers; false after 10 s.
  bool AwaitRunning(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }

  // Lets `n` of the waiting calls return (whichever take the releases).
  void Release(int n) {
    absl::MutexLock lock(&mu_);
    released_ += n;
  }

 private:
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int released_ ABSL_GUARDED_BY(mu_) = 0;
};

class CallLimitTest : public ::testing::Test {
 protected:
  static constexpr int kMaxCalls = 3;

  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);  // as the daemon does
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    LimitConcurrentCalls(kMaxCalls, &builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel_);
  }

  void TearDown() override {
    service_.Release(1000);
    for (std::thread& t : callers_) t.join();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::EnableDefaultHealthCheckService(false);  // a process-wide switch: as it was
  }

  // Starts a GetModelInfo call on a thread of its own; returns its index for Ended().
  int StartCall() {
    absl::MutexLock lock(&mu_);
    const int i = static_cast<int>(ended_.size());
    ended_.emplace_back();
    callers_.emplace_back([this, i] {
      grpc::Status status = Call();
      absl::MutexLock lock(&mu_);
      ended_[i] = std::move(status);
    });
    return i;
  }

  // Call i's status once it has ended.
  std::optional<grpc::Status> Ended(int i) {
    absl::MutexLock lock(&mu_);
    return ended_[i];
  }

  std::vector<int> EndedCalls() {
    absl::MutexLock lock(&mu_);
    std::vector<int> ended;
    for (int i = 0; i < static_cast<int>(ended_.size()); ++i) {
      if (ended_[i].has_value()) ended.push_back(i);
    }
    return ended;
  }

  // grpc.health.v1.Health/Check for the whole server: its status and the response's
  // serving status (1 = SERVING; -1 when the call failed or the response is not one field).
  std::pair<grpc::Status, int> CheckHealth() {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice empty;  // HealthCheckRequest{service: ""} is empty on the wire
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    absl::Mutex mu;
    std::optional<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status status) {
                     absl::MutexLock lock(&mu);
                     done = std::move(status);
                   });
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::optional<grpc::Status>* d) { return d->has_value(); }, &done));
    std::vector<grpc::Slice> slices;
    int serving = -1;
    if (done->ok() && response.Dump(&slices).ok() && slices.size() == 1 && slices[0].size() == 2 &&
        slices[0].begin()[0] == 0x08) {  // field 1, varint
      serving = slices[0].begin()[1];
    }
    return {*done, serving};
  }

  grpc::Status Call() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::ModelInfo info;
    return stub_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  }

  BlockingService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
  std::vector<std::thread> callers_;  // the test thread's alone
  absl::Mutex mu_;
  std::vector<std::optional<grpc::Status>> ended_ ABSL_GUARDED_BY(mu_);
};

// kMaxCalls calls run at once; the next is refused at once, RESOURCE_EXHAUSTED, while they
// go on; once one ends, a new call runs again.
TEST_F(CallLimitTest, CallsPastTheCapAreRefusedWhileTheOthersRun) {
  for (int i = 0; i < kMaxCalls; ++i) StartCall();
  ASSERT_TRUE(service_.AwaitRunning(kMaxCalls));

  const auto start = std::chrono::steady_clock::now();
  const grpc::Status refused = Call();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(service_.running(), kMaxCalls) << "a running call was disturbed";
  EXPECT_THAT(EndedCalls(), IsEmpty());
  // Health checks (Kubernetes' probes) are served beside the cap, not refused by it.
  const auto [health, serving] = CheckHealth();
  EXPECT_TRUE(health.ok()) << health.error_message();
  EXPECT_EQ(serving, 1);

  service_.Release(1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (EndedCalls().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::vector<int> ended = EndedCalls();
  ASSERT_EQ(ended.size(), 1);
  EXPECT_TRUE(Ended(ended[0])->ok()) << Ended(ended[0])->error_message();

  // The ended call's thread goes back to gRPC's pool a moment after its client has the
  // status; a call in that moment is still refused, so try until one runs.
  bool ran = false;
  while (!ran && std::chrono::steady_clock::now() < deadline) {
    const int i = StartCall();
    while (!ran && !Ended(i).has_value() && std::chrono::steady_clock::now() < deadline) {
      ran = service_.running() == kMaxCalls;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (const std::optional<grpc::Status> status = Ended(i); status.has_value()) {
      EXPECT_EQ(status->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    }
  }
  EXPECT_TRUE(ran) << "the room an ended call left was not reused";

  service_.Release(kMaxCalls);
  for (std::thread& t : callers_) t.join();
  callers_.clear();
  int ok = 0;
  for (int i : EndedCalls()) {
    const grpc::Status status = *Ended(i);
    ok += status.ok();
    EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << i << ": " << status.error_message();
  }
  EXPECT_EQ(ok, kMaxCalls + 1);  // every call that ran, and only those, returned OK
  EXPECT_EQ(service_.running(), 0);
}

}  // namespace
}  // namespace kvd
