// What admission and the engine's counters promise, driven offline (RunUntilIdle) with a
// fake clock: admission counts a cached prefix in evictable blocks once, and a turn's own
// pinned chain once, so exact output predictions never preempt; an admission that finds no
// room leaves nothing of its turn pinned; other sessions' idle pins give way to new work;
// max_waiting_requests and Stats() hold while a step runs; a request ended while it waits
// reports its whole life as queue time; recomputing after a preemption is not counted as
// prompt work; a request that ends on a stop token is reserved the KV of its last output
// token; a waiting request's prediction follows what the predictor learns meanwhile; and a
// turn waiting for its session lets the requests behind it by whatever its size; and a session
// whose next turn waits in the queue does not expire meanwhile.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cache/clock.h"
#include "kernels/cpu_backend.h"
#include "model/llama2c_loader.h"
#include "scheduler/engine_loop.h"
#include "tests/scheduler/failing_backend.h"

namespace kvd {
namespace {

// Case `index` of llama2.c's greedy outputs for stories260K: its prompt and output tokens.
struct GoldenCase {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};
GoldenCase LoadGolden(size_t index) {
  std::ifstream in(std::string(KVD_SHARED_DIR) + "/models/golden/stories260K_greedy.jsonl");
  std::string line;
  for (size_t i = 0; std::getline(in, line); ++i) {
    if (i != index) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    return {j["prompt_tokens"].get<std::vector<int32_t>>(),
            j["output_tokens"].get<std::vector<int32_t>>()};
  }
  ADD_FAILURE() << "no golden case " << index;
  return {};
}

// What a client sees of one request.
struct Outcome {
  std::vector<int32_t> tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kAborted;
  Usage usage;
  absl::Status error;
};

// n consecutive token ids from `first`: prompts from disjoint ranges share no block.
std::vector<int32_t> Iota(int32_t n, int32_t first) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class EngineAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = LoadLlama2cCheckpoint(std::string(KVD_SHARED_DIR) + "/models/stories260K.bin");
    ASSERT_TRUE(weights.ok()) << weights.status();
    spec_ = weights->spec;
    auto model = LlamaModel::Create(*weights, &backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  // A pool of 16-token blocks in chunks of `blocks_per_chunk`, from `initial_chunks` up to
  // `max_chunks`, whose memory comes from cache_backend_.
  void MakeCache(int32_t blocks_per_chunk, int32_t initial_chunks, int32_t max_chunks,
                 bool prefix_caching = true) {
    engine_.reset();  // it points at the cache
    const KvShape shape{spec_.num_layers, spec_.num_kv_heads, spec_.head_dim};
    const int64_t block_bytes = KvLayout::Create(shape, DType::kF32, 16)->block_bytes();
    KvCacheOptions o;
    o.chunk_bytes = block_bytes * blocks_per_chunk;
    o.initial_pool_bytes = o.chunk_bytes * initial_chunks;
    o.max_pool_bytes = o.chunk_bytes * max_chunks;
    o.defrag_background_planning = false;
    o.enable_prefix_caching = prefix_caching;
    auto cache = KvCacheManager::Create(o, shape, &cache_backend_, &clock_);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
  }

  void MakeEngine(EngineOptions options = {}) {
    engine_ = std::make_unique<EngineLoop>(options, model_.get(), cache_.get(),
                                           /*tokenizer=*/nullptr, &clock_);
  }

  // Greedy, no stop tokens: exactly max_tokens tokens come out.
  static Request Req(std::vector<int32_t> prompt, int32_t max_tokens,
                     int32_t expected_output_tokens) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.expected_output_tokens = expected_output_tokens;
    r.sampling.temperature = 0;
    return r;
  }

  // Req as a turn of session `session`.
  static Request Turn(std::vector<int32_t> prompt, int32_t max_tokens,
                      int32_t expected_output_tokens, std::string session) {
    Request r = Req(std::move(prompt), max_tokens, expected_output_tokens);
    r.session_id = std::move(session);
    return r;
  }

  // Submits r; its events are recorded in the returned Outcome, then passed to `also`.
  Outcome* Submit(Request r, std::function<void(const StreamEvent&)> also = nullptr) {
    outcomes_.push_back(std::make_unique<Outcome>());
    Outcome* o = outcomes_.back().get();
    auto h = engine_->Submit(std::move(r), [this, o, also](const StreamEvent& e) {
      EXPECT_FALSE(o->finished) << "event after the final one";
      o->tokens.insert(o->tokens.end(), e.token_ids.begin(), e.token_ids.end());
      if (e.finished) {
        o->finished = true;
        o->reason = e.finish_reason;
        o->usage = e.usage;
        o->error = e.error;
      }
      EXPECT_TRUE(cache_->CheckInvariants().ok());
      if (also) also(e);
    });
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) last_handle_ = *h;
    return o;
  }

  CpuBackend backend_{2};               // the model's
  test::FailingBackend cache_backend_;  // the KV pool's memory
  FakeClock clock_;
  ModelSpec spec_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCacheManager> cache_;
  std::unique_ptr<EngineLoop> engine_;
  std::vector<std::unique_ptr<Outcome>> outcomes_;
  uint64_t last_handle_ = 0;  // the last Submit's
};

// With exact predictions (expected_output_tokens == max_tokens, no stop token) predicted
// admission never over-commits, also when the candidate's prefix is cached in evictable
// blocks: the pool counts those as obtainable, and admitting it takes them out of it.
TEST_F(EngineAdmissionTest, PredictedAdmissionCountsAnEvictableCachedPrefixOnce) {
  const std::vector<int32_t> p = Iota(64, 300);  // 4 blocks
  std::vector<int32_t> cold_output;
  for (const bool warm : {false, true}) {
    SCOPED_TRACE(warm ? "P cached" : "cold cache");
    MakeCache(8, 1, 1);  // 8 blocks, no growth
    MakeEngine();
    if (warm) {
      Submit(Req(p, 1, 1));
      engine_->RunUntilIdle();
      ASSERT_EQ(cache_->stats().cached_blocks, 4);
    }
    // R: 48 + 33 - 1 = 80 KV tokens, 5 blocks. C: P + 16 tokens, 80 + 33 - 1 = 112, 7 blocks
    // of which P's 4 may be cached: the two do not fit the pool together.
    Outcome* r = Submit(Req(Iota(48, 100), 33, 33));
    Outcome* c = Submit(Req(Concat(p, Iota(16, 200)), 33, 33));
    engine_->RunUntilIdle();
    for (const Outcome* o : {r, c}) {
      ASSERT_TRUE(o->finished);
      EXPECT_TRUE(o->error.ok()) << o->error;
      EXPECT_EQ(o->tokens.size(), 33u);
      EXPECT_EQ(o->usage.num_preemptions, 0);
    }
    EXPECT_EQ(engine_->Stats().preemptions, 0);
    if (warm) {
      EXPECT_EQ(c->tokens, cold_output);
    } else {
      cold_output = c->tokens;
    }
  }
}

// A request admitted on room the pool counted on but could not supply (here the device has
// no memory for the chunk the pool may grow by) is taken back whole: the session its
// admission started is forgotten, so nothing of a turn that never ran stays pinned and the
// pool's blocks stay obtainable, to be evicted (not released from a session) for room.
TEST_F(EngineAdmissionTest, AnAdmissionWithoutRoomLeavesNoSessionBehind) {
  MakeCache(4, 1, 2);  // 4 blocks, may grow to 8
  MakeEngine();
  const std::vector<int32_t> p = Iota(32, 300);  // 2 blocks
  Submit(Req(p, 1, 1));
  engine_->RunUntilIdle();
  ASSERT_EQ(cache_->stats().cached_blocks, 2);  // and 2 free
  cache_backend_.FailAllocationsWith(absl::ResourceExhaustedError("injected: no device memory"));
  // R is expected to need no more than its 20-token prompt (2 blocks: the free ones) and runs
  // to 20 + 30 - 1 = 49 KV tokens (4 blocks). C, the first turn of session "s", needs 3
  // blocks, P's 2 cached ones among them: admitted counting on the growth, which fails, it
  // waits for R.
  int32_t sessions_while_c_waits = -1;
  int64_t pinned_while_c_waits = -1;
  Outcome* r = Submit(Req(Iota(20, 100), 30, 1), [&](const StreamEvent&) {
    if (sessions_while_c_waits >= 0) return;
    sessions_while_c_waits = cache_->stats().num_sessions;
    pinned_while_c_waits = cache_->stats().pinned_blocks;
  });
  Request turn = Turn(Concat(p, Iota(16, 200)), 2, 1, "s");
  Outcome* c = Submit(turn);
  engine_->RunUntilIdle();
  EXPECT_EQ(cache_backend_.num_failed_allocations(), 1);  // C's admission met it
  EXPECT_EQ(sessions_while_c_waits, 0);
  EXPECT_EQ(pinned_while_c_waits, 0);
  for (const Outcome* o : {r, c}) {
    ASSERT_TRUE(o->finished);
    EXPECT_TRUE(o->error.ok()) << o->error;
    EXPECT_EQ(o->reason, FinishReason::kLength);
  }
  const KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.session_releases_pressure, 0);  // R grew into P's blocks by evicting them
  EXPECT_EQ(st.num_sessions, 1);               // C's turn ran: "s" pins it now
  EXPECT_EQ(engine_->Stats().preemptions, 0);
  EXPECT_TRUE(engine_->CloseSession("s").ok());
}

// An idle session's pins give way to new work: admission counts the blocks only idle
// sessions pin as obtainable (Reserve releases the oldest such session when it needs room),
// so a request does not wait behind them for a running one to finish.
TEST_F(EngineAdmissionTest, IdleSessionPinsGiveWayToNewWorkWhileOthersRun) {
  MakeCache(8, 1, 1);  // 8 blocks, no growth
  MakeEngine();
  Request turn = Turn(Iota(64, 300), 1, 1, "s");
  Submit(turn);
  engine_->RunUntilIdle();
  ASSERT_EQ(cache_->stats().pinned_blocks, 4);  // and 4 free
  // R runs to 20 + 30 - 1 = 49 KV tokens (4 blocks), C to 16 + 17 - 1 = 32 (2 blocks): both
  // fit once the session's pins are released. C, the shorter, finishes first when it runs
  // beside R; had it waited for R, it would finish after it.
  std::vector<std::string> finished;
  const auto record = [&finished](std::string name) {
    return [&finished, name](const StreamEvent& e) {
      if (e.finished) finished.push_back(name);
    };
  };
  Outcome* r = Submit(Req(Iota(20, 100), 30, 30), record("R"));
  Outcome* c = Submit(Req(Iota(16, 200), 17, 17), record("C"));
  engine_->RunUntilIdle();
  for (const Outcome* o : {r, c}) {
    ASSERT_TRUE(o->finished);
    EXPECT_TRUE(o->error.ok()) << o->error;
    EXPECT_EQ(o->reason, FinishReason::kLength);
    EXPECT_EQ(o->usage.num_preemptions, 0);
  }
  EXPECT_EQ(finished, (std::vector<std::string>{"C", "R"}));
  const KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.session_releases_pressure, 1);
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(engine_->Stats().preemptions, 0);
}

// A turn's own session chain is matched, not obtainable: admission counts it once (the
// pinned blocks a turn takes stop being releasable), so a turn that fits only if its own
// pins were released as well waits instead of running into a preemption.
TEST_F(EngineAdmissionTest, ATurnsOwnSessionPinsAreNotCountedTwice) {
  MakeCache(8, 1, 1);  // 8 blocks, no growth
  MakeEngine();
  const std::vector<int32_t> p = Iota(64, 300);  // 4 blocks
  Request turn1 = Turn(p, 1, 1, "s");
  Submit(turn1);
  engine_->RunUntilIdle();
  ASSERT_EQ(cache_->stats().pinned_blocks, 4);
  // R: 20 + 30 - 1 = 49 tokens (4 blocks). Turn 2: 80 + 17 - 1 = 96 tokens (6 blocks), 4 of
  // them its session's pinned chain. 4 + 6 > 8: they must not run together.
  Outcome* r = Submit(Req(Iota(20, 100), 30, 30));
  Request turn2 = Turn(Concat(p, Iota(16, 200)), 17, 17, "s");
  Outcome* c = Submit(turn2);
  engine_->RunUntilIdle();
  for (const Outcome* o : {r, c}) {
    ASSERT_TRUE(o->finished);
    EXPECT_TRUE(o->error.ok()) << o->error;
    EXPECT_EQ(o->usage.num_preemptions, 0);
  }
  EXPECT_EQ(engine_->Stats().preemptions, 0);
}

// max_waiting_requests bounds the requests accepted and not yet running, also while a step
// runs: the requests that step took in still wait. Stats() says so at that moment too.
TEST_F(EngineAdmissionTest, TheWaitingLimitAndStatsHoldMidStep) {
  MakeCache(64, 1, 4);
  MakeEngine({.max_batch_size = 1, .max_waiting_requests = 2});
  EngineStats before, after;
  bool tried = false;
  int accepted = 0;
  Submit(Req(Iota(5, 300), 5, 0), [&](const StreamEvent&) {
    if (std::exchange(tried, true)) return;  // A's first event only
    // A runs alone; B waits. One more fits the limit, of the four tried.
    before = engine_->Stats();
    for (int32_t i = 0; i < 4; ++i) {
      if (engine_->Submit(Req(Iota(5, 310 + 10 * i), 3, 0), nullptr).ok()) ++accepted;
    }
    after = engine_->Stats();
  });
  Outcome* b = Submit(Req(Iota(5, 400), 3, 0));
  engine_->RunUntilIdle();
  EXPECT_EQ(before.requests_running, 1);
  EXPECT_EQ(before.requests_waiting, 1);
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(after.requests_waiting, 2);
  EXPECT_EQ(after.requests_rejected, 3);
  EXPECT_TRUE(b->finished);
  const EngineStats end = engine_->Stats();
  EXPECT_EQ(end.requests_finished, 3);
  EXPECT_EQ(end.requests_waiting, 0);
  EXPECT_EQ(end.requests_running, 0);
}

// A request's queue time runs from its submission to its first admission. One that ends
// before it is ever admitted (here cancelled while it waits) spent its whole life queued and
// reports that, not zero.
TEST_F(EngineAdmissionTest, ARequestEndedWhileWaitingReportsItsWholeLifeAsQueueTime) {
  MakeCache(64, 1, 4);
  MakeEngine({.max_batch_size = 1});
  uint64_t b_handle = 0;
  bool acted = false;
  // A runs alone while B and C wait. At A's first token, 3 s on, B is cancelled; C runs after A.
  Outcome* a = Submit(Req(Iota(5, 300), 4, 0), [&](const StreamEvent&) {
    if (std::exchange(acted, true)) return;
    clock_.Advance(absl::Seconds(3));
    engine_->Cancel(b_handle);
  });
  Outcome* b = Submit(Req(Iota(5, 400), 3, 0));
  b_handle = last_handle_;
  Outcome* c = Submit(Req(Iota(5, 500), 3, 0));
  engine_->RunUntilIdle();
  ASSERT_TRUE(a->finished && b->finished && c->finished);
  EXPECT_EQ(a->usage.queue_time, absl::ZeroDuration());
  EXPECT_EQ(b->reason, FinishReason::kCancelled);
  EXPECT_TRUE(b->tokens.empty());
  EXPECT_EQ(b->usage.total_time, absl::Seconds(3));
  EXPECT_EQ(b->usage.queue_time, b->usage.total_time);
  EXPECT_EQ(b->usage.time_to_first_token, absl::ZeroDuration());  // it had no first token
  EXPECT_EQ(c->reason, FinishReason::kLength);
  EXPECT_EQ(c->usage.queue_time, absl::Seconds(3));  // admitted once A was done
}

// computed_prompt_tokens counts the prompt tokens prefilled at each request's first
// admission, so it never exceeds prompt_tokens: the recompute after a preemption is
// counted by preemptions, not as prompt work the client sent. Nor is its lookup a prefix
// cache lookup: the preempted sequence finds its own blocks (prompt and generated tokens)
// again, which would count as hits on tokens no client sent.
TEST_F(EngineAdmissionTest, RecomputeAfterPreemptionIsNotCountedAsPromptWork) {
  MakeCache(1, 1, 7);  // 7 blocks: two 5 + 99 KV-token requests do not fit together
  MakeEngine({.admission = AdmissionMode::kOptimistic});
  Outcome* a = Submit(Req(Iota(5, 300), 100, 0));
  Outcome* b = Submit(Req(Iota(5, 350), 100, 0));
  engine_->RunUntilIdle();
  ASSERT_TRUE(a->finished);
  ASSERT_TRUE(b->finished);
  EXPECT_EQ(a->tokens.size(), 100u);
  EXPECT_EQ(b->tokens.size(), 100u);
  const EngineStats st = engine_->Stats();
  ASSERT_GE(st.preemptions, 1);
  EXPECT_EQ(st.prompt_tokens, 10);
  EXPECT_EQ(st.computed_prompt_tokens, 10);
  const KvCacheStats cs = cache_->stats();
  EXPECT_EQ(cs.prefix_query_tokens, 10);
  EXPECT_EQ(cs.prefix_hit_tokens + cs.session_hit_tokens, 0);
}

// A request that ends on a stop token has fed back its last output token: the stop token was
// sampled from that token's logits. So an exact prediction of its output tokens reserves that
// token's KV too, and two such requests admitted together never preempt, also where the one
// token more takes another block.
TEST_F(EngineAdmissionTest, AnExactPredictionOfAStopTokenEndingNeverPreempts) {
  // Golden case 2: a 5-token prompt, 220 output tokens, then BOS (where llama2.c stopped, so
  // the file ends there). Its KV holds 5 + 220 = 225 tokens, 15 blocks; 5 + 220 - 1 = 224
  // would be 14. 28 blocks hold two of 14, not two of 15.
  const GoldenCase golden = LoadGolden(2);
  ASSERT_EQ(golden.output.size(), 220u);
  MakeCache(4, 7, 7);  // 28 blocks, no growth
  MakeEngine();
  Request r = Req(golden.prompt, 252, 220);
  r.stop_token_ids = {1};
  Outcome* a = Submit(r);
  Outcome* b = Submit(r);
  engine_->RunUntilIdle();
  for (const Outcome* o : {a, b}) {
    ASSERT_TRUE(o->finished);
    EXPECT_TRUE(o->error.ok()) << o->error;
    EXPECT_EQ(o->reason, FinishReason::kStop);
    EXPECT_EQ(o->tokens, golden.output);
    EXPECT_EQ(o->usage.num_preemptions, 0);
  }
  EXPECT_EQ(engine_->Stats().preemptions, 0);
}

// A waiting request's predicted output is the predictor's value when it is first admitted,
// not when it arrived: requests queued before the predictor learned anything are admitted by
// what it learned while they waited.
TEST_F(EngineAdmissionTest, AWaitingRequestsPredictionFollowsThePredictor) {
  MakeCache(16, 1, 1);  // 16 blocks, no growth
  MakeEngine({.predictor_default_tokens = 200});
  // Golden case 0, stopped at its 10th output token: 9 tokens out, 1 block of KV. The default
  // prediction reserves 5 + 199 = 204 KV tokens, 13 blocks: the four cannot start together.
  const GoldenCase golden = LoadGolden(0);
  ASSERT_GT(golden.output.size(), 9u);
  const int32_t stop = golden.output[9];
  ASSERT_EQ(std::find(golden.output.begin(), golden.output.begin() + 9, stop),
            golden.output.begin() + 9);
  Request r = Req(golden.prompt, 200, 0);
  r.stop_token_ids = {stop};
  std::vector<Outcome*> outcomes;
  for (int i = 0; i < 4; ++i) outcomes.push_back(Submit(r));
  engine_->RunUntilIdle();
  for (const Outcome* o : outcomes) {
    ASSERT_TRUE(o->finished);
    EXPECT_EQ(o->reason, FinishReason::kStop);
    EXPECT_EQ(o->tokens.size(), 9u);
  }
  // The first ran on the default (9 - 200); the other three waited for it, and by then the
  // predictor had learned 9 (error 0 each), so they ran together.
  const EngineStats st = engine_->Stats();
  EXPECT_EQ(st.predicted_output_tokens, 9);
  EXPECT_EQ(st.prediction_error.count, 4);
  EXPECT_EQ(st.prediction_error.sum, 9 - 200);
}

// A turn whose session is busy with its previous turn waits for it whatever room it would
// take, so it lets the requests behind it by even where it would not fit now. Without prefix
// caching the running turn's KV cannot be matched, so the waiting turn looks as large as its
// whole conversation.
TEST_F(EngineAdmissionTest, ATurnWaitingForItsSessionLetsOthersByWhateverItsSize) {
  MakeCache(16, 1, 1, /*prefix_caching=*/false);  // 16 blocks, no growth
  MakeEngine();
  const std::vector<int32_t> p = Iota(128, 300);  // 8 blocks
  std::vector<std::string> finished;
  const auto record = [&finished](std::string name) {
    return [&finished, name](const StreamEvent& e) {
      if (e.finished) finished.push_back(name);
    };
  };
  // T1: 128 + 40 - 1 = 167 KV tokens (11 blocks). T2, its session's next turn: 148 + 4 - 1 =
  // 151 (10 blocks), which with T1's 11 exceeds 16. O: 11 + 3 - 1 = 13 (1 block) fits beside
  // T1 and, shorter, finishes first unless it waits for T1.
  Request t1 = Turn(p, 40, 40, "s");
  Outcome* a = Submit(t1, record("T1"));
  Request t2 = Turn(Concat(p, Iota(20, 100)), 4, 4, "s");
  Outcome* b = Submit(t2, record("T2"));
  Outcome* c = Submit(Req(Iota(11, 50), 3, 3), record("O"));
  engine_->RunUntilIdle();
  for (const Outcome* o : {a, b, c}) {
    ASSERT_TRUE(o->finished);
    EXPECT_TRUE(o->error.ok()) << o->error;
    EXPECT_EQ(o->reason, FinishReason::kLength);
  }
  EXPECT_EQ(finished, (std::vector<std::string>{"O", "T1", "T2"}));
  EXPECT_EQ(engine_->Stats().preemptions, 0);
}

// A session with a turn waiting to run is not idle: however long the turn waits in the queue,
// the session's pins do not expire under it, and the turn finds its history.
TEST_F(EngineAdmissionTest, ASessionDoesNotExpireWhileItsNextTurnWaits) {
  MakeCache(64, 1, 1, /*prefix_caching=*/false);  // only the session can give back history
  MakeEngine({.max_batch_size = 1});
  const std::vector<int32_t> history = Iota(32, 300);  // 2 blocks
  Request turn1 = Turn(history, 1, 1, "s");
  Submit(turn1);
  engine_->RunUntilIdle();
  ASSERT_EQ(cache_->stats().num_sessions, 1);
  // R runs alone for 10 steps of 5 s each, past the session's 30 s idle timeout, while turn 2
  // waits behind it.
  Outcome* r = Submit(Req(Iota(5, 100), 10, 10),
                      [this](const StreamEvent&) { clock_.Advance(absl::Seconds(5)); });
  Request turn2 = Turn(Concat(history, Iota(8, 200)), 2, 2, "s");
  Outcome* t2 = Submit(turn2);
  engine_->RunUntilIdle();
  ASSERT_TRUE(r->finished && t2->finished);
  EXPECT_TRUE(t2->error.ok()) << t2->error;
  EXPECT_GT(t2->usage.queue_time, cache_->options().session_idle_timeout);
  EXPECT_EQ(t2->usage.cached_prompt_tokens, 32);
  EXPECT_EQ(cache_->stats().session_releases_idle, 0);
}

}  // namespace
}  // namespace kvd
