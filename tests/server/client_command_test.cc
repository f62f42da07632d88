// `kvd client`'s flags: exactly one prompt form, token ids parsed strictly, every flag
// reaching its GenerateRequest field (checked against an in-process server that records
// the request), and the stream printed as it arrives. (Talking to a real daemon is covered
// by serve_synthetic_test.cc and tests/gpu/serve_check.sh.)

#include "server/client_command.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvd/v1/kvd.grpc.pb.h"

namespace kvd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result Client(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunClientCommand(args, out, err);
  return {code, out.str(), err.str()};
}

// An Inference server on a free local port that records each GenerateRequest and answers
// with two deltas ("Once", " upon"; ids 10, 11), then a last message with finish_reason
// "stop", usage and the request id (the client's, or "made-up"). A request with the id
// "shutdown" ends instead as a drain's end aborts one: finish_reason "aborted", then
// UNAVAILABLE.
class RecordingServer final : public v1::Inference::Service {
 public:
  RecordingServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~RecordingServer() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // "127.0.0.1:PORT"; port 0 if the server did not start.
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  bool started() const { return server_ != nullptr && port_ != 0; }
  v1::GenerateRequest last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  // Holds one session, "chat-1", until it is closed.
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest* request,
                            v1::CloseSessionResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (request->session_id() != "chat-1" || chat_closed_) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "no session \"" + request->session_id() + "\"");
    }
    chat_closed_ = true;
    return grpc::Status::OK;
  }

  grpc::Status GetCacheStats(grpc::ServerContext*, const v1::GetCacheStatsRequest*,
                             v1::CacheStats* stats) override {
    stats->set_block_size(16);
    stats->set_used_blocks(7);
    return grpc::Status::OK;
  }
  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    info->set_name("recorded");
    info->set_vocab_size(512);
    return grpc::Status::OK;
  }

  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = *request;
    }
    const std::string id = request->request_id().empty() ? "made-up" : request->request_id();
    v1::GenerateResponse delta;
    delta.set_request_id(id);
    delta.add_token_ids(10);
    delta.set_text("Once");
    writer->Write(delta);
    delta.set_token_ids(0, 11);
    delta.set_text(" upon");
    writer->Write(delta);
    v1::GenerateResponse end;
    end.set_request_id(id);
    end.set_finish_reason("stop");
    end.mutable_usage()->set_prompt_tokens(3);
    end.mutable_usage()->set_completion_tokens(2);
    end.mutable_usage()->set_num_preemptions(1);
    if (id == "shutdown") {
      end.set_finish_reason("aborted");
      writer->Write(end);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
    }
    writer->Write(end);
    return grpc::Status::OK;
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  v1::GenerateRequest last_;
  bool chat_closed_ = false;
};

TEST(ClientCommandTest, EveryFlagReachesItsRequestField) {
  RecordingServer server;
  ASSERT_TRUE(server.started());
  const Result r = Client({"--address",
                           server.address(),
                           "--prompt",
                           "Once upon a time",
                           "--max-tokens",
                           "7",
                           "--temperature",
                           "0.5",
                           "--top-p",
                           "0.9",
                           "--top-k",
                           "40",
                           "--min-p",
                           "0.05",
                           "--seed",
                           "18446744073709551615",
                           "--stop",
                           "The end",
                           "--stop=\n\n",
                           "--stop-token-ids",
                           "2,13",
                           "--session-id",
                           "chat-1",
                           "--priority",
                           "-3",
                           "--expected-output-tokens",
                           "120",
                           "--request-id",
                           "req-9",
                           "--ignore-eos",
                           "--timeout",
                           "30"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "Once upon\n");
  const v1::GenerateRequest q = server.last();
  EXPECT_EQ(q.prompt(), "Once upon a time");
  EXPECT_TRUE(q.prompt_token_ids().empty());
  EXPECT_EQ(q.max_tokens(), 7u);
  EXPECT_FLOAT_EQ(q.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(q.top_p(), 0.9f);
  EXPECT_EQ(q.top_k(), 40u);
  EXPECT_FLOAT_EQ(q.min_p(), 0.05f);
  EXPECT_EQ(q.seed(), 18446744073709551615u);
  EXPECT_THAT(q.stop(), ElementsAre("The end", "\n\n"));
  EXPECT_THAT(q.stop_token_ids(), ElementsAre(2u, 13u));
  EXPECT_EQ(q.session_id(), "chat-1");
  EXPECT_EQ(q.priority(), -3);
  EXPECT_EQ(q.expected_output_tokens(), 120u);
  EXPECT_EQ(q.request_id(), "req-9");
  EXPECT_TRUE(q.ignore_eos());
}

// Left out, each field keeps its proto default: the server's defaults apply.
TEST(ClientCommandTest, FlagsLeftOutLeaveTheFieldsUnset) {
  RecordingServer server;
  ASSERT_TRUE(server.started());
  const Result r = Client({"--address", server.address(), "--prompt-token-ids", "1,5,9"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "10 11\n");  // the ids, space-separated, for a token-id prompt
  EXPECT_EQ(r.err, "");
  v1::GenerateRequest expected;
  expected.add_prompt_token_ids(1);
  expected.add_prompt_token_ids(5);
  expected.add_prompt_token_ids(9);
  EXPECT_EQ(server.last().SerializeAsString(), expected.SerializeAsString())
      << server.last().DebugString();
}

TEST(ClientCommandTest, UsageLineNamesTheRequestAndItsPreemptions) {
  RecordingServer server;
  ASSERT_TRUE(server.started());
  const Result r = Client({"--address", server.address(), "--prompt", "hi", "--usage"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("request_id=made-up finish_reason=stop prompt_tokens=3"));
  EXPECT_THAT(r.err, HasSubstr("completion_tokens=2"));
  EXPECT_THAT(r.err, HasSubstr("preemptions=1"));
}

// A call that fails after its final message still prints that message's usage, then the
// error.
TEST(ClientCommandTest, UsageLineComesAlsoWhenTheCallEndsWithAnError) {
  RecordingServer server;
  ASSERT_TRUE(server.started());
  const Result r = Client(
      {"--address", server.address(), "--prompt", "hi", "--request-id", "shutdown", "--usage"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "Once upon\n");
  EXPECT_THAT(r.err, HasSubstr("request_id=shutdown finish_reason=aborted prompt_tokens=3"));
  EXPECT_THAT(r.err, HasSubstr("kvd client: UNAVAILABLE: the server is shutting down"));
}

TEST(ClientCommandTest, CloseSessionReleasesASessionOnceThenNotFound) {
  RecordingServer server;
  ASSERT_TRUE(server.started());
  Result r = Client({"--address", server.address(), "--close-session", "chat-1"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  r = Client({"--address", server.address(), "--close-session", "chat-1", "--timeout", "5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "kvd client: NOT_FOUND: no session \"chat-1\"\n");
  r = Client({"--address", server.address(), "--close-session", "chat-1", "--prompt", "hi"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("give one of --prompt (or --prompt-token-ids), --close-session, "
                               "--cache-stats and --model-info"));
}

TEST(ClientCommandTest, CacheStatsAndModelInfoPrintTheAnswerAsJson) {
  RecordingServer server;
  ASSERT_TRUE(server.started());
  Result r = Client({"--address", server.address(), "--cache-stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json stats = nlohmann::json::parse(r.out);
  EXPECT_EQ(stats["block_size"], 16);
  EXPECT_EQ(stats["used_blocks"], "7");    // uint64: a string in proto3's JSON mapping
  EXPECT_EQ(stats["shared_blocks"], "0");  // every field, zeros too
  EXPECT_EQ(r.err, "");
  r = Client({"--address", server.address(), "--model-info"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json info = nlohmann::json::parse(r.out);
  EXPECT_EQ(info["name"], "recorded");
  EXPECT_EQ(info["vocab_size"], 512);
  // One call at a time, and a unary call takes no completion flag (it would be ignored).
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--cache-stats", "--model-info"},
        std::vector<std::string>{"--close-session", "chat-1", "--cache-stats"},
        std::vector<std::string>{"--model-info", "--prompt-token-ids", "1,2"},
        std::vector<std::string>{"--cache-stats", "--prompt", "hi"}}) {
    std::vector<std::string> args = {"--address", server.address()};
    args.insert(args.end(), extra.begin(), extra.end());
    r = Client(args);
    EXPECT_EQ(r.code, 2) << extra[0] << " " << extra[1];
    EXPECT_THAT(r.err, HasSubstr("give one of --prompt (or --prompt-token-ids)"));
  }
  r = Client({"--address", server.address(), "--cache-stats", "--session-id", "chat-1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--session-id is a completion's flag"));
  r = Client({"--address", server.address(), "--close-session", "chat-1", "--usage"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--usage is a completion's flag"));
  // A daemon that is not there: the call's error, exit 1.
  r = Client({"--address", "127.0.0.1:1", "--cache-stats", "--timeout", "5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kvd client: UNAVAILABLE"));
}

TEST(ClientCommandTest, MalformedStopTokenIdIsAUsageErrorNamingIt) {
  const Result r = Client({"--prompt", "hi", "--stop-token-ids", "2,-1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--stop-token-ids: '-1' is not a token id"));
}

TEST(ClientCommandTest, HelpListsTokenIdPrompts) {
  const Result r = Client({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--prompt-token-ids"));
  EXPECT_THAT(r.out, HasSubstr("--ignore-eos"));
}

TEST(ClientCommandTest, NeedsExactlyOnePromptForm) {
  Result r = Client({"--prompt", "hi", "--prompt-token-ids", "1,2"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("exactly one of --prompt and --prompt-token-ids"));
  // Nothing to do at all: every call it could make is named.
  r = Client({});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("give one of --prompt (or --prompt-token-ids), --close-session, "
                               "--cache-stats and --model-info"));
}

TEST(ClientCommandTest, AnEmptyPromptIsAUsageError) {
  const Result r = Client({"--prompt", "", "--address", "127.0.0.1:1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--prompt '': the prompt is empty"));
}

TEST(ClientCommandTest, MalformedTokenIdIsAUsageErrorNamingIt) {
  for (const char* ids : {"1,x,3", "1,,3", "-4", ""}) {
    const Result r = Client({"--prompt-token-ids", ids, "--address", "127.0.0.1:1"});
    EXPECT_EQ(r.code, 2) << ids;
    EXPECT_THAT(r.err, HasSubstr("--prompt-token-ids")) << ids;
  }
}

// The request's fields are uint32, float and uint64: a number they cannot hold is refused
// before any call, naming the flag and the value, rather than sent wrapped (4294967299 -> 3,
// -1 -> 4294967295) or turned into an undefined deadline.
TEST(ClientCommandTest, OutOfRangeNumbersAreUsageErrorsNamingFlagAndValue) {
  for (const auto& [flag, value, range] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--max-tokens", "4294967299", "[0, 4294967295]"},
           {"--max-tokens", "-1", "[0, 4294967295]"},
           {"--top-k", "-1", "[0, 4294967295]"},
           {"--top-k", "4294967296", "[0, 4294967295]"},
           {"--expected-output-tokens", "-1", "[0, 4294967295]"},
           {"--priority", "2147483648", "[-2147483648, 2147483647]"},
           {"--seed", "-1", "[0, 18446744073709551615]"},
           {"--seed", "18446744073709551616", "[0, 18446744073709551615]"}}) {
    const Result r = Client({"--prompt", "hi", "--address", "127.0.0.1:1", flag, value});
    EXPECT_EQ(r.code, 2) << flag << " " << value << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(flag + ": " + value + " is outside " + range));
  }
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--temperature", "1e300"},
                                                        {"--temperature", "nan"},
                                                        {"--top-p", "inf"},
                                                        {"--min-p", "nan"},
                                                        {"--timeout", "inf"},
                                                        {"--timeout", "1e300"},
                                                        {"--timeout", "nan"},
                                                        {"--timeout", "-1"}}) {
    const Result r = Client({"--prompt", "hi", "--address", "127.0.0.1:1", flag, value});
    EXPECT_EQ(r.code, 2) << flag << " " << value << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(flag + ": " + value + " is out of range; allowed: "));
  }
}

// The request's floats: 1e-50 was once sent as 0 (greedy temperature, unset top-p).
TEST(ClientCommandTest, SamplingFloatsThatRoundToZeroAreUsageErrors) {
  for (const char* flag : {"--temperature", "--top-p", "--min-p"}) {
    const Result r =
        Client({"--prompt", "hi", "--address", "127.0.0.1:1", "--timeout", "1", flag, "1e-50"});
    EXPECT_EQ(r.code, 2) << flag << ": " << r.err;
    EXPECT_THAT(r.err,
                HasSubstr(std::string(flag) + ": 1e-50 is not 0 but rounds to 0 as a float"));
  }
}

// gRPC's resolver once logged raw lines and failed with "UNKNOWN: Failed to create secure
// client channel", which names no flag.
TEST(ClientCommandTest, EmptyAddressIsAUsageErrorNamingIt) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--prompt", "hi", "--address", ""},
        std::vector<std::string>{"--prompt", "hi", "--address="}}) {
    const Result r = Client(args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("kvd client: --address is empty"));
    EXPECT_THAT(r.err, Not(HasSubstr("UNKNOWN")));
    EXPECT_EQ(r.out, "");
  }
}

// A call that fails before any text streams leaves stdout empty, not one bare newline.
TEST(ClientCommandTest, FailedCallPrintsNothingToStdout) {
  for (const char* prompt_flag : {"--prompt", "--prompt-token-ids"}) {
    const Result r = Client({prompt_flag, "1", "--address", "127.0.0.1:1", "--timeout", "1"});
    EXPECT_EQ(r.code, 1) << r.err;  // nothing listens
    EXPECT_EQ(r.out, "") << prompt_flag;
    EXPECT_THAT(r.err, HasSubstr("kvd client: UNAVAILABLE"));
  }
}

// The request's seed is a uint64, as the config's model.seed: the largest is sent, not refused.
TEST(ClientCommandTest, SeedTakesTheWholeUint64Range) {
  const Result r = Client({"--prompt", "hi", "--address", "127.0.0.1:1", "--timeout", "1", "--seed",
                           "18446744073709551615"});
  EXPECT_NE(r.code, 2) << r.err;  // the call fails (nothing listens), not the usage
  EXPECT_THAT(r.err, Not(HasSubstr("--seed")));
}

TEST(ClientCommandTest, HelpStatesTheRanges) {
  const Result r = Client({"--help"});
  EXPECT_THAT(r.out, HasSubstr("[0, 4294967295]"));
  EXPECT_THAT(r.out, HasSubstr("0 .. 315360000"));
}

}  // namespace
}  // namespace kvd
