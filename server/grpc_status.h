#ifndef KVD_SERVER_GRPC_STATUS_H_
#define KVD_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvd {

// The one place where absl status codes become gRPC status codes. The two enums share
// their numbering (both follow google.rpc.Code), and the mapping is 1:1: every absl code
// maps to the gRPC code of the same name, and the message is kept verbatim. An OK status
// maps to grpc::Status::OK (its message is dropped). Thread safe (pure function).
grpc::Status ToGrpcStatus(const absl::Status& status);

// The inverse, for clients of the API (kvd client, tests).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvd

#endif  // KVD_SERVER_GRPC_STATUS_H_
