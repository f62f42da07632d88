// `kvd generate` as a user runs it: the real binary, the real model.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/tools/run_kvd.h"
#include "tools/device.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kModel = std::string(KVD_SHARED_DIR) + "/models/stories260K.bin";
// The goldens are the fp32 CPU reference's (llama2.c's); on a GPU host auto would pick bf16
// CUDA.
const std::string kGenerate = "generate --device cpu --model " + kModel;

TEST(KvdGenerateTest, GreedyStoryMatchesLlama2c) {
  const KvdResult r =
      RunKvd(kGenerate + " --prompt 'Once upon a time' --max-tokens 60 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, StartsWith(", there was a little girl named Lily."));
}

TEST(KvdGenerateTest, JsonOutput) {
  const KvdResult r = RunKvd(kGenerate +
                             " --prompt 'Once upon a time' --max-tokens 20 --temperature 0 --json"
                             " --block-size 4");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], nlohmann::json({1, 403, 407, 261, 378}));
  EXPECT_EQ(j["output_tokens"].size(), 20u);
  EXPECT_EQ(j["stop"], "length");
  EXPECT_THAT(j["text"].get<std::string>(), StartsWith(", there was a little girl"));
}

TEST(KvdGenerateTest, StopsAtBosLikeLlama2c) {
  const KvdResult r =
      RunKvd(kGenerate + " --prompt 'Lily and Tom' --max-tokens 400 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stop"], "stop");                // FinishReasonName, as the server's finish_reason
  EXPECT_EQ(j["output_tokens"].size(), 220u);  // golden: 220 tokens, then BOS
}

// A llama2.c model also stops at EOS (id 2), where a chat model ends its answer. stories260K
// never emits it greedily; sampled this hot, its 44th token is EOS: generation ends before it.
TEST(KvdGenerateTest, StopsAtEosToo) {
  const KvdResult r = RunKvd(kGenerate +
                             " --prompt-token-ids 1 --max-tokens 100 --temperature 50 --seed 4"
                             " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stop"], "stop");
  EXPECT_EQ(j["output_tokens"].size(), 43u);
}

TEST(KvdGenerateTest, SeededSamplingIsReproducible) {
  const std::string args = kGenerate +
                           " --prompt 'The little dog' --max-tokens 40 --temperature 0.9"
                           " --top-p 0.9 --seed 42 --json";
  const KvdResult a = RunKvd(args);
  const KvdResult b = RunKvd(args);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  const KvdResult c = RunKvd(args + " --seed 43");
  EXPECT_NE(a.out, c.out);
}

TEST(KvdGenerateTest, HelpDescribesEveryFlag) {
  const KvdResult top = RunKvd("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.out, HasSubstr("generate"));
  const KvdResult r = RunKvd("generate --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag :
       {"--model", "--tokenizer", "--prompt", "--prompt-token-ids", "--max-tokens", "--temperature",
        "--top-p", "--top-k", "--min-p", "--seed", "--block-size", "--device", "--kv-quantization",
        "--threads", "--json"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("\n  ") + flag + " "));
  }
  EXPECT_THAT(r.out, HasSubstr("the model's context (prompt + output) also caps it"));
}

// 482 prompt tokens leave 30 of stories260K's 512: the finish is the context's, not "length"
// (which --max-tokens 300 was not reached for), and text mode says so on stderr.
TEST(KvdGenerateTest, ContextLimitIsReportedAsSuch) {
  std::string prompt;
  for (int i = 0; i < 48; ++i) prompt += "Once upon a time there was a dog. ";
  const std::string args =
      kGenerate + " --prompt '" + prompt + "' --max-tokens 300 --temperature 0";
  const KvdResult json = RunKvd(args + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.out;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["prompt_tokens"].size(), 482u);
  EXPECT_LT(j["output_tokens"].size(), 300u);
  EXPECT_EQ(j["stop"], "context_limit");
  const KvdResult text = RunKvd(args);
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("kvd generate: the output was cut at the model's context "
                                  "(512 tokens, prompt included)"));
  EXPECT_THAT(RunKvd(kGenerate + " --prompt hi --max-tokens 5 --temperature 0").out,
              Not(HasSubstr("context")));
}

// A value a float cannot hold was once narrowed: 1e-50 ran greedy (temperature 0), top-p 1e-50
// was reported as "top_p = 0", 1e39 as inf.
TEST(KvdGenerateTest, FloatsAFloatCannotHoldAreUsageErrors) {
  struct Case {
    const char* flag;
    const char* value;
    const char* why;
  };
  for (const Case& c : {Case{"temperature", "1e-50", "is not 0 but rounds to 0 as a float"},
                        Case{"top-p", "1e-50", "is not 0 but rounds to 0 as a float"},
                        Case{"min-p", "-1e-60", "is not 0 but rounds to 0 as a float"},
                        Case{"temperature", "1e39", "is out of range"},
                        Case{"top-p", "-1e39", "is out of range"}}) {
    const KvdResult r =
        RunKvd(kGenerate + " --prompt hi --max-tokens 2 --" + c.flag + " " + c.value);
    EXPECT_EQ(r.exit_code, 2) << c.flag << " " << c.value << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(std::string("--") + c.flag + ": " + c.value + " " + c.why));
  }
  // The smallest float is a float, not an error.
  EXPECT_EQ(RunKvd(kGenerate + " --prompt hi --max-tokens 2 --temperature 1e-45").exit_code, 0);
}

// `--prompt --json` once completed the text "--json" (as text, not JSON).
TEST(KvdGenerateTest, AFlagWhereAValueBelongsIsAUsageError) {
  KvdResult r = RunKvd(kGenerate + " --max-tokens 2 --prompt --json");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--prompt needs a value; to pass one starting with --, write "
                               "--prompt=VALUE"));
  r = RunKvd(kGenerate + " --max-tokens 2 --temperature 0 --json --prompt=--json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_tokens"].size(), 2u);
}

TEST(KvdGenerateTest, TopLevelUsageSaysGenerateRunsWhereDevicePoints) {
  // --device defaults to auto: CUDA where the GPU can run the model, not always the CPU, and
  // not on every visible GPU (kAutoPicksCuda).
  const KvdResult top = RunKvd("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.out, HasSubstr("generate   complete one prompt in this process and print the "
                                 "text (on CUDA where\n             the GPU can run the model, "
                                 "else on the CPU; --device picks)"));
}

TEST(KvdGenerateTest, IntegerFlagsOutsideTheirRangeAreUsageErrors) {
  // Once cut to 32 bits or wrapped: 4294967301 tokens ran 5, 2147483648 read as -2147483648,
  // top-k 4294967297 as 1, block size 4294967312 as 16, threads 4294967297 as 1 and -7 as
  // all cores, seed -1 as 2^64 - 1.
  struct Case {
    const char* flag;
    const char* value;
    const char* range;
  };
  for (const Case& c :
       {Case{"max-tokens", "4294967301", "[0, 2147483647]"},
        Case{"max-tokens", "2147483648", "[0, 2147483647]"},
        Case{"max-tokens", "-1", "[0, 2147483647]"}, Case{"top-k", "4294967297", "[0, 2147483647]"},
        Case{"block-size", "4294967312", "a power of two in [1, 256]"},
        // kvd serve takes block sizes the config allows; generate takes the same ones.
        Case{"block-size", "3", "a power of two in [1, 256]"},
        Case{"block-size", "512", "a power of two in [1, 256]"},
        Case{"threads", "4294967297", "[0, 1024]"}, Case{"threads", "-7", "[0, 1024]"},
        Case{"seed", "-1", "[0, 18446744073709551615]"},
        Case{"seed", "18446744073709551616", "[0, 18446744073709551615]"}}) {
    const KvdResult r =
        RunKvd(kGenerate + " --prompt hi --temperature 0 --" + c.flag + " " + c.value);
    EXPECT_EQ(r.exit_code, 2) << c.flag << " " << c.value << ": " << r.out;
    EXPECT_THAT(r.out,
                HasSubstr(std::string("--") + c.flag + ": " + c.value + " is outside " + c.range));
  }
}

TEST(KvdGenerateTest, SeedTakesTheWholeUint64RangeAsTheConfigDoes) {
  // model.seed allows [0, 2^64 - 1]; so does --seed, and each seed is its own stream.
  const std::string args =
      kGenerate + " --prompt 'The little dog' --max-tokens 40 --temperature 0.9 --json";
  const KvdResult top = RunKvd(args + " --seed 18446744073709551615");
  ASSERT_EQ(top.exit_code, 0) << top.out;
  EXPECT_EQ(top.out, RunKvd(args + " --seed 18446744073709551615").out);
  const KvdResult high_bit = RunKvd(args + " --seed 9223372036854775808");
  ASSERT_EQ(high_bit.exit_code, 0) << high_bit.out;
  EXPECT_NE(top.out, high_bit.out);
}

TEST(KvdGenerateTest, BadInputsFailClearly) {
  KvdResult r = RunKvd("generate --prompt hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("--model"));
  r = RunKvd("generate --model /nonexistent/model.bin --prompt hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("/nonexistent/model.bin"));
  // A bad flag value is a usage error (2), as an integer out of range is; what fails while
  // running (the missing model above) is 1.
  r = RunKvd(kGenerate + " --prompt hi --temperature -1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--temperature: temperature = -1 is out of range"));
  EXPECT_THAT(r.out, HasSubstr("usage: kvd generate"));
  // Sampling values are checked before anything loads: a missing model is not reported.
  r = RunKvd("generate --model /nonexistent/model.bin --prompt hi --top-p 0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--top-p: top_p = 0 is out of range"));
  EXPECT_THAT(r.out, Not(HasSubstr("/nonexistent/model.bin")));
  r = RunKvd(kGenerate + " --prompt hi --min-p 2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--min-p: min_p = 2 is out of range"));
  r = RunKvd(kGenerate + " --prompt hi --block-size 0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--block-size: 0 is outside a power of two in [1, 256]"));
  r = RunKvd("generate --model " + kModel + " --prompt hi --device gpu");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--device: 'gpu' is not one of cpu, cuda, auto"));
  EXPECT_THAT(r.out, HasSubstr("usage: kvd generate"));
  r = RunKvd("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown command"));
}

// --kv-quantization int8 runs the story through an int8 KV cache: it begins as the fp32 one
// (the first change of a greedy choice comes later in this story) and then differs, and the
// same command gives the same text. An unknown type is a usage error before anything loads;
// one the device does not run is refused naming what it runs.
TEST(KvdGenerateTest, KvQuantizationInt8StoresTheCacheAsInt8) {
  const std::string story = kGenerate + " --prompt 'Once upon a time' --temperature 0";
  const KvdResult fp32 = RunKvd(story + " --max-tokens 200");
  const KvdResult int8 = RunKvd(story + " --max-tokens 200 --kv-quantization int8");
  ASSERT_EQ(int8.exit_code, 0) << int8.out;
  EXPECT_THAT(int8.out, StartsWith(", there was a little girl named Lily."));
  EXPECT_NE(int8.out, fp32.out);
  EXPECT_EQ(RunKvd(story + " --max-tokens 200 --kv-quantization INT8").out, int8.out);
  EXPECT_EQ(RunKvd(story + " --max-tokens 200 --kv-quantization none").out, fp32.out);

  KvdResult r = RunKvd("generate --model /nonexistent/model.bin --prompt hi --kv-quantization q3");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--kv-quantization: unknown type 'q3'; allowed: none, bf16, fp16, "
                               "fp8, int8, int4"));
  EXPECT_THAT(r.out, Not(HasSubstr("/nonexistent/model.bin")));
  r = RunKvd(story + " --kv-quantization int4");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--kv-quantization: 'int4' is not run on cpu; allowed there: "
                               "none, int8"));
}

// `kvd --version` (or `kvd version`) prints the project's version and whether this build
// has the CUDA backend, and exits 0; the top-level help says so.
TEST(KvdGenerateTest, VersionNamesTheReleaseAndTheBackends) {
  const std::string want = absl::StrCat(
      "kvd ", KVD_VERSION, " (",
      BuiltWithCuda() ? "CUDA and CPU backends" : "CPU backend only; built without CUDA", ")\n");
  for (const char* flag : {"--version", "version"}) {
    const KvdResult r = RunKvd(flag);
    EXPECT_EQ(r.exit_code, 0) << flag;
    EXPECT_EQ(r.out, want) << flag;
  }
  EXPECT_THAT(RunKvd("--help").out, HasSubstr("`kvd --version` prints"));
}

// Token ids in, token ids out: what runs a model without a tokenizer (synthetic ones have
// none). The prompt is the ids as given (no BOS added); the output is the text run's ids.
TEST(KvdGenerateTest, TokenIdPromptsNeedNoTokenizer) {
  const KvdResult text = RunKvd(kGenerate +
                                " --prompt 'Once upon a time' --max-tokens 12"
                                " --temperature 0 --json");
  ASSERT_EQ(text.exit_code, 0) << text.out;
  const nlohmann::json j = nlohmann::json::parse(text.out);
  const std::string prompt_ids = absl::StrJoin(j["prompt_tokens"].get<std::vector<int>>(), ",");
  const std::string output_ids = absl::StrJoin(j["output_tokens"].get<std::vector<int>>(), " ");
  const KvdResult ids =
      RunKvd(kGenerate + " --prompt-token-ids " + prompt_ids + " --max-tokens 12 --temperature 0");
  ASSERT_EQ(ids.exit_code, 0) << ids.out;
  EXPECT_EQ(ids.out, output_ids + "\n");

  const KvdResult synthetic = RunKvd(
      "generate --device cpu --model synthetic:tiny --prompt-token-ids 1,50,60 --max-tokens 5");
  EXPECT_EQ(synthetic.exit_code, 0) << synthetic.out;
  const KvdResult json = RunKvd(
      "generate --device cpu --model synthetic:tiny --prompt-token-ids 1,50,60 --max-tokens 5 "
      "--json");
  ASSERT_EQ(json.exit_code, 0) << json.out;
  EXPECT_FALSE(nlohmann::json::parse(json.out).contains("text"));  // no tokenizer, no text
}

TEST(KvdGenerateTest, BadTokenIdPromptsAreUsageErrors) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--prompt-token-ids 1,x", "--prompt-token-ids: 'x' is not a token id"},
           {"--prompt-token-ids 1,-2", "--prompt-token-ids: '-2' is not a token id"},
           {"--prompt-token-ids 1,512",
            "--prompt-token-ids: 512 is not below the model's "
            "vocabulary size 512"},
           {"--prompt-token-ids 1 --prompt hi", "exactly one of --prompt and --prompt-token-ids"},
           {"--prompt-token-ids 1 --tokenizer x.bin",
            "--tokenizer has no use with --prompt-token-ids"},
           {"--max-tokens 3", "exactly one of --prompt and --prompt-token-ids"}}) {
    const KvdResult r = RunKvd(kGenerate + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(message)) << args;
    EXPECT_THAT(r.out, HasSubstr("usage: kvd generate")) << args;
  }
  const KvdResult text = RunKvd("generate --device cpu --model synthetic:tiny --prompt hi");
  EXPECT_EQ(text.exit_code, 2) << text.out;
  EXPECT_THAT(text.out, HasSubstr("synthetic models have no tokenizer; pass --prompt-token-ids"));
}

// --device takes any case, as the config's model.device does.
TEST(KvdGenerateTest, DeviceNamesTakeAnyCase) {
  const KvdResult r = RunKvd("generate --device CPU --model " + kModel +
                             " --prompt hi --max-tokens 2 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const KvdResult bad = RunKvd("generate --device TPU --model " + kModel + " --prompt hi");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--device: 'TPU' is not one of cpu, cuda, auto"));  // as typed
}

}  // namespace
}  // namespace kvd
