// kvd loads cuBLAS when the first CUDA backend is made, not when a process starts
// (kernels/cuda/cublas_api.h says why). Host-only: loading the libraries needs no GPU, so
// ctest runs these on every CUDA build, each in a process of its own.

#include "kernels/cuda/cublas_api.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

// Whether a file whose path contains `name` is mapped into this process.
bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(name) != std::string::npos;
}

TEST(CublasApiTest, LoadedOnFirstUseNotAtStartup) {
  if (LoadedCublas() == nullptr) {  // nothing in this process has made a backend yet
    EXPECT_FALSE(Mapped("libcublasLt.so")) << "cuBLAS was loaded at startup";
    EXPECT_FALSE(Mapped("libcublas.so")) << "cuBLAS was loaded at startup";
  }
  const absl::StatusOr<const CublasApi*> api = LoadCublas();
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(LoadedCublas(), *api);
  EXPECT_TRUE(Mapped("libcublasLt.so."));
  EXPECT_TRUE(Mapped("libcublas.so."));
#define KVD_EXPECT_BOUND(library, function) EXPECT_NE((*api)->function, nullptr) << #function;
  KVD_CUBLAS_FUNCTIONS(KVD_EXPECT_BOUND)
#undef KVD_EXPECT_BOUND
  EXPECT_NE((*api)->cublasGemmEx, nullptr);
  // The library of the headers kvd was built against, and the calls reach it.
  EXPECT_EQ((*api)->cublasLtGetVersion() / 10000, size_t{CUBLAS_VER_MAJOR});
  EXPECT_STREQ((*api)->cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED),
               "CUBLAS_STATUS_NOT_SUPPORTED");
  // Once per process: the same table again.
  const absl::StatusOr<const CublasApi*> again = LoadCublas();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *api);
}

TEST(CublasApiTest, AMissingLibraryIsUnavailableAndSaysWhatToDo) {
  const absl::StatusOr<CublasApi> api =
      OpenCublas("libkvd-no-such-cublasLt.so.1", "libkvd-no-such-cublas.so.1");
  ASSERT_EQ(api.status().code(), absl::StatusCode::kUnavailable) << api.status();
  EXPECT_THAT(api.status().message(), HasSubstr("libkvd-no-such-cublasLt.so.1"));
  EXPECT_THAT(api.status().message(), HasSubstr("LD_LIBRARY_PATH"));
  EXPECT_THAT(api.status().message(), HasSubstr("--device cpu"));
}

TEST(CublasApiTest, ALibraryWithoutTheFunctionsIsUnavailableAndNamesTheMissingOne) {
  const absl::StatusOr<CublasApi> api = OpenCublas("libm.so.6", "libm.so.6");
  ASSERT_EQ(api.status().code(), absl::StatusCode::kUnavailable) << api.status();
  EXPECT_THAT(api.status().message(), HasSubstr("libm.so.6"));
  EXPECT_THAT(api.status().message(), HasSubstr("has no function cublasLtGetVersion"));
}

TEST(CublasStatusTest, ACublasFailureIsNamedByTheLoadedLibrary) {
  ASSERT_TRUE(LoadCublas().ok());
  const absl::Status status = CublasStatus(CUBLAS_STATUS_ALLOC_FAILED, "Matmul: plan");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("Matmul: plan: "));
  EXPECT_THAT(status.message(), HasSubstr("(CUBLAS_STATUS_ALLOC_FAILED)"));
}

}  // namespace
}  // namespace kvd
