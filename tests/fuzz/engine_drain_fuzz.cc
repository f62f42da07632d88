// Fuzz target: the engine on its own thread (EngineLoop::Start, stories260K on the CPU
// backend) with clients on threads of their own, submitting, cancelling and closing
// sessions at once, while the engine is told to drain (BeginDrain) at any point among their
// calls, or is stopped (Stop) with requests still running. engine_fuzz drives the engine
// offline, one thread; this is the shutdown a daemon goes through on SIGTERM.
//
// Each input builds a small pool and an engine, pre-reads every client's script (a few
// actions: a golden request, that request cancelled once n tokens arrived, a session
// closed; each followed by a short pause), starts the clients, and a drainer thread that
// calls BeginDrain once the clients have made a given number of calls (or never). It
// then joins them all and ends one of three ways: drain and wait until idle, then Stop;
// Stop at once, whatever still runs; or drain and Stop at once.
//
// Invariants, whatever the interleaving:
// - Submit refuses with ResourceExhausted exactly the requests the whole pool cannot hold,
//   draining or not (the request's own faults come first). Any other it refuses with
//   Unavailable once BeginDrain has returned, never before BeginDrain was called, and for no
//   other reason.
// - Every accepted request gets exactly one final event, and none after it, not even when
//   cancelled again once it ended or once the engine stopped. A request accepted before the
//   drain began runs on to its end, unless Stop ended it: its tokens are llama2.c's greedy
//   output (a prefix of it when cancelled or stopped), it ends by length with every token
//   asked for, or cancelled only once its client asked, or aborted (Unavailable) only by
//   Stop and only if it was still running then. Usage counts what was streamed.
// - The cache's invariants hold at every event.
// - CloseSession answers OK or NotFound while the engine runs, and Unavailable only once it
//   is stopped.
// - Draining, the engine becomes idle, having failed nothing it accepted: its stats hold no
//   request, count every accepted one finished, and no KV block in use but sessions' pins.
//   Stopped, it is idle and holds no request, and the same holds of the cache.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

constexpr int kBlockSize = 16;

// One request and what its client saw. The stream callback runs on the engine thread (or,
// for what Stop aborts, on the thread that stops it), the client's checks on its own: `mu`
// orders them.
struct Stream {
  std::vector<int32_t> expected;  // the golden tokens it must produce, in order
  uint64_t handle = 0;            // Submit's, once accepted
  absl::Mutex mu;
  std::vector<int32_t> tokens ABSL_GUARDED_BY(mu);
  int finals ABSL_GUARDED_BY(mu) = 0;
  bool late_event ABSL_GUARDED_BY(mu) = false;  // an event after the final one
  kvd::FinishReason reason ABSL_GUARDED_BY(mu) = kvd::FinishReason::kLength;
  kvd::Usage usage ABSL_GUARDED_BY(mu);
  absl::Status error ABSL_GUARDED_BY(mu);
  // Set by the client before its Cancel call.
  std::atomic<bool> cancel_sent{false};
  bool accepted = false;  // Submit returned a handle (the client's own thread)
};

// One call a client makes, read from the input before any thread starts.
struct Action {
  enum Kind { kSubmit, kCloseSession } kind = kSubmit;
  int story = 0;
  int skip = 0;  // golden output tokens appended to the prompt
  int max_tokens = 1;
  int session = 0;  // 0: none, else "s<session>"
  int priority = 0;
  int cancel_after = -1;
  int pause_us = 0;  // after the call
};

struct Client {
  std::vector<Action> script;
  std::vector<std::unique_ptr<Stream>> streams;
};

// What the threads share about the drain.
struct DrainState {
  std::atomic<int> calls{0};  // Submit and CloseSession calls the clients have made
  std::atomic<bool> begun{false};
  std::atomic<bool> done{false};
};

// Runs `client`'s script against `engine`, whose pool holds pool_blocks blocks and whose
// model's context max_context tokens.
void RunClient(Client& client, kvd::EngineLoop& engine, kvd::KvCacheManager& cache,
               DrainState& drain, const std::vector<GoldenStory>& golden, int64_t pool_blocks,
               int64_t max_context) {
  for (const Action& a : client.script) {
    if (a.kind == Action::kCloseSession) {
      const absl::Status s = engine.CloseSession(absl::StrCat("s", a.session));
      drain.calls.fetch_add(1);
      Require(s.ok() || absl::IsNotFound(s),
              absl::StrCat("CloseSession while the engine runs: ", s.ToString()));
    } else {
      const GoldenStory& g = golden[a.story];
      kvd::Request r = kvd::fuzz::GoldenRequest(g, a.skip, a.max_tokens);
      if (a.session > 0) r.session_id = absl::StrCat("s", a.session);
      r.priority = a.priority;
      auto stream = std::make_unique<Stream>();
      stream->expected = kvd::fuzz::GoldenContinuation(g, a.skip, a.max_tokens);
      Stream* st = stream.get();
      // Whether the whole pool holds the most KV it can need (the last token's is never
      // written): Submit refuses exactly the requests it does not.
      const int64_t max_kv =
          std::min<int64_t>(static_cast<int64_t>(r.prompt.size()) + a.max_tokens - 1, max_context);
      const bool fits = cache.layout().BlocksForTokens(max_kv) <= pool_blocks;
      const bool drained_before = drain.done.load();
      auto handle = engine.Submit(std::move(r), [st, &cache](const kvd::StreamEvent& event) {
        // On the engine thread, or on Stop's once that thread is gone: the cache is not
        // being changed.
        Require(cache.CheckInvariants().ok(), "the cache's invariants broke mid-run");
        absl::MutexLock lock(&st->mu);
        if (st->finals > 0) st->late_event = true;
        st->tokens.insert(st->tokens.end(), event.token_ids.begin(), event.token_ids.end());
        if (!event.finished) return;
        ++st->finals;
        st->reason = event.finish_reason;
        st->usage = event.usage;
        st->error = event.error;
      });
      drain.calls.fetch_add(1);
      // A request the pool cannot hold is refused as such, draining or not: the request's
      // own faults come first, as Submit checks them before the drain.
      if (drained_before && fits) {
        Require(absl::IsUnavailable(handle.status()),
                absl::StrCat("Submit after BeginDrain returned: ", handle.status().ToString()));
      }
      if (!handle.ok()) {
        if (absl::IsUnavailable(handle.status())) {
          Require(drain.begun.load(), "Submit refused as draining before BeginDrain was called");
        } else {
          Require(absl::IsResourceExhausted(handle.status()),
                  absl::StrCat("Submit refused: ", handle.status().ToString()));
          Require(!fits,
                  absl::StrCat("a request the pool holds refused: ", handle.status().ToString()));
        }
      } else {
        Require(fits, "accepted a request the whole pool cannot hold");
        st->accepted = true;
        st->handle = *handle;
        // A client that cancels watches its stream, as a server's handler does, and cancels
        // from its own thread (a stream callback must not call into the engine).
        const absl::Time give_up = absl::Now() + absl::Seconds(60);
        while (a.cancel_after >= 0) {
          bool due;
          {
            absl::MutexLock lock(&st->mu);
            if (st->finals > 0) break;  // ended first
            due = static_cast<int>(st->tokens.size()) >= a.cancel_after;
          }
          if (due) {
            st->cancel_sent.store(true);
            engine.Cancel(*handle);
            break;
          }
          Require(absl::Now() < give_up, "a request neither streamed n tokens nor ended in 60 s");
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
      client.streams.push_back(std::move(stream));
    }
    if (a.pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(a.pause_us));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::fuzz::Stories260kOnCpu& world = kvd::fuzz::TheStories260kOnCpu();
  const std::vector<GoldenStory>& golden = kvd::fuzz::Stories260kGolden();
  InputReader input(data, size);

  // The pool: 16-token blocks, 4..64 a chunk, 1..4 chunks.
  const kvd::KvShape shape{world.spec.num_layers, world.spec.num_kv_heads, world.spec.head_dim};
  const int64_t block_bytes =
      kvd::KvLayout::Create(shape, kvd::DType::kF32, kBlockSize)->block_bytes();
  const unsigned char flags = input.Byte();
  kvd::KvCacheOptions o;
  const int64_t chunk_blocks = int64_t{4} << (input.Byte() % 5);
  o.chunk_bytes = block_bytes * chunk_blocks;
  o.initial_pool_bytes = o.chunk_bytes;
  const int64_t chunks = 1 + input.Byte() % 4;
  o.max_pool_bytes = o.chunk_bytes * chunks;
  o.enable_prefix_caching = !(flags & 1);
  o.enable_defrag = flags & 2;
  o.defrag_background_planning = false;
  o.session_idle_timeout = absl::Seconds(30);
  o.block_size = kBlockSize;
  kvd::RealClock clock;
  auto cache = kvd::KvCacheManager::Create(o, shape, &world.backend, &clock);
  Require(cache.ok(), cache.status().ToString());

  kvd::EngineOptions e;
  e.max_batch_size = 1 + input.Byte() % 8;
  e.max_num_batched_tokens = e.max_batch_size + input.Byte() % 128;
  e.prefill_chunk_tokens = 1 + input.Byte() % 64;
  e.admission = static_cast<kvd::AdmissionMode>((flags >> 2) % 3);
  e.idle_tick = absl::Milliseconds(5);
  // At most 16 requests: the waiting queue never fills, so a ResourceExhausted is the pool's.
  e.max_waiting_requests = 256;
  // How the input ends: drain and wait (0, 1), stop at once (2), drain and stop at once (3).
  const int ending = (flags >> 4) % 4;

  // The clients' scripts, read up front: the threads must not share the reader.
  std::vector<Client> clients(1 + input.Byte() % 4);
  int total_calls = 0;
  for (Client& c : clients) {
    for (int n = 1 + input.Byte() % 4; n > 0 && !input.empty(); --n) {
      Action a;
      const unsigned char kind = input.Byte();
      if (kind % 8 == 7) {
        a.kind = Action::kCloseSession;
        a.session = 1 + input.Byte() % 3;
      } else {
        a.story = input.Byte() % golden.size();
        const int total = static_cast<int>(golden[a.story].output.size());
        // A golden prompt plus the first k tokens of its output; the next 1..24 expected.
        a.skip = kind & 8 ? input.Byte() % (total - 1) : 0;
        a.max_tokens = 1 + input.Byte() % std::min(24, total - a.skip);
        a.session = kind & 16 ? 1 + (kind >> 5) % 3 : 0;
        a.priority = input.Byte() % 3 - 1;
        if (kind & 4) a.cancel_after = input.Byte() % (a.max_tokens + 1);
      }
      a.pause_us = input.Byte() % 8 * 100;
      c.script.push_back(a);
      ++total_calls;
    }
  }
  // The drain begins once the clients have made this many calls: 0, before they start;
  // past their number, not while they run.
  const int drain_after = input.Byte() % (total_calls + 2);
  const int64_t pool_blocks = (*cache)->stats().max_blocks;
  Require(pool_blocks == chunk_blocks * chunks, "the pool is not the chunks asked for");
  // Golden prompts with up to 255 of their output tokens stay under the context (512), so no
  // prompt is refused as too long.
  const int64_t max_context = world.model->spec().max_context_tokens;

  kvd::EngineLoop engine(e, world.model.get(), cache->get(), nullptr, &clock);
  engine.Start();
  DrainState drain;
  // Requests accepted so far (after the clients are joined: all of them).
  auto accepted_count = [&clients] {
    int64_t n = 0;
    for (const Client& c : clients) {
      for (const auto& st : c.streams) n += st->accepted;
    }
    return n;
  };
  // A request that fits any pool here, from the main thread; Submit's verdict.
  auto submit_another = [&engine, &golden] {
    return engine.Submit(kvd::fuzz::GoldenRequest(golden[0], 0, 1), [](const kvd::StreamEvent&) {})
        .status();
  };
  auto begin_drain = [&] {
    drain.begun.store(true);
    engine.BeginDrain();
    drain.done.store(true);
  };
  if (drain_after == 0) begin_drain();  // before any client starts
  std::thread drainer([&] {
    if (drain_after == 0 || drain_after > total_calls) return;
    while (drain.calls.load() < drain_after) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    begin_drain();
  });
  std::vector<std::thread> threads;
  for (Client& c : clients) {
    threads.emplace_back([&c, &engine, &cache, &drain, &golden, pool_blocks, max_context] {
      RunClient(c, engine, **cache, drain, golden, pool_blocks, max_context);
    });
  }
  for (std::thread& t : threads) t.join();
  drainer.join();

  bool stopped_busy = false;  // Stop() may have ended requests in flight
  if (ending == 2) {
    stopped_busy = true;
  } else {
    if (!drain.done.load()) begin_drain();
    if (ending == 3) {
      stopped_busy = true;
    } else {
      Require(engine.WaitIdle(absl::Seconds(60)), "the draining engine did not become idle");
      const kvd::EngineStats idle = engine.Stats();
      Require(idle.requests_waiting == 0 && idle.requests_running == 0,
              "idle, yet the stats hold requests");
      Require(idle.requests_finished == accepted_count(), "finished is not what was accepted");
      Require(idle.cache.used_blocks == idle.cache.pinned_blocks,
              "idle, yet blocks are in use beyond sessions' pins");
    }
    // Still refusing after the drain, whatever ran.
    Require(absl::IsUnavailable(submit_another()), "a Submit after the drain was not refused");
  }
  // Streams already ended: Stop must not touch them.
  std::vector<const Stream*> ended_before_stop;
  for (Client& c : clients) {
    for (const auto& st : c.streams) {
      absl::MutexLock lock(&st->mu);
      if (st->finals > 0) ended_before_stop.push_back(st.get());
    }
  }
  engine.Stop();
  Require(engine.Failure().ok(), engine.Failure().ToString());
  Require(engine.WaitIdle(absl::ZeroDuration()), "stopped, yet not idle");
  const kvd::EngineStats stopped = engine.Stats();
  Require(stopped.requests_waiting == 0 && stopped.requests_running == 0,
          "stopped, yet the stats hold requests");
  // Cancelling what ended, or anything once stopped, changes nothing (late_event below).
  for (Client& c : clients) {
    for (const auto& st : c.streams) {
      if (st->accepted) engine.Cancel(st->handle);
    }
  }
  Require(absl::IsUnavailable(engine.CloseSession("s1")),
          "CloseSession on a stopped engine was not refused");
  Require(absl::IsUnavailable(submit_another()), "a Submit after Stop was not refused");

  for (Client& c : clients) {
    for (const auto& st : c.streams) {
      absl::MutexLock lock(&st->mu);
      if (!st->accepted) {
        Require(st->finals == 0 && st->tokens.empty(), "a refused request got events");
        continue;
      }
      Require(st->finals == 1, "an accepted request got no final event, or several");
      Require(!st->late_event, "an event after the final one");
      Require(st->usage.completion_tokens == static_cast<int32_t>(st->tokens.size()),
              "usage does not count the tokens streamed");
      Require(kvd::fuzz::IsPrefixOf(st->tokens, st->expected),
              "the output differs from llama2.c's greedy output");
      switch (st->reason) {
        case kvd::FinishReason::kLength:
          Require(st->tokens.size() == st->expected.size(), "ended by length early");
          Require(st->error.ok(), st->error.ToString());
          break;
        case kvd::FinishReason::kCancelled:
          Require(st->cancel_sent.load(), "cancelled without its client asking");
          Require(st->error.ok(), st->error.ToString());
          break;
        case kvd::FinishReason::kAborted:
          Require(stopped_busy && absl::IsUnavailable(st->error),
                  absl::StrCat("aborted, not by Stop: ", st->error.ToString()));
          Require(std::find(ended_before_stop.begin(), ended_before_stop.end(), st.get()) ==
                      ended_before_stop.end(),
                  "aborted before Stop was called");
          break;
        default:
          Require(false, absl::StrCat("ended for another reason: ",
                                      std::string(kvd::FinishReasonName(st->reason))));
      }
    }
  }
  // Stopped, the engine thread is gone: the cache is this thread's to read.
  Require((*cache)->CheckInvariants().ok(), "the cache's invariants broke");
  const kvd::KvCacheStats end = (*cache)->stats();
  Require(end.used_blocks == end.pinned_blocks, "blocks in use after every request ended");
  return 0;
}
