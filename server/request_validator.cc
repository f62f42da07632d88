#include "server/request_validator.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/value_codec.h"
#include "kvd/v1/kvd.pb.h"
#include "server/utf8.h"

namespace kvd {

namespace {

absl::Status Bad(absl::string_view field, absl::string_view problem, absl::string_view allowed) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem, "; allowed: ", allowed));
}

// An id field: at most max_bytes of UTF-8, not empty where `required`, and without control
// characters, as identifiers travel into logs and metrics labels.
absl::Status CheckId(absl::string_view field, const std::string& id, int32_t max_bytes,
                     bool required = false) {
  const std::string allowed = absl::StrCat(required ? "1 to " : "at most ", max_bytes,
                                           " bytes of UTF-8 text without control characters");
  if (required && id.empty()) return Bad(field, "is empty", allowed);
  if (static_cast<int64_t>(id.size()) > max_bytes) {
    return Bad(field, absl::StrCat("is ", id.size(), " bytes long"), allowed);
  }
  if (!IsValidUtf8(id)) return Bad(field, "is not valid UTF-8", allowed);
  if (const size_t at = FindControlCharacter(id); at != std::string::npos) {
    return Bad(field,
               absl::StrFormat("contains a control character (0x%02x at byte %d)",
                               static_cast<unsigned char>(id[at]), at),
               allowed);
  }
  return absl::OkStatus();
}

absl::Status CheckTokenIds(absl::string_view field, absl::Span<const uint32_t> ids,
                           int32_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= static_cast<uint32_t>(vocab_size)) {
      return Bad(absl::StrCat(field, "[", i, "]"),
                 absl::StrCat("token id ", ids[i], " is outside the vocabulary"),
                 absl::StrCat("[0, ", vocab_size - 1, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseGenerateRequest(absl::string_view wire, v1::GenerateRequest* request) {
  return ParseRequestMessage(wire, request);
}

absl::Status ParseRequestMessage(absl::string_view wire, google::protobuf::Message* request) {
  const google::protobuf::Descriptor* descriptor = request->GetDescriptor();
  const auto malformed = [descriptor] {
    return absl::InvalidArgumentError(absl::StrCat("request: not a valid ", descriptor->full_name(),
                                                   " message (malformed protobuf data)"));
  };
  // protobuf refuses a proto3 string that is not UTF-8 without saying which (and logs an
  // error); check the string fields first on the raw fields, which parse without checks.
  // Requests are small next to the work they ask for, so parsing twice costs nothing.
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return malformed();
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& field = fields.field(i);
    if (field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const google::protobuf::FieldDescriptor* fd = descriptor->FindFieldByNumber(field.number());
    if (fd != nullptr && fd->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
        !IsValidUtf8(field.length_delimited())) {
      return Bad(fd->name(), "is not valid UTF-8", "UTF-8 text");
    }
  }
  if (!request->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return malformed();
  return absl::OkStatus();
}

std::string ContextCapNote(int32_t context_tokens, int32_t model_context_tokens) {
  if (context_tokens >= model_context_tokens) return "";
  return absl::StrCat(" (kv_cache_config.max_seq_length; the model's is ", model_context_tokens,
                      ")");
}

RequestValidator::RequestValidator(RequestLimits limits, const Tokenizer* tokenizer)
    : limits_(std::move(limits)),
      tokenizer_(tokenizer),
      the_context_(
          absl::StrCat("the context of ", limits_.max_context_tokens, " tokens",
                       ContextCapNote(limits_.max_context_tokens, limits_.model_context_tokens))) {}

absl::Status RequestValidator::ValidateSessionToClose(const std::string& session_id) const {
  return CheckId("session_id", session_id, limits_.max_id_bytes, /*required=*/true);
}

absl::StatusOr<Request> RequestValidator::Validate(const v1::GenerateRequest& in) const {
  const RequestLimits& lim = limits_;
  const int32_t context = lim.max_context_tokens;
  Request out;

  // The prompt.
  const bool has_text = !in.prompt().empty();
  const bool has_ids = in.prompt_token_ids_size() > 0;
  if (has_text == has_ids) {
    return Bad("prompt",
               has_text ? "both prompt and prompt_token_ids are set"
                        : "neither prompt nor prompt_token_ids is set",
               "exactly one of prompt (text) and prompt_token_ids");
  }
  if (has_text) {
    if (tokenizer_ == nullptr) {
      return Bad("prompt", "this model has no tokenizer, so text prompts cannot be used",
                 "prompt_token_ids");
    }
    if (static_cast<int64_t>(in.prompt().size()) > lim.max_prompt_bytes) {
      return Bad("prompt", absl::StrCat("is ", in.prompt().size(), " bytes long"),
                 absl::StrCat("at most ", lim.max_prompt_bytes, " bytes"));
    }
    if (!IsValidUtf8(in.prompt())) return Bad("prompt", "is not valid UTF-8", "UTF-8 text");
    // Encoding a megabyte takes most of a second; a text that cannot fit is refused unread.
    const int64_t min_tokens =
        tokenizer_->MinEncodedTokens(static_cast<int64_t>(in.prompt().size()), /*add_bos=*/true);
    if (min_tokens > context) {
      return Bad("prompt",
                 absl::StrCat("is ", in.prompt().size(), " bytes long, at least ", min_tokens,
                              " tokens, longer than ", the_context_),
                 absl::StrCat("at most ", context, " prompt tokens"));
    }
    out.prompt = tokenizer_->Encode(in.prompt(), /*add_bos=*/true);
  } else {
    if (absl::Status s = CheckTokenIds("prompt_token_ids", in.prompt_token_ids(), lim.vocab_size);
        !s.ok()) {
      return s;
    }
    out.prompt.assign(in.prompt_token_ids().begin(), in.prompt_token_ids().end());
  }
  // The last generated token is sampled but never fed back, so it needs no KV slot: a
  // sequence of `context` positions yields prompt + max_tokens == context + 1 tokens, as
  // llama2.c's run.c does with steps == seq_len.
  const int64_t prompt_tokens = static_cast<int64_t>(out.prompt.size());
  if (prompt_tokens > context) {
    return Bad(has_text ? "prompt" : "prompt_token_ids",
               absl::StrCat("is ", prompt_tokens, " tokens long, longer than ", the_context_),
               absl::StrCat("at most ", context, " prompt tokens"));
  }

  // Output length.
  const int64_t room = context + 1 - prompt_tokens;  // >= 1
  if (in.max_tokens() == 0) {
    // Not capped by `room`: the engine ends the request at the context with kContextLimit,
    // which the client can tell from reaching max_tokens (kLength).
    int64_t max_tokens = lim.default_max_tokens;
    // A pool smaller than the context caps it (the engine would refuse prompt + max_tokens
    // it can never hold); one that holds the context needs no cap, as the engine counts no
    // KV past the context. When even the prompt cannot fit the pool, the engine refuses it,
    // naming the prompt.
    if (const int64_t pool_room = lim.pool_tokens + 1 - prompt_tokens;
        lim.pool_tokens > 0 && lim.pool_tokens < context && pool_room >= 1) {
      max_tokens = std::min(max_tokens, pool_room);
    }
    out.max_tokens = static_cast<int32_t>(max_tokens);
  } else if (in.max_tokens() > room) {
    return Bad("max_tokens",
               absl::StrCat(in.max_tokens(), " with a ", prompt_tokens,
                            "-token prompt does not fit ", the_context_),
               absl::StrCat("[1, ", room,
                            "] for this prompt (prompt + max_tokens <= context + 1; 0 = server "
                            "default)"));
  } else {
    out.max_tokens = static_cast<int32_t>(in.max_tokens());
  }

  // Sampling.
  const float temperature = in.temperature();
  if (!(std::isfinite(temperature) && temperature >= 0.0f && temperature <= 100.0f)) {
    return Bad("temperature", absl::StrCat(temperature, " is out of range"),
               "[0, 100] (0 = greedy)");
  }
  const float top_p = in.top_p();
  if (!(std::isfinite(top_p) && top_p >= 0.0f && top_p <= 1.0f)) {
    return Bad("top_p", absl::StrCat(top_p, " is out of range"), "(0, 1] (0 = unset = 1)");
  }
  const float min_p = in.min_p();
  if (!(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f)) {
    return Bad("min_p", absl::StrCat(min_p, " is out of range"), "[0, 1] (0 = off)");
  }
  if (in.top_k() > static_cast<uint32_t>(lim.vocab_size)) {
    return Bad("top_k", absl::StrCat(in.top_k(), " is larger than the vocabulary"),
               absl::StrCat("[0, ", lim.vocab_size, "] (0 = off)"));
  }
  out.sampling.temperature = temperature;
  out.sampling.top_p = top_p == 0.0f ? 1.0f : top_p;
  out.sampling.min_p = min_p;
  out.sampling.top_k = static_cast<int32_t>(in.top_k());
  out.sampling.seed = in.seed() != 0 ? in.seed() : lim.default_seed;

  // Stop conditions.
  if (in.stop_size() > lim.max_stop_strings) {
    return Bad("stop", absl::StrCat(in.stop_size(), " stop strings given"),
               absl::StrCat("at most ", lim.max_stop_strings));
  }
  for (int i = 0; i < in.stop_size(); ++i) {
    const std::string& stop = in.stop(i);
    const std::string field = absl::StrCat("stop[", i, "]");
    const std::string allowed =
        absl::StrCat("non-empty UTF-8 text of at most ", lim.max_stop_string_bytes, " bytes");
    if (stop.empty()) return Bad(field, "is empty", allowed);
    if (static_cast<int64_t>(stop.size()) > lim.max_stop_string_bytes) {
      return Bad(field, absl::StrCat("is ", stop.size(), " bytes long"), allowed);
    }
    if (!IsValidUtf8(stop)) return Bad(field, "is not valid UTF-8", allowed);
    out.stop.push_back(stop);
  }
  if (in.stop_token_ids_size() > lim.max_stop_token_ids) {
    return Bad("stop_token_ids", absl::StrCat(in.stop_token_ids_size(), " ids given"),
               absl::StrCat("at most ", lim.max_stop_token_ids));
  }
  if (absl::Status s = CheckTokenIds("stop_token_ids", in.stop_token_ids(), lim.vocab_size);
      !s.ok()) {
    return s;
  }
  out.stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  if (!in.ignore_eos()) {
    for (int32_t id : lim.default_stop_token_ids) {
      if (std::find(out.stop_token_ids.begin(), out.stop_token_ids.end(), id) ==
          out.stop_token_ids.end()) {
        out.stop_token_ids.push_back(id);
      }
    }
  }

  // Identity, scheduling hints.
  if (absl::Status s = CheckId("session_id", in.session_id(), lim.max_id_bytes); !s.ok()) return s;
  if (absl::Status s = CheckId("request_id", in.request_id(), lim.max_id_bytes); !s.ok()) return s;
  out.session_id = in.session_id();
  out.request_id = in.request_id();
  out.priority = in.priority();
  if (in.expected_output_tokens() > static_cast<uint32_t>(context)) {
    return Bad("expected_output_tokens",
               absl::StrCat(in.expected_output_tokens(), " exceeds the context"),
               absl::StrCat("[0, ", context, "] (0 = no estimate)"));
  }
  out.expected_output_tokens = static_cast<int32_t>(in.expected_output_tokens());
  return out;
}

}  // namespace kvd
