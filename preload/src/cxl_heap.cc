// The CXL heap: a jemalloc arena over a cxlkv arena's blocks (devdax, file, memfd), or
// memkind's MEMKIND_DAX_KMEM (kmem). See cxl_heap.h and docs/preload.md.
#include "cxlkv/preload/cxl_heap.h"

#include <fcntl.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/config.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/give_away.h"
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
constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14); older headers lack it

// jemalloc is linked (its TLS is initial-exec, so it cannot be dlopen()ed after start-up)
// and called only through its explicit API (mallocx, rallocx, dallocx, sallocx, mallctl).
// Debian's build has no symbol prefix, so it also exports malloc/free/... and the C++
// operators new/delete; libcxlkv_preload.so defines every one of those itself, and being
// first in the global scope, shadows jemalloc's: nothing of the process reaches jemalloc's
// default arenas (docs/preload.md, "jemalloc interplay").

// ---- jemalloc over cxlkv arenas ---------------------------------------------------------------

// A slab: one cxlkv arena whose blocks the heap claims in runs. The plain heap has one (the
// pool); the pooled heap one per extent the orchestrator lent, each mapped into the next
// free part of one address reservation, so ownership is still a single range check.
struct Slab {
  std::unique_ptr<pool::Arena> arena;
  std::uint32_t cls = 0;
  std::uint64_t stride = 0;
  std::uint32_t extent = 0;  // pooled: the extent's index
  bool revoked = false;      // pooled: the lease lapsed; the slab's runs are private memory now
};

class JemallocHeap final : public CxlHeap {
 public:
  static absl::StatusOr<std::unique_ptr<CxlHeap>> Open(const pool::SourceSpec& spec);
  static absl::StatusOr<std::unique_ptr<CxlHeap>> OpenPooled(std::unique_ptr<ExtentSource> source,
                                                             std::uint64_t reserve_bytes);
  ~JemallocHeap() override;

  void* Alloc(std::size_t bytes, std::size_t align, bool zero) noexcept override {
    // A pooled heap has no jemalloc arena before its first extent (jemalloc takes the
    // arena's own metadata from the hooks at creation).
    if (!ready_.load(std::memory_order_acquire)) return nullptr;
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
  bool CanGrow() const noexcept override {
    return source_ != nullptr && !child_.load(std::memory_order_relaxed);
  }
  absl::Status Grow() noexcept override;
  std::uint64_t revocations() const noexcept override {
    return revocations_.load(std::memory_order_relaxed);
  }
  void OnGiveAway(void (*fn)(void*, void*, std::size_t), void* ctx) noexcept override {
    pthread_mutex_lock(&grow_mu_);
    pthread_mutex_lock(&mu_);
    on_give_away_ = fn;
    on_give_away_ctx_ = ctx;
    pthread_mutex_unlock(&mu_);
    pthread_mutex_unlock(&grow_mu_);
  }

 private:
  static constexpr std::size_t kMaxSlabs = 1024;
  struct Run {
    std::uintptr_t addr;
    std::uint64_t bytes;
    std::uint32_t first;
    std::uint32_t n;
    std::uint32_t slab;
    bool inherited;  // private memory (copied at fork, or its extent was revoked): not ours in
                     // the pool
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
  static void RevokeThunk(void* ctx, std::uint32_t extent);

  absl::Status CreateJemallocArena(const std::string& name);
  void AddSlabLocked(std::unique_ptr<pool::Arena> arena, std::uint32_t extent);  // mu_ held
  void* ClaimLocked(std::size_t size, std::size_t alignment) noexcept;            // mu_ held
  void ReleaseRunLocked(const Run& r) noexcept;                                   // mu_ held
  const Run* RunOf(std::uintptr_t addr) const noexcept;                           // mu_ held
  void Revoke(std::uint32_t extent) noexcept;
  void RevokeSlabLocked(std::uint32_t slab) noexcept;  // grow_mu_ and mu_ held
  bool SwapSlabPrivateLocked(std::uint32_t slab) noexcept;  // grow_mu_ and mu_ held

  Slab slabs_[kMaxSlabs];
  std::size_t nslabs_ = 0;   // mu_ (grows only)
  std::size_t next_slab_ = 0;  // mu_: where HookAlloc looks first
  AddressRange range_;
  unsigned arena_ind_ = 0;
  int flags_ = 0;
  HookBox box_{};
  mutable pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  Run runs_[kMaxRuns] = {};
  std::size_t nruns_ = 0;
  std::atomic<std::uint64_t> held_bytes_{0};
  void* shadow_ = nullptr;  // PrepareFork's private copy of the runs

  // Pooled: extents from the orchestrator, mapped one after another into a reservation.
  std::unique_ptr<ExtentSource> source_;
  pthread_mutex_t grow_mu_ = PTHREAD_MUTEX_INITIALIZER;  // before mu_; serializes Grow/Revoke
  std::uintptr_t reserve_next_ = 0;                      // grow_mu_
  std::uint32_t revoked_early_[64] = {};  // grow_mu_: revoked before Grow mapped them
  std::size_t nrevoked_early_ = 0;
  std::atomic<bool> child_{false};  // a forked child: no new runs from the parent's extents
  std::atomic<std::uint64_t> revocations_{0};
  std::atomic<bool> ready_{false};  // the jemalloc arena exists
  void (*on_give_away_)(void*, void*, std::size_t) = nullptr;  // grow_mu_ and mu_
  void* on_give_away_ctx_ = nullptr;
};

absl::Status JemallocHeap::CreateJemallocArena(const std::string& name) {
  box_.hooks = extent_hooks_t{&HookAlloc, &HookDalloc, &HookDestroy, &HookCommit, &HookDecommit,
                              nullptr,    nullptr,     &HookSplit,   &HookMerge};
  box_.heap = this;
  extent_hooks_t* hooks = &box_.hooks;
  unsigned ind = 0;
  std::size_t sz = sizeof(ind);
  // The new value is the hooks pointer itself, so its size is a pointer's.
  // NOLINTNEXTLINE(bugprone-sizeof-expression): sizeof(extent_hooks_t*) is meant
  if (int rc = mallctl("arenas.create", &ind, &sz, &hooks, sizeof(hooks)); rc != 0) {
    return absl::InternalError(absl::StrCat(
        name, ": jemalloc refused a new arena (arenas.create: ", base::ErrnoText(rc), ")"));
  }
  arena_ind_ = ind;
  flags_ = static_cast<int>(MALLOCX_ARENA(ind)) | MALLOCX_TCACHE_NONE;
  ready_.store(true, std::memory_order_release);
  // Never purge: purging a MAP_SHARED file mapping frees nothing (the pages stay in the
  // file) and would hand jemalloc pages it believes are zero. Freed memory stays in the
  // arena for reuse; the blocks return to the pool when the process ends.
  for (const char* key : {"dirty_decay_ms", "muzzy_decay_ms"}) {
    ssize_t never = -1;
    const std::string ctl = absl::StrCat("arena.", ind, ".", key);
    (void)mallctl(ctl.c_str(), nullptr, nullptr, &never, sizeof(never));
  }
  return absl::OkStatus();
}

void JemallocHeap::AddSlabLocked(std::unique_ptr<pool::Arena> arena, std::uint32_t extent) {
  Slab& s = slabs_[nslabs_];
  s.arena = std::move(arena);
  // The class with the smallest blocks: finest extents.
  s.cls = 0;
  for (std::uint32_t c = 1; c < s.arena->class_count(); ++c) {
    if (s.arena->class_record(c).stride_bytes < s.arena->class_record(s.cls).stride_bytes) {
      s.cls = c;
    }
  }
  s.stride = s.arena->class_record(s.cls).stride_bytes;
  s.extent = extent;
  s.revoked = false;
  ++nslabs_;
}

absl::StatusOr<std::unique_ptr<CxlHeap>> JemallocHeap::Open(const pool::SourceSpec& spec) {
  auto arena = OpenPoolArena(spec);
  if (!arena.ok()) return arena.status();
  const std::string name = (*arena)->region().name();
  std::unique_ptr<JemallocHeap> h(new JemallocHeap());
  h->AddSlabLocked(std::move(*arena), 0);
  const Slab& s = h->slabs_[0];
  const pool::ClassRecord& k = s.arena->class_record(s.cls);
  h->range_ = AddressRange{reinterpret_cast<std::uintptr_t>(s.arena->region().addr()) + k.data_offset,
                           std::uint64_t{k.block_count} * k.stride_bytes};
  if (auto st = h->CreateJemallocArena(name); !st.ok()) return st;
  return std::unique_ptr<CxlHeap>(std::move(h));
}

absl::StatusOr<std::unique_ptr<CxlHeap>> JemallocHeap::OpenPooled(
    std::unique_ptr<ExtentSource> source, std::uint64_t reserve_bytes) {
  // Address space only (PROT_NONE, no memory): the extents are mapped into it as they come.
  void* r = ::mmap(nullptr, reserve_bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat(source->Describe(), ": cannot reserve ", base::FormatBytes(reserve_bytes),
                     " of address space for the heap's extents (mmap: ", base::ErrnoText(errno),
                     "); is RLIMIT_AS (ulimit -v) limited?"));
  }
  std::unique_ptr<JemallocHeap> h(new JemallocHeap());
  h->source_ = std::move(source);
  h->range_ = AddressRange{reinterpret_cast<std::uintptr_t>(r), reserve_bytes};
  h->reserve_next_ = h->range_.lo;
  return std::unique_ptr<CxlHeap>(std::move(h));  // the jemalloc arena comes with the first extent
}

absl::Status JemallocHeap::Grow() noexcept {
  if (!CanGrow()) {
    return absl::FailedPreconditionError("this heap does not grow (not pooled, or a forked child)");
  }
  // The RPC runs without grow_mu_: the revocation callback takes grow_mu_ while the domain's
  // watchdog holds its own lock, which the RPC also takes.
  auto e = source_->Grow(&RevokeThunk, this);
  if (!e.ok()) return e.status();
  pthread_mutex_lock(&grow_mu_);
  auto fail = [&](absl::Status st) {
    pthread_mutex_unlock(&grow_mu_);
    source_->Shrink(e->index);
    return st;
  };
  for (std::size_t i = 0; i < nrevoked_early_; ++i) {
    if (revoked_early_[i] != e->index) continue;
    revoked_early_[i] = revoked_early_[--nrevoked_early_];
    pthread_mutex_unlock(&grow_mu_);
    return absl::UnavailableError(absl::StrCat(
        "extent ", e->index, ": the capacity lease lapsed before the heap could use it"));
  }
  // Each extent at the next address aligned like its length (up to 1 GiB): a device-DAX
  // window needs the device's alignment, which divides the extent size.
  std::uint64_t align = e->length & (~e->length + 1);
  align = std::min<std::uint64_t>(std::max<std::uint64_t>(align, kPageBytes), 1ull << 30);
  const std::uintptr_t at = (reserve_next_ + align - 1) & ~(align - 1);
  if (nslabs_ == kMaxSlabs || at + e->length > range_.lo + range_.bytes || at < reserve_next_) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("the heap's address reservation (", base::FormatBytes(range_.bytes),
                     ") has no room for another extent of ", base::FormatBytes(e->length))));
  }
  auto spec = pool::ParseSourceSpec(e->spec);
  if (!spec.ok()) return fail(spec.status());
  auto region = pool::OpenRegionAt(*spec, reinterpret_cast<void*>(at));
  if (!region.ok()) return fail(region.status());
  pool::FormatOptions o;
  o.classes = {pool::ClassSpec{0, kChunkBytes, 1}};
  o.force = true;      // whatever a former holder left there is dead (docs/orchestrator.md)
  o.exclusive = true;  // the capacity lease makes this host the only writer
  auto arena = pool::Arena::Format(*std::move(region), o);
  if (!arena.ok()) return fail(arena.status());
  reserve_next_ = at + e->length;
  pthread_mutex_lock(&mu_);
  AddSlabLocked(*std::move(arena), e->index);
  pthread_mutex_unlock(&mu_);
  absl::Status st;
  if (!ready_.load(std::memory_order_acquire)) st = CreateJemallocArena(source_->Describe());
  pthread_mutex_unlock(&grow_mu_);
  return st;
}

void JemallocHeap::RevokeThunk(void* ctx, std::uint32_t extent) {
  static_cast<JemallocHeap*>(ctx)->Revoke(extent);
}

void JemallocHeap::Revoke(std::uint32_t extent) noexcept {
  pthread_mutex_lock(&grow_mu_);
  pthread_mutex_lock(&mu_);
  bool found = false;
  for (std::uint32_t i = 0; i < nslabs_; ++i) {
    if (slabs_[i].extent == extent && !slabs_[i].revoked) {
      RevokeSlabLocked(i);
      found = true;
    }
  }
  if (!found && nrevoked_early_ < std::size(revoked_early_)) {
    revoked_early_[nrevoked_early_++] = extent;
  }
  pthread_mutex_unlock(&mu_);
  pthread_mutex_unlock(&grow_mu_);
  if (found) {
    Logf(LogLevel::kWarn,
         "extent %u revoked: its capacity lease lapsed (the orchestrator unreachable, or this "
         "process fenced) or the process left the domain; the heap's objects there now live "
         "in private memory, and new allocations come from other extents or the process "
         "allocator",
         static_cast<unsigned>(extent));
  }
}

// Swaps the slab's pool memory for private memory that holds the same bytes, and writes every
// line of the extent back (pool/give_away.h): from here on nothing this process writes
// reaches the extent, which may be lent to another host once the lease term ends, and
// nothing it wrote before can land there later; the objects in it stay valid for the
// program. Called when the lease lapsed, and when the process leaves the domain.
void JemallocHeap::RevokeSlabLocked(std::uint32_t si) noexcept {
  Slab& s = slabs_[si];
  if (s.arena == nullptr) return;  // being destroyed: its destruction writes it back
  const pool::Region& r = s.arena->region();
  auto* lo = r.addr();
  const std::uint64_t len = r.size_bytes();
  // Users of the memory that bypass the page tables (CUDA registrations) go first, while
  // the window still maps the extent.
  if (on_give_away_ != nullptr) on_give_away_(on_give_away_ctx_, lo, len);
  const int rc = pool::SwapAndWriteBack(lo, len, [&] { return SwapSlabPrivateLocked(si); });
  if (rc != 0) {
    Logf(LogLevel::kError, "extent %u: giving it away failed (%s); the window is inaccessible",
         static_cast<unsigned>(s.extent), base::ErrnoText(rc).c_str());
  }
  s.revoked = true;
  revocations_.fetch_add(1, std::memory_order_relaxed);
}

bool JemallocHeap::SwapSlabPrivateLocked(std::uint32_t si) noexcept {
  Slab& s = slabs_[si];
  const pool::Region& r = s.arena->region();
  auto* lo = r.addr();
  const std::uint64_t len = r.size_bytes();
  bool private_file = false;
  if (r.spec().kind != pool::SourceKind::kDevdax) {
    // A private mapping of the same file pages, atomically in place of the shared one: every
    // store made before it is in the page cache and visible, every later one goes to a
    // private copy of its page. Then every page the heap uses is copied now (a write fault
    // without a write), so a later holder's stores to the file never show through.
    void* p = ::mmap(lo, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, r.fd(),
                     static_cast<off_t>(r.spec().offset));
    private_file = p == lo;
  }
  bool all = true;
  for (std::size_t i = 0; i < nruns_; ++i) {
    Run& run = runs_[i];
    if (run.slab != si || run.inherited) continue;
    void* a = reinterpret_cast<void*>(run.addr);
    bool copied = private_file && ::madvise(a, run.bytes, kMadvPopulateWrite) == 0;
    if (!copied) {
      // Device DAX has no private mappings (or the kernel lacks MADV_POPULATE_WRITE): copy
      // the run and move the copy over it. A store another thread makes to the run between
      // the copy and the move is lost — the price of a lease that lapsed (docs/preload.md).
      // Raw system calls: libc's mmap is the shim's, which would serve this from the heap
      // whose locks are held here.
      const long c = ::syscall(SYS_mmap, nullptr, run.bytes, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (c != -1) {
        std::memcpy(reinterpret_cast<void*>(c), a, run.bytes);
        copied = ::syscall(SYS_mremap, c, run.bytes, run.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, a) ==
                 reinterpret_cast<long>(a);
      }
    }
    if (!copied) {
      Logf(LogLevel::kError, "extent %u: could not copy %llu heap bytes at %p out of the pool",
           static_cast<unsigned>(s.extent), static_cast<unsigned long long>(run.bytes), a);
      // Still the pool's pages (shared or, after a failed populate, private but unread): no
      // store may reach them from here on.
      if (!private_file) all = ::mprotect(a, run.bytes, PROT_NONE) == 0 && all;
    }
    run.inherited = true;
    held_bytes_.fetch_sub(run.bytes, std::memory_order_relaxed);
  }
  if (!private_file) {
    // The arena's header and map stay untouched from now on; make them inaccessible.
    const pool::ClassRecord& k = s.arena->class_record(s.cls);
    (void)::mmap(lo, k.data_offset & ~(std::uint64_t{kPageBytes} - 1), PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  }
  return all;
}

JemallocHeap::~JemallocHeap() {
  // arena.<i>.destroy hands every extent back through HookDestroy; then each slab's arena
  // destructor returns this process's blocks to the pool.
  if (ready_.load()) {
    const std::string ctl = absl::StrCat("arena.", arena_ind_, ".destroy");
    (void)mallctl(ctl.c_str(), nullptr, nullptr, nullptr, 0);
  }
  pthread_mutex_lock(&mu_);
  for (std::size_t i = 0; i < nruns_; ++i) ReleaseRunLocked(runs_[i]);
  nruns_ = 0;
  pthread_mutex_unlock(&mu_);
  for (std::size_t i = 0; i < nslabs_; ++i) {
    // Out of the table first, under the locks, so a revocation racing with this leaves the
    // slab alone (the domain's watchdog may call Revoke until the extent is given back).
    pthread_mutex_lock(&grow_mu_);
    pthread_mutex_lock(&mu_);
    const std::uint32_t extent = slabs_[i].extent;
    const bool revoked = slabs_[i].revoked;
    std::unique_ptr<pool::Arena> arena = std::move(slabs_[i].arena);
    slabs_[i].revoked = true;
    pthread_mutex_unlock(&mu_);
    pthread_mutex_unlock(&grow_mu_);
    if (arena != nullptr && !revoked && on_give_away_ != nullptr) {
      on_give_away_(on_give_away_ctx_, arena->region().addr(), arena->region().size_bytes());
    }
    // The arena returns its blocks, then its window is sealed and written back as the region
    // goes (pool/give_away.h); only then is the extent given back.
    arena.reset();
    if (source_ != nullptr && !revoked) source_->Shrink(extent);
  }
  if (source_ != nullptr) {
    ::munmap(reinterpret_cast<void*>(range_.lo), range_.bytes);
    source_.reset();
  }
}

void JemallocHeap::ReleaseRunLocked(const Run& r) noexcept {
  if (r.inherited || slabs_[r.slab].revoked) return;
  std::uint32_t idx[64];
  for (std::uint32_t done = 0; done < r.n;) {
    const std::uint32_t m = std::min<std::uint32_t>(64, r.n - done);
    for (std::uint32_t j = 0; j < m; ++j) idx[j] = r.first + done + j;
    slabs_[r.slab].arena->ReleaseCached(idx, m);
    done += m;
  }
}

void* JemallocHeap::ClaimLocked(std::size_t size, std::size_t alignment) noexcept {
  if (nruns_ == kMaxRuns || (source_ != nullptr && child_.load(std::memory_order_relaxed))) {
    return nullptr;
  }
  for (std::size_t k = 0; k < nslabs_; ++k) {
    const std::size_t si = (next_slab_ + k) % nslabs_;
    Slab& s = slabs_[si];
    if (s.revoked) continue;
    const std::uint64_t n64 = (size + s.stride - 1) / s.stride;
    // When no block start has the alignment (the region's mapping is only page-aligned), a
    // longer run holds an aligned extent: its head stays unused.
    const std::uint64_t padded64 = (size + alignment - kPageBytes + s.stride - 1) / s.stride;
    if (padded64 > 0xFFFFFFFFu) continue;
    auto n = static_cast<std::uint32_t>(n64);
    std::int64_t first = s.arena->ClaimRun(s.cls, n, alignment);
    if (first < 0 && alignment > kPageBytes) {
      n = static_cast<std::uint32_t>(padded64);
      first = s.arena->ClaimRun(s.cls, n, 0);
    }
    if (first < 0) continue;
    const auto run =
        reinterpret_cast<std::uintptr_t>(s.arena->BlockAddr(static_cast<std::uint32_t>(first)));
    runs_[nruns_++] = Run{run, std::uint64_t{n} * s.stride, static_cast<std::uint32_t>(first), n,
                          static_cast<std::uint32_t>(si), false};
    held_bytes_.fetch_add(std::uint64_t{n} * s.stride, std::memory_order_relaxed);
    next_slab_ = si;
    return reinterpret_cast<void*>((run + alignment - 1) & ~(std::uintptr_t{alignment} - 1));
  }
  return nullptr;
}

void* JemallocHeap::HookAlloc(extent_hooks_t* h, void* new_addr, std::size_t size,
                              std::size_t alignment, bool* zero, bool* commit, unsigned) {
  JemallocHeap* self = Self(h);
  if (new_addr != nullptr || size == 0) return nullptr;  // no placement at a given address
  if (alignment < kPageBytes) alignment = kPageBytes;
  pthread_mutex_lock(&self->mu_);
  void* out = self->ClaimLocked(size, alignment);
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
      if (!r.inherited) self->held_bytes_.fetch_sub(r.bytes, std::memory_order_relaxed);
      self->ReleaseRunLocked(r);
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
  const pool::Region* region = r != nullptr ? &slabs_[r->slab].arena->region() : nullptr;
  pthread_mutex_unlock(&mu_);
  if (!inside) return false;
  void* p;
  if (inherited) {  // private memory since a fork or a revocation: keep it private
    p = ::mmap(addr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  } else {
    const auto off = static_cast<off_t>(region->spec().offset + a -
                                        reinterpret_cast<std::uintptr_t>(region->addr()));
    p = ::mmap(addr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, region->fd(), off);
  }
  return p == addr;
}

void JemallocHeap::PrepareFork() noexcept {
  pthread_mutex_lock(&grow_mu_);
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
  pthread_mutex_unlock(&grow_mu_);
}

void JemallocHeap::ChildAfterFork() noexcept {
  auto* at = static_cast<std::byte*>(shadow_);
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
      const pool::Region& region = slabs_[r.slab].arena->region();
      const auto off = static_cast<off_t>(region.spec().offset + r.addr -
                                          reinterpret_cast<std::uintptr_t>(region.addr()));
      (void)::mmap(target, r.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, region.fd(),
                   off);
    }
    r.inherited = true;
  }
  shadow_ = nullptr;
  held_bytes_.store(0, std::memory_order_relaxed);
  // The extents are the parent's, under its capacity lease, which ends with the parent:
  // the child allocates new memory from the process allocator.
  if (source_ != nullptr) child_.store(true, std::memory_order_relaxed);
  pthread_mutex_unlock(&mu_);
  pthread_mutex_unlock(&grow_mu_);
}

std::string JemallocHeap::Describe() const {
  if (source_ != nullptr) {
    pthread_mutex_lock(&mu_);
    const std::size_t n = nslabs_;
    pthread_mutex_unlock(&mu_);
    return absl::StrCat(source_->Describe(), ": jemalloc arena ", arena_ind_, " over ", n,
                        " extent(s) lent by the orchestrator, ", revocations(),
                        " revoked (grows by one when full; blocks of ",
                        base::FormatBytes(kChunkBytes), ")");
  }
  const Slab& s = slabs_[0];
  const pool::ClassRecord& k = s.arena->class_record(s.cls);
  return absl::StrCat(s.arena->region().name(), ": jemalloc arena ", arena_ind_,
                      " over cxlkv arena ", pool::UuidToString(s.arena->uuid()), " (",
                      k.block_count, " blocks of ", base::FormatBytes(k.stride_bytes), ", owner ",
                      s.arena->owner_id(), ")");
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

absl::StatusOr<std::unique_ptr<pool::Arena>> OpenPoolArena(const pool::SourceSpec& spec) {
  auto region = pool::OpenRegion(spec);
  if (!region.ok()) return region.status();
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
  return arena;
}

absl::StatusOr<std::unique_ptr<CxlHeap>> CxlHeap::OpenPooled(std::unique_ptr<ExtentSource> source,
                                                            std::uint64_t reserve_bytes) {
  return JemallocHeap::OpenPooled(std::move(source), reserve_bytes);
}

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
