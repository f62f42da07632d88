// EngineLoop as the daemon uses it, driven offline (RunUntilIdle) with a fake clock:
// batch invariance under preemption, cancellation, priorities, stop strings, sessions
// that keep KV between turns and release it when idle, and defragmentation under load.

#include "scheduler/engine_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/clock.h"
#include "kernels/cpu_backend.h"
#include "model/llama2c_loader.h"
#include "model/tokenizer.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

const std::string kModels = std::string(KVD_SHARED_DIR) + "/models";

struct Golden {
  std::vector<int32_t> prompt;
  int32_t max_tokens;
  std::vector<int32_t> output;
};

// What a client sees of one request.
struct Stream {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<std::string> deltas;
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  Usage usage;
  absl::Status error;
  int order = -1;  // finishing order
};

class EngineLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = LoadLlama2cCheckpoint(kModels + "/stories260K.bin");
    ASSERT_TRUE(weights.ok()) << weights.status();
    spec_ = weights->spec;
    model_ = std::move(*LlamaModel::Create(*weights, &backend_));
    tokenizer_ = std::move(*Tokenizer::LoadLlama2c(kModels + "/tok512.bin"));
    std::ifstream in(kModels + "/golden/stories260K_greedy.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      golden_.push_back({j["prompt_tokens"].get<std::vector<int32_t>>(),
                         j["max_new_tokens"].get<int32_t>(),
                         j["output_tokens"].get<std::vector<int32_t>>()});
    }
    ASSERT_EQ(golden_.size(), 12u);
  }

  // A pool of `chunks` chunks of `blocks_per_chunk` 16-token blocks, growing from 1 chunk.
  void MakeCache(int32_t blocks_per_chunk, int32_t max_chunks, bool defrag = false,
                 DType kv_dtype = DType::kF32) {
    const KvShape shape{spec_.num_layers, spec_.num_kv_heads, spec_.head_dim};
    const int64_t block_bytes = KvLayout::Create(shape, kv_dtype, 16)->block_bytes();
    KvCacheOptions o;
    o.kv_dtype = kv_dtype;
    o.chunk_bytes = block_bytes * blocks_per_chunk;
    o.initial_pool_bytes = o.chunk_bytes;
    o.max_pool_bytes = o.chunk_bytes * max_chunks;
    o.enable_defrag = defrag;
    o.defrag_background_planning = false;
    o.session_idle_timeout = absl::Seconds(30);
    auto cache = KvCacheManager::Create(o, shape, &backend_, &clock_);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }

  void MakeEngine(EngineOptions options = {}) {
    engine_ = std::make_unique<EngineLoop>(options, model_.get(), cache_.get(), tokenizer_.get(),
                                           &clock_);
  }

  Request Greedy(size_t golden_index) {
    Request r;
    r.prompt = golden_[golden_index].prompt;
    r.max_tokens = golden_[golden_index].max_tokens;
    r.sampling.temperature = 0;
    r.stop_token_ids = {1};
    return r;
  }

  // A greedy turn of session `session_id`: golden case `golden_index`'s prompt, cut to
  // `max_tokens` tokens.
  Request SessionTurn(size_t golden_index, int32_t max_tokens, std::string session_id = "s") {
    Request r = Greedy(golden_index);
    r.max_tokens = max_tokens;
    r.session_id = std::move(session_id);
    return r;
  }

  // Submits and returns where the request's stream is recorded; `then` sees each event
  // after it is recorded.
  Stream* Submit(Request r, uint64_t* handle = nullptr,
                 std::function<void(const Stream&)> then = nullptr) {
    streams_.push_back(std::make_unique<Stream>());
    Stream* s = streams_.back().get();
    auto h = engine_->Submit(std::move(r), [this, s, then](const StreamEvent& e) {
      EXPECT_FALSE(s->finished) << "event after the final one";
      s->tokens.insert(s->tokens.end(), e.token_ids.begin(), e.token_ids.end());
      s->text += e.text;
      s->deltas.push_back(e.text);
      if (e.finished) {
        s->finished = true;
        s->reason = e.finish_reason;
        s->usage = e.usage;
        s->error = e.error;
        s->order = finished_++;
      }
      max_chunks_seen_ = std::max(max_chunks_seen_, cache_->stats().num_chunks);
      EXPECT_TRUE(cache_->CheckInvariants().ok());
      if (then) then(*s);
    });
    EXPECT_TRUE(h.ok()) << h.status();
    if (handle != nullptr && h.ok()) *handle = *h;
    return s;
  }

  CpuBackend backend_{2};
  FakeClock clock_;
  ModelSpec spec_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvCacheManager> cache_;
  std::unique_ptr<EngineLoop> engine_;
  std::vector<Golden> golden_;
  std::vector<std::unique_ptr<Stream>> streams_;
  int finished_ = 0;
  int32_t max_chunks_seen_ = 0;
};

TEST_F(EngineLoopTest, PreemptionUnderATinyPoolChangesNoOutput) {
  // 96 blocks hold at most ~3 full-length stories: admission by predicted length
  // over-admits, sequences outgrow the pool and get preempted and recomputed.
  MakeCache(32, 3);
  MakeEngine({.max_batch_size = 12, .max_num_batched_tokens = 256});
  std::vector<Stream*> streams;
  for (size_t i = 0; i < golden_.size(); ++i) streams.push_back(Submit(Greedy(i)));
  engine_->RunUntilIdle();
  for (size_t i = 0; i < golden_.size(); ++i) {
    ASSERT_TRUE(streams[i]->finished) << i;
    EXPECT_EQ(streams[i]->tokens, golden_[i].output) << "case " << i;
    EXPECT_TRUE(streams[i]->error.ok()) << streams[i]->error;
  }
  const EngineStats stats = engine_->Stats();
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_EQ(stats.requests_finished, 12);
  EXPECT_EQ(stats.cache.used_blocks, 0);
  EXPECT_TRUE(cache_->CheckInvariants().ok());
}

// An int8 cache keeps the engine batch invariant: each golden request's greedy output is
// the same alone and among all twelve under a pool so small that they are preempted and
// recomputed (and the int8 outputs are not all the fp32 ones: the cache is quantized).
TEST_F(EngineLoopTest, Int8KvOutputsAreTheSameAloneAndUnderPreemption) {
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < golden_.size(); ++i) {
    engine_.reset();  // before the cache it uses
    MakeCache(32, 3, /*defrag=*/false, DType::kInt8);
    MakeEngine();
    Stream* s = Submit(Greedy(i));
    engine_->RunUntilIdle();
    ASSERT_TRUE(s->finished && s->error.ok()) << i << " " << s->error;
    alone.push_back(s->tokens);
  }
  engine_.reset();
  MakeCache(32, 3, /*defrag=*/false, DType::kInt8);
  MakeEngine({.max_batch_size = 12, .max_num_batched_tokens = 256});
  std::vector<Stream*> streams;
  for (size_t i = 0; i < golden_.size(); ++i) streams.push_back(Submit(Greedy(i)));
  engine_->RunUntilIdle();
  int32_t same_as_fp32 = 0;
  for (size_t i = 0; i < golden_.size(); ++i) {
    ASSERT_TRUE(streams[i]->finished) << i;
    EXPECT_TRUE(streams[i]->error.ok()) << streams[i]->error;
    EXPECT_EQ(streams[i]->tokens, alone[i]) << "case " << i;
    same_as_fp32 += streams[i]->tokens == golden_[i].output;
  }
  std::printf("int8 KV: %d of 12 greedy outputs are llama2.c's fp32 ones\n", same_as_fp32);
  EXPECT_GT(engine_->Stats().preemptions, 0);
  EXPECT_LT(same_as_fp32, 12);
  EXPECT_EQ(cache_->layout().dtype(), DType::kInt8);
}

TEST_F(EngineLoopTest, MemoryStatsAccountForEveryBackendByte) {
  MakeCache(32, 3);
  MakeEngine({.max_batch_size = 12, .max_num_batched_tokens = 256});
  // weights + kv_pool + activations is what the backend holds, as of each step's end.
  const auto expect_accounted = [this](const EngineStats& st) {
    EXPECT_EQ(st.memory.weights_bytes, model_->weight_bytes());
    EXPECT_EQ(st.memory.kv_pool_bytes, st.cache.total_bytes);
    EXPECT_EQ(st.memory.weights_bytes + st.memory.kv_pool_bytes + st.memory.activation_bytes,
              backend_.allocated_bytes());
    EXPECT_EQ(st.memory.workspace_bytes, 0);  // the CPU backend keeps none
    EXPECT_GE(st.memory.activation_bytes, 0);
  };
  const EngineStats before = engine_->Stats();
  expect_accounted(before);
  EXPECT_EQ(before.memory.weights_bytes, spec_.NumParameters() * 4);
  EXPECT_EQ(before.memory.kv_pool_bytes, before.cache.block_bytes * 32);  // one chunk
  for (size_t i = 0; i < golden_.size(); ++i) Submit(Greedy(i));
  engine_->RunUntilIdle();
  const EngineStats after = engine_->Stats();
  expect_accounted(after);
  EXPECT_GT(after.cache.num_chunks, 1);  // the pool grew, and kv_pool with it
  // Activations grew to the largest batch (256 tokens of activations at least).
  EXPECT_GT(after.memory.activation_bytes,
            before.memory.activation_bytes + int64_t{256} * spec_.dim * 4);

  // Each part is what its owner gives back: the engine holds nothing; the cache its chunks
  // (kv_pool), the arena's chunk table (3 pointers) and its block-copy list at the size it
  // starts with (nothing was copied); the model its weights and its activations. Then nothing
  // is left.
  const int64_t arena_lists =
      3 * static_cast<int64_t>(sizeof(void*)) +
      2 * static_cast<int64_t>(sizeof(int32_t)) * KvArena::kInitialCopyPairs;
  const int64_t held = backend_.allocated_bytes();
  engine_.reset();
  EXPECT_EQ(backend_.allocated_bytes(), held);
  cache_.reset();
  const int64_t cache_freed = held - backend_.allocated_bytes();
  EXPECT_EQ(cache_freed, after.memory.kv_pool_bytes + arena_lists);
  const int64_t model_held = backend_.allocated_bytes();
  model_.reset();
  EXPECT_EQ(backend_.allocated_bytes(), 0);
  EXPECT_EQ(model_held, after.memory.weights_bytes + after.memory.activation_bytes - arena_lists);
}

TEST_F(EngineLoopTest, ReserveMaxNeverPreempts) {
  MakeCache(32, 3);
  MakeEngine({.max_batch_size = 12, .admission = AdmissionMode::kReserveMax});
  std::vector<Stream*> streams;
  for (size_t i = 0; i < golden_.size(); ++i) streams.push_back(Submit(Greedy(i)));
  engine_->RunUntilIdle();
  for (size_t i = 0; i < golden_.size(); ++i) EXPECT_EQ(streams[i]->tokens, golden_[i].output);
  EXPECT_EQ(engine_->Stats().preemptions, 0);
}

TEST_F(EngineLoopTest, ReserveMaxCountsOnlyTheKvARequestCanUse) {
  // The last token's KV is never computed: 5 + 108 - 1 = 112 tokens fill 7 blocks and
  // 5 + 12 - 1 = 16 fill one, so the two fit the 8-block pool together and run at once.
  MakeCache(8, 1);
  MakeEngine({.admission = AdmissionMode::kReserveMax});
  Request big = Greedy(3);
  big.max_tokens = 108;
  Request small = Greedy(2);
  small.max_tokens = 12;
  Stream* b = Submit(big);
  Stream* s = Submit(small);
  engine_->RunUntilIdle();
  EXPECT_EQ(s->order, 0);  // it did not wait for the big one
  EXPECT_EQ(b->order, 1);
  EXPECT_EQ(b->tokens,
            std::vector<int32_t>(golden_[3].output.begin(), golden_[3].output.begin() + 108));
  EXPECT_EQ(engine_->Stats().preemptions, 0);
}

// kv_cache_config.max_seq_length reaches the engine as max_context_tokens: a request that
// fills that context before max_tokens ends with kContextLimit (a client can tell it from
// kLength), one whose max_tokens ends it exactly there with kLength, and a longer prompt is
// refused by the context it names.
TEST_F(EngineLoopTest, AContextCappedBelowTheModelsEndsGenerationWithContextLimit) {
  MakeCache(16, 1);
  ASSERT_GT(spec_.max_context_tokens, 40);
  MakeEngine({.max_context_tokens = 40});
  Request capped = Greedy(6);  // never emits BOS within its budget (GeneratorTest)
  const int32_t prompt = static_cast<int32_t>(capped.prompt.size());
  ASSERT_LT(prompt, 40);
  capped.max_tokens = 256;
  Request exact = capped;
  exact.max_tokens = 40 + 1 - prompt;  // the last token needs no position
  Request full = capped;               // a prompt that fills the context: one token
  full.prompt.resize(40, 300);
  Stream* c = Submit(capped);
  Stream* e = Submit(exact);
  Stream* f = Submit(full);
  engine_->RunUntilIdle();
  ASSERT_TRUE(c->finished);
  ASSERT_TRUE(e->finished);
  ASSERT_TRUE(f->finished);
  EXPECT_EQ(c->reason, FinishReason::kContextLimit);
  EXPECT_EQ(e->reason, FinishReason::kLength);
  EXPECT_EQ(f->reason, FinishReason::kContextLimit);
  EXPECT_EQ(f->tokens.size(), 1u);
  // Each was predicted no longer than the context leaves it (the predictor's 128 would have
  // recorded errors of -95 and -127 that no prediction made).
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.prediction_error.count, 3);
  EXPECT_EQ(stats.prediction_error.sum, 0);
  // Both ran to the same 41st position, with the model's greedy tokens.
  const std::vector<int32_t> want(golden_[6].output.begin(),
                                  golden_[6].output.begin() + (40 + 1 - prompt));
  EXPECT_EQ(c->tokens, want);
  EXPECT_EQ(e->tokens, want);
  EXPECT_EQ(engine_->Stats().cache.used_blocks, 0);

  Request too_long = Greedy(6);
  too_long.prompt.assign(41, 300);
  auto s = engine_->Submit(too_long, nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("41 tokens, the context holds 40"));
}

TEST_F(EngineLoopTest, CancelFreesBlocksWithinAStep) {
  MakeCache(64, 4);
  MakeEngine();
  uint64_t handle = 0;
  uint64_t other_handle = 0;
  Stream* victim = Submit(Greedy(0), &handle);
  Stream* other = Submit(Greedy(2), &other_handle);
  // A third request cancels the victim from its stream callback once 5 tokens arrived (as a
  // disconnecting client would). At its next event, one step later, the victim is finished
  // and the pool's used blocks are those of the two still running.
  Request r = Greedy(4);
  r.max_tokens = 30;
  uint64_t canceller = 0;
  int cancelled_after = -1;
  bool checked = false;
  auto h = engine_->Submit(r, [&](const StreamEvent&) {
    if (cancelled_after >= 0 && !checked) {
      checked = true;
      EXPECT_TRUE(victim->finished);
      EXPECT_FALSE(cache_->HasSequence(static_cast<SeqId>(handle)));
      // The two still run (max_tokens keeps them going past this event); a held sequence's
      // blocks are counted, and an unknown one would be a failure, not a crash.
      size_t held = 0;
      for (const uint64_t live : {other_handle, canceller}) {
        EXPECT_TRUE(cache_->HasSequence(static_cast<SeqId>(live))) << live;
        if (cache_->HasSequence(static_cast<SeqId>(live))) {
          held += cache_->BlockIds(static_cast<SeqId>(live)).size();
        }
      }
      EXPECT_EQ(cache_->stats().used_blocks, held);
    }
    if (cancelled_after < 0 && victim->tokens.size() >= 5) {
      cancelled_after = static_cast<int>(victim->tokens.size());
      engine_->Cancel(handle);
    }
  });
  ASSERT_TRUE(h.ok()) << h.status();
  canceller = *h;
  engine_->RunUntilIdle();
  EXPECT_TRUE(checked);
  ASSERT_TRUE(victim->finished);
  EXPECT_EQ(victim->reason, FinishReason::kCancelled);
  EXPECT_EQ(static_cast<int>(victim->tokens.size()), cancelled_after);
  EXPECT_EQ(other->tokens, golden_[2].output);
  EXPECT_EQ(engine_->Stats().cache.used_blocks, 0);
  engine_->Cancel(handle);  // finished handles are ignored
  engine_->Cancel(12345);
  engine_->RunUntilIdle();
}

TEST_F(EngineLoopTest, HigherPriorityRunsFirst) {
  MakeCache(64, 4);
  MakeEngine({.max_batch_size = 1});
  Request low = Greedy(0);
  low.max_tokens = 10;
  Request high = Greedy(2);
  high.max_tokens = 10;
  high.priority = 5;
  Stream* l = Submit(low);
  Stream* h = Submit(high);
  engine_->RunUntilIdle();
  EXPECT_EQ(h->order, 0);
  EXPECT_EQ(l->order, 1);
}

TEST_F(EngineLoopTest, PreemptionTakesTheLowerPriorityRequest) {
  // 7 blocks (112 tokens) hold either request, not both; prompt-only admission lets both in,
  // so the pool runs out as they grow. The later, higher-priority one, whose longer prompt
  // puts it a block ahead, is the one that finds it full: it keeps running and the
  // lower-priority one, planned before it in admission order, is preempted.
  MakeCache(1, 7);
  MakeEngine({.admission = AdmissionMode::kOptimistic});
  Request low = Greedy(0);
  low.max_tokens = 100;
  Request high = Greedy(10);  // a 32-token prompt
  high.max_tokens = 60;
  high.priority = 10;
  Stream* h = nullptr;
  streams_.push_back(std::make_unique<Stream>());
  Stream* l = streams_.back().get();
  ASSERT_TRUE(engine_
                  ->Submit(low,
                           [&](const StreamEvent& e) {
                             l->tokens.insert(l->tokens.end(), e.token_ids.begin(),
                                              e.token_ids.end());
                             if (e.finished) {
                               l->finished = true;
                               l->usage = e.usage;
                               l->order = finished_++;
                             }
                             if (h == nullptr) h = Submit(high);  // after low's first token
                           })
                  .ok());
  engine_->RunUntilIdle();
  ASSERT_TRUE(l->finished);
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(h->finished);
  EXPECT_EQ(h->usage.num_preemptions, 0);
  EXPECT_GE(l->usage.num_preemptions, 1);
  EXPECT_EQ(h->tokens,
            std::vector<int32_t>(golden_[10].output.begin(), golden_[10].output.begin() + 60));
  EXPECT_EQ(l->tokens,
            std::vector<int32_t>(golden_[0].output.begin(), golden_[0].output.begin() + 100));
  EXPECT_LT(h->order, l->order);
}

TEST_F(EngineLoopTest, ABusySessionLetsTheRequestsBehindItBy) {
  MakeCache(64, 4);
  MakeEngine();
  Request first = Greedy(0);
  first.max_tokens = 100;
  first.session_id = "s";
  Request second = Greedy(1);  // the same session: waits for the first turn to end
  second.max_tokens = 5;
  second.session_id = "s";
  Request other = Greedy(2);  // no session: nothing to wait for
  other.max_tokens = 5;
  Stream* a = Submit(first);
  Stream* b = Submit(second);
  Stream* c = Submit(other);
  engine_->RunUntilIdle();
  EXPECT_EQ(c->order, 0);
  EXPECT_EQ(a->order, 1);
  EXPECT_EQ(b->order, 2);
  EXPECT_EQ(c->tokens,
            std::vector<int32_t>(golden_[2].output.begin(), golden_[2].output.begin() + 5));
}

TEST_F(EngineLoopTest, IdleSessionPinsGiveWayToARequestThatNeedsTheRoom) {
  MakeCache(16, 1);  // 16 blocks of 16 tokens; at most half of them pinned
  MakeEngine();
  Request turn = Greedy(1);
  turn.max_tokens = 100;
  turn.session_id = "s";
  Submit(turn);
  engine_->RunUntilIdle();
  const int64_t pinned = cache_->stats().pinned_blocks;
  ASSERT_GT(pinned, 16 - 13);  // what follows cannot fit beside them
  Request big = Greedy(0);
  big.prompt.assign(200, 300);  // 13 blocks with its output
  big.max_tokens = 8;
  Stream* s = Submit(big);
  engine_->RunUntilIdle();
  ASSERT_TRUE(s->finished);
  EXPECT_TRUE(s->error.ok()) << s->error;
  EXPECT_EQ(s->reason, FinishReason::kLength);
  EXPECT_EQ(s->tokens.size(), 8u);
  const KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.session_releases_pressure, 1);
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(engine_->Stats().preemptions, 0);
}

TEST_F(EngineLoopTest, StopStringsAreNeverStreamedInPart) {
  MakeCache(64, 4);
  MakeEngine();
  Request r = Greedy(0);
  r.stop = {" Lily"};
  Stream* s = Submit(r);
  engine_->RunUntilIdle();
  EXPECT_EQ(s->reason, FinishReason::kStop);
  EXPECT_EQ(s->text, ", there was a little girl named");
  for (const std::string& d : s->deltas) EXPECT_THAT(d, ::testing::Not(HasSubstr("Lil")));
  EXPECT_EQ(s->usage.completion_tokens, static_cast<int32_t>(s->tokens.size()));
}

TEST_F(EngineLoopTest, TextDeltasConcatenateToTheDecodedOutput) {
  MakeCache(64, 4);
  MakeEngine();
  Stream* s = Submit(Greedy(2));
  engine_->RunUntilIdle();
  EXPECT_EQ(s->tokens, golden_[2].output);
  EXPECT_EQ(s->text, tokenizer_->Decode(s->tokens, golden_[2].prompt.back()));
  EXPECT_EQ(s->reason, FinishReason::kStop);  // BOS
  EXPECT_EQ(s->usage.prompt_tokens, 5);
}

TEST_F(EngineLoopTest, RejectsWhatCanNeverRun) {
  MakeCache(8, 1);  // 128 tokens in all
  MakeEngine({.max_waiting_requests = 2});
  Request big = Greedy(0);
  big.prompt.assign(200, 300);
  auto s = engine_->Submit(big, nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("200 tokens"));
  EXPECT_EQ(engine_->Stats().requests_rejected, 1);
  Request bad = Greedy(0);
  bad.max_tokens = 0;
  EXPECT_THAT(engine_->Submit(bad, nullptr).status().message(), HasSubstr("max_tokens"));
  bad = Greedy(0);
  bad.prompt.push_back(512);
  EXPECT_THAT(engine_->Submit(bad, nullptr).status().message(), HasSubstr("512"));
  bad = Greedy(0);
  bad.sampling.top_p = 2;
  EXPECT_THAT(engine_->Submit(bad, nullptr).status().message(), HasSubstr("top_p"));
  // A prompt that fits, with more output than the rest of the pool can hold: it could only
  // be cut short, so it is refused up front. The KV of every token but the last is kept.
  Request fits = Greedy(0);
  const int32_t prompt = static_cast<int32_t>(fits.prompt.size());
  ASSERT_LT(prompt, 128);
  fits.max_tokens = 128 - prompt + 1;
  Request too_long = fits;
  ++too_long.max_tokens;
  s = engine_->Submit(too_long, nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("max_tokens: ", too_long.max_tokens,
                                                           " with a ", prompt, "-token prompt")));
  EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("max_tokens <= ", fits.max_tokens)));
  EXPECT_EQ(engine_->Stats().requests_rejected, 2);
  ASSERT_TRUE(engine_->Submit(fits, nullptr).ok());
  Request other = Greedy(1);
  other.max_tokens = 8;
  ASSERT_TRUE(engine_->Submit(other, nullptr).ok());
  EXPECT_EQ(engine_->Submit(other, nullptr).status().code(),
            absl::StatusCode::kResourceExhausted);  // queue full
  engine_->BeginDrain();
  engine_->RunUntilIdle();
  EXPECT_EQ(engine_->Submit(other, nullptr).status().code(), absl::StatusCode::kUnavailable);
  // The request's own faults are judged before the engine's state: one that could never run,
  // or is malformed, is refused as such while draining too (Unavailable would invite a retry
  // elsewhere that fails the same way).
  EXPECT_EQ(engine_->Submit(too_long, nullptr).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(engine_->Submit(bad, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineLoopTest, SessionKeepsKvBetweenTurnsAndReleasesItWhenIdle) {
  MakeCache(32, 4);  // 128 blocks: fewer than the twelve stories' distinct blocks
  MakeEngine();
  Request turn1 = Greedy(0);
  turn1.max_tokens = 40;
  turn1.session_id = "chat-1";
  Stream* a = Submit(turn1);
  engine_->RunUntilIdle();
  ASSERT_EQ(a->tokens.size(), 40u);
  EXPECT_GT(engine_->Stats().cache.pinned_blocks, 0);

  // Turn 2 sends the whole conversation plus new text; only the new part is prefilled.
  Request turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), a->tokens.begin(), a->tokens.end());
  const std::vector<int32_t> more = tokenizer_->Encode("Then she went home.", false);
  turn2.prompt.insert(turn2.prompt.end(), more.begin(), more.end());
  const int32_t history = static_cast<int32_t>(turn1.prompt.size() + a->tokens.size());
  Stream* b = Submit(turn2);
  engine_->RunUntilIdle();
  EXPECT_GE(b->usage.cached_prompt_tokens, history - 1);
  EXPECT_GT(engine_->Stats().cache.session_hit_tokens, 0);

  // The same prompt without the session gives the same output.
  Request cold = turn2;
  cold.session_id.clear();
  Stream* c = Submit(cold);
  engine_->RunUntilIdle();
  EXPECT_EQ(c->tokens, b->tokens);

  // Idle past the timeout: pins become ordinary cached blocks...
  const int64_t pinned = engine_->Stats().cache.pinned_blocks;
  ASSERT_GT(pinned, 0);
  clock_.Advance(absl::Seconds(31));
  cache_->Tick();
  KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(st.session_releases_idle, 1);
  EXPECT_GT(st.cached_blocks, 0);
  // ...which pressure evicts: fill the pool with other stories.
  for (size_t i = 0; i < golden_.size(); ++i) Submit(Greedy(i));
  engine_->RunUntilIdle();
  EXPECT_GT(cache_->stats().evictions, 0);
  EXPECT_THAT(engine_->CloseSession("chat-1").code(), absl::StatusCode::kNotFound);
}

// A session turn P runs; a long high-priority request H arrives and, as both grow, takes
// P's blocks (16 in all: H alone needs 15). `while_p_waits` runs as H finishes, while P
// waits to be recomputed.
class PreemptedSessionTest : public EngineLoopTest {
 protected:
  // Returns P's stream; `p_handle` gets P's handle before P is preempted.
  Stream* RunPreemptedTurn(const std::function<void()>& while_p_waits,
                           uint64_t* p_handle = nullptr) {
    MakeCache(16, 1);
    MakeEngine({.admission = AdmissionMode::kOptimistic});
    Request p = Greedy(0);
    p.session_id = "p";
    p.max_tokens = 100;  // 105 tokens: 7 blocks
    Request h = Greedy(1);
    h.prompt.assign(216, 300);  // 14 blocks; 15 with its output
    h.max_tokens = 24;
    h.stop_token_ids.clear();
    h.priority = 1;
    bool submitted = false;
    Stream* ps = Submit(p, p_handle, [&](const Stream& s) {
      if (submitted || s.tokens.size() < 16) return;
      submitted = true;
      Submit(h, nullptr, [&](const Stream& hs) {
        if (!hs.finished) return;
        EXPECT_EQ(hs.tokens.size(), 24u);
        while_p_waits();
      });
    });
    engine_->RunUntilIdle();
    EXPECT_TRUE(submitted);
    EXPECT_TRUE(ps->finished);
    EXPECT_EQ(ps->usage.num_preemptions, 1);
    return ps;
  }
  void ExpectRecomputedToItsEnd(const Stream& p) {
    EXPECT_TRUE(p.error.ok()) << p.error;
    EXPECT_EQ(p.tokens,
              std::vector<int32_t>(golden_[0].output.begin(), golden_[0].output.begin() + 100));
  }
};

// The session stays with its preempted turn: it is still there (holding nothing), and
// closing it works, as for a running turn: the turn then ends without pinning its KV.
TEST_F(PreemptedSessionTest, ClosingItWhileItsTurnWaitsWorks) {
  Stream* p = RunPreemptedTurn([&] {
    EXPECT_EQ(cache_->stats().num_sessions, 1);
    EXPECT_EQ(cache_->stats().pinned_blocks, 0);
    EXPECT_TRUE(engine_->CloseSession("p").ok());
  });
  ExpectRecomputedToItsEnd(*p);
  const KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(st.session_releases_closed, 1);
  EXPECT_EQ(st.session_releases_pressure, 0);
}

// The session's next turn, though of higher priority, waits for the preempted one.
TEST_F(PreemptedSessionTest, ItsNextTurnWaitsForIt) {
  Request r = Greedy(2);
  r.session_id = "p";
  r.max_tokens = 4;
  r.priority = 2;
  Stream* next = nullptr;
  Stream* p = RunPreemptedTurn([&] { next = Submit(r); });
  ExpectRecomputedToItsEnd(*p);
  ASSERT_NE(next, nullptr);
  ASSERT_TRUE(next->finished);
  EXPECT_LT(p->order, next->order);
  EXPECT_EQ(cache_->stats().num_sessions, 1);
}

// A preempted turn cancelled while it waits lets its session go on, empty: the next turn
// runs, and the session is there until its idle timeout.
TEST_F(PreemptedSessionTest, CancellingItsTurnWhileItWaitsFreesTheSession) {
  Request r = Greedy(2);
  r.session_id = "p";
  r.max_tokens = 4;
  uint64_t handle = 0;
  Stream* next = nullptr;
  Stream* p = RunPreemptedTurn(
      [&] {
        engine_->Cancel(handle);
        next = Submit(r);
      },
      &handle);
  EXPECT_EQ(p->reason, FinishReason::kCancelled);
  ASSERT_NE(next, nullptr);
  ASSERT_TRUE(next->finished);
  EXPECT_TRUE(next->error.ok()) << next->error;
  EXPECT_EQ(next->tokens.size(), 4u);
  KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.num_sessions, 1);
  EXPECT_GT(st.pinned_blocks, 0);  // the next turn's history
  clock_.Advance(absl::Seconds(31));
  cache_->Tick();
  st = cache_->stats();
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.session_releases_idle, 1);
}

TEST_F(EngineLoopTest, CloseSessionReleasesAtOnce) {
  MakeCache(64, 4);
  MakeEngine();
  Submit(SessionTurn(0, 20));
  engine_->RunUntilIdle();
  ASSERT_GT(cache_->stats().pinned_blocks, 0);
  EXPECT_TRUE(engine_->CloseSession("s").ok());
  EXPECT_EQ(cache_->stats().pinned_blocks, 0);
  EXPECT_EQ(cache_->stats().session_releases_closed, 1);
}

// Closing a session also covers its turns sent before the close that have not started: they
// run without it, so none re-creates the session and pins its KV until the idle timeout. A
// close that names only such a turn succeeds.
TEST_F(EngineLoopTest, ClosingASessionCoversItsTurnsNotYetStarted) {
  MakeCache(64, 4);
  MakeEngine();
  const Request r = SessionTurn(0, 20);
  Stream* turn = Submit(r);
  EXPECT_TRUE(engine_->CloseSession("s").ok());
  engine_->RunUntilIdle();
  ASSERT_TRUE(turn->finished);
  EXPECT_EQ(turn->tokens,
            std::vector<int32_t>(golden_[0].output.begin(), golden_[0].output.begin() + 20));
  KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_THAT(engine_->CloseSession("s").code(), absl::StatusCode::kNotFound);
  // A turn sent after the close starts the session afresh.
  Submit(r);
  engine_->RunUntilIdle();
  st = cache_->stats();
  EXPECT_EQ(st.num_sessions, 1);
  EXPECT_GT(st.pinned_blocks, 0);
}

// The same for a turn queued behind a running one of its session: closed while the first
// runs, neither keeps the session, and the second runs beside the first.
TEST_F(EngineLoopTest, ClosingASessionCoversATurnWaitingForTheRunningOne) {
  MakeCache(64, 4);
  MakeEngine();
  bool closed = false;
  Stream* a = Submit(SessionTurn(0, 20), nullptr, [&](const Stream& s) {
    if (closed || s.tokens.size() < 5) return;
    closed = true;
    EXPECT_EQ(cache_->stats().num_sessions, 1);
    EXPECT_TRUE(engine_->CloseSession("s").ok());
  });
  Stream* b = Submit(SessionTurn(1, 10));
  engine_->RunUntilIdle();
  ASSERT_TRUE(closed);
  ASSERT_TRUE(a->finished && b->finished);
  // Without the session it no longer waits for the first turn: it starts the next step and,
  // shorter, ends first.
  EXPECT_LT(b->order, a->order);
  EXPECT_EQ(b->tokens,
            std::vector<int32_t>(golden_[1].output.begin(), golden_[1].output.begin() + 10));
  const KvCacheStats st = cache_->stats();
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.pinned_blocks, 0);
  EXPECT_EQ(st.session_releases_closed, 1);
}

// On the engine's own thread the close comes in at a step's intake, after every turn sent
// before it: the waiting turn runs without the session.
TEST_F(EngineLoopTest, ClosingASessionOnTheEngineThreadCoversItsQueuedTurns) {
  MakeCache(64, 4);
  MakeEngine();
  engine_->Start();
  Request first = SessionTurn(0, 200);
  first.stop_token_ids.clear();
  Submit(first);
  Stream* b = Submit(SessionTurn(1, 10));
  EXPECT_TRUE(engine_->CloseSession("s").ok());
  ASSERT_TRUE(engine_->WaitIdle(absl::Seconds(60)));
  ASSERT_TRUE(b->finished);
  EXPECT_TRUE(b->error.ok()) << b->error;
  const KvCacheStats st = engine_->Stats().cache;  // as of the last step's end
  EXPECT_EQ(st.num_sessions, 0);
  EXPECT_EQ(st.pinned_blocks, 0);
  engine_->BeginDrain();
  engine_->Stop();
}

// A turn sent after the close keeps the session though it reaches the engine in the same
// intake as the close: the close covers only turns sent before it. Here the engine thread,
// in a stream callback, holds the intake while another thread closes the session and then a
// turn of it is sent.
TEST_F(EngineLoopTest, ATurnSentAfterTheCloseInTheSameIntakeStartsTheSessionAfresh) {
  MakeCache(64, 4);
  MakeEngine();
  engine_->Start();
  std::thread closer;
  absl::Status closed = absl::UnknownError("not called");
  Stream* b = nullptr;
  Submit(SessionTurn(0, 20), nullptr, [&](const Stream& s) {
    if (b != nullptr || s.tokens.empty()) return;
    closer = std::thread([&] { closed = engine_->CloseSession("s"); });
    absl::SleepFor(absl::Milliseconds(300));  // the close is queued: it waits for the intake
    b = Submit(SessionTurn(1, 10));
  });
  ASSERT_TRUE(engine_->WaitIdle(absl::Seconds(60)));
  closer.join();
  EXPECT_TRUE(closed.ok()) << closed;
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->finished);
  EXPECT_TRUE(b->error.ok()) << b->error;
  const KvCacheStats st = engine_->Stats().cache;
  EXPECT_EQ(st.session_releases_closed, 1);  // the first turn's session
  EXPECT_EQ(st.num_sessions, 1);             // the next turn's, started afresh
  EXPECT_GT(st.pinned_blocks, 0);
  engine_->BeginDrain();
  engine_->Stop();
}

// Two threads stopping at once: the second returns only once the first has aborted every
// request, since what follows a Stop (the destructor) frees what that abort still uses. Here
// the second starts from the first one's abort, in a stream callback.
TEST_F(EngineLoopTest, ASecondStopReturnsOnlyOnceTheFirstHasAbortedEveryRequest) {
  MakeCache(64, 4);
  MakeEngine();
  std::thread second;
  std::atomic<bool> second_returned = false;
  bool returned_during_abort = true;
  Stream* s = Submit(Greedy(0), nullptr, [&](const Stream& st) {
    if (!st.finished) return;
    second = std::thread([&] {
      engine_->Stop();
      second_returned = true;
    });
    absl::SleepFor(absl::Milliseconds(300));
    returned_during_abort = second_returned;
  });
  engine_->Stop();  // never started: aborts the queued request on this thread
  ASSERT_TRUE(second.joinable());
  second.join();
  EXPECT_EQ(s->reason, FinishReason::kAborted);
  EXPECT_FALSE(returned_during_abort);
  EXPECT_TRUE(second_returned);
}

// A request whose deadline passes while it runs ends there, kDeadline, with the tokens it had
// and its blocks freed; the request beside it runs on.
TEST_F(EngineLoopTest, ARunningRequestPastItsDeadlineEndsThere) {
  MakeCache(64, 4);
  MakeEngine();
  Request late = Greedy(0);
  late.deadline = clock_.Now() + absl::Seconds(1);
  Stream* other = Submit(Greedy(1));
  size_t tokens_by_deadline = 0;
  Stream* s = Submit(late, nullptr, [&](const Stream& st) {
    if (tokens_by_deadline == 0 && st.tokens.size() >= 3) {
      tokens_by_deadline = st.tokens.size();
      clock_.Advance(absl::Seconds(2));
    }
  });
  engine_->RunUntilIdle();
  ASSERT_TRUE(s->finished);
  EXPECT_EQ(s->reason, FinishReason::kDeadline);
  EXPECT_TRUE(s->error.ok()) << s->error;
  // Its tokens so far, the greedy output's start, and nothing after the deadline.
  ASSERT_GE(tokens_by_deadline, 3u);
  ASSERT_LT(tokens_by_deadline, golden_[0].output.size());
  ASSERT_EQ(s->tokens.size(), tokens_by_deadline);
  EXPECT_TRUE(std::equal(s->tokens.begin(), s->tokens.end(), golden_[0].output.begin()));
  EXPECT_EQ(s->usage.completion_tokens, static_cast<int32_t>(tokens_by_deadline));
  EXPECT_EQ(other->tokens, golden_[1].output);
  EXPECT_TRUE(other->error.ok()) << other->error;
  EXPECT_EQ(cache_->stats().used_blocks, 0);
  EXPECT_TRUE(cache_->CheckInvariants().ok());
}

// A request still waiting when its deadline passes ends without a token, kDeadline, its whole
// life counted as queue time.
TEST_F(EngineLoopTest, AWaitingRequestPastItsDeadlineEndsWithoutAToken) {
  MakeCache(64, 4);
  MakeEngine({.max_batch_size = 1});
  bool advanced = false;
  Stream* first = Submit(Greedy(0), nullptr, [&](const Stream& st) {
    if (!advanced && !st.tokens.empty()) clock_.Advance(absl::Seconds(2));
    advanced = advanced || !st.tokens.empty();
  });
  Request late = Greedy(1);
  late.deadline = clock_.Now() + absl::Seconds(1);
  Stream* s = Submit(late);
  engine_->RunUntilIdle();
  ASSERT_TRUE(s->finished);
  EXPECT_EQ(s->reason, FinishReason::kDeadline);
  EXPECT_TRUE(s->tokens.empty());
  EXPECT_EQ(s->usage.queue_time, s->usage.total_time);
  EXPECT_GE(s->usage.queue_time, absl::Seconds(2));
  EXPECT_EQ(first->tokens, golden_[0].output);  // no deadline: runs to its end
  EXPECT_EQ(cache_->stats().used_blocks, 0);
}

TEST_F(EngineLoopTest, DefragmentationDuringGenerationChangesNoOutput) {
  // 16-block chunks: the twelve stories grow the pool to many chunks; as short stories
  // finish, live blocks move down and emptied top chunks are released.
  MakeCache(16, 32, /*defrag=*/true);
  MakeEngine({.max_batch_size = 12});
  std::vector<Stream*> streams;
  for (size_t i = 0; i < golden_.size(); ++i) streams.push_back(Submit(Greedy(i)));
  engine_->RunUntilIdle();
  for (size_t i = 0; i < golden_.size(); ++i) {
    EXPECT_EQ(streams[i]->tokens, golden_[i].output) << "case " << i;
  }
  EXPECT_GE(max_chunks_seen_, 4);
  EXPECT_GT(cache_->stats().defrag_moves, 0);  // blocks in use moved: during generation
  for (int i = 0; i < 64 && cache_->stats().num_chunks > 1; ++i) cache_->Tick();
  EXPECT_EQ(cache_->stats().num_chunks, 1);
  EXPECT_TRUE(cache_->CheckInvariants().ok());
}

TEST_F(EngineLoopTest, PrefillIsChunkedPerSequence) {
  MakeCache(64, 4);
  MakeEngine({.prefill_chunk_tokens = 4});
  Request r = Greedy(10);  // a 32-token prompt
  r.max_tokens = 10;
  Stream* s = Submit(r);
  engine_->RunUntilIdle();
  EXPECT_EQ(s->tokens,
            std::vector<int32_t>(golden_[10].output.begin(), golden_[10].output.begin() + 10));
  // 8 prefill steps of 4 tokens (the last one samples), then 9 decode steps.
  EXPECT_EQ(engine_->Stats().steps, 8 + 9);
}

TEST_F(EngineLoopTest, RunsOnItsOwnThread) {
  MakeCache(64, 4);
  MakeEngine();
  engine_->Start();
  Stream* s = Submit(Greedy(4));
  ASSERT_TRUE(engine_->WaitIdle(absl::Seconds(60)));
  EXPECT_EQ(s->tokens, golden_[4].output);
  Request r = Greedy(0);
  r.session_id = "t";
  r.max_tokens = 5;
  Submit(r);
  ASSERT_TRUE(engine_->WaitIdle(absl::Seconds(60)));
  EXPECT_TRUE(engine_->CloseSession("t").ok());
  engine_->BeginDrain();
  engine_->Stop();
}

// WaitIdle returns only once every request submitted before it has finished, also when the
// engine thread is mid-step as the request arrives: here it steps continuously (no idle
// wait), so submissions keep landing between one step's end and the next one's intake.
TEST_F(EngineLoopTest, WaitIdleWaitsForRequestsSubmittedMidStep) {
  MakeCache(64, 4);
  MakeEngine({.idle_tick = absl::ZeroDuration()});
  engine_->Start();
  for (int i = 0; i < 300; ++i) {
    Request r = Greedy(4);
    r.max_tokens = 1;
    Stream* s = Submit(r);
    ASSERT_TRUE(engine_->WaitIdle(absl::Seconds(60)));
    ASSERT_TRUE(s->finished) << "submission " << i;
    EXPECT_EQ(s->tokens.size(), 1u);
  }
  engine_->BeginDrain();
  engine_->Stop();
}

}  // namespace
}  // namespace kvd
