#ifndef KVD_KERNELS_STATUS_MACROS_H_
#define KVD_KERNELS_STATUS_MACROS_H_

// Early return on a non-OK absl::Status, for every library (kernels/ is the bottom of
// the dependency order, so all of them can include this).

#include "absl/status/status.h"

#define KVD_RETURN_IF_ERROR(expr)                                 \
  do {                                                            \
    if (::absl::Status kvd_status_ = (expr); !kvd_status_.ok()) { \
      return kvd_status_;                                         \
    }                                                             \
  } while (0)

#endif  // KVD_KERNELS_STATUS_MACROS_H_
