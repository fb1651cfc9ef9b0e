// cxlkv/preload/shm_backing.h — shared-memory files backed by the CXL pool (CXLKV_SHM).
//
// Modern vLLM keeps its CPU KV offload tier in one file, /dev/shm/vllm_offload_<id>.mmap: the
// first worker creates it (O_CREAT|O_EXCL) and ftruncates it, every worker mmaps it
// MAP_SHARED, populates it (MADV_POPULATE_WRITE, or MAP_POPULATE in older releases) and
// registers it with cudaHostRegister. No cudaHostAlloc, no large malloc: the shim's heap never
// sees it. ShmBacking puts such a file in the pool when it is mapped — identified at mmap
// time by the path of the descriptor (/proc/self/fd/N), matched against a glob — with no
// change to the engine:
//
//   kmem:node=N   the mapping is the file's own, bound to node N (mbind MPOL_BIND on the
//                 MAP_SHARED range before anything populates it). tmpfs keeps the policy on
//                 the file, so every page any process faults in afterwards lands on N.
//   devdax:, file:  the file's pages are not used at all: the first process to map it claims
//                 a run of the pool's blocks (zeroed, persisted: they outlive the process)
//                 and records it beside the file (layout.h); every process maps that extent
//                 of the pool device or file instead, at the same offsets. The extent is
//                 freed once the file is unlinked and no process maps it any more.
//
// What a process sees is what the file would give: zeros at first, one memory for every
// process mapping it, fork keeps it shared, exec drops it. A binding that cannot be made (the
// pool is full) is recorded too, so that every process then maps the file itself rather
// than some of them the pool. Limits (docs/preload.md): the extent has the file's size when
// first mapped (a later mapping beyond it fails with EINVAL); msync/fsync of the file do not
// reach the extent; a kmem page the file already had before the binding stays where it is.
//
// Thread-safe. Every method that touches the OS is noexcept and reports what it could not do
// through the log (once per reason) and its result; none allocates from the shim's heap (the
// shim calls them under its guard).
#ifndef CXLKV_PRELOAD_SHM_BACKING_H_
#define CXLKV_PRELOAD_SHM_BACKING_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::preload {

// fnmatch(3) with FNM_PATHNAME: '*' and '?' do not match '/'.
bool ShmPathMatches(const char* glob, const char* path) noexcept;

// The sidecar file of a bound file (layout.h): <dir>/.<base>.<ino>.<btime hex>.cxlkv.
std::string ShmSidecarPath(const std::string& file_path, std::uint64_t ino, std::int64_t btime_ns);

class ShmBacking {
 public:
  // pool: kmem (the node must exist), devdax or file (the pool's arena is opened, and a blank
  // pool formatted, at the first binding). glob: absolute paths to back.
  static absl::StatusOr<std::unique_ptr<ShmBacking>> Create(const pool::SourceSpec& pool,
                                                            std::string glob);
  ~ShmBacking();
  ShmBacking(const ShmBacking&) = delete;
  ShmBacking& operator=(const ShmBacking&) = delete;

  enum class Outcome : std::uint8_t {
    kNotMatched,  // not a matching file (or not one this can back): map the file as asked
    kMapped,      // `addr` is the mapping; `bound` says whether the pool backs it
    kFailed,      // the mmap must fail with `err` (the file is bound to memory not mappable)
  };
  struct Mapped {
    Outcome outcome = Outcome::kNotMatched;
    void* addr = nullptr;
    int err = 0;
    bool bound = false;     // kMapped: on the pool (bound to the node, or an extent of it)
    std::size_t bytes = 0;  // kMapped: the mapping's length
    bool matched = false;   // the file matched the glob (kNotMatched: but stays in its file)
  };
  // An mmap(addr, len, prot, flags, fd, off) whose flags are MAP_SHARED (or
  // MAP_SHARED_VALIDATE) and fd >= 0. The caller returns kMapped's addr, or MAP_FAILED with
  // errno = err for kFailed, or makes the mapping itself for kNotMatched.
  Mapped Map(void* addr, std::size_t len, int prot, int flags, int fd, off_t off) noexcept;

  // Before the caller's munmap(addr, len): the length to unmap. A device-DAX extent mapping is
  // longer than asked (rounded to the device alignment, which the kernel also requires of a
  // partial unmap): a munmap of all the caller asked for covers the rounding too.
  std::size_t UnmapLength(const void* addr, std::size_t len) const noexcept;
  // The caller's munmap(addr, len) succeeded: a bound extent it covers entirely is no longer
  // mapped by this mapping (its mapper lock is dropped), and freed if the file is gone.
  void Unmapped(const void* addr, std::size_t len) noexcept;
  // A file was unlinked; `before` is its lstat from just before (dirfd/path as given to
  // unlinkat). Frees its extent if nobody maps it.
  void Unlinked(int dirfd, const char* path, const struct stat& before) noexcept;
  // Frees the extents of files in `dir` that are gone and mapped by nobody; returns how many.
  std::size_t CollectGarbage(const std::string& dir) noexcept;

  // For tests: called in a binding between the sidecar's open and its lock, the window in
  // which another process's collector may find the sidecar empty and remove it (a process
  // descheduled there). nullptr (the default) calls nothing. Not for production use.
  static void SetBeforeSidecarLockHookForTesting(void (*hook)()) noexcept;

  // fork: the parent takes the lock before and releases it after; the child releases it
  // (its copies of the mapper descriptors keep the extents held while it maps them). Taken
  // and released in different pthread_atfork handlers, which the analysis cannot pair.
  void LockForFork() noexcept ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void UnlockAfterFork() noexcept ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }

  // Mappings of bound extents this process tracks (for munmap's fast check).
  std::size_t tracked() const noexcept { return ntracked_.load(std::memory_order_relaxed); }
  const pool::SourceSpec& pool_spec() const noexcept { return spec_; }
  std::string Describe() const;

 private:
  struct Tracked {
    std::uintptr_t addr = 0;
    std::size_t bytes = 0;  // mapped (device DAX: rounded up to the device alignment)
    std::size_t asked = 0;  // what the caller asked for, rounded to the page
    int lock_fd = -1;
    std::string sidecar;
  };
  static constexpr std::size_t kMaxTracked = 64;

  ShmBacking() = default;
  Mapped MapKmem(void* addr, std::size_t len, int prot, int flags, int fd, off_t off,
                 const char* path) noexcept;
  Mapped MapExtent(void* addr, std::size_t len, int prot, int flags, int fd, off_t off,
                   const std::string& path) noexcept;
  absl::Status EnsureArena() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CollectGarbage of every sidecar in dir but `skip` (a name).
  std::size_t CollectDirLocked(const std::string& dir, const std::string& skip) noexcept
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Collects one sidecar (see CollectGarbage).
  bool CollectLocked(int dirfd, const std::string& dir, const std::string& name) noexcept
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  pool::SourceSpec spec_;
  std::string glob_;
  // The arena, the table, binding and collecting in this process (base::Mutex:
  // docs/architecture.md).
  mutable base::Mutex mu_;
  std::unique_ptr<pool::Arena> arena_ ABSL_GUARDED_BY(mu_);
  std::uint32_t cls_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t stride_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t align_ ABSL_GUARDED_BY(mu_) = 0;
  std::string arena_error_ ABSL_GUARDED_BY(mu_);  // why the arena could not be opened (once)
  Tracked tracked_[kMaxTracked] ABSL_GUARDED_BY(mu_);
  std::atomic<std::size_t> ntracked_{0};
  std::atomic<bool> once_not_tmpfs_{false}, once_mbind_{false}, once_full_{false},
      once_table_{false}, once_arena_{false};
};

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_SHM_BACKING_H_
