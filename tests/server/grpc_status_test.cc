#include "server/grpc_status.h"

#include <gtest/gtest.h>

namespace kvd {
namespace {

TEST(GrpcStatusTest, EveryCodeMapsToTheSameNamedCodeAndBack) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code), code == 0 ? "" : "why");
    const grpc::Status out = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(out.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(out), in);
  }
}

TEST(GrpcStatusTest, KeepsTheMessage) {
  const grpc::Status s = ToGrpcStatus(absl::InvalidArgumentError("top_p: 2 is out of range"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "top_p: 2 is out of range");
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("draining")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace kvd
