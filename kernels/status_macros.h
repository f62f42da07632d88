#ifndef KVD_KERNELS_STATUS_MACROS_H_
#define KVD_KERNELS_STATUS_MACROS_H_

// Early return on a non-OK absl::Status, and a status with context before its message, for
// every library (kernels/ is the bottom of the dependency order, so all can include this).

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define KVD_RETURN_IF_ERROR(expr)                                 \
  do {                                                            \
    if (::absl::Status kvd_status_ = (expr); !kvd_status_.ok()) { \
      return kvd_status_;                                         \
    }                                                             \
  } while (0)

namespace kvd {

// `status` with "prefix: " before its message (saying where a value came from: a flag, a
// key, a path), its code kept. REQUIRES: !status.ok().
inline absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

}  // namespace kvd

#endif  // KVD_KERNELS_STATUS_MACROS_H_
