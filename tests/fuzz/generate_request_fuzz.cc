// Fuzz target: a GenerateRequest from a client, as wire bytes (ParseGenerateRequest) or as
// fields set from the input, through RequestValidator with stories260K's tokenizer.
//
// Invariants: a refusal is InvalidArgument whose message starts with the field it is about
// ("max_tokens: ..."); a request that passes is one the engine can run as it stands: prompt
// ids in the vocabulary, prompt + max_tokens within the context (+ 1) when the client set
// max_tokens (the default may run past it: the engine ends the request at the context with
// "context_limit") and within the pool (+ 1) when it did not, sampling options the
// Sampler accepts (its constructor aborts on others), stop strings non-empty UTF-8, stop ids
// in the vocabulary with the model's end of text unless ignore_eos, identifiers UTF-8
// without control characters.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "config/value_codec.h"
#include "kvd/v1/kvd.pb.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "server/request_validator.h"
#include "server/utf8.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/stories260k_tokenizer.h"

namespace {

using kvd::fuzz::InputReader;
using kvd::fuzz::Require;

constexpr int32_t kContext = 256;
constexpr int32_t kEndOfText = 1;

const kvd::RequestValidator& Validator() {
  static const kvd::RequestValidator* validator = [] {
    kvd::RequestLimits limits;
    limits.vocab_size = 512;
    limits.max_context_tokens = kContext;
    limits.default_max_tokens = 200;
    limits.pool_tokens = 128;  // smaller than the context: the default is capped by the pool
    limits.max_prompt_bytes = 4096;
    limits.max_stop_strings = 4;
    limits.max_stop_string_bytes = 8;
    limits.max_stop_token_ids = 4;
    limits.max_id_bytes = 16;
    limits.default_stop_token_ids = {kEndOfText};
    return new kvd::RequestValidator(limits, &kvd::fuzz::Stories260kTokenizer());
  }();
  return *validator;
}

// A float that is often on or near the edge of a range: small integers, halves, NaN, inf.
float EdgyFloat(InputReader& input) {
  const unsigned char b = input.Byte();
  switch (b % 8) {
    case 0:
      return 0.0f;
    case 1:
      return -0.0f;
    case 2:
      return static_cast<float>(b / 8) / 16.0f;  // 0 .. 1.9375
    case 3:
      return std::numeric_limits<float>::quiet_NaN();
    case 4:
      return (b & 8 ? -1 : 1) * std::numeric_limits<float>::infinity();
    case 5:
      return std::numeric_limits<float>::denorm_min();
    default: {
      float f;
      const std::string_view bytes = input.Bytes(4);
      uint32_t bits = 0;
      std::memcpy(&bits, bytes.data(), bytes.size());
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
}

uint32_t SmallOrAny(InputReader& input) {
  const unsigned char b = input.Byte();
  if (b < 200) return b * 3u;  // 0 .. 597: around the vocabulary and the context
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | input.Byte();
  return v;
}

kvd::v1::GenerateRequest FromFields(InputReader& input) {
  kvd::v1::GenerateRequest r;
  const unsigned char present = input.Byte();
  if (present & 1) r.set_prompt(std::string(input.Bytes(input.Byte() * 4)));
  if (present & 2) {
    for (int n = input.Byte() % 40; n > 0; --n) r.add_prompt_token_ids(SmallOrAny(input));
  }
  if (present & 4) r.set_max_tokens(SmallOrAny(input));
  if (present & 8) r.set_temperature(EdgyFloat(input) * 64);
  if (present & 16) r.set_top_p(EdgyFloat(input));
  if (present & 32) r.set_min_p(EdgyFloat(input));
  if (present & 64) r.set_top_k(SmallOrAny(input));
  if (present & 128) {
    for (int n = input.Byte() % 6; n > 0; --n)
      r.add_stop(std::string(input.Bytes(input.Byte() % 12)));
  }
  const unsigned char more = input.Byte();
  if (more & 1) {
    for (int n = input.Byte() % 6; n > 0; --n) r.add_stop_token_ids(SmallOrAny(input));
  }
  if (more & 2) r.set_session_id(std::string(input.Bytes(input.Byte() % 20)));
  if (more & 4) r.set_request_id(std::string(input.Bytes(input.Byte() % 20)));
  if (more & 8) r.set_expected_output_tokens(SmallOrAny(input));
  r.set_ignore_eos(more & 16);
  r.set_seed(more & 32 ? 0 : 7);
  r.set_priority(static_cast<int8_t>(input.Byte()));
  return r;
}

void Check(const kvd::v1::GenerateRequest& in) {
  const absl::StatusOr<kvd::Request> out = Validator().Validate(in);
  if (!out.ok()) {
    Require(out.status().code() == absl::StatusCode::kInvalidArgument, "not InvalidArgument");
    const absl::string_view message = out.status().message();
    const size_t colon = message.find(": ");
    Require(colon != absl::string_view::npos && colon > 0, "the message names no field");
    for (char c : message.substr(0, colon)) {
      Require(std::islower(static_cast<unsigned char>(c)) ||
                  std::isdigit(static_cast<unsigned char>(c)) || c == '_' || c == '[' || c == ']',
              "the message does not start with a field name");
    }
    return;
  }
  const kvd::Request& r = *out;
  Require(!r.prompt.empty(), "an empty prompt passed");
  for (int32_t id : r.prompt) Require(id >= 0 && id < 512, "a prompt id outside the vocabulary");
  Require(r.max_tokens >= 1, "max_tokens < 1");
  if (in.max_tokens() != 0) {
    Require(static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= kContext + 1,
            "prompt + max_tokens exceed the context");
  } else {
    // 200, capped by what the 128-token pool leaves unless the prompt alone overflows it
    // (the engine refuses that prompt).
    const int64_t prompt = static_cast<int64_t>(r.prompt.size());
    Require(r.max_tokens == (prompt > 128 ? 200 : std::min<int64_t>(200, 128 + 1 - prompt)),
            "the default max_tokens is not 200 capped by what the pool leaves");
  }
  Require(r.sampling.Validate().ok(), "sampling options the Sampler refuses");
  kvd::Sampler sampler(r.sampling);  // aborts on options it cannot use
  for (const std::string& stop : r.stop) {
    Require(!stop.empty() && kvd::IsValidUtf8(stop), "a stop string that is empty or not UTF-8");
  }
  for (int32_t id : r.stop_token_ids) Require(id >= 0 && id < 512, "a stop id out of range");
  const bool has_end = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), kEndOfText) !=
                       r.stop_token_ids.end();
  Require(in.ignore_eos() || has_end, "the model's end of text is not a stop id");
  for (const std::string* id : {&r.session_id, &r.request_id}) {
    Require(kvd::IsValidUtf8(*id), "an id that is not UTF-8");
    Require(kvd::FindControlCharacter(*id) == std::string::npos, "an id with a control character");
  }
  Require(r.expected_output_tokens >= 0 && r.expected_output_tokens <= kContext,
          "expected_output_tokens out of range");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  InputReader input(data, size);
  if (input.Byte() % 2 == 0) {
    kvd::v1::GenerateRequest request;
    const std::string_view wire = input.Rest();
    const absl::Status parsed =
        kvd::ParseGenerateRequest(absl::string_view(wire.data(), wire.size()), &request);
    if (!parsed.ok()) {
      Require(parsed.code() == absl::StatusCode::kInvalidArgument, "not InvalidArgument");
      return 0;
    }
    Check(request);
  } else {
    const kvd::v1::GenerateRequest request = FromFields(input);
    // What a client sends is what the server parses (protobuf itself refuses to send a
    // string that is not UTF-8 well, so only valid ones make the trip).
    bool all_utf8 = kvd::IsValidUtf8(request.prompt()) && kvd::IsValidUtf8(request.session_id()) &&
                    kvd::IsValidUtf8(request.request_id());
    for (const std::string& stop : request.stop()) all_utf8 = all_utf8 && kvd::IsValidUtf8(stop);
    if (all_utf8) {
      const std::string wire = request.SerializeAsString();
      kvd::v1::GenerateRequest parsed;
      Require(kvd::ParseGenerateRequest(wire, &parsed).ok(), "a sent request did not parse");
      Require(parsed.SerializeAsString() == wire, "a sent request parsed differently");
    }
    Check(request);
  }
  return 0;
}
