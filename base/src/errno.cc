#include "cxlkv/base/errno.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace cxlkv::base {
namespace {

absl::string_view Hint(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
      return " — check the owner and mode of the path, or run as a user allowed to map it";
    case ENOENT:
      return " — check the path (for devdax: `daxctl list` shows the devices)";
    case ENOSPC:
      return " — the file system is full; pick a smaller size= or free space";
    case ENOMEM:
      return " — not enough memory for the mapping; pick a smaller size=";
    case EINVAL:
      return " — the size or alignment is not accepted by this device";
    case ENXIO:
    case ENODEV:
      return " — the device is not enabled in devdax mode (daxctl list)";
    default:
      return "";
  }
}

}  // namespace

std::string ErrnoText(int err) {
  char buf[128];
  return ::strerror_r(err, buf, sizeof(buf));  // GNU: returns the message (in buf or static)
}

absl::Status ErrnoStatus(int err, absl::string_view object, absl::string_view call) {
  std::string msg = absl::StrCat(object, ": ", call, ": ", ErrnoText(err), Hint(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case EBUSY:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cxlkv::base
