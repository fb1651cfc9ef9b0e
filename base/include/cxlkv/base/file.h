// cxlkv/base/file.h — durable files: the one way a file the project keeps is written, and
// whole-buffer reads and writes that survive EINTR and short transfers.
//
// The crash guarantee of ReplaceFile, stated once for every caller (the orchestrator's state
// file, the LMCache coordinator's snapshot, the reuse tracker's stats, the calibration, the NVMe
// store's meta page): a crash or power loss at any moment leaves `path` holding either its old
// contents (or no file, if there was none) or the complete new contents — never a mix, never a
// truncated or empty file — and once ReplaceFile has returned OK the new contents are on stable
// media, the rename included. How: the bytes go to `path`.tmp, which is fdatasync'd, renamed
// over `path`, and the directory is fsync'd. A crash may leave `path`.tmp behind; the next
// ReplaceFile truncates it. Any failed step fails the call with a Status naming the file and
// the step (and removes the temporary file); `path` is then unchanged on disk, except that a
// failed directory fsync comes after the rename: the new contents may be visible but are not
// known to be durable, and the caller must not act as if they were.
//
// Thread-safe as far as the file system is: two concurrent ReplaceFile calls on one path race
// for the temporary file; callers serialise writes to one path themselves.
#ifndef CXLKV_BASE_FILE_H_
#define CXLKV_BASE_FILE_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::base {

// An owned file descriptor, closed when it goes (-1: none).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Writes all of `bytes` to `fd` at its offset, retrying EINTR and short writes. Errors name
// `path` and the call (ErrnoStatus).
absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view path);

// Reads `fd` to its end, retrying EINTR; more than `max_bytes` fails (kInvalidArgument naming
// `path` and the limit) rather than growing without bound.
absl::StatusOr<std::string> ReadAll(int fd, absl::string_view path,
                                    std::size_t max_bytes = std::string::npos);

// Opens `path` and reads it whole (ReadAll). A missing file is kNotFound naming it.
absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     std::size_t max_bytes = std::string::npos);

// fsyncs the directory that holds `path` (its parent; "." for a bare name), so that a rename
// or creation of `path` is durable. Failure names the directory.
absl::Status SyncParentDir(const std::string& path);

// Replaces `path` with `pieces` written back to back, with the guarantee above; the file gets
// `mode` (0600 for state only the owner reads).
absl::Status ReplaceFile(const std::string& path, std::initializer_list<absl::string_view> pieces,
                         mode_t mode = 0600);
inline absl::Status ReplaceFile(const std::string& path, absl::string_view bytes,
                                mode_t mode = 0600) {
  return ReplaceFile(path, {bytes}, mode);
}

// The same in a directory the caller holds open (`dir_fd`, named `dir` in messages): `name` is
// relative to it. The NVMe store keeps its directory open for its whole life.
absl::Status ReplaceFileAt(int dir_fd, const std::string& dir, const std::string& name,
                           std::initializer_list<absl::string_view> pieces, mode_t mode = 0600);

// For tests: a hook ReplaceFile calls before each step — "write", "sync", "rename", "sync-dir"
// — with the final path. A non-zero return fails that step with that errno instead of running
// it (a full disk, a directory that cannot be synced); a hook may also end the process there (a
// crash between two steps). nullptr (the default) calls nothing. Not for production use.
using FileStepHook = int (*)(absl::string_view step, const std::string& path);
void SetFileStepHookForTesting(FileStepHook hook);

}  // namespace cxlkv::base

#endif  // CXLKV_BASE_FILE_H_
