// devdax: a device-DAX character device (/dev/daxX.Y). Size and alignment come from
// libdaxctl; the mapping honours the device alignment.
#include <daxctl/libdaxctl.h>
#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/region.h"
#include "region_source.h"

namespace cxlkv::pool {
namespace {

struct DaxInfo {
  std::uint64_t size = 0;
  std::uint64_t align = 0;
  bool found = false;
  bool system_ram = false;
};

// Looks the device up by name in libdaxctl (never by hand-parsing sysfs).
absl::StatusOr<DaxInfo> LookupDax(absl::string_view devname) {
  daxctl_ctx* ctx = nullptr;
  if (int rc = daxctl_new(&ctx); rc < 0) return base::ErrnoStatus(-rc, "libdaxctl", "daxctl_new");
  DaxInfo info;
  daxctl_region* region;
  daxctl_region_foreach(ctx, region) {
    daxctl_dev* dev;
    daxctl_dev_foreach(region, dev) {
      if (devname != daxctl_dev_get_devname(dev)) continue;
      info.found = true;
      info.size = daxctl_dev_get_size(dev);
      info.align = daxctl_dev_get_align(dev);
      if (info.align == 0) info.align = daxctl_region_get_align(region);
      daxctl_memory* mem = daxctl_dev_get_memory(dev);
      info.system_ram = mem != nullptr && daxctl_memory_is_online(mem) > 0;
    }
  }
  daxctl_unref(ctx);
  return info;
}

std::string DevdaxName(const SourceSpec& spec) { return spec.path; }

absl::Status OpenDevdax(const SourceSpec& spec, const std::string& /*name*/, OpenedSource* out) {
  const absl::string_view base = absl::string_view(spec.path).substr(spec.path.rfind('/') + 1);
  auto info = LookupDax(base);
  if (!info.ok()) return info.status();
  out->fd.reset(::open(spec.path.c_str(), O_RDWR | O_CLOEXEC));
  if (out->fd.get() < 0) {
    if (errno == ENOENT && info->found && info->system_ram) {
      return absl::FailedPreconditionError(
          absl::StrCat(spec.path,
                       ": the device is onlined as system RAM (kmem), not devdax; use "
                       "kmem:node=N or `daxctl reconfigure-device --mode=devdax ",
                       base, "`"));
    }
    return base::ErrnoStatus(errno, spec.path, "open");
  }
  if (!info->found) {
    return absl::NotFoundError(
        absl::StrCat(spec.path,
                     ": libdaxctl does not know this device; is it a device-DAX node? "
                     "(`daxctl list` shows the devices)"));
  }
  out->size_bytes = info->size;
  out->alignment = std::max<std::uint64_t>(info->align, kPageBytes);
  if (out->size_bytes == 0 || out->size_bytes % out->alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.path, ": size ", out->size_bytes,
                     " is not a non-zero multiple of the device alignment ", out->alignment));
  }
  return absl::OkStatus();
}

}  // namespace

const SourceBackend kDevdaxBackend = {&DevdaxName, &OpenDevdax, nullptr, true};

}  // namespace cxlkv::pool
