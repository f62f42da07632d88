#ifndef KVD_MODEL_REGULAR_FILE_H_
#define KVD_MODEL_REGULAR_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd {

// The size in bytes of the regular file at `path`, which a loader is about to read whole or
// by its header's sizes. Errors start with `what` (e.g. "tokenizer file 'x'"): NotFound when
// nothing is there, PermissionDenied when the path cannot be examined for that reason,
// InvalidArgument for a directory, device, pipe or socket (reading one would block, never
// end or fail midway) and for any other failure to examine the path (a symbolic-link loop, a
// name too long), with the system's reason. Never throws.
absl::StatusOr<int64_t> RegularFileSize(const std::string& path, absl::string_view what);

// The error for a file that RegularFileSize accepted but that would not open, from the
// errno the open left: "<what>: cannot open for reading: <the system's reason>", as
// PermissionDenied (EACCES, EPERM), NotFound (ENOENT, ENOTDIR: gone meanwhile),
// ResourceExhausted (out of file descriptors or memory) or InvalidArgument (anything else).
absl::Status CannotOpen(absl::string_view what, int error_number);

}  // namespace kvd

#endif  // KVD_MODEL_REGULAR_FILE_H_
