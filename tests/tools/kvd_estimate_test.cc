// `kvd estimate` reproduces the seeds' worked example and the exact GQA figure.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/ascii.h"
#include "config/config_enums.h"
#include "tests/tools/run_kvd.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

TEST(KvdEstimateTest, SeedsWorkedExampleLlama7bFp16) {
  // 32 layers, d_model 4096, 32 KV heads (multi-head attention), fp16, 4 x 2048 tokens.
  const KvdResult r = RunKvd(
      "estimate --model synthetic:llama2-7b --batch 4 --seq-len 2048 --kv-dtype fp16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["batch_bytes"], 4294967296LL);
  EXPECT_EQ(j["seed_formula_batch_bytes"], 4294967296LL);  // MHA: both formulas agree
}

TEST(KvdEstimateTest, Llama3GqaNeedsAQuarterOfTheSeedFormula) {
  const KvdResult r =
      RunKvd("estimate --model synthetic:llama3-8b --batch 64 --seq-len 4096 --budget 80GB --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes_per_token"], 131072);
  EXPECT_EQ(j["kv_dtype"], "bf16");  // the default
  EXPECT_EQ(j["seed_formula_bytes_per_token"], 524288);
  EXPECT_DOUBLE_EQ(j["seed_formula_over_exact"].get<double>(), 4.0);
  EXPECT_EQ(j["batch_bytes"], 64LL * 4096 * 131072);
  // 80 GB / (256 blocks x 2 MiB) = 149 whole sequences.
  EXPECT_EQ(j["sequences_in_budget"], 149);
  // The weights beside the pool: what kvd_memory_bytes{component="weights"} reads on CUDA.
  EXPECT_EQ(j["num_parameters"], 8030261248LL);
  EXPECT_EQ(j["weights_bytes_bf16"], 2 * 8030261248LL);
  EXPECT_EQ(j["weights_bytes_f32"], 4 * 8030261248LL);
}

// deploy/kvd.yaml's pool on the CPU: serve has 51 chunks of 512 20 KiB blocks (10 MiB) of
// its 512 MiB max_size, 26112 blocks, 816 sequences of 512 tokens; the estimate says the same,
// not 512 MiB / 20 KiB = 26214 blocks and 819 sequences.
TEST(KvdEstimateTest, BudgetCountsThePoolServeBuildsFromMaxSize) {
  const std::string stories = "estimate --model " + std::string(KVD_SHARED_DIR) +
                              "/models/stories260K.bin --batch 1 --seq-len 512 --kv-dtype f32 "
                              "--budget 512MiB";
  KvdResult r = RunKvd(stories + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.value("pool_chunk_bytes", int64_t{-1}), 10 << 20);
  EXPECT_EQ(j.value("pool_chunks", int64_t{-1}), 51);
  EXPECT_EQ(j.value("pool_blocks", int64_t{-1}), 26112);
  EXPECT_EQ(j.value("pool_bytes", int64_t{-1}), 51 * (10 << 20));  // kvd_kv_pool_max_bytes
  EXPECT_EQ(j["sequences_in_budget"], 816);
  EXPECT_EQ(j["tokens_in_budget"], 26112 * 16);
  r = RunKvd(stories);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("as memory_pool.max_size: 51 chunks of 10485760 bytes, 26112 "
                               "blocks, 534773760 bytes"));
  EXPECT_THAT(r.out, HasSubstr("816 sequences of 512 tokens"));
  // A budget serve refuses as max_size: less than one 2 MiB block of llama3-8b.
  r = RunKvd("estimate --model synthetic:llama3-8b --batch 1 --seq-len 16 --budget 1MiB");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("is smaller than one KV block (2097152 bytes)"));
  r = RunKvd("estimate --help");
  EXPECT_THAT(r.out, HasSubstr("memory_pool.max_size"));
  EXPECT_THAT(r.out, HasSubstr("kvd_kv_pool_max_bytes"));
}

TEST(KvdEstimateTest, TableAndErrors) {
  KvdResult r = RunKvd("estimate --model " + std::string(KVD_SHARED_DIR) +
                       "/models/stories260K.bin --batch 2 --seq-len 512 --kv-dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("per token           1280 bytes"));
  EXPECT_THAT(r.out, HasSubstr("weights: 260032 parameters, 520064 bytes in bf16 (the CUDA "
                               "backend), 1040128 in f32 (the CPU backend)\n"));
  // A bad flag value is a usage error (2); a model that is not there is a runtime one (1).
  r = RunKvd("estimate --model synthetic:llama3-8b --batch 1 --seq-len 10 --kv-dtype int3");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--kv-dtype: unknown type 'int3'"));
  EXPECT_THAT(r.out, HasSubstr("usage: kvd estimate"));
  r = RunKvd("estimate --model synthetic:llama9 --batch 1 --seq-len 10");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("llama9"));
  r = RunKvd("estimate --model synthetic:llama3-8b --batch 1 --seq-len 10 --budget 12XB");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--budget: '12XB': unknown unit 'XB'"));
  // Every --budget error quotes the value typed.
  for (const char* budget : {"1.5B", "-1GB"}) {
    r = RunKvd(
        std::string("estimate --model synthetic:llama3-8b --batch 1 --seq-len 10 --budget ") +
        budget);
    EXPECT_EQ(r.exit_code, 2) << budget << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(std::string("--budget: '") + budget + "': ")) << budget;
  }
  // Not cut to 32 bits (4294967312 would have become 16): a usage error.
  r = RunKvd("estimate --model synthetic:llama3-8b --batch 1 --seq-len 10 --block-size 4294967312");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("--block-size: 4294967312 is outside a power of two in [1, 256]"));
  // Sizes only what kvd serve would run (kv_cache_config.block_size).
  for (const char* block_size : {"3", "100000"}) {
    r = RunKvd(std::string("estimate --model synthetic:llama3-8b --batch 1 --seq-len 10 "
                           "--block-size ") +
               block_size);
    EXPECT_EQ(r.exit_code, 2) << block_size;
    EXPECT_THAT(r.out, HasSubstr("is outside a power of two in [1, 256]"));
  }
  r = RunKvd("estimate --model synthetic:llama3-8b --seq-len 10");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("--batch"));
  r = RunKvd("estimate --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* f :
       {"--model", "--batch", "--seq-len", "--kv-dtype", "--block-size", "--budget", "--json"}) {
    EXPECT_THAT(r.out, HasSubstr(f));
  }
}

// Once sized without a word: a batch of 0 or -3, and sequences no model run could hold.
TEST(KvdEstimateTest, BatchAndSeqLenOutsideWhatAModelRunsAreUsageErrors) {
  const std::string model = "estimate --model synthetic:llama3-8b ";
  for (const char* args : {"--batch 0 --seq-len 10", "--batch -3 --seq-len 10",
                           "--batch 1 --seq-len 0", "--batch 1 --seq-len -1"}) {
    const KvdResult r = RunKvd(model + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(" is outside [1, 9223372036854775807]")) << args;
  }
  KvdResult r = RunKvd(model + "--batch 1 --seq-len 100000");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--seq-len: 100000 is more than the context of model "
                               "synthetic:llama3-8b (8192 tokens)"));
  r = RunKvd("estimate --model " + std::string(KVD_SHARED_DIR) +
             "/models/stories260K.bin --batch 1 --seq-len 513");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--seq-len: 513 is more than the context of model "));
  EXPECT_THAT(r.out, HasSubstr("(512 tokens)"));
  EXPECT_EQ(RunKvd(model + "--batch 1 --seq-len 8192").exit_code, 0);  // the whole context
}

TEST(KvdEstimateTest, KvDtypeTakesTheConfigsQuantizationNamesInAnyCase) {
  const std::string args = "estimate --model synthetic:llama3-8b --batch 1 --seq-len 16 --json";
  for (KvQuantization q : AllValues<KvQuantization>()) {
    if (q == KvQuantization::kNone) continue;  // no one dtype: below
    const std::string name(Name(q));
    const KvdResult r = RunKvd(args + " --kv-dtype " + absl::AsciiStrToUpper(name));
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out)["kv_dtype"], name);
  }
  const KvdResult f32 = RunKvd(args + " --kv-dtype F32");
  ASSERT_EQ(f32.exit_code, 0) << f32.out;
  EXPECT_EQ(nlohmann::json::parse(f32.out)["bytes_per_token"], 2 * 131072);
  // `none` is the backend's native type, which the estimate cannot see: it says which to pass.
  for (const char* none : {"none", "None"}) {
    const KvdResult r = RunKvd(args + " --kv-dtype " + none);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_THAT(r.out, HasSubstr("pass f32 for the CPU backend, bf16 for CUDA"));
  }
}

TEST(KvdEstimateTest, HelpSaysTheCpuBackendStoresF32) {
  // The default (bf16) is CUDA's; sizing a CPU deployment with it is off by 2x.
  const KvdResult r = RunKvd("estimate --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("the CPU backend stores KV as f32"));
  EXPECT_THAT(r.out, HasSubstr("pass --kv-dtype f32 for CPU deployments"));
}

TEST(KvdEstimateTest, ZeroBudgetIsAnErrorNotDropped) {
  // It once printed no budget row and no budget fields, as if --budget were absent.
  for (const char* zero : {"0", "0GB"}) {
    const KvdResult r =
        RunKvd(std::string(
                   "estimate --model synthetic:llama3-8b --batch 1 --seq-len 16 --json --budget ") +
               zero);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_THAT(r.out, HasSubstr(std::string("--budget: '") + zero + "' is zero bytes"));
  }
}

}  // namespace
}  // namespace kvd
