// Fuzz target: the engine (EngineLoop on the CPU backend, stories260K) under any mix of
// requests, pool sizes, batch budgets and admission modes: tiny pools that force
// preemption, prefix caching and sessions over turns, priorities, cancellation from a
// stream callback, defragmentation, time passing between rounds.
//
// The oracle is llama2.c's greedy output (../shared/models/golden): a request whose prompt
// is a golden prompt followed by the first k tokens of its golden output must produce the
// next tokens of that output, whatever ran beside it, whatever was cached and however often
// it was preempted (the CPU backend is exact, so batching and recompute change nothing).
//
// Invariants: every accepted request gets exactly one final event and none after it; one
// that ends by length produced exactly the expected tokens, one cancelled (by its own stream
// callback, the only way here: no golden output holds the stop token 1) a prefix of them; no
// request fails; usage counts what was streamed; the cache's invariants hold at every event;
// when every round is done no block is in use but sessions' pins.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "kernels/cpu_backend.h"
#include "model/llama_model.h"
#include "scheduler/engine_loop.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/stories260k_golden.h"

namespace {

using kvd::fuzz::GoldenStory;
using kvd::fuzz::InputReader;
using kvd::fuzz::Require;

// One request and what its client saw.
struct Client {
  std::vector<int32_t> expected;  // the golden tokens it must produce, in order
  uint64_t handle = 0;
  int cancel_after = -1;  // cancel once this many tokens arrived (-1: never)
  bool cancel_sent = false;
  std::vector<int32_t> tokens;
  bool finished = false;
  kvd::FinishReason reason = kvd::FinishReason::kLength;
  kvd::Usage usage;
  absl::Status error;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::fuzz::Stories260kOnCpu& world = kvd::fuzz::TheStories260kOnCpu();
  const std::vector<GoldenStory>& golden = kvd::fuzz::Stories260kGolden();
  InputReader input(data, size);

  // The pool: 16-token blocks, 2..64 a chunk, 1..4 chunks.
  const kvd::KvShape shape{world.spec.num_layers, world.spec.num_kv_heads, world.spec.head_dim};
  const int64_t block_bytes = kvd::KvLayout::Create(shape, kvd::DType::kF32, 16)->block_bytes();
  const unsigned char flags = input.Byte();
  kvd::KvCacheOptions o;
  o.chunk_bytes = block_bytes * (2 << (input.Byte() % 6));
  o.initial_pool_bytes = o.chunk_bytes;
  o.max_pool_bytes = o.chunk_bytes * (1 + input.Byte() % 4);
  o.enable_prefix_caching = !(flags & 1);
  o.enable_defrag = flags & 2;
  o.defrag_background_planning = false;
  o.session_idle_timeout = absl::Seconds(30);
  kvd::FakeClock clock;
  auto cache = kvd::KvCacheManager::Create(o, shape, &world.backend, &clock);
  Require(cache.ok(), cache.status().ToString());

  kvd::EngineOptions e;
  e.max_batch_size = 1 + input.Byte() % 12;
  e.max_num_batched_tokens = e.max_batch_size + input.Byte() % 256;
  e.prefill_chunk_tokens = 1 + input.Byte() % 64;
  e.admission = static_cast<kvd::AdmissionMode>((flags >> 2) % 3);
  kvd::EngineLoop engine(e, world.model.get(), cache->get(), nullptr, &clock);

  std::vector<std::unique_ptr<Client>> clients;
  for (int round = 0; round < 3 && !input.empty(); ++round) {
    for (int n = 1 + input.Byte() % 6; n > 0 && !input.empty(); --n) {
      const GoldenStory& g = golden[input.Byte() % golden.size()];
      const int total = static_cast<int>(g.output.size());
      // A golden prompt plus the first k tokens of its output (a later turn, or a prompt
      // that shares a prefix with others); the next 1..40 tokens are expected.
      const int k = input.Byte() % 4 == 0 ? input.Byte() % (total - 1) : 0;
      const int m = 1 + input.Byte() % std::min(40, total - k);
      kvd::Request r = kvd::fuzz::GoldenRequest(g, k, m);
      const unsigned char options = input.Byte();
      if (options & 3) r.session_id = absl::StrCat("s", options & 3);
      r.priority = (options >> 2) % 3 - 1;
      auto client = std::make_unique<Client>();
      client->expected = kvd::fuzz::GoldenContinuation(g, k, m);
      if (options & 16) client->cancel_after = input.Byte() % (m + 1);
      Client* c = client.get();
      auto handle = engine.Submit(r, [c, &engine, &cache](const kvd::StreamEvent& event) {
        Require(!c->finished, "an event after the final one");
        c->tokens.insert(c->tokens.end(), event.token_ids.begin(), event.token_ids.end());
        Require((*cache)->CheckInvariants().ok(), "the cache's invariants broke mid-run");
        if (event.finished) {
          c->finished = true;
          c->reason = event.finish_reason;
          c->usage = event.usage;
          c->error = event.error;
        } else if (c->cancel_after >= 0 && !c->cancel_sent &&
                   static_cast<int>(c->tokens.size()) >= c->cancel_after) {
          c->cancel_sent = true;
          engine.Cancel(c->handle);
        }
      });
      if (!handle.ok()) {
        // Only a request the whole pool cannot hold is refused at Submit (a session turn
        // whose session is busy waits for it).
        Require(handle.status().code() == absl::StatusCode::kResourceExhausted,
                handle.status().ToString());
        continue;
      }
      c->handle = *handle;
      clients.push_back(std::move(client));
    }
    engine.RunUntilIdle();
    clock.Advance(absl::Seconds(input.Byte() % 40));
    if (input.Byte() % 4 == 0) (void)engine.CloseSession(absl::StrCat("s", 1 + input.Byte() % 3));
  }

  for (const auto& c : clients) {
    Require(c->finished, "a request got no final event");
    Require(c->error.ok(), absl::StrCat("a request failed: ", c->error.ToString()));
    Require(c->usage.completion_tokens == static_cast<int32_t>(c->tokens.size()),
            "usage does not count the tokens streamed");
    Require(kvd::fuzz::IsPrefixOf(c->tokens, c->expected),
            "the output differs from llama2.c's greedy output");
    if (c->reason == kvd::FinishReason::kLength) {
      Require(c->tokens.size() == c->expected.size(), "ended by length early");
    } else {
      Require(c->reason == kvd::FinishReason::kCancelled && c->cancel_sent,
              absl::StrCat("ended for another reason: ",
                           std::string(kvd::FinishReasonName(c->reason))));
    }
  }
  // What is still held is sessions' pinned KV, kept for their next turn.
  const kvd::KvCacheStats end = (*cache)->stats();
  Require(end.used_blocks == end.pinned_blocks, "blocks in use after every request ended");
  return 0;
}
