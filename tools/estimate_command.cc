#include "tools/estimate_command.h"

#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cache/memory_estimator.h"
#include "config/byte_size.h"
#include "model/model_loader.h"
#include "tools/flags.h"

namespace kvd {

namespace {

FlagSet MakeFlags() {
  FlagSet f(
      "kvd estimate --model PATH|synthetic:PRESET --batch B --seq-len L [--kv-dtype D]\n"
      "                    [--block-size N] [--budget BYTES] [--json]\n"
      "\n"
      "KV-cache memory for B sequences of L tokens: per token, per block, for the batch, and\n"
      "how many such sequences fit in the pool `kvd serve` builds with memory_pool.max_size\n"
      "BYTES: whole chunks of blocks, short of BYTES by under 1/16 of it or under one block\n"
      "(the daemon's kvd_kv_pool_max_bytes). Beside it, the d_model formula\n"
      "(2 x layers x d_model x bytes), which overstates grouped-query-attention models.\n"
      "The default, bf16, is what the CUDA backend stores; the CPU backend stores KV as f32\n"
      "(twice the bytes): pass --kv-dtype f32 for CPU deployments, --kv-dtype int8 for\n"
      "kv_cache_config.quantization: int8 on either. Also the weights' bytes\n"
      "(bf16 on CUDA, f32 on the CPU): with the pool, most of what the daemon holds (its\n"
      "kvd_memory_bytes; activations and workspace come on top, growing with the batch).");
  f.AddString("model",
              "GGUF file, Hugging Face directory or llama2.c checkpoint (only headers are "
              "read) or synthetic:<preset> (tiny, llama2-7b, llama3-8b)");
  constexpr IntRange kPositive{1, std::numeric_limits<int64_t>::max()};
  f.AddInt("batch", "number of sequences", std::nullopt, kPositive);
  f.AddInt("seq-len", "tokens per sequence (prompt + output), at most the model's context",
           std::nullopt, kPositive);
  f.AddString("kv-dtype",
              "KV storage, any case: f32 (the CPU backend), bf16 (CUDA), fp16, fp8, int8, int4",
              std::string("bf16"));
  f.AddInt("block-size", "tokens per KV block, as kv_cache_config.block_size", 16,
           IntRange{1, 256, /*power_of_two=*/true});
  f.AddString("budget",
              "KV memory to fit into, as kv_cache_config.memory_pool.max_size, > 0, e.g. 80GB "
              "or 64GiB (B, KB/MB/GB/TB, KiB/MiB/GiB/TiB)");
  f.AddBool("json", "print one JSON object instead of a table");
  return f;
}

// The KV dtype --kv-dtype names: a ParseDType name in any case, as the config reads its
// kv_cache_config.quantization names (which are ParseDType names too). The config's "none",
// the backend's native type, is refused with the two types it means: the estimate has no
// backend to pick one.
absl::StatusOr<DType> ParseKvDtype(const std::string& text) {
  const std::string name = absl::AsciiStrToLower(text);
  if (name == "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-dtype: '", text,
        "' (kv_cache_config.quantization) is the backend's native KV type, which depends on "
        "the device: pass f32 for the CPU backend, bf16 for CUDA"));
  }
  if (std::optional<DType> dtype = ParseDType(name)) return *dtype;
  return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: unknown type '", text,
                                                 "'; allowed: f32, bf16, fp16, fp8, int8, int4"));
}

// --budget in bytes; 0 when absent.
absl::StatusOr<int64_t> ParseBudget(const FlagSet& flags) {
  if (!flags.Has("budget")) return 0;
  auto budget = ParseByteSize(flags.GetString("budget"));
  if (!budget.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--budget: '", flags.GetString("budget"),
                                                   "': ", budget.status().message()));
  }
  // The estimator reads 0 as "no budget"; a typed 0 is a mistake, not that (nothing fits).
  if (*budget == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--budget: '", flags.GetString("budget"),
                     "' is zero bytes; allowed: a byte size > 0 (leave --budget out for none)"));
  }
  return *budget;
}

// The flag values Parse cannot judge alone, parsed before the model is read: a failure is a
// usage error.
struct FlagValues {
  DType kv_dtype = DType::kBF16;
  int64_t budget_bytes = 0;  // 0: none
};

absl::StatusOr<FlagValues> ParseFlagValues(const FlagSet& flags) {
  auto dtype = ParseKvDtype(flags.GetString("kv-dtype"));
  if (!dtype.ok()) return dtype.status();
  auto budget = ParseBudget(flags);
  if (!budget.ok()) return budget.status();
  return FlagValues{*dtype, *budget};
}

// --seq-len against the model's context: a usage error too, once the model is known.
absl::Status CheckSeqLen(const FlagSet& flags, const ModelSpec& spec) {
  const int64_t seq_len = flags.GetInt("seq-len");
  if (spec.max_context_tokens <= 0 || seq_len <= spec.max_context_tokens) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--seq-len: ", seq_len,
                                                 " is more than the context of model ", spec.name,
                                                 " (", spec.max_context_tokens, " tokens)"));
}

absl::Status Run(const FlagSet& flags, const FlagValues& values, const ModelSpec& spec,
                 std::ostream& out) {
  MemoryEstimateRequest req;
  req.num_layers = spec.num_layers;
  req.d_model = spec.dim;
  req.num_kv_heads = spec.num_kv_heads;
  req.head_dim = spec.head_dim;
  req.kv_dtype = values.kv_dtype;
  req.block_size = static_cast<int32_t>(flags.GetInt("block-size"));  // ranged in MakeFlags
  req.batch = flags.GetInt("batch");
  req.seq_len = flags.GetInt("seq-len");
  req.budget_bytes = values.budget_bytes;
  auto est = MemoryEstimator::Estimate(req);
  if (!est.ok()) return est.status();
  const int64_t parameters = spec.NumParameters();
  if (!flags.GetBool("json")) {
    out << "model " << spec.name << ": " << spec.num_layers << " layers, d_model " << spec.dim
        << ", " << spec.num_heads << " query heads, " << spec.num_kv_heads << " KV heads x "
        << spec.head_dim << "\n"
        << MemoryEstimator::Format(req, *est) << "weights: " << parameters << " parameters, "
        << parameters * 2 << " bytes in bf16 (the CUDA backend), " << parameters * 4
        << " in f32 (the CPU backend)\n";
    return absl::OkStatus();
  }
  nlohmann::json j;
  j["model"] = spec.name;
  j["num_layers"] = spec.num_layers;
  j["d_model"] = spec.dim;
  j["num_kv_heads"] = spec.num_kv_heads;
  j["head_dim"] = spec.head_dim;
  j["kv_dtype"] = std::string(DTypeName(values.kv_dtype));
  j["block_size"] = req.block_size;
  j["batch"] = req.batch;
  j["seq_len"] = req.seq_len;
  j["bytes_per_token"] = est->bytes_per_token;
  j["bytes_per_token_with_scales"] = est->bytes_per_token_with_scales;
  j["bytes_per_block"] = est->bytes_per_block;
  j["blocks_per_sequence"] = est->blocks_per_sequence;
  j["batch_bytes"] = est->batch_bytes;
  j["batch_bytes_paged"] = est->batch_bytes_paged;
  j["seed_formula_bytes_per_token"] = est->seed_bytes_per_token;
  j["seed_formula_batch_bytes"] = est->seed_batch_bytes;
  j["seed_formula_over_exact"] = est->seed_over_exact;
  j["num_parameters"] = parameters;
  j["weights_bytes_bf16"] = parameters * 2;
  j["weights_bytes_f32"] = parameters * 4;
  if (req.budget_bytes > 0) {
    j["budget_bytes"] = req.budget_bytes;
    j["pool_chunk_bytes"] = est->pool_chunk_bytes;
    j["pool_chunks"] = est->pool_chunks;
    j["pool_blocks"] = est->pool_blocks;
    j["pool_bytes"] = est->pool_bytes;
    j["sequences_in_budget"] = est->sequences_in_budget;
    j["tokens_in_budget"] = est->tokens_in_budget;
  }
  out << j.dump() << "\n";
  return absl::OkStatus();
}

}  // namespace

int RunEstimateCommand(const std::vector<std::string>& args, std::ostream& out,
                       std::ostream& err) {
  FlagSet flags = MakeFlags();
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    err << "kvd estimate: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  if (flags.help()) {
    out << flags.Usage();
    return 0;
  }
  if (absl::Status s = flags.Require({"model", "batch", "seq-len"}); !s.ok()) {
    err << "kvd estimate: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  const absl::StatusOr<FlagValues> values = ParseFlagValues(flags);
  if (!values.ok()) {
    err << "kvd estimate: " << values.status().message() << "\n\n" << flags.Usage();
    return 2;
  }
  auto spec = LoadModelSpec(flags.GetString("model"));
  if (!spec.ok()) {
    err << "kvd estimate: " << spec.status().message() << "\n";
    return 1;
  }
  if (absl::Status s = CheckSeqLen(flags, *spec); !s.ok()) {
    err << "kvd estimate: " << s.message() << "\n\n" << flags.Usage();
    return 2;
  }
  if (absl::Status s = Run(flags, *values, *spec, out); !s.ok()) {
    err << "kvd estimate: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace kvd
