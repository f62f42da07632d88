// How the model loaders report a file they may not read (regular_file.h's CannotOpen): the
// code says why (PermissionDenied, not NotFound) and the message gives the system's reason.

#include "model/regular_file.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/llama2c_loader.h"
#include "model/tokenizer.h"

namespace kvd {
namespace {

TEST(CannotOpenTest, TheCodeFollowsTheSystemsReason) {
  EXPECT_EQ(CannotOpen("f", EACCES).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CannotOpen("f", EPERM).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CannotOpen("f", ENOENT).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CannotOpen("f", EMFILE).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CannotOpen("f", EIO).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CannotOpen("tokenizer file 'x'", EACCES).message(),
            "tokenizer file 'x': cannot open for reading: Permission denied");
}

// A copy of `source` that nobody may read (mode 000).
std::string UnreadableCopy(const std::string& source, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/kvd_regular_file_test_" + name;
  std::filesystem::remove(path);
  std::filesystem::copy_file(source, path);
  chmod(path.c_str(), 0);
  return path;
}

// Runs `check` (which must return true) where permissions apply: as root, in a child
// process that first becomes the unprivileged user 65534 (root reads any file). Where root
// cannot become that user (a user namespace without it), the child exits 3 unchecked.
template <typename Check>
void ExpectWithoutPrivileges(Check check) {
  if (geteuid() != 0) {
    EXPECT_TRUE(check());
    return;
  }
  EXPECT_EXIT(
      {
        if (setgid(65534) != 0 || setuid(65534) != 0) std::exit(3);
        std::exit(check() ? 0 : 1);
      },
      [](int status) {
        return WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3);
      },
      "");
}

TEST(CannotOpenTest, AnUnreadableTokenizerIsPermissionDeniedNotNotFound) {
  const std::string path =
      UnreadableCopy(KVD_SHARED_DIR "/models/tok512.bin", "unreadable_tok512.bin");
  ExpectWithoutPrivileges([&] {
    const auto tokenizer = Tokenizer::LoadLlama2c(path, 512);
    const absl::Status& s = tokenizer.status();
    return s.code() == absl::StatusCode::kPermissionDenied &&
           absl::StrContains(s.message(), path) &&
           absl::StrContains(s.message(), "cannot open for reading: Permission denied");
  });
  std::filesystem::remove(path);
}

TEST(CannotOpenTest, AnUnreadableCheckpointSaysWhy) {
  const std::string path =
      UnreadableCopy(KVD_SHARED_DIR "/models/stories260K.bin", "unreadable_stories260K.bin");
  ExpectWithoutPrivileges([&] {
    const auto weights = LoadLlama2cCheckpoint(path, int64_t{1} << 30);
    const absl::Status& s = weights.status();
    return s.code() == absl::StatusCode::kPermissionDenied &&
           absl::StrContains(s.message(), path) &&
           absl::StrContains(s.message(), "cannot open for reading: Permission denied");
  });
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvd
