#include "cxlkv/pool/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/give_away.h"
#include "region_source.h"

namespace cxlkv::pool {
namespace {

absl::Status Mmap(void* at, int fd, std::uint64_t size, std::uint64_t offset,
                  absl::string_view name, std::byte** out) {
  void* p = ::mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at != nullptr ? MAP_FIXED : 0),
                   fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return base::ErrnoStatus(errno, name, "mmap");
  *out = static_cast<std::byte*>(p);
  return absl::OkStatus();
}

// One backend per source kind, in SourceKind order.
constexpr const SourceBackend* kBackends[] = {&kDevdaxBackend, &kKmemBackend, &kFileBackend,
                                              &kMemfdBackend};
static_assert(static_cast<int>(SourceKind::kDevdax) == 0 &&
              static_cast<int>(SourceKind::kKmem) == 1 &&
              static_cast<int>(SourceKind::kFile) == 2 &&
              static_cast<int>(SourceKind::kMemfd) == 3 && std::size(kBackends) == 4);

}  // namespace

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
  base::UniqueFd fd(::fcntl(fd_, F_DUPFD_CLOEXEC, 0));
  if (fd.get() < 0) return base::ErrnoStatus(errno, name_, "dup");
  if (auto st = Mmap(nullptr, fd.get(), size_bytes_, spec_.offset, name_, &r->addr_); !st.ok()) {
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
  const SourceBackend& backend = *kBackends[static_cast<int>(spec.kind)];
  if (!backend.fixed_address && at != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(backend.name(spec), ": cannot be mapped at a chosen address"));
  }
  if (spec.size_bytes % kPageBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.ToString(), ": size ", spec.size_bytes, " is not a multiple of the ", kPageBytes,
        "-byte page; round it (e.g. ", (spec.size_bytes / kPageBytes + 1) * kPageBytes, ")"));
  }
  std::unique_ptr<Region> r(new Region());
  r->spec_ = spec;
  r->name_ = backend.name(spec);
  OpenedSource src;
  if (auto st = backend.open(spec, r->name_, &src); !st.ok()) return st;
  r->alignment_ = src.alignment;
  std::uint64_t size = src.size_bytes;
  if (size % kPageBytes != 0) {
    // The source's own size (spec sizes were checked above): nothing cxlkv made, which is
    // always whole pages.
    return absl::InvalidArgumentError(absl::StrCat(
        r->name_, ": size ", size, " bytes is not a multiple of the ", kPageBytes,
        "-byte page, so it holds no arena or domain cxlkv made (they are whole pages): check "
        "the path"));
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
  if (auto st = Mmap(at, src.fd.get(), size, offset, r->name_, &r->addr_); !st.ok()) return st;
  r->size_bytes_ = size;
  r->in_reservation_ = at != nullptr;
  if (backend.mapped != nullptr) {
    if (auto st = backend.mapped(spec, r->name_, r->addr_, size); !st.ok()) return st;
  }
  r->fd_ = src.fd.release();
  src.created.clear();  // opened: a file created for it stays
  return r;
}

absl::StatusOr<std::unique_ptr<Region>> OpenExistingRegion(const SourceSpec& spec) {
  if (spec.kind != SourceKind::kFile) return OpenRegion(spec);  // nothing else is created
  struct stat st {};
  if (::stat(spec.path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(spec.path,
                       ": file does not exist (this command only reads and never creates one); "
                       "check the path, or create an arena there with `cxlkvctl arena format ",
                       spec.ToString(), "`"));
    }
    return base::ErrnoStatus(errno, spec.path, "stat");
  }
  if (S_ISREG(st.st_mode) && spec.size_bytes != 0 &&
      static_cast<std::uint64_t>(st.st_size) != spec.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.path, ": file is ", st.st_size, " bytes but the spec asks for ", spec.size_bytes,
        " (this command only reads and never resizes it); drop size= to use the file as it is"));
  }
  SourceSpec as_is = spec;
  as_is.size_bytes = 0;  // the file at its size: nothing created, extended or truncated
  return OpenRegion(as_is);
}

}  // namespace cxlkv::pool
