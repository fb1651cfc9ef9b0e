// cxlkv/pool/region.h — one mapped memory source (devdax, kmem, file, memfd).
//
// OpenRegion() is the backend seam: every backend produces the same Region, a MAP_SHARED
// mapping of a file descriptor with a known size and alignment, so arenas, tests and tools
// run the same code on /dev/daxX.Y as on a file in /dev/shm. Each kind opens its source in its
// own file (pool/src/region_<kind>.cc, behind the table in pool/src/region_source.h); the
// page and window checks and the mapping are shared (region.cc).
//   devdax: size and alignment from libdaxctl; the mapping honours the device alignment.
//   kmem:   an anonymous shmem object whose pages are bound to the NUMA node (mbind
//           MPOL_BIND), so it is shared with fork()ed children only.
//   file:   created with ?size= (and fallocated unless reserve=0), or opened at its size.
//   memfd:  memfd_create(); shared with fork()ed children or via /proc/PID/fd/N.
// A Region is immutable after creation and safe to read from any thread; destroying it
// unmaps the memory. Destroying a window (a spec with offset= and length=: one extent of a
// pooled source, which another host may hold next) first seals it read-only and writes every
// line of it back (give_away.h), so nothing this host wrote can land after it changed hands.
#ifndef CXLKV_POOL_REGION_H_
#define CXLKV_POOL_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::pool {

class Region {
 public:
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  std::byte* addr() const noexcept { return addr_; }
  std::uint64_t size_bytes() const noexcept { return size_bytes_; }
  // Alignment the arena must respect for block placement (device alignment for devdax,
  // the page size otherwise).
  std::uint64_t alignment() const noexcept { return alignment_; }
  const SourceSpec& spec() const noexcept { return spec_; }
  // Name for messages, e.g. "/dev/dax0.0" or "memfd:cxlkv".
  const std::string& name() const noexcept { return name_; }
  int fd() const noexcept { return fd_; }

  // A second, independent mapping of the same memory (dup of the descriptor). Lets a
  // memfd outlive one user: the pool keeps the original, each arena gets a duplicate.
  absl::StatusOr<std::unique_ptr<Region>> Duplicate() const;

  // Enters this mapping in give_away.h's table, for a party that may have to give the memory
  // away after handing the Region to someone else (WithTrackedRegion). Idempotent; the id
  // stays valid until the Region is destroyed. Not thread-safe: call it before sharing.
  std::uint64_t Track();

 private:
  friend absl::StatusOr<std::unique_ptr<Region>> OpenRegionAt(const SourceSpec&, void*);
  Region() = default;

  SourceSpec spec_;
  std::string name_;
  std::byte* addr_ = nullptr;
  std::uint64_t size_bytes_ = 0;
  std::uint64_t alignment_ = 0;
  int fd_ = -1;
  bool in_reservation_ = false;
  std::uint64_t tracked_id_ = 0;  // Track()
};

// Opens and maps a source. Errors name the source and the fix: kNotFound (no such device,
// file or node), kPermissionDenied, kInvalidArgument (size not a multiple of the page or
// device alignment, size mismatch with an existing file), kResourceExhausted (no space to
// reserve the file), kFailedPrecondition (device in the wrong mode).
absl::StatusOr<std::unique_ptr<Region>> OpenRegion(const SourceSpec& spec);
absl::StatusOr<std::unique_ptr<Region>> OpenRegion(absl::string_view spec);
// For read-only commands (`cxlkvctl arena info`): opens an existing source at its size and
// never creates, extends or truncates a file. A file spec's size= must match the file
// (kInvalidArgument otherwise); a missing file is kNotFound naming the path and the fix.
// Other kinds open as OpenRegion does (they create nothing that outlives the process).
absl::StatusOr<std::unique_ptr<Region>> OpenExistingRegion(const SourceSpec& spec);
// The same, mapped at `at` (MAP_FIXED; nullptr: anywhere) inside an address range the
// caller reserved (e.g. a PROT_NONE placeholder): `at` must be aligned to the source's
// alignment. Destroying such a Region puts an inaccessible placeholder back instead of
// unmapping, so the reservation stays whole. Not for kmem.
absl::StatusOr<std::unique_ptr<Region>> OpenRegionAt(const SourceSpec& spec, void* at);

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_REGION_H_
