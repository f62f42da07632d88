#include "model/regular_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd {

absl::StatusOr<int64_t> RegularFileSize(const std::string& path, absl::string_view what) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  // A missing file, or a missing folder on its path (a file where a folder should be).
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    const std::string message = absl::StrCat(what, ": cannot examine the path: ", ec.message());
    return ec == std::errc::permission_denied ? absl::PermissionDeniedError(message)
                                              : absl::InvalidArgumentError(message);
  }
  if (!std::filesystem::exists(status))
    return absl::NotFoundError(absl::StrCat(what, ": no such file"));
  if (!std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a regular file"));
  }
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot stat: ", ec.message()));
  return static_cast<int64_t>(size);
}

absl::Status CannotOpen(absl::string_view what, int error_number) {
  const std::string message =
      absl::StrCat(what, ": cannot open for reading: ", std::strerror(error_number));
  switch (error_number) {
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

}  // namespace kvd
