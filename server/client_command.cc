#include "server/client_command.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kvd/v1/kvd.grpc.pb.h"
#include "server/grpc_status.h"
#include "tools/flags.h"

namespace kvd {

namespace {

FlagSet MakeFlags() {
  FlagSet f(
      "kvd client --address HOST:PORT (--prompt TEXT | --prompt-token-ids 1,2,3)\n"
      "           [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
      "           [--seed S] [--stop TEXT]... [--stop-token-ids 1,2] [--session-id ID]\n"
      "           [--priority N] [--expected-output-tokens N] [--request-id ID]\n"
      "           [--ignore-eos] [--timeout SECONDS] [--usage]\n"
      "       kvd client --address HOST:PORT --close-session ID [--timeout SECONDS]\n"
      "       kvd client --address HOST:PORT (--cache-stats | --model-info) [--timeout SECONDS]\n"
      "\n"
      "Streams a completion of TEXT (or of the token ids) from a running `kvd serve` to\n"
      "stdout; with --prompt-token-ids the generated token ids are printed, space-separated.\n"
      "--close-session releases a multi-turn session's pinned KV instead (NOT_FOUND, exit 1,\n"
      "for a session the daemon does not hold). --cache-stats and --model-info print the\n"
      "daemon's GetCacheStats or GetModelInfo answer as one JSON object, every field present\n"
      "and named as in kvd.proto (64-bit integers are strings, as proto3's JSON mapping\n"
      "writes them).\n"
      "A number outside its flag's range (below) is a usage error, never wrapped or clamped;\n"
      "the server checks the sampling values and answers INVALID_ARGUMENT naming the field.");
  f.AddString("address", "the daemon's gRPC address", "127.0.0.1:50051");
  f.AddString("prompt", "text to complete");
  f.AddString("prompt-token-ids", "comma-separated prompt token ids, instead of --prompt");
  constexpr IntRange kUint32{0, std::numeric_limits<uint32_t>::max()};  // the proto's fields
  f.AddInt("max-tokens", "most tokens to generate; 0 = server default", 0, kUint32);
  f.AddFloat32("temperature", "a finite number; 0 = greedy", 0.0);
  f.AddFloat32("top-p", "nucleus mass in (0, 1]; 0 = unset", 0.0);
  f.AddInt("top-k", "0 = off", 0, kUint32);
  f.AddFloat32("min-p", "drop tokens below min-p times the top probability; 0 = off", 0.0);
  f.AddUint64("seed", "sampling seed; 0 = server default", 0);
  f.AddStringList("stop", "stop string (not printed); give it once per string");
  f.AddString("stop-token-ids", "comma-separated token ids that end generation (not printed)");
  f.AddString("session-id", "multi-turn session id");
  f.AddString("close-session", "release this session's pinned KV; no completion");
  f.AddBool("cache-stats", "print the KV cache's and the engine's stats as JSON; no completion");
  f.AddBool("model-info", "print the served model's description as JSON; no completion");
  f.AddInt("priority", "larger runs first and is preempted last", 0,
           IntRange{std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()});
  f.AddInt("expected-output-tokens", "your estimate of the output length, for admission; 0 = none",
           0, kUint32);
  f.AddString("request-id", "echoed in the responses; empty = the server makes one up");
  f.AddBool("ignore-eos", "do not stop at the model's end-of-text token");
  f.AddFloat("timeout", "deadline in seconds, 0 .. 315360000 (ten years); 0 = none", 0.0);
  f.AddBool("usage", "print the request id, usage and timings to stderr at the end");
  return f;
}

// Longest --timeout: far beyond any call, and far inside what a time point can hold.
constexpr double kMaxTimeoutSeconds = 10.0 * 365 * 24 * 3600;

// The flag's value if it is finite and in [min, max] (a float field cannot hold more, and a
// deadline of "inf" seconds is no time point); else a usage error naming the flag, the value
// and `allowed`.
std::optional<double> FloatInRange(const FlagSet& flags, const std::string& name, double min,
                                   double max, std::string_view allowed, std::ostream& err) {
  const double value = flags.GetFloat(name);
  if (std::isfinite(value) && value >= min && value <= max) return value;
  err << "kvd client: --" << name << ": " << flags.GetString(name)
      << " is out of range; allowed: " << allowed << "\n";
  return std::nullopt;
}

// The comma-separated token ids of flag `name`, or a usage error naming the flag and the item.
std::optional<std::vector<uint32_t>> TokenIds(const FlagSet& flags, const std::string& name,
                                              std::ostream& err) {
  std::vector<uint32_t> ids;
  for (absl::string_view item : absl::StrSplit(flags.GetString(name), ',')) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(item, &id)) {
      err << "kvd client: --" << name << ": '" << item
          << "' is not a token id (comma-separated non-negative integers)\n";
      return std::nullopt;
    }
    ids.push_back(id);
  }
  return ids;
}

// The deadline of a call given --timeout seconds (0: none).
void SetTimeout(grpc::ClientContext& context, double timeout_seconds) {
  if (timeout_seconds > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(static_cast<int64_t>(timeout_seconds * 1e6)));
  }
}

// A failed call's status on `err`, as "kvd client: CODE: message"; returns 1.
int CallFailed(const grpc::Status& status, std::ostream& err) {
  err << "kvd client: " << absl::StatusCodeToString(FromGrpcStatus(status).code()) << ": "
      << status.error_message() << "\n";
  return 1;
}

}  // namespace

int RunClientCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  FlagSet flags = MakeFlags();
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    err << "kvd client: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  if (flags.help()) {
    out << flags.Usage();
    return 0;
  }
  // An empty address would reach gRPC's resolver, which logs and fails with a message that
  // names no flag.
  if (flags.GetString("address").empty()) {
    err << "kvd client: --address is empty; give the daemon's HOST:PORT\n\n" << flags.Usage();
    return 2;
  }
  const std::optional<double> timeout = FloatInRange(
      flags, "timeout", 0, kMaxTimeoutSeconds, "0 .. 315360000 seconds (0 = no deadline)", err);
  if (!timeout) return 2;
  // One thing a call: a completion, or one of the unary calls, which take none of the
  // completion's flags (they would be ignored, as if they applied).
  constexpr char kOneCall[] =
      "give one of --prompt (or --prompt-token-ids), --close-session, --cache-stats and "
      "--model-info";
  const int unary = int{flags.Has("close-session")} + int{flags.GetBool("cache-stats")} +
                    int{flags.GetBool("model-info")};
  if (unary > 1) {
    err << "kvd client: " << kOneCall << "\n\n" << flags.Usage();
    return 2;
  }
  if (unary == 1) {
    for (const char* completion_flag :
         {"prompt", "prompt-token-ids", "max-tokens", "temperature", "top-p", "top-k", "min-p",
          "seed", "stop", "stop-token-ids", "session-id", "priority", "expected-output-tokens",
          "request-id", "ignore-eos", "usage"}) {
      if (flags.Has(completion_flag)) {
        err << "kvd client: --" << completion_flag << " is a completion's flag; " << kOneCall
            << "\n\n"
            << flags.Usage();
        return 2;
      }
    }
    auto stub = v1::Inference::NewStub(
        grpc::CreateChannel(flags.GetString("address"), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    SetTimeout(context, *timeout);
    if (flags.Has("close-session")) {
      v1::CloseSessionRequest request;
      request.set_session_id(flags.GetString("close-session"));
      v1::CloseSessionResponse response;
      const grpc::Status status = stub->CloseSession(&context, request, &response);
      return status.ok() ? 0 : CallFailed(status, err);
    }
    grpc::Status status;
    std::unique_ptr<google::protobuf::Message> answer;
    if (flags.GetBool("cache-stats")) {
      auto stats = std::make_unique<v1::CacheStats>();
      status = stub->GetCacheStats(&context, v1::GetCacheStatsRequest(), stats.get());
      answer = std::move(stats);
    } else {
      auto info = std::make_unique<v1::ModelInfo>();
      status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), info.get());
      answer = std::move(info);
    }
    if (!status.ok()) return CallFailed(status, err);
    google::protobuf::util::JsonPrintOptions options;
#if GOOGLE_PROTOBUF_VERSION >= 5026000  // protobuf 26 renamed the option
    options.always_print_fields_with_no_presence = true;
#else
    options.always_print_primitive_fields = true;
#endif
    options.preserve_proto_field_names = true;
    std::string json;
    if (const auto s = google::protobuf::util::MessageToJsonString(*answer, &json, options);
        !s.ok()) {
      err << "kvd client: cannot print the answer as JSON: " << s.ToString() << "\n";
      return 1;
    }
    out << json << "\n";
    return 0;
  }
  const bool token_ids = flags.Has("prompt-token-ids");
  if (token_ids && flags.Has("prompt")) {
    err << "kvd client: exactly one of --prompt and --prompt-token-ids is required\n\n"
        << flags.Usage();
    return 2;
  }
  if (!token_ids && !flags.Has("prompt")) {
    err << "kvd client: " << kOneCall << "\n\n" << flags.Usage();
    return 2;
  }
  v1::GenerateRequest request;
  if (token_ids) {
    const std::optional<std::vector<uint32_t>> ids = TokenIds(flags, "prompt-token-ids", err);
    if (!ids) return 2;
    request.mutable_prompt_token_ids()->Add(ids->begin(), ids->end());
  } else {
    if (flags.GetString("prompt").empty()) {
      // The server would answer that no prompt was given, which reads as a missing flag.
      err << "kvd client: --prompt '': the prompt is empty; give some text\n";
      return 2;
    }
    request.set_prompt(flags.GetString("prompt"));
  }
  // The proto's fields are uint32, float and uint64: the integer flags' ranges are checked
  // by Parse, the floats' here, so that the server sees the number the user typed (or the
  // user sees why not), never a wrapped one.
  // Temperature, top-p and min-p ranges are the server's to check; here only what a float holds
  // (Parse has refused a finite value that overflows a float or rounds to 0 in one).
  constexpr double kMaxFloat = std::numeric_limits<float>::max();
  constexpr char kFloatRange[] = "a finite number within a float's range (|x| <= about 3.4028e38)";
  const std::optional<double> temperature =
      FloatInRange(flags, "temperature", -kMaxFloat, kMaxFloat, kFloatRange, err);
  const std::optional<double> top_p =
      FloatInRange(flags, "top-p", -kMaxFloat, kMaxFloat, kFloatRange, err);
  const std::optional<double> min_p =
      FloatInRange(flags, "min-p", -kMaxFloat, kMaxFloat, kFloatRange, err);
  if (!temperature || !top_p || !min_p) return 2;
  request.set_ignore_eos(flags.GetBool("ignore-eos"));
  request.set_max_tokens(static_cast<uint32_t>(flags.GetInt("max-tokens")));
  request.set_temperature(static_cast<float>(*temperature));
  request.set_top_p(static_cast<float>(*top_p));
  request.set_top_k(static_cast<uint32_t>(flags.GetInt("top-k")));
  request.set_min_p(static_cast<float>(*min_p));
  request.set_seed(flags.GetUint64("seed"));
  for (const std::string& stop : flags.GetStrings("stop")) request.add_stop(stop);
  if (flags.Has("stop-token-ids")) {
    const std::optional<std::vector<uint32_t>> ids = TokenIds(flags, "stop-token-ids", err);
    if (!ids) return 2;
    request.mutable_stop_token_ids()->Add(ids->begin(), ids->end());
  }
  request.set_session_id(flags.GetString("session-id"));
  request.set_priority(static_cast<int32_t>(flags.GetInt("priority")));
  request.set_expected_output_tokens(static_cast<uint32_t>(flags.GetInt("expected-output-tokens")));
  request.set_request_id(flags.GetString("request-id"));

  auto channel =
      grpc::CreateChannel(flags.GetString("address"), grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext context;
  SetTimeout(context, *timeout);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  v1::GenerateResponse response;
  v1::GenerateResponse last;
  bool first_id = true;
  bool wrote = false;  // the trailing newline ends output, if there was any
  while (reader->Read(&response)) {
    if (token_ids) {
      for (uint32_t id : response.token_ids()) {
        out << (first_id ? "" : " ") << id;
        first_id = false;
        wrote = true;
      }
      out << std::flush;
    } else {
      out << response.text() << std::flush;
      wrote = wrote || !response.text().empty();
    }
    if (!response.finish_reason().empty()) last = response;
  }
  const grpc::Status status = reader->Finish();
  if (wrote) out << "\n";
  // A call that ends with an error after its final message (aborted at a drain's end, say)
  // still has its usage to print.
  if (flags.GetBool("usage") && !last.finish_reason().empty()) {
    const v1::Usage& u = last.usage();
    err << "request_id=" << last.request_id() << " finish_reason=" << last.finish_reason()
        << " prompt_tokens=" << u.prompt_tokens()
        << " cached_prompt_tokens=" << u.cached_prompt_tokens()
        << " completion_tokens=" << u.completion_tokens()
        << " queue_time_s=" << u.queue_time_seconds()
        << " ttft_s=" << u.time_to_first_token_seconds() << " total_s=" << u.total_time_seconds()
        << " preemptions=" << u.num_preemptions() << "\n";
  }
  if (!status.ok()) return CallFailed(status, err);
  return 0;
}

}  // namespace kvd
