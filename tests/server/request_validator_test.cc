#include "server/request_validator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "kvd/v1/kvd.pb.h"

namespace kvd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int32_t kVocab = 512;
constexpr int32_t kContext = 64;

class RequestValidatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::LoadLlama2c(KVD_SHARED_DIR "/models/tok512.bin", kVocab);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    limits_.vocab_size = kVocab;
    limits_.max_context_tokens = kContext;
    limits_.default_max_tokens = 16;
    limits_.max_prompt_bytes = 1000;
    limits_.max_stop_strings = 4;
    limits_.max_stop_string_bytes = 8;
    limits_.max_stop_token_ids = 4;
    limits_.max_id_bytes = 16;
    limits_.default_seed = 77;
    limits_.default_stop_token_ids = {1};
  }

  absl::StatusOr<Request> Check(const v1::GenerateRequest& r) {
    return RequestValidator(limits_, tokenizer_.get()).Validate(r);
  }

  static v1::GenerateRequest Ok() {
    v1::GenerateRequest r;
    r.set_prompt("Once upon a time");
    r.set_max_tokens(8);
    return r;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  RequestLimits limits_;
};

TEST_F(RequestValidatorTest, TextPromptIsTokenizedWithBos) {
  auto r = Check(Ok());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt, tokenizer_->Encode("Once upon a time", /*add_bos=*/true));
  EXPECT_EQ(r->prompt.front(), Tokenizer::kBosId);
  EXPECT_EQ(r->max_tokens, 8);
}

TEST_F(RequestValidatorTest, TokenIdsAreTakenVerbatim) {
  v1::GenerateRequest in;
  in.add_prompt_token_ids(5);
  in.add_prompt_token_ids(kVocab - 1);
  auto r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompt, ElementsAre(5, kVocab - 1));
}

TEST_F(RequestValidatorTest, DefaultsFillUnsetFields) {
  v1::GenerateRequest in = Ok();
  in.set_max_tokens(0);
  auto r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 16);                    // default_max_tokens
  EXPECT_EQ(r->sampling.temperature, 0.0f);        // greedy
  EXPECT_EQ(r->sampling.top_p, 1.0f);              // 0 = unset = 1
  EXPECT_EQ(r->sampling.seed, 77u);                // default_seed
  EXPECT_THAT(r->stop_token_ids, ElementsAre(1));  // the model's end of text
  EXPECT_EQ(r->deadline, absl::InfiniteFuture());
}

// Where kv_cache_config.max_seq_length, not the model, sets the context, the refusals say
// so: a client told "the context of 64 tokens" by a 512-token model would look elsewhere.
TEST_F(RequestValidatorTest, AContextTheConfigCapsIsNamedAsSuch) {
  v1::GenerateRequest in;
  for (int i = 0; i < kContext + 1; ++i) in.add_prompt_token_ids(7);
  EXPECT_THAT(std::string(Check(in).status().message()),
              ::testing::EndsWith("longer than the context of 64 "
                                  "tokens; allowed: at most 64 "
                                  "prompt tokens"));
  limits_.model_context_tokens = 512;
  EXPECT_THAT(Check(in).status().message(),
              HasSubstr("longer than the context of 64 tokens (kv_cache_config.max_seq_length; "
                        "the model's is 512)"));
  in.clear_prompt_token_ids();
  in.add_prompt_token_ids(7);
  in.set_max_tokens(65);
  EXPECT_THAT(Check(in).status().message(),
              HasSubstr("does not fit the context of 64 tokens (kv_cache_config.max_seq_length"));
  in.set_prompt(std::string(900, 'a'));  // text: refused by its least token count
  in.clear_prompt_token_ids();
  in.clear_max_tokens();
  EXPECT_THAT(Check(in).status().message(),
              HasSubstr("the context of 64 tokens (kv_cache_config.max_seq_length"));
}

// The context does not cap the default: the engine ends such a request where the context
// is full with finish_reason "context_limit", where a capped max_tokens would read "length".
TEST_F(RequestValidatorTest, DefaultMaxTokensIsLeftToRunIntoTheContext) {
  v1::GenerateRequest in;
  for (int i = 0; i < kContext - 5; ++i) in.add_prompt_token_ids(7);
  auto r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 16);  // default_max_tokens, though 6 fill the context
  in.set_max_tokens(6);          // the last token needs no KV slot
  EXPECT_TRUE(Check(in).ok());
  in.set_max_tokens(7);
  EXPECT_THAT(Check(in).status().message(), HasSubstr("max_tokens: 7 with a"));
}

// A small pool caps the default too: the engine would refuse prompt + 256 tokens that can
// never fit, naming a max_tokens the client never sent. An explicit value is left to the
// engine to judge (RESOURCE_EXHAUSTED naming it).
TEST_F(RequestValidatorTest, DefaultMaxTokensIsCappedByThePool) {
  limits_.default_max_tokens = 50;
  limits_.pool_tokens = 32;
  v1::GenerateRequest in;
  for (int i = 0; i < 5; ++i) in.add_prompt_token_ids(7);
  auto r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 28);  // 5 + 28 - 1 = 32 positions
  in.set_max_tokens(40);
  r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 40);
  // A prompt the pool cannot hold keeps the default; the engine refuses it by the prompt.
  in.clear_max_tokens();
  in.clear_prompt_token_ids();
  for (int i = 0; i < 40; ++i) in.add_prompt_token_ids(7);
  r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 50);
}

// A pool that holds the whole context caps nothing: the engine counts no KV past the
// context, so the default runs into it and ends "context_limit" (capped to what the pool
// leaves, 5 here, it would end "length" at the very same token).
TEST_F(RequestValidatorTest, APoolThatHoldsTheContextLeavesTheDefaultToTheContext) {
  limits_.pool_tokens = kContext;
  v1::GenerateRequest in;
  for (int i = 0; i < kContext - 4; ++i) in.add_prompt_token_ids(7);
  auto r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 16);
  limits_.pool_tokens = kContext - 1;  // one position short: capped, so it is never refused
  r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 4);
}

// Like llama2.c's run.c with steps == seq_len: the last token sampled is never fed back,
// so prompt + max_tokens may be context + 1 (the golden outputs go that far).
TEST_F(RequestValidatorTest, PromptPlusMaxTokensMayExceedTheContextByTheLastToken) {
  v1::GenerateRequest in;
  for (int i = 0; i < 10; ++i) in.add_prompt_token_ids(7);
  in.set_max_tokens(kContext - 9);
  EXPECT_TRUE(Check(in).ok());
  in.set_max_tokens(kContext - 8);
  EXPECT_FALSE(Check(in).ok());
}

TEST_F(RequestValidatorTest, APromptMayFillTheContextForOneToken) {
  v1::GenerateRequest in;
  for (int i = 0; i < kContext; ++i) in.add_prompt_token_ids(7);
  in.set_max_tokens(1);
  EXPECT_TRUE(Check(in).ok());
}

// A text that cannot fit the context whatever it encodes to is refused by its length, without
// encoding it (a megabyte takes most of a second to encode).
TEST_F(RequestValidatorTest, ATextTooLongForAnyEncodingIsRefusedByItsLength) {
  v1::GenerateRequest in = Ok();
  in.set_prompt(std::string(990, 'x'));
  auto r = Check(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("prompt: is 990 bytes long, at least "));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("longer than the context of 64"));
  // One that may fit is encoded and judged by its tokens.
  in.set_prompt(std::string(kContext - 10, 'x'));
  r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LE(static_cast<int64_t>(r->prompt.size()), kContext);
}

TEST_F(RequestValidatorTest, FieldsAreCopied) {
  v1::GenerateRequest in = Ok();
  in.set_temperature(0.7f);
  in.set_top_p(0.9f);
  in.set_top_k(40);
  in.set_min_p(0.05f);
  in.set_seed(123);
  in.add_stop("The end");
  in.add_stop_token_ids(2);
  in.set_session_id("chat-1");
  in.set_priority(-3);
  in.set_expected_output_tokens(12);
  in.set_request_id("req-9");
  auto r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.temperature, 0.7f);
  EXPECT_EQ(r->sampling.top_p, 0.9f);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.min_p, 0.05f);
  EXPECT_EQ(r->sampling.seed, 123u);
  EXPECT_THAT(r->stop, ElementsAre("The end"));
  EXPECT_THAT(r->stop_token_ids, ElementsAre(2, 1));
  EXPECT_EQ(r->session_id, "chat-1");
  EXPECT_EQ(r->priority, -3);
  EXPECT_EQ(r->expected_output_tokens, 12);
  EXPECT_EQ(r->request_id, "req-9");
}

TEST_F(RequestValidatorTest, IgnoreEosDropsTheDefaultStopTokens) {
  v1::GenerateRequest in = Ok();
  in.set_ignore_eos(true);
  in.add_stop_token_ids(9);
  auto r = Check(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->stop_token_ids, ElementsAre(9));
}

TEST_F(RequestValidatorTest, TextPromptNeedsATokenizer) {
  auto r = RequestValidator(limits_, nullptr).Validate(Ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("prompt:"));
}

// Each bad request is refused with INVALID_ARGUMENT, and the message starts with the field
// and says what is allowed.
struct BadCase {
  std::string name;
  std::function<void(v1::GenerateRequest&)> mutate;
  std::string field;  // the message starts with "<field>:"
};

class BadRequestTest : public RequestValidatorTest,
                       public ::testing::WithParamInterface<BadCase> {};

TEST_P(BadRequestTest, IsInvalidArgumentNamingTheField) {
  v1::GenerateRequest in = Ok();
  GetParam().mutate(in);
  auto r = Check(in);
  ASSERT_FALSE(r.ok()) << GetParam().name << " was accepted";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), StartsWith(GetParam().field + ":")) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("allowed:")) << r.status();
}

const BadCase kBadCases[] = {
    {"NeitherPrompt", [](auto& r) { r.clear_prompt(); }, "prompt"},
    {"BothPrompts", [](auto& r) { r.add_prompt_token_ids(5); }, "prompt"},
    {"PromptTooManyBytes", [](auto& r) { r.set_prompt(std::string(1001, 'a')); }, "prompt"},
    {"PromptBadUtf8", [](auto& r) { r.set_prompt("abc\xff"); }, "prompt"},
    {"PromptTruncatedUtf8", [](auto& r) { r.set_prompt("price \xe2\x82"); }, "prompt"},
    {"PromptSurrogate", [](auto& r) { r.set_prompt("\xed\xa0\x80"); }, "prompt"},
    {"PromptOverlongUtf8", [](auto& r) { r.set_prompt("\xc0\xaf"); }, "prompt"},
    {"PromptTooManyTokens",
     [](auto& r) {
       std::string text;
       for (int i = 0; i < 100; ++i) text += "cat dog ";
       r.set_prompt(text);
     },
     "prompt"},
    {"TokenIdOutsideVocab",
     [](auto& r) {
       r.clear_prompt();
       r.add_prompt_token_ids(1);
       r.add_prompt_token_ids(kVocab);
     },
     "prompt_token_ids[1]"},
    {"TokenIdsPastTheContext",
     [](auto& r) {
       r.clear_prompt();
       for (int i = 0; i < kContext + 1; ++i) r.add_prompt_token_ids(7);
     },
     "prompt_token_ids"},
    {"MaxTokensPastContext", [](auto& r) { r.set_max_tokens(kContext + 1); }, "max_tokens"},
    {"TemperatureNegative", [](auto& r) { r.set_temperature(-0.5f); }, "temperature"},
    {"TemperatureTooLarge", [](auto& r) { r.set_temperature(101.0f); }, "temperature"},
    {"TemperatureNaN", [](auto& r) { r.set_temperature(std::numeric_limits<float>::quiet_NaN()); },
     "temperature"},
    {"TemperatureInfinite",
     [](auto& r) { r.set_temperature(std::numeric_limits<float>::infinity()); }, "temperature"},
    {"TopPAboveOne", [](auto& r) { r.set_top_p(1.5f); }, "top_p"},
    {"TopPNegative", [](auto& r) { r.set_top_p(-0.1f); }, "top_p"},
    {"MinPAboveOne", [](auto& r) { r.set_min_p(2.0f); }, "min_p"},
    {"MinPNegative", [](auto& r) { r.set_min_p(-1.0f); }, "min_p"},
    {"TopKLargerThanVocab", [](auto& r) { r.set_top_k(kVocab + 1); }, "top_k"},
    {"StopEmpty", [](auto& r) { r.add_stop(""); }, "stop[0]"},
    {"StopTooLong", [](auto& r) { r.add_stop("123456789"); }, "stop[0]"},
    {"StopBadUtf8",
     [](auto& r) {
       r.add_stop("ok");
       r.add_stop("\xfe");
     },
     "stop[1]"},
    {"TooManyStops",
     [](auto& r) {
       for (int i = 0; i < 5; ++i) r.add_stop()->assign(1, 'x');
     },
     "stop"},
    {"StopTokenOutsideVocab", [](auto& r) { r.add_stop_token_ids(600); }, "stop_token_ids[0]"},
    {"TooManyStopTokens",
     [](auto& r) {
       for (int i = 0; i < 5; ++i) r.add_stop_token_ids(2);
     },
     "stop_token_ids"},
    {"SessionIdTooLong", [](auto& r) { r.set_session_id(std::string(17, 's')); }, "session_id"},
    {"SessionIdControlChar", [](auto& r) { r.set_session_id("a\nb"); }, "session_id"},
    {"SessionIdBadUtf8", [](auto& r) { r.set_session_id("\x80"); }, "session_id"},
    {"RequestIdTooLong", [](auto& r) { r.set_request_id(std::string(17, 'r')); }, "request_id"},
    {"ExpectedOutputPastContext", [](auto& r) { r.set_expected_output_tokens(kContext + 1); },
     "expected_output_tokens"},
};

INSTANTIATE_TEST_SUITE_P(Cases, BadRequestTest, ::testing::ValuesIn(kBadCases),
                         [](const auto& info) { return info.param.name; });

TEST(ParseGenerateRequestTest, ParsesValidWireData) {
  v1::GenerateRequest in;
  in.set_prompt("hello");
  in.set_max_tokens(3);
  v1::GenerateRequest out;
  ASSERT_TRUE(ParseGenerateRequest(in.SerializeAsString(), &out).ok());
  EXPECT_EQ(out.prompt(), "hello");
  EXPECT_EQ(out.max_tokens(), 3u);
}

TEST(ParseGenerateRequestTest, NamesTheStringFieldThatIsNotUtf8) {
  // Field 1 (prompt), wire type 2, length 2, bytes "a\xff".
  const std::string prompt_wire(
      "\x0a\x02"
      "a\xff",
      4);
  v1::GenerateRequest out;
  absl::Status s = ParseGenerateRequest(prompt_wire, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("prompt: is not valid UTF-8"));

  // Field 10 (session_id): tag (10 << 3) | 2 = 0x52.
  const std::string session_wire("\x52\x01\xc3", 3);
  s = ParseGenerateRequest(session_wire, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("session_id:"));
}

TEST(ParseGenerateRequestTest, MalformedWireDataIsInvalidArgument) {
  const std::string garbage(
      "\x0a\x7f"
      "abc",
      5);  // length 127 but 3 bytes follow
  v1::GenerateRequest out;
  absl::Status s = ParseGenerateRequest(garbage, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("request:"));
}

}  // namespace
}  // namespace kvd
