// file: a regular file (e.g. in /dev/shm or on a DAX file system). Created with ?size= (and
// fallocated unless reserve=0), or opened at its size. A file created here is removed again
// when the open fails (ENOSPC while reserving, a bad window): a failed open leaves nothing.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/region.h"
#include "region_source.h"

namespace cxlkv::pool {
namespace {

std::string FileName(const SourceSpec& spec) { return spec.path; }

absl::Status OpenFile(const SourceSpec& spec, const std::string& /*name*/, OpenedSource* out) {
  std::uint64_t size = spec.size_bytes;
  out->fd.reset(::open(spec.path.c_str(), O_RDWR | O_CLOEXEC));
  if (out->fd.get() < 0 && errno == ENOENT && size != 0) {
    out->fd.reset(::open(spec.path.c_str(), O_RDWR | O_CLOEXEC | O_CREAT | O_EXCL, 0600));
    // Ours now: removed again if the open fails after all (OpenedSource::created).
    if (out->fd.get() >= 0) out->created = spec.path;
  }
  if (out->fd.get() < 0) {
    if (errno == ENOENT && size == 0) {
      return absl::NotFoundError(absl::StrCat(
          spec.path, ": file does not exist; add ?size=BYTES to the spec to create it"));
    }
    return base::ErrnoStatus(errno, spec.path, "open");
  }
  struct stat st {};
  if (::fstat(out->fd.get(), &st) != 0) return base::ErrnoStatus(errno, spec.path, "fstat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.path, ": not a regular file; use devdax: for device-DAX character devices"));
  }
  const auto existing = static_cast<std::uint64_t>(st.st_size);
  if (size == 0) {
    size = existing;
    if (size == 0) {
      // Not "add ?size=": that makes a new, empty region of it, and an arena, pool or prefix
      // domain that was there stays lost without a word.
      return absl::InvalidArgumentError(absl::StrCat(
          spec.path,
          ": file is empty (0 bytes), so it holds no region. If it held one (an arena, a pool, "
          "a prefix domain), it was truncated and its contents are gone: restore it from a "
          "backup (nothing was changed). Only to make a new, empty region of it, give the spec "
          "?size=BYTES"));
    }
  } else if (existing != 0 && existing != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.path, ": file is ", existing, " bytes but the spec asks for ", size,
                     "; drop size= to use the file as it is, or remove the file to recreate it"));
  }
  out->size_bytes = size;
  if (size % kPageBytes != 0) return absl::OkStatus();  // region.cc reports it, file untouched
  if (existing == 0) {
    if (::ftruncate(out->fd.get(), static_cast<off_t>(size)) != 0) {
      return base::ErrnoStatus(errno, spec.path, "ftruncate");
    }
    if (spec.reserve) {
      // Reserve now so a full file system is an error here, not a SIGBUS later.
      if (int rc = ::posix_fallocate(out->fd.get(), 0, static_cast<off_t>(size)); rc != 0) {
        (void)::ftruncate(out->fd.get(), 0);
        return base::ErrnoStatus(rc, spec.path, "posix_fallocate");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

const SourceBackend kFileBackend = {&FileName, &OpenFile, nullptr, true};

}  // namespace cxlkv::pool
