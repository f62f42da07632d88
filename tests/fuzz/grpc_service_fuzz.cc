// Fuzz target: the gRPC service's streaming path end to end. InferenceService over the
// running EngineLoop (its own thread, stories260K, the CPU backend, a pool small enough to
// preempt), wired as the daemon wires them (CacheOptionsFrom, EngineOptionsFrom), behind a
// gRPC server reached through an in-process channel. Each input runs 1..6 calls at once, each
// on its own client thread, as wire bytes through a generic stub:
// - golden: a golden prompt followed by k of its output tokens, greedy, sometimes in a
//   session, with a request id, a client that cancels after n messages, a deadline of a few
//   milliseconds or a client slow to read;
// - fields: a request built from the input (text or ids, sampling options, stop strings and
//   ids, sessions, priorities), valid or not;
// - wire: any bytes as the request message, or no message at all;
// - CloseSession, with a session of this input or any id;
// - GetCacheStats or GetModelInfo.
// Sometimes the service begins draining while the calls run. The server is built for each
// input and shut down at its end, which waits for every handler; the engine runs on (so its
// own drain, which the daemon begins beside the service's, is left to engine_drain_fuzz,
// engine_loop_test and the integration tests' drain_test.py).
//
// Invariants:
// - A Generate request the server refuses gets exactly the error ParseGenerateRequest and
//   RequestValidator give in-process (or UNAVAILABLE once draining, which is checked after
//   parsing and before validation; always for a call made after the drain began), and no
//   message. The pool holds a whole context, so the engine refuses nothing the validator
//   passes.
// - A stream's messages parse, all carry the request's id (or one "kvd-N" of the server's,
//   another for each call), ids in the vocabulary, at most max_tokens of them, text without
//   any stop string; only the last has a finish reason, never `cancelled` or `aborted` (the
//   service writes no final event to a client that left), `deadline` only past the call's
//   deadline; the final usage counts what was streamed.
// - A call that ends OK ended for length, a stop or the context, and by length with exactly
//   max_tokens; without stop strings its text is its tokens' (Tokenizer::Decode) where those
//   make whole characters; a golden one produced llama2.c's greedy tokens (a prefix of them
//   when cancelled or past its deadline: CANCELLED and DEADLINE_EXCEEDED only then).
// - CloseSession is OK or NOT_FOUND for an id Generate would take (1..max_id_bytes bytes of
//   UTF-8 without a control character), INVALID_ARGUMENT otherwise; GetCacheStats is a consistent
//   snapshot of this pool (free + used + cached = total, bytes = blocks x block bytes);
//   GetModelInfo is what the service was given.
// - Once the server has shut down the engine goes idle without a failure, having refused
//   nothing, finished at least the calls that ended OK and at most those it was given, and
//   generated at least what was streamed; once this input's sessions are closed no KV block
//   is in use.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/clock.h"
#include "cache/kv_cache_manager.h"
#include "cache/kv_layout.h"
#include "config/inference_config.h"
#include "kernels/cpu_backend.h"
#include "kvd/v1/kvd.grpc.pb.h"
#include "model/llama_model.h"
#include "scheduler/engine_loop.h"
#include "server/inference_service.h"
#include "server/request_validator.h"
#include "server/serve_options.h"
#include "server/utf8.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/stories260k_golden.h"
#include "tests/fuzz/stories260k_tokenizer.h"

namespace {

using kvd::fuzz::InputReader;
using kvd::fuzz::Require;

constexpr char kGenerate[] = "/kvd.v1.Inference/Generate";
constexpr char kCloseSession[] = "/kvd.v1.Inference/CloseSession";
constexpr int kMaxIdBytes = 16;
constexpr int kSessions = 3;  // golden calls use sessions "s1".."s3"

// The engine and what the service needs, built once and running for the whole process.
struct World {
  kvd::RealClock clock;
  kvd::CpuBackend backend{1};
  kvd::ModelSpec spec;
  std::unique_ptr<kvd::LlamaModel> model;
  std::unique_ptr<kvd::KvCacheManager> cache;
  std::unique_ptr<kvd::EngineLoop> engine;
  std::optional<kvd::RequestValidator> validator;
  kvd::ServedModelInfo info;
  int64_t pool_tokens = 0;
};

World& TheWorld() {
  static World* world = [] {
    auto* w = new World;
    w->model = kvd::fuzz::LoadStories260k(&w->backend, &w->spec);

    // A pool of 32 blocks (512 tokens, one full context), so that a few calls at once
    // preempt one another; chunked prefill and small batches, so that they interleave.
    const kvd::KvShape shape{w->spec.num_layers, w->spec.num_kv_heads, w->spec.head_dim};
    const int64_t block_bytes = kvd::KvLayout::Create(shape, kvd::DType::kF32, 16)->block_bytes();
    kvd::InferenceConfig config;
    config.kv_cache.max_batch_size = 4;
    config.kv_cache.max_seq_length = w->spec.max_context_tokens;
    config.kv_cache.memory_pool.initial_size_bytes = 8 * block_bytes;
    config.kv_cache.memory_pool.max_size_bytes = 32 * block_bytes;
    config.scheduler.max_num_batched_tokens = 48;
    config.scheduler.prefill_chunk_tokens = 16;
    Require(config.Validate().ok(), "the config is invalid");
    const kvd::KvCacheOptions options =
        kvd::CacheOptionsFrom(config.kv_cache, kvd::DType::kF32, shape);
    Require(kvd::CheckPoolSize(config.kv_cache, options, shape).ok(), "the pool is refused");
    auto cache = kvd::KvCacheManager::Create(options, shape, &w->backend, &w->clock);
    Require(cache.ok(), cache.status().ToString());
    w->cache = *std::move(cache);
    w->engine = std::make_unique<kvd::EngineLoop>(kvd::EngineOptionsFrom(config), w->model.get(),
                                                  w->cache.get(),
                                                  &kvd::fuzz::Stories260kTokenizer(), &w->clock);
    w->engine->Start();
    // Stopped before the process's other statics go (World itself is never destroyed).
    std::atexit([] { TheWorld().engine->Stop(); });

    kvd::RequestLimits limits;
    limits.vocab_size = w->spec.vocab_size;
    limits.max_context_tokens = w->spec.max_context_tokens;
    limits.default_max_tokens = 24;  // keeps an input's run short
    w->pool_tokens = w->cache->stats().max_blocks * int64_t{16};
    // So the engine refuses nothing the validator passes (see the invariants).
    Require(w->pool_tokens >= w->spec.max_context_tokens, "the pool holds less than a context");
    limits.pool_tokens = w->pool_tokens;
    limits.max_prompt_bytes = 512;
    limits.max_stop_strings = 4;
    limits.max_stop_string_bytes = 8;
    limits.max_stop_token_ids = 4;
    limits.max_id_bytes = kMaxIdBytes;
    limits.default_stop_token_ids = w->spec.StopTokenIds();
    w->validator.emplace(limits, &kvd::fuzz::Stories260kTokenizer());
    w->info.spec = w->spec;
    w->info.backend = "cpu";
    w->info.kv_dtype = "f32";
    w->info.block_size = 16;
    w->info.max_context_tokens = limits.max_context_tokens;

    return w;
  }();
  return *world;
}

enum class Kind { kGolden, kFields, kWire, kClose, kInfo };

// One call: what it sends, what the in-process oracle expects, what the client saw.
struct Call {
  Kind kind = Kind::kGolden;
  bool send_message = true;  // false: half-close without a request message
  std::string wire;
  int cancel_after = -1;     // TryCancel once this many messages arrived (-1: never)
  int deadline_ms = 0;       // 0: a minute, which no call here should need
  bool slow = false;         // sleeps a millisecond before each read
  bool after_drain = false;  // started once the service had begun draining
  bool model_info = false;   // kInfo: GetModelInfo rather than GetCacheStats

  // Generate's oracle: refused while parsing (before the drain check), refused by the
  // validator (after it), or the request the engine runs.
  std::optional<absl::Status> parse_error;
  std::optional<absl::Status> validate_error;
  std::optional<kvd::Request> request;
  std::vector<int32_t> expected;  // golden calls: the greedy tokens due

  grpc::Status status;
  std::vector<std::string> replies;  // the messages' wire bytes
};

// A length-delimited protobuf field (its tag, its length as a varint, the bytes), built by
// hand so that any bytes can be sent (the CloseSession request's session_id is field 1).
std::string LengthDelimited(int field, std::string_view bytes) {
  std::string out(1, static_cast<char>(field << 3 | 2));
  for (uint64_t n = bytes.size();; n >>= 7) {
    out.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
    if (n <= 0x7f) break;
  }
  out.append(bytes);
  return out;
}

// Sends `call.wire` on `method` and reads every reply, as the client options say.
void RunCall(const std::shared_ptr<grpc::Channel>& channel, const char* method, Call& call) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       (call.deadline_ms > 0 ? std::chrono::milliseconds(call.deadline_ms)
                                             : std::chrono::milliseconds(60000)));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> rw =
      stub.PrepareCall(&context, method, &cq);
  // One operation at a time, so the queue answers the one just started.
  auto await = [&cq](intptr_t expected_tag) {
    void* tag = nullptr;
    bool ok = false;
    Require(cq.Next(&tag, &ok), "the completion queue shut down");
    Require(reinterpret_cast<intptr_t>(tag) == expected_tag, "an unexpected completion");
    return ok;
  };
  rw->StartCall(reinterpret_cast<void*>(1));
  bool live = await(1);
  if (live && call.send_message) {
    grpc::Slice slice(call.wire);
    grpc::ByteBuffer buffer(&slice, 1);
    rw->Write(buffer, reinterpret_cast<void*>(2));
    live = await(2);
  }
  if (live) {
    rw->WritesDone(reinterpret_cast<void*>(3));
    live = await(3);
  }
  if (call.cancel_after == 0) context.TryCancel();
  while (live) {
    if (call.slow) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    grpc::ByteBuffer reply;
    rw->Read(&reply, reinterpret_cast<void*>(4));
    if (!await(4)) break;
    std::vector<grpc::Slice> slices;
    Require(reply.Dump(&slices).ok(), "a reply could not be read");
    std::string bytes;
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    call.replies.push_back(std::move(bytes));
    if (static_cast<int>(call.replies.size()) == call.cancel_after) context.TryCancel();
  }
  rw->Finish(&call.status, reinterpret_cast<void*>(5));
  await(5);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

// The Generate oracle's expectations for `call.wire`, as the service will decide them.
void Expect(const World& world, Call& call) {
  kvd::v1::GenerateRequest proto;
  if (!call.send_message) {
    call.parse_error = absl::InvalidArgumentError("request: no request message sent");
    return;
  }
  if (absl::Status s = kvd::ParseGenerateRequest(call.wire, &proto); !s.ok()) {
    call.parse_error = s;
    return;
  }
  absl::StatusOr<kvd::Request> request = world.validator->Validate(proto);
  if (!request.ok()) {
    call.validate_error = request.status();
  } else {
    call.request = *std::move(request);
  }
}

// A golden prompt plus the first k tokens of its output; the next 1..40 tokens are due.
Call GoldenCall(InputReader& input) {
  const std::vector<kvd::fuzz::GoldenStory>& golden = kvd::fuzz::Stories260kGolden();
  Call call;
  call.kind = Kind::kGolden;
  const kvd::fuzz::GoldenStory& g = golden[input.Byte() % golden.size()];
  const int total = static_cast<int>(g.output.size());
  const int k = input.Byte() % 4 == 0 ? (input.Byte() << 8 | input.Byte()) % (total - 1) : 0;
  const int m = 1 + input.Byte() % std::min(40, total - k);
  kvd::v1::GenerateRequest r;
  for (int32_t id : g.prompt) r.add_prompt_token_ids(static_cast<uint32_t>(id));
  for (int i = 0; i < k; ++i) r.add_prompt_token_ids(static_cast<uint32_t>(g.output[i]));
  r.set_max_tokens(static_cast<uint32_t>(m));
  const unsigned char options = input.Byte();
  if (options % 4 != 0) r.set_session_id(absl::StrCat("s", options % 4));
  if (options & 4) r.set_request_id(absl::StrCat("golden-", input.Byte()));
  if (options & 8) r.set_expected_output_tokens(input.Byte() % 64);
  r.set_priority((options >> 4) % 3 - 1);
  call.wire = r.SerializeAsString();
  call.expected.assign(g.output.begin() + k, g.output.begin() + k + m);
  const unsigned char client = input.Byte();
  if (client & 1) call.cancel_after = input.Byte() % (m + 1);
  if (client & 2) call.deadline_ms = 1 + input.Byte() % 40;
  call.slow = client & 4;
  return call;
}

// A request from fields the input picks: often valid, sometimes not.
Call FieldsCall(InputReader& input) {
  static constexpr std::string_view kWords[] = {"Once", " upon", " a time", " Lily", " the",
                                                ".",    "\n",    " é",      "🙂",  ""};
  static constexpr std::string_view kStops[] = {".", " the", "Lily", "\n", "", "a"};
  Call call;
  call.kind = Kind::kFields;
  kvd::v1::GenerateRequest r;
  const unsigned char present = input.Byte();
  if (present & 1) {
    std::string text;
    for (int n = input.Byte() % 8; n > 0; --n) text += kWords[input.Byte() % std::size(kWords)];
    r.set_prompt(text);
  }
  if (present & 2) {
    for (int n = input.Byte() % 24; n > 0; --n) r.add_prompt_token_ids(input.Byte() * 3u % 520);
  }
  if (present & 4) r.set_max_tokens(input.Byte() % 48);
  if (present & 8) r.set_temperature(static_cast<float>(input.Byte() % 160) / 64.0f);
  if (present & 16) r.set_top_p(static_cast<float>(input.Byte() % 20) / 16.0f);
  if (present & 32) r.set_top_k(input.Byte() * 3u);
  if (present & 64) r.set_min_p(static_cast<float>(input.Byte() % 20) / 16.0f);
  if (present & 128) {
    for (int n = input.Byte() % 3; n > 0; --n) r.add_stop(std::string(kStops[input.Byte() % 6]));
  }
  const unsigned char more = input.Byte();
  if (more & 1) {
    for (int n = input.Byte() % 3; n > 0; --n) r.add_stop_token_ids(input.Byte() * 3u % 520);
  }
  if (more & 2) r.set_session_id(absl::StrCat("f", input.Byte() % 4));
  if (more & 4) r.set_request_id(std::string(input.Byte() % 24, 'r'));
  if (more & 8) r.set_expected_output_tokens(input.Byte());
  r.set_ignore_eos(more & 16);
  r.set_seed(input.Byte());
  r.set_priority(static_cast<int8_t>(input.Byte()) % 4);
  call.wire = r.SerializeAsString();
  const unsigned char client = input.Byte();
  if (client & 1) call.cancel_after = input.Byte() % 8;
  if (client & 2) call.deadline_ms = 1 + input.Byte() % 40;
  call.slow = client & 4;
  return call;
}

std::string Why(const Call& c, absl::string_view what) {
  return absl::StrCat(what, " (status ", static_cast<int>(c.status.error_code()), " '",
                      c.status.error_message(), "', ", c.replies.size(), " messages, deadline ",
                      c.deadline_ms, " ms, cancel after ", c.cancel_after, ")");
}

bool SameError(const grpc::Status& got, const absl::Status& want) {
  return static_cast<int>(got.error_code()) == static_cast<int>(want.code()) &&
         got.error_message() == want.message();
}

// What a Generate call streamed, for the checks across calls.
struct Streamed {
  std::string server_id;  // the "kvd-N" the server gave it, if any
  int64_t tokens = 0;
  int64_t preemptions = 0;  // from the final usage, if it came
};

// The invariants of a Generate call (see the top of the file).
Streamed CheckGenerate(const World& world, const Call& c, bool draining) {
  Streamed streamed;
  const grpc::StatusCode code = c.status.error_code();
  const bool client_cut = (code == grpc::StatusCode::CANCELLED && c.cancel_after >= 0) ||
                          (code == grpc::StatusCode::DEADLINE_EXCEEDED && c.deadline_ms > 0);
  if (!c.request.has_value()) Require(c.replies.empty(), Why(c, "a refused request got messages"));
  if (c.parse_error.has_value()) {
    Require(client_cut || SameError(c.status, *c.parse_error), Why(c, "not the parser's error"));
    return streamed;
  }
  // The service checks for the drain after parsing and before validating.
  if (c.after_drain || (draining && code == grpc::StatusCode::UNAVAILABLE)) {
    Require(c.replies.empty(), Why(c, "a call refused for the drain got messages"));
    Require(client_cut || (code == grpc::StatusCode::UNAVAILABLE &&
                           absl::StrContains(c.status.error_message(), "draining")),
            Why(c, "a call made while draining not refused for it"));
    return streamed;
  }
  if (!c.request.has_value()) {
    Require(client_cut || SameError(c.status, *c.validate_error),
            Why(c, "not the validator's error"));
    return streamed;
  }
  const kvd::Request& request = *c.request;
  Require(code == grpc::StatusCode::OK || client_cut, Why(c, "an unexpected status"));

  std::vector<int32_t> tokens;
  std::string text;
  kvd::v1::GenerateResponse last;
  for (size_t i = 0; i < c.replies.size(); ++i) {
    kvd::v1::GenerateResponse r;
    Require(r.ParseFromString(c.replies[i]), Why(c, "a message does not parse"));
    if (i == 0 && request.request_id.empty()) {
      const std::string& id = r.request_id();
      Require(
          id.size() > 4 && absl::StartsWith(id, "kvd-") &&
              std::all_of(id.begin() + 4, id.end(), [](char ch) { return ch >= '0' && ch <= '9'; }),
          Why(c, "no request id of the server's"));
      streamed.server_id = id;
    }
    Require(
        r.request_id() == (request.request_id.empty() ? streamed.server_id : request.request_id),
        Why(c, "another request's id"));
    Require(i + 1 == c.replies.size() || r.finish_reason().empty(),
            Why(c, "a finish reason before the last message"));
    for (uint32_t id : r.token_ids()) {
      Require(id < static_cast<uint32_t>(world.spec.vocab_size), Why(c, "an id past the vocab"));
      tokens.push_back(static_cast<int32_t>(id));
    }
    text += r.text();
    last = r;
  }
  Require(static_cast<int32_t>(tokens.size()) <= request.max_tokens, Why(c, "past max_tokens"));
  for (const std::string& stop : request.stop) {
    Require(!absl::StrContains(text, stop), Why(c, "the text holds a stop string"));
  }
  if (!c.expected.empty()) {
    Require(tokens.size() <= c.expected.size() &&
                std::equal(tokens.begin(), tokens.end(), c.expected.begin()),
            Why(c, "the output differs from llama2.c's greedy output"));
  }
  streamed.tokens = static_cast<int64_t>(tokens.size());
  Require(code != grpc::StatusCode::OK || !last.finish_reason().empty(),
          Why(c, "an OK call without a final message"));
  if (last.finish_reason().empty()) return streamed;  // cut short by the client before the end
  const std::string& reason = last.finish_reason();
  Require(reason == "length" || reason == "stop" || reason == "context_limit" ||
              (reason == "deadline" && code != grpc::StatusCode::OK && c.deadline_ms > 0),
          Why(c, absl::StrCat("a call ended for '", reason, "'")));
  const kvd::v1::Usage& usage = last.usage();
  streamed.preemptions = usage.num_preemptions();
  Require(usage.completion_tokens() == tokens.size(), Why(c, "usage does not count the tokens"));
  Require(usage.prompt_tokens() == request.prompt.size(), Why(c, "usage miscounts the prompt"));
  Require(usage.cached_prompt_tokens() <= usage.prompt_tokens(), Why(c, "more cached than sent"));
  Require(usage.queue_time_seconds() >= 0 && usage.time_to_first_token_seconds() >= 0 &&
              usage.total_time_seconds() >= usage.time_to_first_token_seconds(),
          Why(c, "usage times out of order"));
  if (code != grpc::StatusCode::OK) return streamed;
  Require(reason != "deadline", Why(c, "an OK call past its deadline"));
  if (request.stop.empty()) {
    const std::string decoded =
        kvd::fuzz::Stories260kTokenizer().Decode(tokens, request.prompt.back());
    Require(!kvd::IsValidUtf8(decoded) || text == decoded, Why(c, "not the tokens' text"));
  }
  if (reason == "length") {
    Require(static_cast<int32_t>(tokens.size()) == request.max_tokens,
            Why(c, "ended by length early"));
  }
  if (reason == "context_limit") {
    // Every position filled (the last token takes none), short of max_tokens.
    Require(static_cast<int64_t>(request.prompt.size()) + static_cast<int64_t>(tokens.size()) ==
                    int64_t{world.info.max_context_tokens} + 1 &&
                static_cast<int32_t>(tokens.size()) < request.max_tokens,
            Why(c, "ended by the context elsewhere than at its end"));
  }
  if (!c.expected.empty()) {
    Require(reason == "length", Why(c, "a golden call did not end by length"));
  }
  return streamed;
}

// A session id the service takes: 1..kMaxIdBytes bytes of UTF-8 with no C0 control character
// and no DEL.
bool AcceptableId(const std::string& id) {
  return !id.empty() && id.size() <= kMaxIdBytes && kvd::IsValidUtf8(id) &&
         std::none_of(id.begin(), id.end(), [](char ch) {
           const auto byte = static_cast<unsigned char>(ch);
           return byte < 0x20 || byte == 0x7f;
         });
}

void CheckCloseSession(const Call& c) {
  const grpc::StatusCode code = c.status.error_code();
  kvd::v1::CloseSessionRequest request;
  if (!c.send_message || !kvd::ParseRequestMessage(c.wire, &request).ok() ||
      !AcceptableId(request.session_id())) {
    Require(code == grpc::StatusCode::INVALID_ARGUMENT, Why(c, "a bad CloseSession not refused"));
    Require(c.replies.empty(), Why(c, "a refused CloseSession answered"));
    return;
  }
  Require(code == grpc::StatusCode::OK || code == grpc::StatusCode::NOT_FOUND,
          Why(c, "CloseSession neither closed nor found nothing"));
  Require(c.replies.size() == (code == grpc::StatusCode::OK ? 1u : 0u),
          Why(c, "CloseSession's answer"));
}

void CheckStats(const World& world, const kvd::v1::CacheStats& s) {
  Require(s.block_size() == 16 && s.max_blocks() == static_cast<uint64_t>(world.pool_tokens / 16),
          "not this pool's geometry");
  Require(s.free_blocks() + s.used_blocks() + s.cached_blocks() == s.total_blocks(),
          "free + used + cached blocks differ from the total");
  Require(s.total_blocks() <= s.max_blocks(), "more blocks than the pool's most");
  Require(s.pinned_blocks() <= s.used_blocks(), "more pinned blocks than used");
  Require(s.total_bytes() == s.total_blocks() * s.block_bytes() &&
              s.used_bytes() == s.used_blocks() * s.block_bytes() &&
              s.cached_bytes() == s.cached_blocks() * s.block_bytes() &&
              s.max_bytes() == s.max_blocks() * s.block_bytes(),
          "bytes differ from blocks");
  Require(s.prefix_hit_tokens() + s.session_hit_tokens() <= s.prefix_query_tokens(),
          "more prompt tokens found than looked up");
}

void CheckModelInfo(const World& world, const kvd::v1::ModelInfo& m) {
  const kvd::ModelSpec& spec = world.spec;
  Require(m.name() == spec.name && m.num_layers() == static_cast<uint32_t>(spec.num_layers) &&
              m.dim() == static_cast<uint32_t>(spec.dim) &&
              m.num_heads() == static_cast<uint32_t>(spec.num_heads) &&
              m.num_kv_heads() == static_cast<uint32_t>(spec.num_kv_heads) &&
              m.head_dim() == static_cast<uint32_t>(spec.head_dim) &&
              m.vocab_size() == static_cast<uint32_t>(spec.vocab_size) &&
              m.max_context_tokens() == static_cast<uint32_t>(world.info.max_context_tokens) &&
              m.bos_token_id() == static_cast<uint32_t>(spec.bos_token_id) &&
              m.eos_token_id() == static_cast<uint32_t>(spec.eos_token_id) &&
              m.backend() == world.info.backend && m.kv_dtype() == world.info.kv_dtype &&
              m.block_size() == static_cast<uint32_t>(world.info.block_size),
          "GetModelInfo is not the model served");
}

template <typename Pred>
bool WaitFor(Pred pred) {
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (!pred()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& world = TheWorld();
  InputReader input(data, size);

  std::vector<Call> calls;
  std::set<std::string> sessions;
  for (int n = 1 + input.Byte() % 6; n > 0 && !input.empty(); --n) {
    Call call;
    switch (input.Byte() % 8) {
      case 0:
      case 1:
      case 2:
        call = GoldenCall(input);
        break;
      case 3:
      case 4:
        call = FieldsCall(input);
        break;
      case 5:
        call.kind = Kind::kWire;
        call.send_message = input.Byte() % 8 != 0;
        call.wire = std::string(input.Bytes(input.Byte()));
        break;
      case 6: {
        call.kind = Kind::kClose;
        const unsigned char b = input.Byte();
        call.send_message = b % 16 != 0;
        call.wire = b & 1 ? LengthDelimited(1, input.Bytes(input.Byte() % 24))
                          : LengthDelimited(1, absl::StrCat("s", 1 + b / 2 % kSessions));
        break;
      }
      default:
        call.kind = Kind::kInfo;
        call.model_info = input.Byte() % 2;
        break;
    }
    if (call.kind != Kind::kClose && call.kind != Kind::kInfo) {
      Expect(world, call);
      if (call.kind == Kind::kGolden) Require(call.request.has_value(), "a golden call refused");
      if (call.request.has_value() && !call.request->session_id.empty()) {
        sessions.insert(call.request->session_id);
      }
    }
    calls.push_back(std::move(call));
  }
  const unsigned char drain = input.Byte();

  const kvd::EngineStats before = world.engine->Stats();
  int64_t streamed_tokens = 0;
  int64_t preemptions = 0;
  int finished_ok = 0;
  int submitted = 0;  // valid requests of calls started before the drain began
  {
    kvd::InferenceService service(world.engine.get(), *world.validator, world.info);
    grpc::ServerBuilder builder;
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    Require(server != nullptr, "the gRPC server did not start");
    std::shared_ptr<grpc::Channel> channel = server->InProcessChannel(grpc::ChannelArguments());
    std::unique_ptr<kvd::v1::Inference::Stub> stub = kvd::v1::Inference::NewStub(channel);

    // Draining begins after the first `before_drain` calls started (maybe while they run);
    // the calls after it start once it has begun. (Not on 0, the byte past the input's end.)
    const bool draining = drain % 4 == 3;
    const size_t before_drain = draining ? drain / 4 % (calls.size() + 1) : calls.size();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (draining && i == before_drain) {
        std::this_thread::sleep_for(std::chrono::milliseconds(drain / 16 % 8));
        service.BeginDrain();
      }
      Call& call = calls[i];
      call.after_drain = i >= before_drain;
      threads.emplace_back([&world, &call, &channel, &stub] {
        switch (call.kind) {
          case Kind::kClose:
            RunCall(channel, kCloseSession, call);
            break;
          case Kind::kInfo: {
            grpc::ClientContext context;
            if (call.model_info) {
              kvd::v1::ModelInfo info;
              call.status = stub->GetModelInfo(&context, kvd::v1::GetModelInfoRequest(), &info);
              Require(call.status.ok(), "GetModelInfo failed");
              CheckModelInfo(world, info);
            } else {
              kvd::v1::CacheStats stats;
              call.status = stub->GetCacheStats(&context, kvd::v1::GetCacheStatsRequest(), &stats);
              Require(call.status.ok(), "GetCacheStats failed");
              CheckStats(world, stats);
            }
            break;
          }
          default:
            RunCall(channel, kGenerate, call);
        }
      });
    }
    if (draining && before_drain == calls.size()) service.BeginDrain();
    for (std::thread& t : threads) t.join();
    // Waits for every handler, including those of calls their clients gave up on.
    server->Shutdown();

    std::set<std::string> server_ids;
    for (const Call& call : calls) {
      if (call.kind == Kind::kClose) CheckCloseSession(call);
      if (call.kind == Kind::kGolden || call.kind == Kind::kFields || call.kind == Kind::kWire) {
        const Streamed s = CheckGenerate(world, call, draining);
        Require(s.server_id.empty() || server_ids.insert(s.server_id).second,
                "two calls got the same request id from the server");
        streamed_tokens += s.tokens;
        preemptions += s.preemptions;
        finished_ok += call.request.has_value() && call.status.ok();
        submitted += call.request.has_value() && !call.after_drain;
      }
    }
  }

  Require(world.engine->WaitIdle(absl::Seconds(20)), "the engine is still busy");
  Require(world.engine->Failure().ok(), "the engine failed");
  const kvd::EngineStats after = world.engine->Stats();
  Require(after.requests_waiting == 0 && after.requests_running == 0,
          "requests left in the engine");
  Require(after.requests_rejected == before.requests_rejected, "the engine refused a request");
  Require(after.requests_finished - before.requests_finished >= finished_ok &&
              after.requests_finished - before.requests_finished <= submitted,
          "the engine finished fewer requests than ended OK, or more than it was given");
  Require(after.generated_tokens - before.generated_tokens >= streamed_tokens,
          "the engine generated fewer tokens than were streamed");
  Require(after.preemptions - before.preemptions >= preemptions,
          "the engine counted fewer preemptions than the calls' usage");
  for (int s = 1; s <= kSessions; ++s) sessions.insert(absl::StrCat("s", s));
  for (const std::string& id : sessions) {
    const absl::Status closed = world.engine->CloseSession(id);
    Require(closed.ok() || absl::IsNotFound(closed), closed.ToString());
  }
  Require(WaitFor([&] {
            const kvd::EngineStats s = world.engine->Stats();
            return s.cache.used_blocks == 0 && s.cache.num_sessions == 0;
          }),
          "KV blocks in use after every call ended and every session closed");
  return 0;
}
