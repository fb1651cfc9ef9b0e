#include "cxlkv/base/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"

namespace cxlkv::base {
namespace {

std::atomic<FileStepHook> g_hook{nullptr};

// The hook's verdict for `step`: 0 runs the step, anything else is the errno it fails with.
int Hook(absl::string_view step, const std::string& path) {
  const FileStepHook hook = g_hook.load(std::memory_order_acquire);
  return hook == nullptr ? 0 : hook(step, path);
}

// `path` split into its directory ("." for a bare name, "/" for a file in the root) and name.
void Split(const std::string& path, std::string* dir, std::string* name) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    *dir = ".";
    *name = path;
  } else {
    *dir = slash == 0 ? "/" : path.substr(0, slash);
    *name = path.substr(slash + 1);
  }
}

}  // namespace

void SetFileStepHookForTesting(FileStepHook hook) { g_hook.store(hook, std::memory_order_release); }

absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view path) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, path, "write");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(int fd, absl::string_view path, std::size_t max_bytes) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, path, "read");
    }
    if (n == 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": larger than ", max_bytes, " bytes; is it the right file?"));
    }
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path, std::size_t max_bytes) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, path, "open");
  return ReadAll(fd.get(), path, max_bytes);
}

absl::Status SyncParentDir(const std::string& path) {
  std::string dir, name;
  Split(path, &dir, &name);
  const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return ErrnoStatus(errno, "directory " + dir, "open");
  if (::fsync(dfd.get()) != 0) {
    return ErrnoStatus(
        errno, "directory " + dir,
        absl::StrCat("fsync (to make ", path, " durable; keep it on a local file system)"));
  }
  return absl::OkStatus();
}

absl::Status ReplaceFileAt(int dir_fd, const std::string& dir, const std::string& name,
                           std::initializer_list<absl::string_view> pieces, mode_t mode) {
  const std::string path = dir == "/" ? "/" + name : absl::StrCat(dir, "/", name);
  const std::string tmp_name = name + ".tmp";
  const std::string tmp = path + ".tmp";
  absl::Status st;
  {
    const UniqueFd fd(
        ::openat(dir_fd, tmp_name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
    if (fd.get() < 0) return ErrnoStatus(errno, tmp, "create");
    if (const int err = Hook("write", path); err != 0) {
      st = ErrnoStatus(err, tmp, "write");
    }
    for (const absl::string_view piece : pieces) {
      if (!st.ok()) break;
      st = WriteAll(fd.get(), piece, tmp);
    }
    if (st.ok()) {
      // The contents and the size: what reading the file back needs.
      const int err = Hook("sync", path);
      if (err != 0 || ::fdatasync(fd.get()) != 0) {
        st = ErrnoStatus(err != 0 ? err : errno, tmp, "fdatasync");
      }
    }
  }
  if (st.ok()) {
    const int err = Hook("rename", path);
    if (err != 0 || ::renameat(dir_fd, tmp_name.c_str(), dir_fd, name.c_str()) != 0) {
      st = ErrnoStatus(err != 0 ? err : errno, path, absl::StrCat("rename from ", tmp));
    }
  }
  if (!st.ok()) {
    ::unlinkat(dir_fd, tmp_name.c_str(), 0);
    return st;
  }
  // The rename is durable only once the directory is.
  const int err = Hook("sync-dir", path);
  if (err != 0 || ::fsync(dir_fd) != 0) {
    return ErrnoStatus(
        err != 0 ? err : errno, "directory " + dir,
        absl::StrCat("fsync (to make the new ", path, " durable; keep it on a local file system)"));
  }
  return absl::OkStatus();
}

absl::Status ReplaceFile(const std::string& path, std::initializer_list<absl::string_view> pieces,
                         mode_t mode) {
  std::string dir, name;
  Split(path, &dir, &name);
  const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) {
    return ErrnoStatus(errno, "directory " + dir, absl::StrCat("open (to replace ", name, ")"));
  }
  return ReplaceFileAt(dfd.get(), dir, name, pieces, mode);
}

}  // namespace cxlkv::base
