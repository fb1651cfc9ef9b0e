// The CXL heap: a jemalloc arena over a cxlkv arena's blocks (devdax, file, memfd), or
// memkind's MEMKIND_DAX_KMEM (kmem). See cxl_heap.h and docs/preload.md.
#include "cxlkv/preload/cxl_heap.h"

#include <fcntl.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlkv/config.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/preload/pointer_set.h"
#include "log.h"
#if CXLKV_HAVE_MEMKIND
#include <memkind.h>
#endif

namespace cxlkv::preload {
namespace {

constexpr std::size_t kPageBytes = 4096;
constexpr std::size_t kMaxRuns = 4096;

// jemalloc is linked (its TLS is initial-exec, so it cannot be dlopen()ed after start-up)
// and called only through its explicit API (mallocx, rallocx, dallocx, sallocx, mallctl).
// Debian's build has no symbol prefix, so it also exports malloc/free/... and the C++
// operators new/delete; libcxlkv_preload.so defines every one of those itself, and being
// first in the global scope, shadows jemalloc's: nothing of the process reaches jemalloc's
// default arenas (docs/preload.md, "jemalloc interplay").

// ---- jemalloc over a cxlkv arena ----------------------------------------------------------

class JemallocHeap final : public CxlHeap {
 public:
  static absl::StatusOr<std::unique_ptr<CxlHeap>> Open(const pool::SourceSpec& spec);
  ~JemallocHeap() override;

  void* Alloc(std::size_t bytes, std::size_t align, bool zero) noexcept override {
    int f = flags_ | (zero ? MALLOCX_ZERO : 0);
    if (align > 16) f |= MALLOCX_ALIGN(align);
    return mallocx(bytes == 0 ? 1 : bytes, f);
  }
  void Free(void* p) noexcept override { dallocx(p, MALLOCX_TCACHE_NONE); }
  void* Realloc(void* p, std::size_t bytes) noexcept override {
    return rallocx(p, bytes == 0 ? 1 : bytes, flags_);
  }
  std::size_t UsableSize(const void* p) const noexcept override {
    return sallocx(const_cast<void*>(p), 0);
  }
  bool Owns(const void* p) const noexcept override { return range_.Contains(p); }
  AddressRange range() const noexcept override { return range_; }
  bool RestoreMapping(void* addr, std::size_t bytes) noexcept override;
  void PrepareFork() noexcept override;
  void ParentAfterFork() noexcept override;
  void ChildAfterFork() noexcept override;
  std::uint64_t held_bytes() const noexcept override {
    return held_bytes_.load(std::memory_order_relaxed);
  }
  std::string Describe() const override;

 private:
  struct Run {
    std::uintptr_t addr;
    std::uint64_t bytes;
    std::uint32_t first;
    std::uint32_t n;
    bool inherited;  // copied from the parent at fork: private memory, not ours in the arena
  };
  // extent_hooks_t first, so a hook's extent_hooks_t* is also the JemallocHeap's box.
  struct HookBox {
    extent_hooks_t hooks;
    JemallocHeap* heap;
  };

  JemallocHeap() = default;
  static JemallocHeap* Self(extent_hooks_t* h) { return reinterpret_cast<HookBox*>(h)->heap; }
  static void* HookAlloc(extent_hooks_t* h, void* new_addr, std::size_t size, std::size_t alignment,
                         bool* zero, bool* commit, unsigned arena_ind);
  static bool HookDalloc(extent_hooks_t*, void*, std::size_t, bool, unsigned) { return true; }
  static void HookDestroy(extent_hooks_t* h, void* addr, std::size_t size, bool, unsigned);
  static bool HookCommit(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, unsigned) {
    return false;  // always committed
  }
  static bool HookDecommit(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t,
                           unsigned) {
    return true;  // refused: the pages stay committed
  }
  static bool HookSplit(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, bool,
                        unsigned) {
    return false;  // any split of contiguous memory is fine
  }
  static bool HookMerge(extent_hooks_t*, void*, std::size_t, void*, std::size_t, bool, unsigned) {
    return false;
  }
  const Run* RunOf(std::uintptr_t addr) const noexcept;  // mu_ held

  std::unique_ptr<pool::Arena> arena_;
  std::uint32_t cls_ = 0;
  std::uint64_t stride_ = 0;
  AddressRange range_;
  unsigned arena_ind_ = 0;
  int flags_ = 0;
  HookBox box_{};
  mutable pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  Run runs_[kMaxRuns] = {};
  std::size_t nruns_ = 0;
  std::atomic<std::uint64_t> held_bytes_{0};
  void* shadow_ = nullptr;  // PrepareFork's private copy of the runs
};

absl::StatusOr<std::unique_ptr<CxlHeap>> JemallocHeap::Open(const pool::SourceSpec& spec) {
  auto region = pool::OpenRegion(spec);
  if (!region.ok()) return region.status();
  const std::string name = (*region)->name();
  // Processes starting at once must not both format a blank pool: serialize open/format on
  // the pool itself (an advisory lock on its file or device).
  const int lock_fd = (*region)->fd();
  const bool locked = ::flock(lock_fd, LOCK_EX) == 0;
  absl::StatusOr<std::unique_ptr<pool::Arena>> arena;
  {
    std::byte* base = (*region)->addr();
    std::uint64_t magic = 0;
    std::memcpy(&magic, base, sizeof(magic));
    bool blank = magic == 0;
    if (blank) {  // formatted only when the whole header page is zero
      for (std::size_t i = 0; i < kPageBytes && blank; ++i) blank = base[i] == std::byte{0};
    }
    if (blank) {
      pool::FormatOptions o;
      o.classes = {pool::ClassSpec{0, kChunkBytes, 1}};
      arena = pool::Arena::Format(std::move(*region), o);
    } else {
      arena = pool::Arena::Open(std::move(*region));
    }
  }
  if (locked) ::flock(lock_fd, LOCK_UN);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(),
                        absl::StrCat(arena.status().message(),
                                     " (the preload shim formats only a blank pool and otherwise "
                                     "needs a cxlkv arena there)"));
  }
  std::unique_ptr<JemallocHeap> h(new JemallocHeap());
  h->arena_ = std::move(*arena);
  // The class with the smallest blocks: finest extents.
  for (std::uint32_t c = 1; c < h->arena_->class_count(); ++c) {
    if (h->arena_->class_record(c).stride_bytes < h->arena_->class_record(h->cls_).stride_bytes) {
      h->cls_ = c;
    }
  }
  const pool::ClassRecord& k = h->arena_->class_record(h->cls_);
  h->stride_ = k.stride_bytes;
  const pool::Region& r = h->arena_->region();
  h->range_ = AddressRange{reinterpret_cast<std::uintptr_t>(r.addr()) + k.data_offset,
                           std::uint64_t{k.block_count} * k.stride_bytes};

  h->box_.hooks = extent_hooks_t{&HookAlloc, &HookDalloc, &HookDestroy, &HookCommit, &HookDecommit,
                                 nullptr,    nullptr,     &HookSplit,   &HookMerge};
  h->box_.heap = h.get();
  extent_hooks_t* hooks = &h->box_.hooks;
  unsigned ind = 0;
  std::size_t sz = sizeof(ind);
  if (int rc = mallctl("arenas.create", &ind, &sz, &hooks, sizeof(hooks)); rc != 0) {
    return absl::InternalError(absl::StrCat(
        name, ": jemalloc refused a new arena (arenas.create: ", std::strerror(rc), ")"));
  }
  h->arena_ind_ = ind;
  h->flags_ = static_cast<int>(MALLOCX_ARENA(ind)) | MALLOCX_TCACHE_NONE;
  // Never purge: purging a MAP_SHARED file mapping frees nothing (the pages stay in the
  // file) and would hand jemalloc pages it believes are zero. Freed memory stays in the
  // arena for reuse; the blocks return to the pool when the process ends.
  for (const char* key : {"dirty_decay_ms", "muzzy_decay_ms"}) {
    ssize_t never = -1;
    const std::string ctl = absl::StrCat("arena.", ind, ".", key);
    (void)mallctl(ctl.c_str(), nullptr, nullptr, &never, sizeof(never));
  }
  return std::unique_ptr<CxlHeap>(std::move(h));
}

JemallocHeap::~JemallocHeap() {
  // arena.<i>.destroy hands every extent back through HookDestroy; then the arena's
  // destructor returns this process's blocks to the pool.
  const std::string ctl = absl::StrCat("arena.", arena_ind_, ".destroy");
  (void)mallctl(ctl.c_str(), nullptr, nullptr, nullptr, 0);
  pthread_mutex_lock(&mu_);
  for (std::size_t i = 0; i < nruns_; ++i) {
    if (runs_[i].inherited) continue;
    std::uint32_t idx[64];
    for (std::uint32_t done = 0; done < runs_[i].n;) {
      const std::uint32_t m = std::min<std::uint32_t>(64, runs_[i].n - done);
      for (std::uint32_t j = 0; j < m; ++j) idx[j] = runs_[i].first + done + j;
      arena_->ReleaseCached(idx, m);
      done += m;
    }
  }
  nruns_ = 0;
  pthread_mutex_unlock(&mu_);
}

void* JemallocHeap::HookAlloc(extent_hooks_t* h, void* new_addr, std::size_t size,
                              std::size_t alignment, bool* zero, bool* commit, unsigned) {
  JemallocHeap* self = Self(h);
  if (new_addr != nullptr || size == 0) return nullptr;  // no placement at a given address
  if (alignment < kPageBytes) alignment = kPageBytes;
  const std::uint64_t n64 = (size + self->stride_ - 1) / self->stride_;
  // When no block start has the alignment (the region's mapping is only page-aligned), a
  // longer run holds an aligned extent: its head stays unused.
  const std::uint64_t padded64 =
      (size + alignment - kPageBytes + self->stride_ - 1) / self->stride_;
  if (padded64 > 0xFFFFFFFFu) return nullptr;
  pthread_mutex_lock(&self->mu_);
  void* out = nullptr;
  if (self->nruns_ < kMaxRuns) {
    auto n = static_cast<std::uint32_t>(n64);
    std::int64_t first = self->arena_->ClaimRun(self->cls_, n, alignment);
    if (first < 0 && alignment > kPageBytes) {
      n = static_cast<std::uint32_t>(padded64);
      first = self->arena_->ClaimRun(self->cls_, n, 0);
    }
    if (first >= 0) {
      const auto run = reinterpret_cast<std::uintptr_t>(
          self->arena_->BlockAddr(static_cast<std::uint32_t>(first)));
      out = reinterpret_cast<void*>((run + alignment - 1) & ~(std::uintptr_t{alignment} - 1));
      self->runs_[self->nruns_++] =
          Run{run, std::uint64_t{n} * self->stride_, static_cast<std::uint32_t>(first), n, false};
      self->held_bytes_.fetch_add(std::uint64_t{n} * self->stride_, std::memory_order_relaxed);
    }
  }
  pthread_mutex_unlock(&self->mu_);
  if (out == nullptr) return nullptr;
  // Blocks come back from other processes with their old contents.
  if (*zero) std::memset(out, 0, size);
  *commit = true;
  return out;
}

void JemallocHeap::HookDestroy(extent_hooks_t* h, void* addr, std::size_t size, bool, unsigned) {
  JemallocHeap* self = Self(h);
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  pthread_mutex_lock(&self->mu_);
  // Runs wholly inside [lo, lo + size) go back to the pool; jemalloc may destroy a run in
  // pieces (after splits), and pieces of a run stay claimed until the process ends.
  for (std::size_t i = 0; i < self->nruns_;) {
    Run& r = self->runs_[i];
    if (r.addr >= lo && r.addr + r.bytes <= lo + size) {
      if (!r.inherited) {
        std::uint32_t idx[64];
        for (std::uint32_t done = 0; done < r.n;) {
          const std::uint32_t m = std::min<std::uint32_t>(64, r.n - done);
          for (std::uint32_t j = 0; j < m; ++j) idx[j] = r.first + done + j;
          self->arena_->ReleaseCached(idx, m);
          done += m;
        }
        self->held_bytes_.fetch_sub(r.bytes, std::memory_order_relaxed);
      }
      r = self->runs_[--self->nruns_];
    } else {
      ++i;
    }
  }
  pthread_mutex_unlock(&self->mu_);
}

const JemallocHeap::Run* JemallocHeap::RunOf(std::uintptr_t addr) const noexcept {
  for (std::size_t i = 0; i < nruns_; ++i) {
    if (addr - runs_[i].addr < runs_[i].bytes) return &runs_[i];
  }
  return nullptr;
}

bool JemallocHeap::RestoreMapping(void* addr, std::size_t bytes) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  pthread_mutex_lock(&mu_);
  const Run* r = RunOf(a);
  const bool inherited = r != nullptr && r->inherited;
  const bool inside = r != nullptr && a + bytes <= r->addr + r->bytes;
  pthread_mutex_unlock(&mu_);
  if (!inside) return false;
  void* p;
  if (inherited) {  // private memory since the fork: keep it private
    p = ::mmap(addr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  } else {
    const pool::Region& region = arena_->region();
    const auto off = static_cast<off_t>(a - reinterpret_cast<std::uintptr_t>(region.addr()));
    p = ::mmap(addr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, region.fd(), off);
  }
  return p == addr;
}

void JemallocHeap::PrepareFork() noexcept {
  pthread_mutex_lock(&mu_);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < nruns_; ++i) {
    if (!runs_[i].inherited) total += runs_[i].bytes;
  }
  shadow_ = nullptr;
  if (total == 0) return;
  void* s = ::mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s == MAP_FAILED) return;  // the child falls back to a private mapping of the file
  auto* at = static_cast<std::byte*>(s);
  for (std::size_t i = 0; i < nruns_; ++i) {
    if (runs_[i].inherited) continue;
    std::memcpy(at, reinterpret_cast<const void*>(runs_[i].addr), runs_[i].bytes);
    at += runs_[i].bytes;
  }
  shadow_ = s;
}

void JemallocHeap::ParentAfterFork() noexcept {
  if (shadow_ != nullptr) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < nruns_; ++i) {
      if (!runs_[i].inherited) total += runs_[i].bytes;
    }
    ::munmap(shadow_, total);
    shadow_ = nullptr;
  }
  pthread_mutex_unlock(&mu_);
}

void JemallocHeap::ChildAfterFork() noexcept {
  auto* at = static_cast<std::byte*>(shadow_);
  const pool::Region& region = arena_->region();
  if (at == nullptr && held_bytes_.load(std::memory_order_relaxed) != 0) {
    Logf(LogLevel::kWarn,
         "fork: no memory for a private copy of the %llu CXL heap bytes; the child maps them "
         "copy-on-write from the pool file (pages it has not written show the parent's writes)",
         static_cast<unsigned long long>(held_bytes_.load(std::memory_order_relaxed)));
  }
  for (std::size_t i = 0; i < nruns_; ++i) {
    Run& r = runs_[i];
    if (r.inherited) continue;
    void* target = reinterpret_cast<void*>(r.addr);
    if (at != nullptr) {
      // Moves the private copy over the shared pages: page-table moves, no copy.
      (void)::mremap(at, r.bytes, r.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, target);
      at += r.bytes;
    } else {
      // No memory for a copy: a private (copy-on-write) mapping of the file. The child's
      // writes stay its own; pages it has not written yet still show the parent's later
      // writes (docs/preload.md, "fork").
      const auto off = static_cast<off_t>(r.addr - reinterpret_cast<std::uintptr_t>(region.addr()));
      (void)::mmap(target, r.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, region.fd(),
                   off);
    }
    r.inherited = true;
  }
  shadow_ = nullptr;
  held_bytes_.store(0, std::memory_order_relaxed);
  pthread_mutex_unlock(&mu_);
}

std::string JemallocHeap::Describe() const {
  const pool::ClassRecord& k = arena_->class_record(cls_);
  return absl::StrCat(arena_->region().name(), ": jemalloc arena ", arena_ind_,
                      " over cxlkv arena ", pool::UuidToString(arena_->uuid()), " (", k.block_count,
                      " blocks of ", pool::FormatBytes(k.stride_bytes), ", owner ",
                      arena_->owner_id(), ")");
}

// ---- memkind MEMKIND_DAX_KMEM ---------------------------------------------------------------

#if CXLKV_HAVE_MEMKIND
class KmemHeap final : public CxlHeap {
 public:
  static absl::StatusOr<std::unique_ptr<CxlHeap>> Open(const pool::SourceSpec& spec) {
    const std::string name = absl::StrCat("kmem:node=", spec.numa_node);
    if (memkind_check_available(MEMKIND_DAX_KMEM) != MEMKIND_SUCCESS) {
      return absl::NotFoundError(absl::StrCat(
          name,
          ": memkind finds no dax-kmem NUMA node (MEMKIND_DAX_KMEM unavailable); online "
          "a CXL/DAX device as system RAM (`daxctl reconfigure-device --mode=system-ram "
          "daxX.Y`) or use a devdax:, file: or memfd: pool"));
    }
    std::unique_ptr<KmemHeap> h(new KmemHeap());
    h->name_ = name;
    return std::unique_ptr<CxlHeap>(std::move(h));
  }
  void* Alloc(std::size_t bytes, std::size_t align, bool zero) noexcept override {
    if (bytes == 0) bytes = 1;
    void* p = nullptr;
    if (align > 16) {
      if (memkind_posix_memalign(MEMKIND_DAX_KMEM, &p, align, bytes) != 0) p = nullptr;
    } else {
      p = memkind_malloc(MEMKIND_DAX_KMEM, bytes);
    }
    if (p == nullptr) return nullptr;
    if (!live_.Insert(p)) {  // table full: not served from kmem
      memkind_free(MEMKIND_DAX_KMEM, p);
      return nullptr;
    }
    if (zero) std::memset(p, 0, bytes);
    bytes_.fetch_add(memkind_malloc_usable_size(MEMKIND_DAX_KMEM, p), std::memory_order_relaxed);
    return p;
  }
  void Free(void* p) noexcept override {
    bytes_.fetch_sub(memkind_malloc_usable_size(MEMKIND_DAX_KMEM, p), std::memory_order_relaxed);
    live_.Erase(p);
    memkind_free(MEMKIND_DAX_KMEM, p);
  }
  void* Realloc(void* p, std::size_t bytes) noexcept override {
    void* q = Alloc(bytes, 0, false);
    if (q == nullptr) return nullptr;
    std::memcpy(q, p, std::min(bytes, UsableSize(p)));
    Free(p);
    return q;
  }
  std::size_t UsableSize(const void* p) const noexcept override {
    return memkind_malloc_usable_size(MEMKIND_DAX_KMEM, const_cast<void*>(p));
  }
  bool Owns(const void* p) const noexcept override { return live_.Contains(p); }
  AddressRange range() const noexcept override { return {}; }
  bool RestoreMapping(void*, std::size_t) noexcept override { return false; }
  // Anonymous private memory: fork's copy-on-write already gives the child its own copy.
  void PrepareFork() noexcept override {}
  void ParentAfterFork() noexcept override {}
  void ChildAfterFork() noexcept override {}
  std::uint64_t held_bytes() const noexcept override {
    return bytes_.load(std::memory_order_relaxed);
  }
  std::string Describe() const override {
    return absl::StrCat(name_,
                        ": memkind MEMKIND_DAX_KMEM (memkind picks the dax-kmem node "
                        "closest to the allocating CPU)");
  }

 private:
  std::string name_;
  PointerSet<1u << 20> live_;
  std::atomic<std::uint64_t> bytes_{0};
};
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<CxlHeap>> CxlHeap::Open(const pool::SourceSpec& spec) {
  if (spec.kind == pool::SourceKind::kKmem) {
#if CXLKV_HAVE_MEMKIND
    return KmemHeap::Open(spec);
#else
    return absl::UnimplementedError(
        absl::StrCat("kmem:node=", spec.numa_node,
                     ": this build has no memkind (apt-get install libmemkind-dev and rebuild)"));
#endif
  }
  return JemallocHeap::Open(spec);
}

}  // namespace cxlkv::preload
