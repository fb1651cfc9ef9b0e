// Shared-memory files backed by the pool (CXLKV_SHM): shm_backing.h is the contract,
// layout.h the sidecar record and its locks, docs/preload.md the user's view.
#include "cxlkv/preload/shm_backing.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/pool/layout.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/preload/cxl_heap.h"
#include "cxlkv/preload/layout.h"
#include "log.h"

namespace cxlkv::preload {
namespace {

constexpr std::size_t kPage = 4096;
constexpr int kMadvPopulateRead = 22;      // MADV_POPULATE_READ (Linux 5.14)
constexpr int kMadvPopulateWrite = 23;     // MADV_POPULATE_WRITE
constexpr int kMpolBind = 2;               // MPOL_BIND
constexpr unsigned kMpolMfMove = 1u << 1;  // MPOL_MF_MOVE

std::uint64_t RoundUp(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

// The path a descriptor was opened with, as the kernel knows it ("... (deleted)" once unlinked).
bool PathOfFd(int fd, std::string* out) {
  char link[64], buf[4096];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  out->assign(buf, static_cast<std::size_t>(n));
  return true;
}

// Inode, size and birth time (0 where the file system keeps none).
struct FileId {
  std::uint64_t dev = 0, ino = 0, size = 0;
  std::int64_t btime_ns = 0;
  mode_t mode = 0;
};
bool IdOf(int dirfd, const char* path, int flags, FileId* id) {
  struct statx sx {};
  if (::statx(dirfd, path, flags | AT_STATX_SYNC_AS_STAT, STATX_BASIC_STATS | STATX_BTIME, &sx) !=
      0) {
    return false;
  }
  id->dev = (std::uint64_t{sx.stx_dev_major} << 32) | sx.stx_dev_minor;
  id->ino = sx.stx_ino;
  id->size = sx.stx_size;
  id->mode = sx.stx_mode;
  id->btime_ns =
      (sx.stx_mask & STATX_BTIME) != 0
          ? static_cast<std::int64_t>(sx.stx_btime.tv_sec) * 1000000000 + sx.stx_btime.tv_nsec
          : 0;
  return true;
}

// Open-file-description locks on one byte of a sidecar (layout.h).
bool LockByte(int fd, off_t byte, short type, bool wait) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  for (;;) {
    if (::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return true;
    if (errno != EINTR) return false;
  }
}
void UnlockByte(int fd, off_t byte) { LockByte(fd, byte, F_UNLCK, false); }

bool ReadAll(int fd, void* buf, std::size_t n, off_t at) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    at += r;
  }
  return true;
}
bool WriteAll(int fd, const void* buf, std::size_t n, off_t at) {
  const auto* p = static_cast<const unsigned char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    at += r;
  }
  return true;
}

// A sidecar's record and block generations; false when there is none (empty, torn, foreign).
bool ReadBinding(int fd, ShmBindingRecord* rec, std::vector<std::uint32_t>* gens) {
  if (!ReadAll(fd, rec, sizeof(*rec), 0)) return false;
  if (!coherence::Check(*rec, kShmBindingMagic, kShmBindingVersion, kShmBindingVersion,
                        "shm binding")
           .ok()) {
    return false;
  }
  gens->assign(rec->block_count, 0);
  if (rec->block_count != 0 &&
      !ReadAll(fd, gens->data(), gens->size() * sizeof(std::uint32_t), sizeof(*rec))) {
    return false;
  }
  return coherence::Crc32c(gens->data(), gens->size() * sizeof(std::uint32_t)) == rec->gens_crc;
}

bool WriteBinding(int fd, ShmBindingRecord* rec, const std::vector<std::uint32_t>& gens) {
  rec->block_count = static_cast<std::uint32_t>(gens.size());
  rec->gens_crc = coherence::Crc32c(gens.data(), gens.size() * sizeof(std::uint32_t));
  coherence::Seal(*rec, kShmBindingMagic, kShmBindingVersion, 1);
  // Generations first, the record last: a reader that finds a sealed record finds its
  // generations complete (a crash in between leaves no valid record, only a file to collect).
  return ::ftruncate(fd, 0) == 0 &&
         (gens.empty() ||
          WriteAll(fd, gens.data(), gens.size() * sizeof(std::uint32_t), sizeof(*rec))) &&
         WriteAll(fd, rec, sizeof(*rec), 0);
}

void CopyText(char* dst, std::size_t cap, const std::string& s) {
  const std::size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

void SplitPath(const std::string& path, std::string* dir, std::string* base) {
  const auto slash = path.rfind('/');
  *dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  *base = slash == std::string::npos ? path : path.substr(slash + 1);
}

std::atomic<void (*)()> g_before_sidecar_lock{nullptr};

}  // namespace

void ShmBacking::SetBeforeSidecarLockHookForTesting(void (*hook)()) noexcept {
  g_before_sidecar_lock.store(hook, std::memory_order_release);
}

bool ShmPathMatches(const char* glob, const char* path) noexcept {
  return glob != nullptr && path != nullptr && ::fnmatch(glob, path, FNM_PATHNAME) == 0;
}

std::string ShmSidecarPath(const std::string& file_path, std::uint64_t ino, std::int64_t btime_ns) {
  std::string dir, base;
  SplitPath(file_path, &dir, &base);
  char tail[64];
  std::snprintf(tail, sizeof(tail), ".%" PRIu64 ".%" PRIx64 "%s", ino,
                static_cast<std::uint64_t>(btime_ns), kShmSidecarSuffix);
  return absl::StrCat(dir == "/" ? "" : dir, "/.", base, tail);
}

absl::StatusOr<std::unique_ptr<ShmBacking>> ShmBacking::Create(const pool::SourceSpec& pool,
                                                               std::string glob) {
  if (glob.empty() || glob.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "CXLKV_SHM '", glob, "': give a glob of absolute paths, e.g. /dev/shm/vllm_offload_*"));
  }
  if (pool.kind == pool::SourceKind::kMemfd) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CXLKV_SHM needs a pool other processes can map; ", pool.ToString(),
        " is private to this process tree: use kmem:node=N, devdax:/dev/daxX.Y or file:PATH"));
  }
  if (pool.kind == pool::SourceKind::kKmem) {
    const std::string node = absl::StrCat("/sys/devices/system/node/node", pool.numa_node);
    if (::access(node.c_str(), F_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          pool.ToString(), ": no NUMA node ", pool.numa_node, " (", node,
          " is missing); online the CXL memory as system RAM (daxctl reconfigure-device "
          "--mode=system-ram) and name its node"));
    }
  }
  std::unique_ptr<ShmBacking> b(new ShmBacking());
  b->spec_ = pool;
  b->glob_ = std::move(glob);
  return b;
}

ShmBacking::~ShmBacking() {
  for (Tracked& t : tracked_) {
    if (t.lock_fd >= 0) ::close(t.lock_fd);
  }
}

std::string ShmBacking::Describe() const {
  return absl::StrCat("CXLKV_SHM ", glob_, " -> ", spec_.ToString(),
                      spec_.kind == pool::SourceKind::kKmem ? " (pages bound to the node)"
                                                            : " (an extent of the pool per file)");
}

ShmBacking::Mapped ShmBacking::Map(void* addr, std::size_t len, int prot, int flags, int fd,
                                   off_t off) noexcept {
  std::string path;
  if (len == 0 || !PathOfFd(fd, &path) || !ShmPathMatches(glob_.c_str(), path.c_str())) {
    return {};
  }
  if (spec_.kind == pool::SourceKind::kKmem)
    return MapKmem(addr, len, prot, flags, fd, off, path.c_str());
  return MapExtent(addr, len, prot, flags, fd, off, path);
}

// ---- kmem: the file's own pages, bound to the node --------------------------------------------

ShmBacking::Mapped ShmBacking::MapKmem(void* addr, std::size_t len, int prot, int flags, int fd,
                                       off_t off, const char* path) noexcept {
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0 || (fs.f_type != TMPFS_MAGIC &&
                                  fs.f_type != static_cast<decltype(fs.f_type)>(HUGETLBFS_MAGIC))) {
    // A disk file's page cache ignores a mapping's memory policy: binding would do nothing.
    if (FirstTime(once_not_tmpfs_)) {
      Logf(LogLevel::kWarn,
           "CXLKV_SHM: %s is not on tmpfs or hugetlbfs; its pages cannot be "
           "bound to kmem:node=%d and it is mapped as it is",
           path, spec_.numa_node);
    }
    return {};
  }
  // Bind before anything is populated: MAP_POPULATE is done here, after the policy.
  void* p = ::mmap(addr, len, prot, flags & ~MAP_POPULATE, fd, off);
  if (p == MAP_FAILED) return {Outcome::kFailed, nullptr, errno, false, 0, true};
  const std::size_t bytes = RoundUp(len, kPage);
  const auto node = static_cast<unsigned>(spec_.numa_node);
  unsigned long mask[16] = {};  // nodes 0..1023
  bool bound = false;
  if (node < 1024) {
    mask[node / 64] |= 1ul << (node % 64);
    // tmpfs stores the policy with the file's range (a shared policy), so it holds for every
    // page any process faults in later, not only through this mapping. MPOL_MF_MOVE also
    // moves pages this mapping already has (a file written before it was mapped).
    bound = ::syscall(SYS_mbind, p, bytes, kMpolBind, mask, 1025ul, kMpolMfMove) == 0;
  } else {
    errno = EINVAL;
  }
  const int err = errno;
  if (!bound && FirstTime(once_mbind_)) {
    Logf(LogLevel::kWarn,
         "CXLKV_SHM: mbind of %s to node %d failed: %s; its pages go where the "
         "kernel puts them",
         path, spec_.numa_node, base::ErrnoText(err).c_str());
  }
  if ((flags & MAP_POPULATE) != 0) {
    (void)::madvise(p, bytes, (prot & PROT_WRITE) != 0 ? kMadvPopulateWrite : kMadvPopulateRead);
  }
  Logf(LogLevel::kInfo, "CXLKV_SHM: %s [%lld, +%zu) %s node %d", path, static_cast<long long>(off),
       len, bound ? "bound to" : "NOT bound to", spec_.numa_node);
  return {Outcome::kMapped, p, 0, bound, len, true};
}

// ---- devdax / file: an extent of the pool instead of the file ----------------------------------

absl::Status ShmBacking::EnsureArena() {
  if (arena_ != nullptr) return absl::OkStatus();
  if (!arena_error_.empty()) return absl::FailedPreconditionError(arena_error_);
  auto arena = OpenPoolArena(spec_);
  if (!arena.ok()) {
    arena_error_ = std::string(arena.status().message());
    return arena.status();
  }
  arena_ = *std::move(arena);
  cls_ = 0;
  for (std::uint32_t c = 1; c < arena_->class_count(); ++c) {
    if (arena_->class_record(c).stride_bytes < arena_->class_record(cls_).stride_bytes) cls_ = c;
  }
  stride_ = arena_->class_record(cls_).stride_bytes;
  align_ = std::max<std::uint64_t>(arena_->region().alignment(), kPage);
  return absl::OkStatus();
}

ShmBacking::Mapped ShmBacking::MapExtent(void* addr, std::size_t len, int prot, int flags, int fd,
                                         off_t off, const std::string& path) noexcept {
  const char* name = path.c_str();
  if (path.size() > 10 && path.compare(path.size() - 10, 10, " (deleted)") == 0) {
    Logf(LogLevel::kInfo, "CXLKV_SHM: %s is unlinked; mapped as it is", name);
    return {};
  }
  FileId id;
  if (!IdOf(fd, "", AT_EMPTY_PATH, &id) || !S_ISREG(id.mode) || id.size == 0 || off < 0) return {};
  base::MutexLock lock(mu_);
  if (auto st = EnsureArena(); !st.ok()) {
    if (FirstTime(once_arena_)) {
      Logf(LogLevel::kError,
           "CXLKV_SHM: cannot open the pool for %s: %s; matching files are "
           "mapped as they are",
           name, std::string(st.message()).c_str());
    }
    return {};
  }
  const std::string sidecar = ShmSidecarPath(path, id.ino, id.btime_ns);
  // Opened (or created) and then locked: between the two, another process's collector may
  // lock the still-empty sidecar first, read no binding and remove it. The lock then holds a
  // file no one else will open, and a binding written there would be seen by no other process
  // (which would bind the same file to another extent): after the lock, the descriptor must
  // still be the file at the sidecar's path, or it starts over.
  int lfd = -1;
  for (int attempt = 0;; ++attempt) {
    lfd =
        ::open(sidecar.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (id.mode & 0666) | 0600);
    if (lfd >= 0) {
      if (auto hook = g_before_sidecar_lock.load(std::memory_order_acquire)) hook();
    }
    if (lfd < 0 || !LockByte(lfd, kShmRecordLockByte, F_WRLCK, true)) {
      const int err = errno;
      if (lfd >= 0) ::close(lfd);
      Logf(LogLevel::kError, "CXLKV_SHM: cannot create or lock %s: %s; %s is mapped as it is",
           sidecar.c_str(), base::ErrnoText(err).c_str(), name);
      return {};
    }
    struct stat held {
    }, linked{};
    if (::fstat(lfd, &held) == 0 && held.st_nlink > 0 && ::stat(sidecar.c_str(), &linked) == 0 &&
        held.st_dev == linked.st_dev && held.st_ino == linked.st_ino) {
      break;
    }
    UnlockByte(lfd, kShmRecordLockByte);
    ::close(lfd);
    if (attempt == 100) {
      Logf(LogLevel::kError,
           "CXLKV_SHM: %s was removed under this process 100 times in a row; %s is mapped as "
           "it is",
           sidecar.c_str(), name);
      return {};
    }
  }
  auto fail = [&](int err, const std::string& why) -> Mapped {
    Logf(LogLevel::kError, "CXLKV_SHM: %s: %s", name, why.c_str());
    UnlockByte(lfd, kShmRecordLockByte);
    ::close(lfd);
    return {Outcome::kFailed, nullptr, err, false, 0, true};
  };
  ShmBindingRecord rec;
  std::vector<std::uint32_t> gens;
  const bool have = ReadBinding(lfd, &rec, &gens) && rec.file_dev == id.dev &&
                    rec.file_ino == id.ino && rec.file_btime_ns == id.btime_ns;
  if (!have) {
    // The first mapping of this file anywhere: claim the extent, or record that the pool
    // cannot hold it, so that every other process does the same as this one.
    rec = ShmBindingRecord{};
    rec.file_dev = id.dev;
    rec.file_ino = id.ino;
    rec.file_btime_ns = id.btime_ns;
    rec.file_bytes = id.size;
    rec.cls = cls_;
    std::memcpy(rec.arena_uuid, arena_->uuid().data(), sizeof(rec.arena_uuid));
    CopyText(rec.pool, sizeof(rec.pool), spec_.ToString());
    const std::uint64_t need = RoundUp(RoundUp(id.size, align_), stride_);
    std::uint64_t blocks = need / stride_;
    std::int64_t first = -1;
    // A device-DAX extent must start on the device alignment, and the pool's blocks need not
    // (the data area starts after the metadata): when no run starts aligned, a run longer by
    // what it takes to reach the next aligned address holds an aligned extent (the heap does
    // the same for jemalloc's aligned requests).
    const std::uint64_t lead_blocks = align_ > kPage ? (align_ + stride_ - 1) / stride_ : 0;
    auto claim = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      std::int64_t f = -1;
      if (blocks <= arena_->class_record(cls_).block_count) {
        f = arena_->ClaimRun(cls_, static_cast<std::uint32_t>(blocks), align_);
      }
      if (f < 0 && lead_blocks > 0 &&
          blocks + lead_blocks <= arena_->class_record(cls_).block_count) {
        f = arena_->ClaimRun(cls_, static_cast<std::uint32_t>(blocks + lead_blocks), 0);
        if (f >= 0) blocks += lead_blocks;
      }
      return f;
    };
    first = claim();
    if (first < 0 && arena_->MaybeRecover().blocks_reclaimed > 0) first = claim();
    if (first >= 0) {
      // Claimed (kCached under this process's owner), then handed out and persisted: the
      // extent outlives this process; only the collector frees it (layout.h).
      const auto f = static_cast<std::uint32_t>(first);
      gens.resize(blocks);
      bool ok = true;
      for (std::uint32_t i = 0; i < blocks && ok; ++i) {
        pool::BlockWord& w = arena_->word(f + i);
        std::uint64_t v = w.load(std::memory_order_acquire);
        gens[i] = pool::WordGen(v);
        ok = pool::WordState(v) == pool::kCached &&
             w.compare_exchange_strong(
                 v,
                 pool::PackWord(pool::kAllocated, pool::WordOwner(v), gens[i], pool::WordClass(v)),
                 std::memory_order_acq_rel) &&
             arena_->Persist(f + i, gens[i]);
      }
      if (!ok) {
        // Cannot happen while this process holds the run; leave it to Recover (the blocks
        // not yet persisted are this process's and return when it exits).
        return fail(EIO, "the pool's map changed under a claimed run; not bound");
      }
      // The extent: the run's first aligned address (the run's start unless it was lengthened).
      std::byte* run = arena_->BlockAddr(f);
      std::byte* start = run + (RoundUp(reinterpret_cast<std::uintptr_t>(run), align_) -
                                reinterpret_cast<std::uintptr_t>(run));
      // A new file reads as zeros; the blocks may hold an earlier user's bytes.
      std::memset(start, 0, need);
      rec.state = static_cast<std::uint32_t>(ShmBindingState::kBound);
      rec.first_block = f;
      rec.extent_bytes = need;
      rec.source_offset = arena_->region().spec().offset +
                          static_cast<std::uint64_t>(start - arena_->region().addr());
    } else {
      gens.clear();
      rec.state = static_cast<std::uint32_t>(ShmBindingState::kPassThrough);
      CopyText(rec.reason, sizeof(rec.reason),
               absl::StrCat("the pool has no free run of ", base::FormatBytes(need), " (", blocks,
                            " blocks of ", base::FormatBytes(stride_), ", starting on a ",
                            base::FormatBytes(align_), " boundary)"));
    }
    if (!WriteBinding(lfd, &rec, gens)) {
      const int err = errno;
      if (first >= 0) {
        for (std::uint32_t i = 0; i < gens.size(); ++i) {
          arena_->FreeShared(static_cast<std::uint32_t>(first) + i, gens[i]);
        }
      }
      return fail(err, absl::StrCat("cannot write ", sidecar, ": ", base::ErrnoText(err)));
    }
    if (first >= 0) {
      Logf(LogLevel::kInfo,
           "CXLKV_SHM: %s (%llu bytes) bound to %s blocks [%u, +%u) at offset "
           "%llu",
           name, static_cast<unsigned long long>(id.size), spec_.ToString().c_str(),
           rec.first_block, rec.block_count, static_cast<unsigned long long>(rec.source_offset));
    }
  }
  if (rec.state == static_cast<std::uint32_t>(ShmBindingState::kPassThrough)) {
    if (FirstTime(once_full_)) {
      Logf(LogLevel::kWarn, "CXLKV_SHM: %s stays in its file: %s", name, rec.reason);
    }
    UnlockByte(lfd, kShmRecordLockByte);
    ::close(lfd);
    Mapped m;
    m.matched = true;
    return m;
  }
  if (std::memcmp(rec.arena_uuid, arena_->uuid().data(), sizeof(rec.arena_uuid)) != 0) {
    return fail(ENXIO, absl::StrCat("bound to another pool (", rec.pool, ") than this process's ",
                                    spec_.ToString(),
                                    "; run every process with the same "
                                    "CXLKV_POOL"));
  }
  const std::uint64_t offset = static_cast<std::uint64_t>(off);
  if (offset % align_ != 0 || offset + len > rec.extent_bytes) {
    return fail(EINVAL, absl::StrCat("[", offset, ", +", len, ") is outside its extent of ",
                                     rec.extent_bytes,
                                     " bytes (the file's size when it was "
                                     "first mapped) or not on a ",
                                     align_,
                                     "-byte boundary of "
                                     "it; unmap it everywhere and unlink it to start over, or "
                                     "leave it out of CXLKV_SHM"));
  }
  // The extent, mapped like the file would be. A device-DAX mapping must start and end on the
  // device's alignment: the extent is rounded to it, and without MAP_FIXED the address is
  // chosen inside an aligned reservation.
  const int pool_fd = arena_->region().fd();
  const int map_flags = (flags & ~MAP_TYPE) | MAP_SHARED;
  std::size_t bytes = RoundUp(len, kPage);
  void* p = MAP_FAILED;
  if (align_ > kPage && (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) == 0) {
    bytes = RoundUp(bytes, align_);
    void* r = ::mmap(nullptr, bytes + align_, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r != MAP_FAILED) {
      const auto lo = reinterpret_cast<std::uintptr_t>(r);
      const std::uintptr_t at = RoundUp(lo, align_);
      if (at > lo) ::munmap(r, at - lo);
      if (at + bytes < lo + bytes + align_) {
        ::munmap(reinterpret_cast<void*>(at + bytes), lo + bytes + align_ - (at + bytes));
      }
      p = ::mmap(reinterpret_cast<void*>(at), bytes, prot, map_flags | MAP_FIXED, pool_fd,
                 static_cast<off_t>(rec.source_offset + offset));
      if (p == MAP_FAILED) {
        const int err = errno;
        ::munmap(reinterpret_cast<void*>(at), bytes);
        errno = err;
      }
    }
  } else {
    p = ::mmap(addr, bytes, prot, map_flags, pool_fd,
               static_cast<off_t>(rec.source_offset + offset));
  }
  if (p == MAP_FAILED) {
    const int err = errno;
    return fail(err, absl::StrCat("mmap of its extent in ", spec_.ToString(),
                                  " failed: ", base::ErrnoText(err)));
  }
  // This process maps the extent now: the mapper lock stays with the descriptor until the
  // mapping goes (Unmapped) or the process does.
  if (!LockByte(lfd, kShmMapperLockByte, F_RDLCK, false)) {
    const int err = errno;
    ::munmap(p, bytes);
    return fail(
        err, absl::StrCat("cannot take the mapper lock of ", sidecar, ": ", base::ErrnoText(err)));
  }
  UnlockByte(lfd, kShmRecordLockByte);
  std::size_t slot = kMaxTracked;
  for (std::size_t i = 0; i < kMaxTracked && slot == kMaxTracked; ++i) {
    if (tracked_[i].lock_fd < 0) slot = i;
  }
  if (slot < kMaxTracked) {
    tracked_[slot] =
        Tracked{reinterpret_cast<std::uintptr_t>(p), bytes, RoundUp(len, kPage), lfd, sidecar};
    ntracked_.fetch_add(1, std::memory_order_relaxed);
  } else if (FirstTime(once_table_)) {
    // The descriptor stays open (and the extent held) until the process exits.
    Logf(LogLevel::kWarn,
         "CXLKV_SHM: more than %zu bound mappings at once; the extents of the "
         "rest stay held until the process exits",
         kMaxTracked);
  }
  // Collect what earlier runs left in the same directory (files gone, nobody mapping them).
  std::string dir, base;
  SplitPath(path, &dir, &base);
  CollectDirLocked(dir, sidecar.substr(sidecar.rfind('/') + 1));
  return {Outcome::kMapped, p, 0, true, len, true};
}

// ---- collecting extents nobody maps -------------------------------------------------------------

bool ShmBacking::CollectLocked(int dirfd, const std::string& dir,
                               const std::string& name) noexcept {
  const int fd = ::openat(dirfd, name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  bool freed = false;
  if (LockByte(fd, kShmRecordLockByte, F_WRLCK, false)) {
    ShmBindingRecord rec;
    std::vector<std::uint32_t> gens;
    const bool valid = ReadBinding(fd, &rec, &gens);
    // The file the sidecar names: .<base>.<ino>.<btime>.cxlkv.
    bool file_gone = true;
    if (valid) {
      const std::string stem = name.substr(1, name.size() - 1 - std::strlen(kShmSidecarSuffix));
      const auto dot2 = stem.rfind('.');
      const auto dot1 = dot2 == std::string::npos ? std::string::npos : stem.rfind('.', dot2 - 1);
      if (dot1 != std::string::npos) {
        FileId now;
        const std::string base = stem.substr(0, dot1);
        file_gone = !IdOf(dirfd, base.c_str(), AT_SYMLINK_NOFOLLOW, &now) ||
                    now.ino != rec.file_ino || now.btime_ns != rec.file_btime_ns;
      }
    }
    const bool ours = valid && rec.state == static_cast<std::uint32_t>(ShmBindingState::kBound) &&
                      arena_ != nullptr &&
                      std::memcmp(rec.arena_uuid, arena_->uuid().data(), 16) == 0;
    const bool foreign_pool =
        valid && rec.state == static_cast<std::uint32_t>(ShmBindingState::kBound) && !ours;
    // Freed only when nobody maps it: byte 1 exclusive fails while any mapper holds it shared.
    if (file_gone && !foreign_pool && LockByte(fd, kShmMapperLockByte, F_WRLCK, false)) {
      if (ours) {
        for (std::uint32_t i = 0; i < rec.block_count; ++i) {
          arena_->FreeShared(rec.first_block + i, gens[i]);
        }
        Logf(LogLevel::kInfo,
             "CXLKV_SHM: freed the extent of %s/%s (%u blocks): the file is "
             "gone and nobody maps it",
             dir.c_str(), name.c_str(), rec.block_count);
      }
      // Emptied before it goes, so a process that opened it meanwhile finds no binding.
      (void)!::ftruncate(fd, 0);
      ::unlinkat(dirfd, name.c_str(), 0);
      freed = ours;
    }
  }
  ::close(fd);  // drops both locks
  return freed;
}

std::size_t ShmBacking::CollectDirLocked(const std::string& dir, const std::string& skip) noexcept {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return 0;
  DIR* d = ::fdopendir(dfd);
  if (d == nullptr) {
    ::close(dfd);
    return 0;
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 7 && n[0] == '.' && n.compare(n.size() - 6, 6, kShmSidecarSuffix) == 0 &&
        n != skip) {
      names.push_back(n);
    }
  }
  std::size_t freed = 0;
  for (const std::string& n : names) freed += CollectLocked(::dirfd(d), dir, n) ? 1 : 0;
  ::closedir(d);
  return freed;
}

std::size_t ShmBacking::CollectGarbage(const std::string& dir) noexcept {
  base::MutexLock lock(mu_);
  if (spec_.kind == pool::SourceKind::kKmem || !EnsureArena().ok()) return 0;
  return CollectDirLocked(dir, "");
}

std::size_t ShmBacking::UnmapLength(const void* addr, std::size_t len) const noexcept {
  if (ntracked_.load(std::memory_order_relaxed) == 0) return len;
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  base::MutexLock lock(mu_);
  for (const Tracked& t : tracked_) {
    if (t.lock_fd >= 0 && t.addr == lo && len >= t.asked && len < t.bytes) return t.bytes;
  }
  return len;
}

void ShmBacking::Unmapped(const void* addr, std::size_t len) noexcept {
  if (ntracked_.load(std::memory_order_relaxed) == 0) return;
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  base::MutexLock lock(mu_);
  for (Tracked& t : tracked_) {
    if (t.lock_fd < 0 || t.addr < lo || t.addr + t.bytes > lo + len) continue;
    // The whole extent mapping is gone: drop this mapping's claim, then collect the extent
    // if its file was unlinked while it was mapped.
    ::close(t.lock_fd);
    t.lock_fd = -1;
    ntracked_.fetch_sub(1, std::memory_order_relaxed);
    std::string dir, name;
    SplitPath(t.sidecar, &dir, &name);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      CollectLocked(dfd, dir, name);
      ::close(dfd);
    }
  }
}

void ShmBacking::Unlinked(int dirfd, const char* path, const struct stat& before) noexcept {
  if (spec_.kind == pool::SourceKind::kKmem || !S_ISREG(before.st_mode)) return;
  // The sidecar's name needs the birth time, which lstat does not give: look for any sidecar
  // of this name and inode in the directory.
  const std::string p = path;
  std::string dir, base;
  SplitPath(p, &dir, &base);
  const std::string prefix = absl::StrCat(".", base, ".", before.st_ino, ".");
  base::MutexLock lock(mu_);
  if (!EnsureArena().ok()) return;
  const int dfd = ::openat(dirfd, dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  DIR* d = ::fdopendir(dfd);
  if (d == nullptr) {
    ::close(dfd);
    return;
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.compare(0, prefix.size(), prefix) == 0 && n.size() > prefix.size() + 6 &&
        n.compare(n.size() - 6, 6, kShmSidecarSuffix) == 0) {
      names.push_back(n);
    }
  }
  for (const std::string& n : names) CollectLocked(::dirfd(d), dir, n);
  ::closedir(d);
}

}  // namespace cxlkv::preload
