// LlamaModel's decode graphs (SetDecodeGraphs) on the CPU reference backend behind
// FakeGraphBackend: a replayed step gives the uncaptured step's logits, and a step that fails
// to allocate leaves the model able to run the next steps correctly, never replaying a graph
// over memory it freed nor over a metadata buffer it lost.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/cpu_backend.h"
#include "model/llama_model.h"
#include "model/synthetic_model.h"
#include "tests/model/fake_graph_backend.h"

namespace kvd {
namespace {

using test::FakeGraphBackend;
using test::FakeGraphRecorder;

constexpr int32_t kBlockSize = 16;

// A zeroed single-chunk f32 KV arena of 1 << chunk_shift blocks in `backend`'s memory.
class KvArena {
 public:
  KvArena(Backend* backend, const ModelSpec& spec, int32_t chunk_shift) {
    const int64_t block_bytes =
        int64_t{spec.num_kv_heads} * kBlockSize * spec.head_dim * sizeof(float);
    const int64_t region_bytes = block_bytes << chunk_shift;
    const size_t bytes = static_cast<size_t>(region_bytes * 2 * spec.num_layers);
    chunk_ = *backend->Allocate(bytes);
    std::memset(chunk_.data(), 0, bytes);
    chunks_[0] = chunk_.data();
    for (int32_t l = 0; l < spec.num_layers; ++l) {
      views_.push_back({.chunks = chunks_,
                        .num_chunks = 1,
                        .chunk_shift = chunk_shift,
                        .k_offset_bytes = region_bytes * (2 * l),
                        .v_offset_bytes = region_bytes * (2 * l + 1),
                        .block_bytes = block_bytes,
                        .dtype = DType::kF32,
                        .num_kv_heads = spec.num_kv_heads,
                        .block_size = kBlockSize,
                        .head_dim = spec.head_dim});
    }
  }
  absl::Span<const KvCacheView> views() const { return views_; }

 private:
  DeviceBuffer chunk_;
  void* chunks_[1] = {nullptr};
  std::vector<KvCacheView> views_;
};

// One decode token (id 3 + i) for each sequence i, whose context this token included is
// lens[i] tokens in consecutive blocks from first_blocks[i].
ForwardBatch Decode(const std::vector<int32_t>& lens, const std::vector<int32_t>& first_blocks) {
  ForwardBatch batch;
  for (size_t i = 0; i < lens.size(); ++i) {
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b * kBlockSize < lens[i]; ++b) blocks.push_back(first_blocks[i] + b);
    const int32_t token = 3 + static_cast<int32_t>(i);
    batch.AddSequence({&token, 1}, lens[i] - 1, blocks, kBlockSize, /*want_logits=*/true);
  }
  return batch;
}

// Whole prompts of `tokens` tokens for sequences in consecutive blocks from each of
// first_blocks, every one wanting logits.
ForwardBatch Prefill(int32_t tokens, const std::vector<int32_t>& first_blocks) {
  ForwardBatch batch;
  std::vector<int32_t> prompt(tokens);
  for (int32_t i = 0; i < tokens; ++i) prompt[i] = 5 + i % 200;
  for (int32_t first : first_blocks) {
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b * kBlockSize < tokens; ++b) blocks.push_back(first + b);
    batch.AddSequence(prompt, 0, blocks, kBlockSize, /*want_logits=*/true);
  }
  return batch;
}

// A model with decode graphs on FakeGraphBackend beside the same model without them on the
// plain CPU backend, each over its own arena.
class GraphedAndReference {
 public:
  GraphedAndReference(int32_t max_batch_size, int32_t chunk_shift)
      : spec_(*SyntheticSpec("tiny")),
        graphed_(*LlamaModel::Create(*MakeSyntheticWeights(spec_, 11), &fake_)),
        reference_(*LlamaModel::Create(*MakeSyntheticWeights(spec_, 11), &cpu_)),
        graphed_kv_(&fake_, spec_, chunk_shift),
        reference_kv_(&cpu_, spec_, chunk_shift) {
    graphed_->SetDecodeGraphs(std::make_unique<FakeGraphRecorder>(&fake_), max_batch_size);
  }
  FakeGraphBackend& fake() { return fake_; }
  LlamaModel& graphed() { return *graphed_; }
  const DecodeGraphStats& stats() const { return graphed_->decode_graph_stats(); }
  absl::Span<const KvCacheView> graphed_kv() const { return graphed_kv_.views(); }

  // Runs `batch` on both models: OK, and the same logits bit for bit.
  void ExpectSameLogits(const ForwardBatch& batch) {
    std::vector<float> graphed_logits, reference_logits;
    const absl::Status graphed = graphed_->Forward(batch, graphed_kv_.views(), &graphed_logits);
    ASSERT_TRUE(graphed.ok()) << graphed;
    const absl::Status reference =
        reference_->Forward(batch, reference_kv_.views(), &reference_logits);
    ASSERT_TRUE(reference.ok()) << reference;
    ASSERT_EQ(graphed_logits.size(), batch.logit_rows.size() * spec_.vocab_size);
    EXPECT_EQ(graphed_logits, reference_logits);
  }

 private:
  // Declared before the models and arenas, which free into them.
  FakeGraphBackend fake_;
  CpuBackend cpu_{1};
  ModelSpec spec_;
  std::unique_ptr<LlamaModel> graphed_, reference_;
  KvArena graphed_kv_, reference_kv_;
};

TEST(LlamaModelGraphsTest, ReplayedStepsEqualUncapturedSteps) {
  GraphedAndReference models(/*max_batch_size=*/2, /*chunk_shift=*/6);
  for (int32_t step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    models.ExpectSameLogits(Decode({20 + step, 40 + step}, {0, 10}));
  }
  EXPECT_EQ(models.stats().captures, 1);
  EXPECT_EQ(models.stats().replays, 3);
  EXPECT_EQ(models.stats().capture_failures, 0);
}

// Three sequences in the bucket of four: the padding row (token 0, no K/V write) is recorded
// and replayed with the real ones, whose logits equal the uncaptured steps'. Four sequences
// replay the same graph; one sequence records the bucket of one.
TEST(LlamaModelGraphsTest, BatchesPaddedToTheirBucketEqualUncapturedSteps) {
  GraphedAndReference models(/*max_batch_size=*/4, /*chunk_shift=*/6);
  for (int32_t step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    models.ExpectSameLogits(Decode({20 + step, 40 + step, 3 + step}, {0, 10, 20}));
  }
  EXPECT_EQ(models.stats().captures, 1);
  EXPECT_EQ(models.stats().replays, 2);
  models.ExpectSameLogits(Decode({23, 43, 6, 70}, {0, 10, 20, 30}));  // the full bucket
  EXPECT_EQ(models.stats().replays, 3);
  models.ExpectSameLogits(Decode({24}, {0}));  // bucket 1
  EXPECT_EQ(models.stats().captures, 2);
  EXPECT_EQ(models.stats().capture_failures, 0);
}

// A graph promises its attention the longest context of its class (the power of two at or
// above it, 256 keys at least), which the CPU backend holds it to: a longer context records
// the next class's graph instead of replaying the last one, and a batch back in an earlier
// class replays that class's graph.
TEST(LlamaModelGraphsTest, GraphsAreRecordedPerContextClass) {
  GraphedAndReference models(/*max_batch_size=*/2, /*chunk_shift=*/7);
  models.ExpectSameLogits(Decode({200}, {0}));  // class 256: recorded
  models.ExpectSameLogits(Decode({256}, {0}));  // replayed
  EXPECT_EQ(models.stats().captures, 1);
  EXPECT_EQ(models.stats().replays, 1);
  models.ExpectSameLogits(Decode({257}, {0}));  // class 512: recorded
  models.ExpectSameLogits(Decode({512}, {0}));
  EXPECT_EQ(models.stats().captures, 2);
  EXPECT_EQ(models.stats().replays, 2);
  models.ExpectSameLogits(Decode({250}, {0}));          // class 256 again: replayed
  models.ExpectSameLogits(Decode({30, 513}, {0, 40}));  // bucket 2, class 1024: recorded
  models.ExpectSameLogits(Decode({31, 300}, {0, 40}));  // bucket 2, class 512: recorded
  EXPECT_EQ(models.stats().captures, 4);
  EXPECT_EQ(models.stats().replays, 3);
  EXPECT_EQ(models.stats().capture_failures, 0);
}

// Runs `warmup` and two decode steps (recorded, replayed) on both models, then `prefill` on
// the graphed one with its allocation `fail` failing, then two more decode steps.
void DecodeAroundAFailedPrefill(const std::vector<ForwardBatch>& warmup,
                                const ForwardBatch& prefill, int64_t fail) {
  GraphedAndReference models(/*max_batch_size=*/2, /*chunk_shift=*/6);
  for (const ForwardBatch& batch : warmup) models.ExpectSameLogits(batch);
  models.ExpectSameLogits(Decode({20, 40}, {0, 10}));
  models.ExpectSameLogits(Decode({21, 41}, {0, 10}));
  ASSERT_EQ(models.stats().replays, 1);

  models.fake().FailAllocation(fail);
  std::vector<float> logits;
  const absl::Status s = models.graphed().Forward(prefill, models.graphed_kv(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;

  models.ExpectSameLogits(Decode({22, 42}, {0, 10}));
  models.ExpectSameLogits(Decode({23, 43}, {0, 10}));
  EXPECT_EQ(models.stats().capture_failures, 0);
}

// A prefill that grows the activation scratch fails at each of its allocations in turn (a
// full device). Whatever buffers it replaced before the failure, the next decode steps give
// the uncaptured steps' logits: a graph recorded over a replaced buffer is recorded again,
// never replayed.
TEST(LlamaModelGraphsTest, AScratchGrowthFailingPartWayLeavesNoGraphOverFreedMemory) {
  // Three 70-token prompts: more tokens and logit rows than the decode bucket's scratch
  // holds; after a 210-token prompt with one logit row, more logit rows only.
  const ForwardBatch prefill = Prefill(70, {20, 30, 40});
  const std::vector<std::vector<ForwardBatch>> warmups = {{}, {Prefill(210, {50})}};
  for (const std::vector<ForwardBatch>& warmup : warmups) {
    SCOPED_TRACE(testing::Message() << warmup.size() << " warm-up prefills");
    int64_t allocations = 0;  // the prefill's, when none fails
    {
      GraphedAndReference models(2, 6);
      for (const ForwardBatch& batch : warmup) models.ExpectSameLogits(batch);
      models.ExpectSameLogits(Decode({20, 40}, {0, 10}));
      const int64_t before = models.fake().num_allocations();
      models.ExpectSameLogits(prefill);
      allocations = models.fake().num_allocations() - before;
    }
    // Token-row buffers then logit-row buffers, or the logit-row buffers alone.
    ASSERT_GE(allocations, warmup.empty() ? 6 : 2);
    for (int64_t fail = 0; fail < allocations; ++fail) {
      SCOPED_TRACE(testing::Message() << "allocation " << fail << " of the prefill fails");
      DecodeAroundAFailedPrefill(warmup, prefill, fail);
    }
  }
}

// Graphs need scratch for the largest bucket (8 here); where that cannot be had, a decode step
// runs uncaptured in scratch for its own two rows, and a later step records its graph.
// With decode graphs, the reservation covers their largest bucket too (8 rows for a batch of
// up to 6), which the first decode step would otherwise allocate.
TEST(LlamaModelGraphsTest, ReservedActivationsCoverTheLargestBucket) {
  GraphedAndReference models(/*max_batch_size=*/6, /*chunk_shift=*/6);
  const int64_t before = models.fake().allocated_bytes();
  ASSERT_TRUE(models.graphed().ReserveActivations(4, 2).ok());
  EXPECT_EQ(models.fake().allocated_bytes() - before,
            LlamaModel::ActivationBytes(models.graphed().spec(), 8, 8));
  const int64_t reserved = models.fake().allocated_bytes();
  models.ExpectSameLogits(Decode({20, 40}, {0, 10}));
  EXPECT_EQ(models.stats().captures, 1);
  // Beyond the reservation, only the graphs' metadata buffer.
  EXPECT_LT(models.fake().allocated_bytes() - reserved, 4096);
}

// A reservation the backend cannot hold fails with the backend's code, saying what it asked
// for.
TEST(LlamaModelGraphsTest, AReservationThatDoesNotFitSaysWhatItAskedFor) {
  GraphedAndReference models(/*max_batch_size=*/6, /*chunk_shift=*/6);
  models.fake().FailAllocation(2);
  const absl::Status s = models.graphed().ReserveActivations(4, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              ::testing::StartsWith(absl::StrCat(
                  "allocating the activations of a step of 8 tokens and 8 sampled rows (",
                  LlamaModel::ActivationBytes(models.graphed().spec(), 8, 8), " bytes): ")));
  // The model stays usable: a later reservation, and steps, succeed.
  ASSERT_TRUE(models.graphed().ReserveActivations(4, 2).ok());
  models.ExpectSameLogits(Decode({20, 40}, {0, 10}));
}

TEST(LlamaModelGraphsTest, ADecodeRunsUncapturedWhereTheLargestBucketsScratchCannotBeHad) {
  GraphedAndReference models(/*max_batch_size=*/8, /*chunk_shift=*/6);
  models.fake().FailAllocation(0);  // the first of the 8-row buffers
  models.ExpectSameLogits(Decode({20, 40}, {0, 10}));
  EXPECT_EQ(models.stats().captures, 0);
  models.ExpectSameLogits(Decode({21, 41}, {0, 10}));
  EXPECT_EQ(models.stats().captures, 1);
  models.ExpectSameLogits(Decode({22, 42}, {0, 10}));
  EXPECT_EQ(models.stats().replays, 1);
  EXPECT_EQ(models.stats().capture_failures, 0);
}

// The decode-graph metadata buffer must grow for a step with more blocks, and that allocation
// fails. The step fails, and the steps after it still run: those that fit the old buffer
// replay the graph recorded before, and the larger step grows the buffer once it can.
TEST(LlamaModelGraphsTest, AMetadataGrowthThatFailsKeepsTheBufferAndItsGraphs) {
  GraphedAndReference models(/*max_batch_size=*/1, /*chunk_shift=*/7);
  models.ExpectSameLogits(Decode({150}, {0}));  // 10 blocks: recorded
  ASSERT_EQ(models.stats().captures, 1);

  models.fake().FailAllocation(0);
  std::vector<float> logits;
  const absl::Status s =
      models.graphed().Forward(Decode({1600}, {0}), models.graphed_kv(), &logits);  // 100 blocks
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;

  models.ExpectSameLogits(Decode({151}, {0}));
  models.ExpectSameLogits(Decode({152}, {0}));
  EXPECT_EQ(models.stats().captures, 1);
  EXPECT_EQ(models.stats().replays, 2);
  models.ExpectSameLogits(Decode({1601}, {0}));
  models.ExpectSameLogits(Decode({1602}, {0}));
  EXPECT_EQ(models.stats().capture_failures, 0);
}

}  // namespace
}  // namespace kvd
