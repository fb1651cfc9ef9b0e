// memfd: memfd_create() of the spec's size; shared with fork()ed children or through
// /proc/PID/fd/N. The backend of the unit tests.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/region.h"
#include "region_source.h"

namespace cxlkv::pool {
namespace {

std::string MemfdName(const SourceSpec& spec) { return absl::StrCat("memfd:", spec.path); }

absl::Status OpenMemfd(const SourceSpec& spec, const std::string& name, OpenedSource* out) {
  out->fd.reset(::memfd_create(spec.path.c_str(), MFD_CLOEXEC));
  if (out->fd.get() < 0) return base::ErrnoStatus(errno, name, "memfd_create");
  out->size_bytes = spec.size_bytes;  // a multiple of the page (checked by the caller)
  if (::ftruncate(out->fd.get(), static_cast<off_t>(out->size_bytes)) != 0) {
    return base::ErrnoStatus(errno, name, "ftruncate");
  }
  return absl::OkStatus();
}

}  // namespace

const SourceBackend kMemfdBackend = {&MemfdName, &OpenMemfd, nullptr, true};

}  // namespace cxlkv::pool
