#ifndef KVD_SERVER_REQUEST_VALIDATOR_H_
#define KVD_SERVER_REQUEST_VALIDATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer.h"
#include "scheduler/request.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace kvd::v1 {
class GenerateRequest;  // kvd/v1/kvd.pb.h; kept out of this header on purpose
}  // namespace kvd::v1

namespace kvd {

// What a GenerateRequest may ask for. Plain aggregate; the daemon fills it from the model
// and the config.
struct RequestLimits {
  int32_t vocab_size = 0;
  // KV positions of one request: min(the model's context, max_seq_length).
  int32_t max_context_tokens = 0;
  // The model's own context: where it is larger, messages name max_seq_length (0: never).
  int32_t model_context_tokens = 0;
  // max_tokens when the request leaves it 0, capped by what the whole KV pool leaves where
  // the pool is smaller than the context (a request must not be refused for a value it never
  // sent), not by the context: a request that fills the context first ends with
  // finish_reason "context_limit".
  int32_t default_max_tokens = 256;
  // KV positions the whole pool holds (blocks x block_size); 0 = no cap on the default.
  int64_t pool_tokens = 0;
  int32_t max_prompt_bytes = 1 << 20;  // `prompt` text
  int32_t max_stop_strings = 16;
  int32_t max_stop_string_bytes = 256;
  int32_t max_stop_token_ids = 64;
  int32_t max_id_bytes = 256;  // session_id and request_id
  // Seed for requests that give 0 (proto3 cannot tell 0 from unset).
  uint64_t default_seed = 0;
  // Appended to every request's stop ids unless it sets ignore_eos: the model's end of
  // text (ModelSpec::StopTokenIds: BOS and EOS for llama2.c checkpoints; EOS and the model's
  // other end tokens otherwise).
  std::vector<int32_t> default_stop_token_ids;
};

// " (kv_cache_config.max_seq_length; the model's is M)" where the config caps the model's
// context of M positions to `context_tokens`, else "": what the daemon's startup line and the
// validator's refusals append to the context they name.
std::string ContextCapNote(int32_t context_tokens, int32_t model_context_tokens);

// Turns a GenerateRequest into an engine Request, or says exactly what is wrong with it.
//
// Every error is InvalidArgument and its message starts with the field's name, then the
// problem and the allowed range, e.g.
//   "temperature: 101 is out of range; allowed: [0, 100] (0 = greedy)".
// Checks, in order: exactly one of prompt / prompt_token_ids; prompt size and UTF-8; token
// ids < vocab_size; prompt length <= max_context_tokens; max_tokens (0 = default) with
// prompt + max_tokens <= max_context_tokens + 1 (the last token sampled needs no KV slot,
// as in llama2.c's run.c); temperature in [0, 100]; top_p in (0, 1]
// (0 = unset = 1); min_p in [0, 1]; top_k <= vocab_size; stop strings (count, non-empty,
// length, UTF-8); stop_token_ids (count, < vocab_size); session_id and request_id (length,
// UTF-8, no control characters); expected_output_tokens <= max_context_tokens.
// The prompt text is tokenized with BOS; prompt_token_ids are taken verbatim.
// The result's deadline is left infinite (the transport sets it).
//
// Immutable after construction; Validate is safe to call concurrently. Does not own the
// tokenizer, which must outlive it (null: only prompt_token_ids are accepted).
class RequestValidator {
 public:
  RequestValidator(RequestLimits limits, const Tokenizer* tokenizer);

  absl::StatusOr<Request> Validate(const v1::GenerateRequest& request) const;

  // A CloseSession's session_id: what Validate allows as one (length, UTF-8, no control
  // characters), and not empty. InvalidArgument naming the field otherwise.
  absl::Status ValidateSessionToClose(const std::string& session_id) const;

  const RequestLimits& limits() const { return limits_; }

 private:
  RequestLimits limits_;
  const Tokenizer* tokenizer_;
  // "the context of N tokens", naming max_seq_length where it sets N (refusals only).
  std::string the_context_;
};

// Parses a GenerateRequest from its wire bytes. Unlike protobuf's own parser (whose only
// answer to a proto3 string that is not UTF-8 is a failed parse), this names the field:
// InvalidArgument "prompt: not valid UTF-8 ...". Malformed wire data is InvalidArgument
// too. Thread safe.
absl::Status ParseGenerateRequest(absl::string_view wire, v1::GenerateRequest* request);

// The same for any request message (CloseSession's too): a top-level string field that is
// not UTF-8 is InvalidArgument naming it, malformed data InvalidArgument naming the type.
absl::Status ParseRequestMessage(absl::string_view wire, google::protobuf::Message* request);

}  // namespace kvd

#endif  // KVD_SERVER_REQUEST_VALIDATOR_H_
