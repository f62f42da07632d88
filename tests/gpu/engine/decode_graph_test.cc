// Decode steps replayed as CUDA graphs (LlamaModel::SetDecodeGraphs) compute what the
// uncaptured path computes. Two models with the same seeded weights each drive their own KV
// arena with the same block tables: one never records, the other replays graphs. Prefill
// runs uncaptured in both, so the arenas start bit-identical; then both decode the same
// tokens and every step's logits are compared. A batch that fills its bucket must match bit
// for bit (same kernels, same shapes); a padded batch runs the GEMMs with more rows, so it
// must match to bf16 accuracy. Contexts cross the decode kernel's split boundaries (whole
// granules of at most 128 keys) between replays, a new KV chunk, grown scratch and a longer
// context class force a new recording, and batches that are not pure decodes never record.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cache/kv_arena.h"
#include "cache/kv_layout.h"
#include "model/llama_model.h"
#include "tests/gpu/gpu_test_util.h"
#include "tools/device.h"
#include "tools/random_model.h"

namespace kvd::gpu_test {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kChunkShift = 10;  // 1024 blocks = 16k tokens per chunk
constexpr uint64_t kSeed = 11;

// Small, but with head_dim 64 so attention takes the fast split-KV decode kernel.
ModelSpec SmallSpec() {
  ModelSpec s;
  s.name = "graph-test";
  s.num_layers = 2;
  s.dim = 256;
  s.hidden_dim = 512;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.vocab_size = 1000;
  s.max_context_tokens = 4096;
  return s;
}

// The result of one decode step in both engines.
struct StepCheck {
  bool bitwise_equal = false;
  double max_abs_diff = 0;
  double max_abs_ref = 0;
};

// Two engines over twin arenas: `eager_` never records, `graphed_` replays decode graphs.
class TwinDecode {
 public:
  TwinDecode(CudaBackend* gpu, int32_t max_batch) : gpu_(gpu), spec_(SmallSpec()) {
    eager_ = OrDie(CreateRandomModel(spec_, kSeed, gpu), "eager model");
    graphed_ = OrDie(CreateRandomModel(spec_, kSeed, gpu), "graphed model");
    graphed_->SetDecodeGraphs(MakeOpGraphRecorder(gpu), max_batch);
    const KvLayout layout =
        OrDie(KvLayout::Create({spec_.num_layers, spec_.num_kv_heads, spec_.head_dim}, DType::kBF16,
                               kBlockSize),
              "layout");
    for (auto* arena : {&eager_arena_, &graphed_arena_}) {
      *arena = OrDie(KvArena::Create(layout, kChunkShift, /*max_chunks=*/4, gpu), "arena");
    }
    AddChunk();
  }

  LlamaModel& graphed() { return *graphed_; }
  const DecodeGraphStats& stats() const { return graphed_->decode_graph_stats(); }

  // Adds a chunk to both arenas; sequences added afterwards live in it.
  void AddChunk() {
    OrDie(eager_arena_->AddChunk(), "AddChunk");
    OrDie(graphed_arena_->AddChunk(), "AddChunk");
    next_block_ = (eager_arena_->num_chunks() - 1) << kChunkShift;
  }

  // A sequence with a pseudo-random prompt of `prompt_len` tokens, prefilled (uncaptured)
  // in both engines, with blocks for `room` more tokens. Returns its index.
  int32_t AddSequence(int32_t prompt_len, int32_t room) {
    Seq s;
    const int32_t blocks = (prompt_len + room + kBlockSize - 1) / kBlockSize;
    for (int32_t b = 0; b < blocks; ++b) s.blocks.push_back(next_block_++);
    EXPECT_LE(next_block_, eager_arena_->num_chunks() << kChunkShift) << "test arena too small";
    std::vector<int32_t> prompt(prompt_len);
    for (int32_t i = 0; i < prompt_len; ++i) {
      prompt[i] = static_cast<int32_t>((seqs_.size() * 7919 + i * 104729 + 13) % 997);
    }
    ForwardBatch batch;
    batch.AddSequence(prompt, 0, s.blocks, kBlockSize, /*want_logits=*/true);
    std::vector<float> eager_logits, graphed_logits;
    OrDie(eager_->Forward(batch, Views(*eager_arena_), &eager_logits), "eager prefill");
    OrDie(graphed_->Forward(batch, Views(*graphed_arena_), &graphed_logits), "graphed prefill");
    EXPECT_EQ(0, std::memcmp(eager_logits.data(), graphed_logits.data(),
                             eager_logits.size() * sizeof(float)))
        << "prefill must be identical in both engines";
    s.len = prompt_len;
    s.next = Argmax(eager_logits.data());
    seqs_.push_back(s);
    return static_cast<int32_t>(seqs_.size()) - 1;
  }

  // One decode step of `ids` in both engines; both feed the eager engine's greedy token.
  StepCheck Step(const std::vector<int32_t>& ids) {
    ForwardBatch batch;
    for (int32_t id : ids) {
      const Seq& s = seqs_[id];
      batch.AddSequence({s.next}, s.len, s.blocks, kBlockSize, /*want_logits=*/true);
    }
    std::vector<float> ref, got;
    OrDie(eager_->Forward(batch, Views(*eager_arena_), &ref), "eager decode");
    OrDie(graphed_->Forward(batch, Views(*graphed_arena_), &got), "graphed decode");
    StepCheck check;
    check.bitwise_equal =
        ref.size() == got.size() && std::memcmp(ref.data(), got.data(), ref.size() * 4) == 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
      const double diff = std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) : INFINITY;
      check.max_abs_diff = std::max(check.max_abs_diff, diff);
      check.max_abs_ref = std::max(check.max_abs_ref, std::fabs(static_cast<double>(ref[i])));
    }
    for (size_t r = 0; r < ids.size(); ++r) {
      Seq& s = seqs_[ids[r]];
      ++s.len;
      s.next = Argmax(ref.data() + r * spec_.vocab_size);
    }
    return check;
  }

  int32_t len(int32_t id) const { return seqs_[id].len; }

 private:
  struct Seq {
    std::vector<int32_t> blocks;
    int32_t len = 0;
    int32_t next = 0;
  };

  std::vector<KvCacheView> Views(const KvArena& arena) const {
    std::vector<KvCacheView> views;
    for (int32_t l = 0; l < spec_.num_layers; ++l) views.push_back(arena.LayerView(l));
    return views;
  }
  int32_t Argmax(const float* row) const {
    return static_cast<int32_t>(std::max_element(row, row + spec_.vocab_size) - row);
  }

  CudaBackend* gpu_;
  ModelSpec spec_;
  std::unique_ptr<LlamaModel> eager_, graphed_;
  std::unique_ptr<KvArena> eager_arena_, graphed_arena_;
  int32_t next_block_ = 0;
  std::vector<Seq> seqs_;
};

using DecodeGraphTest = GpuVsCpuTest;

// Full buckets match bit for bit; padded ones to bf16 accuracy, and the padding rows never
// touch the real sequences' KV (a stray write would show in later steps of the twin).
TEST_F(DecodeGraphTest, ReplayedStepsEqualUncapturedStepsInEveryBucket) {
  for (int32_t n : {1, 2, 3, 4, 5, 8, 13, 16}) {
    SCOPED_TRACE(::testing::Message() << "batch of " << n);
    TwinDecode twin(&gpu(), /*max_batch=*/16);
    std::vector<int32_t> ids;
    // Contexts from 9 to ~1000 keys; sequence 0 starts at 120 and crosses 128 keys (a split
    // granule boundary) during the steps, so its split count changes between replays.
    for (int32_t i = 0; i < n; ++i) {
      ids.push_back(twin.AddSequence(i == 0 ? 120 : 9 + (i * 211) % 1000, /*room=*/16));
    }
    const bool full_bucket = (n & (n - 1)) == 0;
    constexpr int32_t kSteps = 12;
    for (int32_t step = 0; step < kSteps; ++step) {
      const StepCheck c = twin.Step(ids);
      SCOPED_TRACE(::testing::Message() << "step " << step << ", context " << twin.len(ids[0]));
      if (full_bucket) {
        EXPECT_TRUE(c.bitwise_equal) << "max |diff| " << c.max_abs_diff;
      } else {
        EXPECT_LE(c.max_abs_diff, 0.02 * std::max(1.0, c.max_abs_ref));
      }
    }
    EXPECT_GT(twin.len(ids[0]), 128);
    EXPECT_EQ(twin.stats().capture_failures, 0) << twin.stats().last_failure;
    EXPECT_EQ(twin.stats().captures, 1);
    EXPECT_EQ(twin.stats().replays, kSteps - 1);
  }
}

TEST_F(DecodeGraphTest, ANewKvChunkIsRecordedAgainAndRead) {
  TwinDecode twin(&gpu(), /*max_batch=*/8);
  std::vector<int32_t> first, second;
  for (int32_t i = 0; i < 4; ++i) first.push_back(twin.AddSequence(50 + 90 * i, 8));
  for (int32_t step = 0; step < 3; ++step) EXPECT_TRUE(twin.Step(first).bitwise_equal);
  EXPECT_EQ(twin.stats().captures, 1);
  EXPECT_EQ(twin.stats().replays, 2);

  // The chunk table keeps its address but num_chunks changes: the graph is recorded anew,
  // and sequences whose blocks all live in the new chunk decode correctly through it.
  twin.AddChunk();
  // Their longest context in the first batch's class (257 to 512 keys), so that the first
  // batch comes back to the graph recorded here.
  for (int32_t i = 0; i < 4; ++i) second.push_back(twin.AddSequence(70 + 80 * i, 8));
  for (int32_t step = 0; step < 3; ++step) EXPECT_TRUE(twin.Step(second).bitwise_equal);
  EXPECT_EQ(twin.stats().captures, 2);
  EXPECT_EQ(twin.stats().replays, 4);
  EXPECT_TRUE(twin.Step(first).bitwise_equal);  // the old chunk through the new graph
  EXPECT_EQ(twin.stats().replays, 5);
  EXPECT_EQ(twin.stats().capture_failures, 0) << twin.stats().last_failure;
}

// A graph promises its attention the longest context of its class (a power of two of at
// least 256 keys): a step whose context passes it records the next class's graph, bit for
// bit the uncaptured step (whose promise is the exact length), and a batch back in the
// earlier class replays that class's graph.
TEST_F(DecodeGraphTest, EachContextClassHasItsGraph) {
  TwinDecode twin(&gpu(), /*max_batch=*/2);
  const std::vector<int32_t> ids = {twin.AddSequence(254, 8), twin.AddSequence(40, 8)};
  // Contexts of 255 and 256 keys (class 256), then 257 to 259 (class 512).
  for (int32_t step = 0; step < 5; ++step) EXPECT_TRUE(twin.Step(ids).bitwise_equal);
  EXPECT_EQ(twin.stats().captures, 2);
  EXPECT_EQ(twin.stats().replays, 3);
  const int32_t short_one = twin.AddSequence(100, 8);
  EXPECT_TRUE(twin.Step({short_one, ids[1]}).bitwise_equal);  // class 256 again: replayed
  EXPECT_EQ(twin.stats().captures, 2);
  EXPECT_EQ(twin.stats().replays, 4);
  EXPECT_EQ(twin.stats().capture_failures, 0) << twin.stats().last_failure;
}

TEST_F(DecodeGraphTest, GrownScratchIsRecordedAgain) {
  TwinDecode twin(&gpu(), /*max_batch=*/4);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 4; ++i) ids.push_back(twin.AddSequence(20 + 30 * i, 8));
  for (int32_t step = 0; step < 2; ++step) EXPECT_TRUE(twin.Step(ids).bitwise_equal);
  EXPECT_EQ(twin.stats().captures, 1);
  // A long prefill grows the model's activations and the backend's GEMM input scratch: a
  // graph still pointing at the old buffers would read freed memory.
  twin.AddSequence(1500, 8);
  for (int32_t step = 0; step < 2; ++step) EXPECT_TRUE(twin.Step(ids).bitwise_equal);
  EXPECT_EQ(twin.stats().captures, 2);
  EXPECT_EQ(twin.stats().replays, 2);
}

TEST_F(DecodeGraphTest, OnlyPureDecodeBatchesWithinTheLimitAreRecorded) {
  TwinDecode twin(&gpu(), /*max_batch=*/2);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 3; ++i) ids.push_back(twin.AddSequence(40 + 10 * i, 8));
  // Three sequences exceed max_batch 2 (bucket 2): uncaptured, still equal.
  EXPECT_TRUE(twin.Step(ids).bitwise_equal);
  // Prefills (several tokens of one sequence) never record.
  twin.AddSequence(33, 8);
  EXPECT_EQ(twin.stats().captures, 0);
  EXPECT_EQ(twin.stats().replays, 0);
  EXPECT_TRUE(twin.Step({ids[0], ids[1]}).bitwise_equal);
  EXPECT_EQ(twin.stats().captures, 1);
}

}  // namespace
}  // namespace kvd::gpu_test
