#include "tools/generate_command.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cache/clock.h"
#include "config/config_enums.h"
#include "config/inference_config.h"
#include "kernels/cpu_sampling.h"
#include "kernels/params.h"
#include "kernels/status_macros.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "model/streaming_decoder.h"
#include "model/tokenizer.h"
#include "scheduler/generator.h"
#include "scheduler/request.h"
#include "tools/cpu_count.h"
#include "tools/device.h"
#include "tools/engine_setup.h"
#include "tools/flags.h"
#include "tools/random_model.h"

namespace kvd {

namespace {

// The integer flags' ranges are those of the fields they set (int32), so the casts in Run()
// keep every value Parse() lets through. --threads is capped as the config's
// server.num_threads is (kMaxCpuThreads).
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

FlagSet MakeFlags() {
  FlagSet f(
      "kvd generate --model PATH (--prompt TEXT | --prompt-token-ids 1,2,3) [--tokenizer PATH]\n"
      "                    [--max-tokens N] [--temperature T] [--top-p P] [--top-k K]\n"
      "                    [--min-p P] [--seed S] [--block-size B] [--device cuda|cpu|auto]\n"
      "                    [--kv-quantization none|bf16|int8] [--threads N] [--json]\n"
      "\n"
      "Completes PROMPT with the model and prints the completion (the prompt is not\n"
      "repeated); with --prompt-token-ids, which needs no tokenizer (synthetic models have\n"
      "none), the generated token ids are printed instead, space-separated.\n"
      "llama2.c models stop at BOS (id 1), as llama2.c's run.c does, or at EOS (id 2),\n"
      "where a chat model ends its answer; others at EOS. On cuda the weights and the KV\n"
      "cache are bf16 (logits differ slightly from the fp32 CPU reference), on cpu fp32, or\n"
      "int8 with --kv-quantization int8 (to see what it changes before serving with it).\n"
      "Synthetic models are generated in device memory from --seed. A number outside its\n"
      "flag's range (below) is a usage error, never wrapped or clamped, as is a sampling\n"
      "value outside the range its help gives, a --device other than those three or an\n"
      "unknown --kv-quantization; all are refused before the model loads.");
  f.AddString("model",
              "GGUF file (.gguf), Hugging Face directory, llama2.c checkpoint (.bin) or "
              "synthetic:<preset>");
  f.AddString("tokenizer",
              "llama2.c tokenizer.bin, GGUF file or SentencePiece .model; default: the model's "
              "own (GGUF, Hugging Face tokenizer.model), else tok512.bin or tokenizer.bin "
              "beside the model, whichever matches its vocabulary");
  f.AddString("prompt", "text to complete");
  f.AddString("prompt-token-ids", "comma-separated prompt token ids, instead of --prompt");
  f.AddInt("max-tokens",
           "most tokens to generate; the model's context (prompt + output) also caps it", 256,
           IntRange{0, kMaxInt32});
  f.AddFloat32("temperature", "0 = greedy; otherwise softmax temperature", 1.0);
  f.AddFloat32("top-p", "nucleus sampling mass, in (0, 1]", 1.0);
  f.AddInt("top-k", "keep the K most likely tokens; 0 = off", 0, IntRange{0, kMaxInt32});
  f.AddFloat32("min-p", "drop tokens below min-p times the top probability; 0 = off", 0.0);
  f.AddUint64("seed",
              "sampling seed, as the config's model.seed; the same seed gives the same text", 0);
  f.AddInt("block-size", "tokens per KV block, as kv_cache_config.block_size", 16,
           IntRange{1, 256, /*power_of_two=*/true});
  f.AddString("device", absl::StrCat("cuda, cpu, or auto (", kAutoPicksCuda, ")"), "auto");
  f.AddString("kv-quantization",
              "KV cache storage, as kv_cache_config.quantization: none (the device's own: "
              "fp32 on cpu, bf16 on cuda), or one the device runs (cpu: int8; cuda: bf16, int8)",
              "none");
  f.AddInt("threads", "CPU threads for --device cpu; 0 = the CPUs this process may use", 0,
           IntRange{0, kMaxCpuThreads});
  f.AddBool("json", "print one JSON object instead of text");
  return f;
}

// The model's own tokenizer (LoadModelTokenizer) with a vocabulary that matches it.
absl::StatusOr<std::unique_ptr<Tokenizer>> FindTokenizer(const std::string& model_path,
                                                         int32_t vocab_size) {
  auto tokenizer = LoadModelTokenizer(model_path, vocab_size);
  if (tokenizer.ok()) return tokenizer;
  return absl::Status(tokenizer.status().code(),
                      absl::StrCat(tokenizer.status().message(), "; pass --tokenizer PATH"));
}

// The sampling flags as the generator takes them (Parse has refused floats a float cannot
// hold); not yet validated.
SamplingParams SamplingFromFlags(const FlagSet& flags) {
  SamplingParams sampling;
  sampling.temperature = static_cast<float>(flags.GetFloat("temperature"));
  sampling.top_p = static_cast<float>(flags.GetFloat("top-p"));
  sampling.top_k = static_cast<int32_t>(flags.GetInt("top-k"));
  sampling.min_p = static_cast<float>(flags.GetFloat("min-p"));
  sampling.seed = flags.GetUint64("seed");
  return sampling;
}

// The ids of --prompt-token-ids: comma-separated non-negative integers (their range is the
// model's to judge, in Run).
absl::StatusOr<std::vector<int32_t>> PromptTokenIds(const FlagSet& flags) {
  std::vector<int32_t> ids;
  for (absl::string_view item : absl::StrSplit(flags.GetString("prompt-token-ids"), ',')) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(item, &id) || id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-token-ids: '", item,
                       "' is not a token id (comma-separated non-negative integers)"));
    }
    ids.push_back(id);
  }
  return ids;
}

// --kv-quantization as a known name (which ones the device runs is checked once it is known).
absl::StatusOr<KvQuantization> KvQuantizationFromFlag(const FlagSet& flags) {
  const std::string text = flags.GetString("kv-quantization");
  if (const std::optional<KvQuantization> q = ParseEnum<KvQuantization>(text)) return *q;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv-quantization: unknown type '", text,
                   "'; allowed: ", QuantizationNames(AllValues<KvQuantization>())));
}

// The flag values Parse cannot judge alone, checked before anything loads (a typo in --top-p
// must not cost a checkpoint load): a failure is a usage error. Whether the named device is
// there is Run's to find out (a runtime failure).
absl::Status CheckFlagValues(const FlagSet& flags) {
  if (flags.Has("prompt") == flags.Has("prompt-token-ids")) {
    return absl::InvalidArgumentError("exactly one of --prompt and --prompt-token-ids is required");
  }
  if (flags.Has("prompt-token-ids")) {
    if (absl::Status s = PromptTokenIds(flags).status(); !s.ok()) return s;
    if (flags.Has("tokenizer")) {
      return absl::InvalidArgumentError(
          "--tokenizer has no use with --prompt-token-ids (ids in, ids out); give one of them");
    }
  }
  if (flags.GetString("model").rfind("synthetic:", 0) == 0 && flags.Has("prompt") &&
      !flags.Has("tokenizer")) {
    return absl::InvalidArgumentError(
        "synthetic models have no tokenizer; pass --prompt-token-ids, or --tokenizer PATH with "
        "a matching vocabulary");
  }
  // Each sampling flag alone through the sampler's check, so that an error names the flag
  // typed (and the field it sets, "--top-p: top_p = 0 is out of range; ...").
  const SamplingParams sampling = SamplingFromFlags(flags);
  for (const auto& [flag, set] :
       std::vector<std::pair<const char*, std::function<void(SamplingRow&)>>>{
           {"--temperature", [&](SamplingRow& r) { r.temperature = sampling.temperature; }},
           {"--top-p", [&](SamplingRow& r) { r.top_p = sampling.top_p; }},
           {"--top-k", [&](SamplingRow& r) { r.top_k = sampling.top_k; }},
           {"--min-p", [&](SamplingRow& r) { r.min_p = sampling.min_p; }}}) {
    SamplingRow alone;
    set(alone);
    if (absl::Status s = ValidateSamplingRow(alone, ""); !s.ok()) return Prefixed(flag, s);
  }
  const std::string device = absl::AsciiStrToLower(flags.GetString("device"));
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return Prefixed("--device", ResolveDevice(flags.GetString("device")).status());
  }
  return KvQuantizationFromFlag(flags).status();
}

// Sets *usage_error when the failure is a flag value the model refuses (a token id past its
// vocabulary), which only the model's header could judge.
absl::Status Run(const FlagSet& flags, std::ostream& out, std::ostream& err, bool* usage_error) {
  const std::string model_ref = flags.GetString("model");
  const SamplingParams sampling = SamplingFromFlags(flags);
  auto resolved = ResolveDevice(flags.GetString("device"));
  if (!resolved.ok()) {
    return Prefixed("--device", resolved.status());
  }
  // Synthetic weights are made in backend memory (no host fp32 copy, any size); checkpoints
  // are loaded on the host and uploaded.
  // The spec (the header alone) and the tokenizer are checked before the weights load; the
  // spec also before the backend is made, for the device to fit the model.
  const bool synthetic = model_ref.rfind("synthetic:", 0) == 0;
  auto header_spec = LoadModelSpec(model_ref);
  if (!header_spec.ok()) return header_spec.status();
  const ModelSpec& spec = *header_spec;
  auto device = FitDeviceToModel(*resolved, spec.head_dim);
  if (!device.ok()) return Prefixed("--device", device.status());
  if (!device->fallback_reason.empty()) {
    err << "kvd generate: --device auto runs on the CPU: " << device->fallback_reason << "\n";
  }
  const KvQuantization quantization = *KvQuantizationFromFlag(flags);  // CheckFlagValues'd
  const absl::Span<const KvQuantization> runs = KvQuantizationsOn(device->device);
  if (std::find(runs.begin(), runs.end(), quantization) == runs.end()) {
    *usage_error = true;
    return absl::UnimplementedError(absl::StrCat(
        "--kv-quantization: '", std::string(Name(quantization)), "' is not run on ",
        std::string(DeviceName(device->device)), "; allowed there: ", QuantizationNames(runs)));
  }
  auto backend = MakeBackend(device->device, static_cast<int>(flags.GetInt("threads")));
  if (!backend.ok()) return backend.status();
  // Token ids need no tokenizer; text needs one (the given file, else the one beside the
  // model).
  const bool token_ids = flags.Has("prompt-token-ids");
  std::unique_ptr<Tokenizer> tokenizer;
  GenerationRequest request;
  if (token_ids) {
    request.prompt = *PromptTokenIds(flags);  // CheckFlagValues parsed them
    for (const int32_t id : request.prompt) {
      if (id >= spec.vocab_size) {
        *usage_error = true;
        return absl::InvalidArgumentError(absl::StrCat("--prompt-token-ids: ", id,
                                                       " is not below the model's vocabulary size ",
                                                       spec.vocab_size));
      }
    }
  } else {
    auto loaded = flags.Has("tokenizer")
                      ? LoadTokenizerFile(flags.GetString("tokenizer"), spec.vocab_size)
                      : FindTokenizer(model_ref, spec.vocab_size);
    if (!loaded.ok()) return loaded.status();
    tokenizer = *std::move(loaded);
    request.prompt = tokenizer->Encode(flags.GetString("prompt"), /*add_bos=*/true);
  }

  auto model = [&]() -> absl::StatusOr<std::unique_ptr<LlamaModel>> {
    if (synthetic) {  // the CPU backend's weights are host memory
      return CreateRandomModel(
          spec, flags.GetUint64("seed"), backend->get(),
          device->device == Device::kCpu ? AvailableHostBytes() : std::nullopt);
    }
    auto weights = LoadModel(model_ref);
    if (!weights.ok()) return weights.status();
    return LlamaModel::Create(*std::move(weights), backend->get());
  }();
  if (!model.ok()) return model.status();

  request.max_new_tokens = static_cast<int32_t>(flags.GetInt("max-tokens"));
  request.sampling = sampling;
  request.stop_token_ids = spec.StopTokenIds();

  RealClock clock;
  const int32_t block_size = static_cast<int32_t>(flags.GetInt("block-size"));
  auto cache = CreateCache(spec, backend->get(), &clock,
                           {.block_size = block_size,
                            .num_sequences = 1,
                            .kv_dtype = KvDtypeFor(quantization, DefaultKvDtype(**backend))});
  if (!cache.ok()) return cache.status();

  const bool json = flags.GetBool("json");
  std::optional<StreamingDecoder> decoder;
  if (tokenizer != nullptr) decoder.emplace(tokenizer.get(), request.prompt.back());
  std::string text;
  bool first_id = true;
  Generator generator(model->get(), cache->get());
  auto results = generator.Run({request}, [&](size_t, int32_t token) {
    if (decoder.has_value()) {
      const std::string delta = decoder->Push(token);
      text += delta;
      if (!json) out << delta << std::flush;
    } else if (!json) {
      out << (first_id ? "" : " ") << token << std::flush;
      first_id = false;
    }
  });
  if (!results.ok()) return results.status();
  const std::string tail = decoder.has_value() ? decoder->Flush() : std::string();
  text += tail;
  const GenerationResult& r = (*results)[0];
  if (json) {
    nlohmann::json j;
    j["prompt_tokens"] = request.prompt;
    j["output_tokens"] = r.output;
    if (decoder.has_value()) j["text"] = text;
    j["stop"] = std::string(FinishReasonName(r.finish));
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    out << tail << "\n";
    if (r.finish == FinishReason::kContextLimit) {
      err << "kvd generate: the output was cut at the model's context (" << spec.max_context_tokens
          << " tokens, prompt included) after " << r.output.size() << " tokens\n";
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunGenerateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  FlagSet flags = MakeFlags();
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    err << "kvd generate: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  if (flags.help()) {
    out << flags.Usage();
    return 0;
  }
  if (absl::Status s = flags.Require({"model"}); !s.ok()) {
    err << "kvd generate: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  if (absl::Status s = CheckFlagValues(flags); !s.ok()) {
    err << "kvd generate: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  bool usage_error = false;
  if (absl::Status s = Run(flags, out, err, &usage_error); !s.ok()) {
    err << "kvd generate: " << s.message() << "\n";
    if (usage_error) err << "\n" << flags.Usage();
    return usage_error ? 2 : 1;
  }
  return 0;
}

}  // namespace kvd
