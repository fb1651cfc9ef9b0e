// cxlkv/base/errno.h — errno as text and as a Status: the one place a failed system call's
// errno becomes an absl::Status, for every module (media, NVMe, tiers, the daemon, preload).
// Thread-safe: neither function keeps state.
#ifndef CXLKV_BASE_ERRNO_H_
#define CXLKV_BASE_ERRNO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cxlkv::base {

// Turns errno from `call` on `object` into a Status with the object named and, where one
// exists, a hint for the fix: ENOENT -> kNotFound, EACCES/EPERM -> kPermissionDenied,
// ENOSPC/ENOMEM -> kResourceExhausted, EINVAL -> kInvalidArgument, EBUSY -> kUnavailable,
// anything else kInternal. The message is "<object>: <call>: <errno text>[ — <hint>]".
absl::Status ErrnoStatus(int err, absl::string_view object, absl::string_view call);

// errno's message ("No such file or directory"), safe from any thread: strerror() may share
// one buffer between threads, GNU strerror_r() does not.
std::string ErrnoText(int err);

}  // namespace cxlkv::base

#endif  // CXLKV_BASE_ERRNO_H_
