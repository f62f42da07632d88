// What the engine does when its backend fails: a failed step aborts the requests in it and
// the engine runs on, unless the failure is DataLoss (a device fault that lost the CUDA
// context), after which nothing can run: every request is aborted, new ones are refused,
// and Failure() says why, so that the daemon can stop serving and exit.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cache/clock.h"
#include "cache/kv_layout.h"
#include "model/llama2c_loader.h"
#include "scheduler/engine_loop.h"
#include "tests/scheduler/failing_backend.h"
#include "tools/engine_setup.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  std::vector<int32_t> tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  absl::Status error;
};

class EngineFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = LoadLlama2cCheckpoint(std::string(KVD_SHARED_DIR) + "/models/stories260K.bin");
    ASSERT_TRUE(weights.ok()) << weights.status();
    spec_ = weights->spec;
    auto model = LlamaModel::Create(*std::move(weights), &backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    auto cache = CreateCacheForSequences(spec_, &backend_, &clock_, 16, 4);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    engine_ = std::make_unique<EngineLoop>(EngineOptions{}, model_.get(), cache_.get(),
                                           /*tokenizer=*/nullptr, &clock_);
  }

  Request Greedy() {
    Request r;
    r.prompt = {1, 400, 401, 402};
    r.max_tokens = 8;
    r.sampling.temperature = 0;
    return r;
  }

  absl::StatusOr<uint64_t> Submit(Request r, Outcome* o) {
    return engine_->Submit(std::move(r), [o](const StreamEvent& e) {
      EXPECT_FALSE(o->finished) << "event after the final one";
      o->tokens.insert(o->tokens.end(), e.token_ids.begin(), e.token_ids.end());
      if (e.finished) {
        o->finished = true;
        o->reason = e.finish_reason;
        o->error = e.error;
      }
    });
  }

  test::FailingBackend backend_;
  FakeClock clock_;
  ModelSpec spec_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCacheManager> cache_;
  std::unique_ptr<EngineLoop> engine_;
};

TEST_F(EngineFailureTest, AFailedStepAbortsItsRequestsAndTheEngineRunsOn) {
  backend_.FailOpsWith(absl::InternalError("injected: one bad launch"));
  Outcome first;
  ASSERT_TRUE(Submit(Greedy(), &first).ok());
  engine_->RunUntilIdle();
  ASSERT_TRUE(first.finished);
  EXPECT_EQ(first.reason, FinishReason::kAborted);
  EXPECT_THAT(first.error.message(), HasSubstr("one bad launch"));
  EXPECT_TRUE(engine_->Failure().ok());

  backend_.FailOpsWith(absl::OkStatus());
  Outcome second;
  ASSERT_TRUE(Submit(Greedy(), &second).ok());
  engine_->RunUntilIdle();
  ASSERT_TRUE(second.finished);
  EXPECT_EQ(second.reason, FinishReason::kLength);
  EXPECT_EQ(second.tokens.size(), 8u);
  EXPECT_EQ(cache_->stats().used_blocks, 0);
}

TEST_F(EngineFailureTest, ABackendLostForGoodStopsTheEngine) {
  // Two requests in the step that fails (a batch of two), one more waiting behind them.
  engine_ = std::make_unique<EngineLoop>(EngineOptions{.max_batch_size = 2}, model_.get(),
                                         cache_.get(), nullptr, &clock_);
  Outcome a, b, c;
  ASSERT_TRUE(Submit(Greedy(), &a).ok());
  ASSERT_TRUE(Submit(Greedy(), &b).ok());
  ASSERT_TRUE(Submit(Greedy(), &c).ok());
  backend_.FailOpsWith(absl::DataLossError("injected: an illegal memory access"));
  engine_->RunUntilIdle();
  for (const Outcome* o : {&a, &b, &c}) {
    ASSERT_TRUE(o->finished);
    EXPECT_EQ(o->reason, FinishReason::kAborted);
    EXPECT_EQ(o->error.code(), absl::StatusCode::kUnavailable) << o->error;
    EXPECT_THAT(o->error.message(), HasSubstr("illegal memory access"));
  }
  EXPECT_EQ(engine_->Failure().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(cache_->stats().used_blocks, 0);

  // Nothing more is taken, even once the backend answers again.
  backend_.FailOpsWith(absl::OkStatus());
  Outcome d;
  const auto refused = Submit(Greedy(), &d);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("the backend failed"));
  EXPECT_EQ(engine_->CloseSession("s").code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(d.finished);
}

// The daemon's view: the engine thread stops by itself and WaitIdle (the drain) returns.
// The device has no memory for the pool to grow into (another process took it): a request
// whose first chunk needs more blocks than the pool holds now, though it would fit the
// configured maximum, cannot run while nothing else does. It is aborted, not left waiting
// forever, and the engine serves the requests after it.
TEST_F(EngineFailureTest, ARequestThePoolCannotGrowForIsAbortedAndTheRestRun) {
  const KvShape shape{spec_.num_layers, spec_.num_kv_heads, spec_.head_dim};
  KvCacheOptions o;
  o.chunk_bytes = KvLayout::Create(shape, DType::kF32, 16)->block_bytes() * 16;
  o.initial_pool_bytes = o.chunk_bytes;  // 16 blocks of 16 tokens now, up to 64
  o.max_pool_bytes = o.chunk_bytes * 4;
  o.defrag_background_planning = false;
  auto cache = KvCacheManager::Create(o, shape, &backend_, &clock_);
  ASSERT_TRUE(cache.ok()) << cache.status();
  engine_.reset();
  cache_ = *std::move(cache);
  engine_ = std::make_unique<EngineLoop>(EngineOptions{}, model_.get(), cache_.get(),
                                         /*tokenizer=*/nullptr, &clock_);
  backend_.FailAllocationsWith(absl::ResourceExhaustedError("out of device memory"));
  Request big = Greedy();
  big.prompt.assign(300, 400);  // 19 blocks in its first chunk
  Outcome big_outcome, small_outcome;
  ASSERT_TRUE(Submit(big, &big_outcome).ok());
  engine_->RunUntilIdle();
  ASSERT_TRUE(big_outcome.finished);
  EXPECT_EQ(big_outcome.reason, FinishReason::kAborted);
  EXPECT_EQ(big_outcome.error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big_outcome.error.message(), HasSubstr("the KV pool cannot hold this request"));
  EXPECT_GT(backend_.num_failed_allocations(), 0);
  EXPECT_EQ(cache_->stats().used_blocks, 0);
  // Memory again (the model's activations need some too): the engine runs on.
  backend_.FailAllocationsWith(absl::OkStatus());
  ASSERT_TRUE(Submit(Greedy(), &small_outcome).ok());
  engine_->RunUntilIdle();
  ASSERT_TRUE(small_outcome.finished);
  EXPECT_TRUE(small_outcome.error.ok()) << small_outcome.error;
  EXPECT_EQ(small_outcome.tokens.size(), 8u);
}

TEST_F(EngineFailureTest, TheEngineThreadStopsByItselfAndReportsIdle) {
  engine_->Start();
  backend_.FailOpsWith(absl::DataLossError("injected: a kernel fault"));
  Outcome a;
  ASSERT_TRUE(Submit(Greedy(), &a).ok());
  ASSERT_TRUE(engine_->WaitIdle(absl::Seconds(60)));
  EXPECT_TRUE(a.finished);
  EXPECT_EQ(a.reason, FinishReason::kAborted);
  EXPECT_EQ(engine_->Failure().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Submit(Greedy(), &a).status().code(), absl::StatusCode::kUnavailable);
  engine_->Stop();
}

}  // namespace
}  // namespace kvd
