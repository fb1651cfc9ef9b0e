#include "cxlkv/pool/region.h"

#include <daxctl/libdaxctl.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cxlkv/pool/give_away.h"

namespace cxlkv::pool {
namespace {

constexpr std::uint64_t kPageBytes = 4096;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

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

absl::Status Mmap(void* at, int fd, std::uint64_t size, std::uint64_t offset,
                  absl::string_view name, std::byte** out) {
  void* p = ::mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at != nullptr ? MAP_FIXED : 0),
                   fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return ErrnoStatus(errno, name, "mmap");
  *out = static_cast<std::byte*>(p);
  return absl::OkStatus();
}

struct DaxInfo {
  std::uint64_t size = 0;
  std::uint64_t align = 0;
  bool found = false;
  bool system_ram = false;
};

// Looks the device up by name in libdaxctl (never by hand-parsing sysfs).
absl::StatusOr<DaxInfo> LookupDax(absl::string_view devname) {
  daxctl_ctx* ctx = nullptr;
  if (int rc = daxctl_new(&ctx); rc < 0) return ErrnoStatus(-rc, "libdaxctl", "daxctl_new");
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

}  // namespace

absl::Status ErrnoStatus(int err, absl::string_view object, absl::string_view call) {
  char buf[128];
  const char* text = ::strerror_r(err, buf, sizeof(buf));  // GNU: returns the message
  std::string msg = absl::StrCat(object, ": ", call, ": ", text, Hint(err));
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

std::uint64_t Region::Track() {
  if (tracked_id_ == 0 && addr_ != nullptr) tracked_id_ = TrackRegion(addr_, size_bytes_);
  return tracked_id_;
}

Region::~Region() {
  // Out of the table first: a revocation in progress on this mapping finishes, later ones
  // leave it alone.
  if (tracked_id_ != 0) UntrackRegion(tracked_id_);
  // A window is one extent of a pooled source: memory that changes hands between hosts.
  // Nothing this process wrote may reach it after the next holder does (give_away.h).
  if (addr_ != nullptr && spec_.length != 0) (void)SealAndWriteBack(addr_, size_bytes_);
  if (addr_ != nullptr && in_reservation_) {
    // Put the caller's placeholder back, so nothing else is mapped into its reservation.
    (void)::mmap(addr_, size_bytes_, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  } else if (addr_ != nullptr) {
    ::munmap(addr_, size_bytes_);
  }
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<Region>> Region::Duplicate() const {
  std::unique_ptr<Region> r(new Region());
  r->spec_ = spec_;
  r->name_ = name_;
  r->alignment_ = alignment_;
  Fd fd;
  fd.fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (fd.fd < 0) return ErrnoStatus(errno, name_, "dup");
  if (auto st = Mmap(nullptr, fd.fd, size_bytes_, spec_.offset, name_, &r->addr_); !st.ok()) {
    return st;
  }
  r->size_bytes_ = size_bytes_;
  r->fd_ = fd.release();
  return r;
}

absl::StatusOr<std::unique_ptr<Region>> OpenRegion(absl::string_view spec) {
  auto parsed = ParseSourceSpec(spec);
  if (!parsed.ok()) return parsed.status();
  return OpenRegion(*parsed);
}

absl::StatusOr<std::unique_ptr<Region>> OpenRegion(const SourceSpec& spec) {
  return OpenRegionAt(spec, nullptr);
}

absl::StatusOr<std::unique_ptr<Region>> OpenRegionAt(const SourceSpec& spec, void* at) {
  if (spec.kind == SourceKind::kKmem && at != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("kmem:node=", spec.numa_node, ": cannot be mapped at a chosen address"));
  }
  if (spec.size_bytes % kPageBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.ToString(), ": size ", spec.size_bytes, " is not a multiple of the ", kPageBytes,
        "-byte page; round it (e.g. ", (spec.size_bytes / kPageBytes + 1) * kPageBytes, ")"));
  }
  std::unique_ptr<Region> r(new Region());
  r->spec_ = spec;
  r->alignment_ = kPageBytes;
  Fd fd;
  std::uint64_t size = spec.size_bytes;

  switch (spec.kind) {
    case SourceKind::kDevdax: {
      r->name_ = spec.path;
      const absl::string_view base = absl::string_view(spec.path).substr(spec.path.rfind('/') + 1);
      auto info = LookupDax(base);
      if (!info.ok()) return info.status();
      fd.fd = ::open(spec.path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd.fd < 0) {
        if (errno == ENOENT && info->found && info->system_ram) {
          return absl::FailedPreconditionError(
              absl::StrCat(spec.path,
                           ": the device is onlined as system RAM (kmem), not devdax; use "
                           "kmem:node=N or `daxctl reconfigure-device --mode=devdax ",
                           base, "`"));
        }
        return ErrnoStatus(errno, spec.path, "open");
      }
      if (!info->found) {
        return absl::NotFoundError(
            absl::StrCat(spec.path,
                         ": libdaxctl does not know this device; is it a device-DAX node? "
                         "(`daxctl list` shows the devices)"));
      }
      size = info->size;
      r->alignment_ = std::max<std::uint64_t>(info->align, kPageBytes);
      if (size == 0 || size % r->alignment_ != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(spec.path, ": size ", size,
                         " is not a non-zero multiple of the device alignment ", r->alignment_));
      }
      break;
    }
    case SourceKind::kKmem: {
      r->name_ = absl::StrCat("kmem:node=", spec.numa_node);
      if (numa_available() < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(r->name_, ": NUMA is not available on this kernel"));
      }
      long long free_bytes = 0;
      if (spec.numa_node > numa_max_node() || numa_node_size64(spec.numa_node, &free_bytes) <= 0) {
        return absl::NotFoundError(absl::StrCat(
            r->name_, ": NUMA node ", spec.numa_node,
            " has no memory or does not exist; `cxlkvctl topology` lists the memory nodes"));
      }
      if (size == 0) {
        size = (static_cast<std::uint64_t>(free_bytes) / 2) & ~((2ull << 20) - 1);
      }
      fd.fd = ::memfd_create("cxlkv-kmem", MFD_CLOEXEC);
      if (fd.fd < 0) return ErrnoStatus(errno, r->name_, "memfd_create");
      break;
    }
    case SourceKind::kFile: {
      r->name_ = spec.path;
      const int flags = O_RDWR | O_CLOEXEC | (size != 0 ? O_CREAT : 0);
      fd.fd = ::open(spec.path.c_str(), flags, 0600);
      if (fd.fd < 0) {
        if (errno == ENOENT && size == 0) {
          return absl::NotFoundError(absl::StrCat(
              spec.path, ": file does not exist; add ?size=BYTES to the spec to create it"));
        }
        return ErrnoStatus(errno, spec.path, "open");
      }
      struct stat st {};
      if (::fstat(fd.fd, &st) != 0) return ErrnoStatus(errno, spec.path, "fstat");
      if (!S_ISREG(st.st_mode)) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.path, ": not a regular file; use devdax: for device-DAX character devices"));
      }
      const auto existing = static_cast<std::uint64_t>(st.st_size);
      if (size == 0) {
        size = existing;
        if (size == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(spec.path, ": file is empty; add ?size=BYTES to the spec"));
        }
      } else if (existing != 0 && existing != size) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.path, ": file is ", existing, " bytes but the spec asks for ", size,
            "; drop size= to use the file as it is, or remove the file to recreate it"));
      }
      if (size % kPageBytes != 0) break;  // reported below, before touching the file
      if (existing == 0) {
        if (::ftruncate(fd.fd, static_cast<off_t>(size)) != 0) {
          return ErrnoStatus(errno, spec.path, "ftruncate");
        }
        if (spec.reserve) {
          // Reserve now so a full file system is an error here, not a SIGBUS later.
          if (int rc = ::posix_fallocate(fd.fd, 0, static_cast<off_t>(size)); rc != 0) {
            (void)::ftruncate(fd.fd, 0);
            return ErrnoStatus(rc, spec.path, "posix_fallocate");
          }
        }
      }
      break;
    }
    case SourceKind::kMemfd: {
      r->name_ = absl::StrCat("memfd:", spec.path);
      fd.fd = ::memfd_create(spec.path.c_str(), MFD_CLOEXEC);
      if (fd.fd < 0) return ErrnoStatus(errno, r->name_, "memfd_create");
      break;
    }
  }

  if (size % kPageBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(r->name_, ": size ", size, " is not a multiple of the ", kPageBytes,
                     "-byte page; round it (e.g. ", (size / kPageBytes + 1) * kPageBytes, ")"));
  }
  if (spec.kind == SourceKind::kKmem || spec.kind == SourceKind::kMemfd) {
    if (::ftruncate(fd.fd, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, r->name_, "ftruncate");
    }
  }
  std::uint64_t offset = 0;
  if (spec.length != 0) {
    // A window (one extent of a pooled region): aligned to the source's alignment and at
    // least 2 MiB (the extent granule), inside the source.
    const std::uint64_t align = std::max<std::uint64_t>(r->alignment_, 2ull << 20);
    if (spec.offset % align != 0 || spec.length % align != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          r->name_, ": window offset ", spec.offset, " length ", spec.length,
          " is not aligned to ", align, " bytes; extents are multiples of 2 MiB"));
    }
    if (spec.offset > size || spec.length > size - spec.offset) {
      return absl::OutOfRangeError(absl::StrCat(
          r->name_, ": window [", spec.offset, ", ", spec.offset + spec.length,
          ") runs past the end of the source (", size, " bytes); is it the right device?"));
    }
    offset = spec.offset;
    size = spec.length;
    r->name_ = absl::StrCat(r->name_, "@", offset, "+", size);
  }
  if (at != nullptr && reinterpret_cast<std::uintptr_t>(at) % r->alignment_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(r->name_, ": address ", absl::Hex(at),
                                                   " is not aligned to ", r->alignment_,
                                                   " bytes (the device alignment)"));
  }
  if (auto st = Mmap(at, fd.fd, size, offset, r->name_, &r->addr_); !st.ok()) return st;
  r->size_bytes_ = size;
  r->in_reservation_ = at != nullptr;
  if (spec.kind == SourceKind::kKmem) {
    // Bind before first touch: shmem keeps the policy with the object, so every page,
    // whoever faults it, comes from the node.
    struct bitmask* nodes = numa_allocate_nodemask();
    numa_bitmask_setbit(nodes, static_cast<unsigned>(spec.numa_node));
    const long rc = mbind(r->addr_, size, MPOL_BIND, nodes->maskp, nodes->size + 1, 0);
    const int err = errno;
    numa_free_nodemask(nodes);
    if (rc != 0) return ErrnoStatus(err, r->name_, "mbind");
  }
  r->fd_ = fd.release();
  return r;
}

}  // namespace cxlkv::pool
