// `kvd serve` with a synthetic model, which has no tokenizer, run as a user runs it (the real
// binary, KVD_BINARY, on the CPU): it serves prompt_token_ids, and refuses text prompts and
// stop strings with INVALID_ARGUMENT naming the field; SIGTERM drains it to exit 0. The
// same daemon on CUDA is tests/gpu/serve_check.sh. A GGUF model whose tokenizer kvd cannot
// read is served the same way.

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvd/v1/kvd.grpc.pb.h"
#include "tests/model/gguf_writer.h"
#include "tests/model/hf_writer.h"
#include "tests/tools/run_kvd.h"

namespace kvd {
namespace {

// A `kvd serve` child process whose stdout is read line by line. Kills it if still running.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(KVD_BINARY));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // posix_spawn, not fork: other tests of this binary left gRPC threads running.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    if (posix_spawn(&pid_, KVD_BINARY, &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fds[0];
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }

  // Reads stdout until a line starting with `prefix` (returns the rest of it) or the timeout.
  std::string WaitForLine(const std::string& prefix, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      for (size_t nl; (nl = buffer_.find('\n')) != std::string::npos;) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
      }
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(out_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    return "";
  }

  // SIGTERM, then the exit status (-1 unless it exited normally within the timeout).
  int Terminate(std::chrono::seconds timeout) {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      usleep(20000);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
};

struct Streamed {
  grpc::Status status;
  std::vector<uint32_t> token_ids;
  std::string text;
  std::string finish_reason;
};

Streamed Generate(v1::Inference::Stub& stub, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub.Generate(&context, request);
  Streamed s;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    s.token_ids.insert(s.token_ids.end(), response.token_ids().begin(), response.token_ids().end());
    s.text += response.text();
    if (!response.finish_reason().empty()) s.finish_reason = response.finish_reason();
  }
  s.status = reader->Finish();
  return s;
}

// `kvd serve` of synthetic:tiny on one CPU thread on a free local port, no metrics, then
// `sets` as --set overrides.
std::vector<std::string> ServeTiny(const std::vector<std::string>& sets) {
  std::vector<std::string> args = {
      "serve", "--model",        "synthetic:tiny",      "--device",
      "cpu",   "--grpc-address", "127.0.0.1:0",         "--metrics-address",
      "",      "--set",          "server.num_threads=1"};
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  return args;
}

// A stub for the daemon's gRPC address, once it says it serves; null if it never does.
std::unique_ptr<v1::Inference::Stub> StubOf(Daemon& daemon) {
  const std::string address = daemon.WaitForLine("kvd: serving gRPC on ", std::chrono::seconds(30));
  if (address.empty()) return nullptr;
  return v1::Inference::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

TEST(ServeSyntheticTest, ServesTokenIdsAndRefusesTextWithoutATokenizer) {
  Daemon daemon(ServeTiny({}));
  auto stub = StubOf(daemon);
  ASSERT_NE(stub, nullptr) << "the daemon never printed its gRPC address";

  v1::GenerateRequest ids;
  for (uint32_t id : {1u, 17u, 42u, 99u}) ids.add_prompt_token_ids(id);
  ids.set_max_tokens(8);
  ids.set_ignore_eos(true);
  const Streamed ok = Generate(*stub, ids);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.finish_reason, "length");
  EXPECT_EQ(ok.token_ids.size(), 8u);
  EXPECT_EQ(ok.text, "");  // no tokenizer, no text

  v1::GenerateRequest text;
  text.set_prompt("Once upon a time");
  const Streamed refused_text = Generate(*stub, text);
  EXPECT_EQ(refused_text.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(refused_text.status.error_message(), "prompt"))
      << refused_text.status.error_message();

  v1::GenerateRequest stop = ids;
  stop.add_stop("The end");
  const Streamed refused_stop = Generate(*stub, stop);
  EXPECT_EQ(refused_stop.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(refused_stop.status.error_message(), "stop"))
      << refused_stop.status.error_message();

  stub.reset();  // close the connection: the drain then has nothing to wait for
  EXPECT_EQ(daemon.Terminate(std::chrono::seconds(30)), 0);
}

// A synthetic model is one model per seed, however it runs: `kvd serve` on the CPU once made
// its weights another way than `kvd generate` (and `kvd serve` on CUDA), so the same
// model.seed served another model.
TEST(ServeSyntheticTest, TheSameSeedServesTheModelThatGenerateRuns) {
  Daemon daemon(ServeTiny({"model.seed=7"}));
  auto stub = StubOf(daemon);
  ASSERT_NE(stub, nullptr) << "the daemon never printed its gRPC address";
  v1::GenerateRequest greedy;
  for (uint32_t id : {1u, 50u, 60u, 70u}) greedy.add_prompt_token_ids(id);
  greedy.set_max_tokens(8);  // temperature 0: greedy
  const Streamed served = Generate(*stub, greedy);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  ASSERT_FALSE(served.token_ids.empty());
  stub.reset();
  EXPECT_EQ(daemon.Terminate(std::chrono::seconds(30)), 0);

  const KvdResult generated = RunKvd(
      "generate --model synthetic:tiny --seed 7 --prompt-token-ids 1,50,60,70 "
      "--max-tokens 8 --temperature 0 --device cpu --threads 1");
  EXPECT_EQ(generated.exit_code, 0);
  EXPECT_EQ(generated.out, absl::StrCat(absl::StrJoin(served.token_ids, " "), "\n"));
}

// A GGUF model whose vocabulary kvd's tokenizer cannot read (here tokenizer.ggml.model
// "gpt2", as Llama 3's files have) is served as a synthetic model is: token ids in and out,
// text refused, and the startup output says so.
TEST(ServeSyntheticTest, AGgufModelWithAnUnreadableTokenizerServesTokenIds) {
  test::GgufWriter file = test::TinyLlamaGguf{}.Writer();
  file.AddString("tokenizer.ggml.model", "gpt2");
  const std::string path = file.WriteTemp("serve_gpt2_tokenizer.gguf");
  std::vector<std::string> args = ServeTiny({});
  args[2] = path;  // --model
  Daemon daemon(args);
  const std::string said = daemon.WaitForLine("kvd: GGUF file", std::chrono::seconds(30));
  EXPECT_TRUE(absl::StrContains(said, "tokenizer.ggml.model 'gpt2'")) << said;
  EXPECT_TRUE(absl::StrContains(said, "serving prompt_token_ids only")) << said;
  auto stub = StubOf(daemon);
  ASSERT_NE(stub, nullptr) << "the daemon never printed its gRPC address";

  v1::GenerateRequest ids;
  for (uint32_t id : {1u, 7u, 9u}) ids.add_prompt_token_ids(id);
  ids.set_max_tokens(4);
  ids.set_ignore_eos(true);
  const Streamed ok = Generate(*stub, ids);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.token_ids.size(), 4u);
  v1::GenerateRequest text;
  text.set_prompt("Once upon a time");
  EXPECT_EQ(Generate(*stub, text).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  stub.reset();
  EXPECT_EQ(daemon.Terminate(std::chrono::seconds(30)), 0);
}

// A Hugging Face directory (stories260K written as transformers stores a Llama, with its
// tokenizer.model) serves a text prompt's greedy completion as `kvd generate` gives it from
// the llama2.c checkpoint, and says which model it serves.
TEST(ServeSyntheticTest, AHuggingFaceDirectoryServesTheCheckpointsText) {
  const std::string dir = ::testing::TempDir() + "/serve_stories260K_hf";
  test::WriteHfStories260k(dir);
  std::vector<std::string> args = ServeTiny({});
  args[2] = dir;  // --model
  Daemon daemon(args);
  const std::string model = daemon.WaitForLine("kvd: model ", std::chrono::seconds(30));
  EXPECT_TRUE(absl::StartsWith(model, "serve_stories260K_hf (")) << model;
  auto stub = StubOf(daemon);
  ASSERT_NE(stub, nullptr) << "the daemon never printed its gRPC address";
  v1::GenerateRequest text;
  text.set_prompt("Once upon a time");
  text.set_max_tokens(24);
  text.set_ignore_eos(true);
  const Streamed served = Generate(*stub, text);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.token_ids.size(), 24u);
  stub.reset();
  EXPECT_EQ(daemon.Terminate(std::chrono::seconds(30)), 0);

  const KvdResult generated = RunKvd("generate --model " KVD_SHARED_DIR
                                     "/models/stories260K.bin --prompt 'Once upon a time' "
                                     "--max-tokens 24 --temperature 0 --device cpu --threads 1");
  ASSERT_EQ(generated.exit_code, 0) << generated.out;
  EXPECT_EQ(generated.out, served.text + "\n");
}

}  // namespace
}  // namespace kvd
