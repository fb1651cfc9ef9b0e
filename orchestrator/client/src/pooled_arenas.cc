// PooledArenas: arenas in granted extents, their revocation, and reads of other hosts' ones.
#include "cxlkv/orchestrator/pooled_arenas.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/pool/give_away.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::orchestrator {

PooledArenas::PooledArenas(HostClient& client) : client_(client) {
  watchdog_ = std::thread([this] { Watch(); });
}

PooledArenas::~PooledArenas() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  // Leaving the domain: every extent still held stops being this host's when the client
  // leaves, next. Each goes as a revocation does: an arena still open is swapped for private
  // memory and written back, a raw extent's holder stops writing it and writes it back.
  base::MutexLock l(mu_);
  for (auto& [extent, h] : held_) {
    if (!h.revoked->load()) RevokeLocked(extent, h);
  }
}

void PooledArenas::OnGiveAway(std::uint32_t extent, std::function<void()> fn) {
  base::MutexLock l(mu_);
  auto it = held_.find(extent);
  if (it != held_.end()) it->second.before_give_away = std::move(fn);
}

void PooledArenas::Closing(std::uint32_t extent) {
  base::MutexLock l(mu_);
  auto it = held_.find(extent);
  if (it != held_.end()) it->second.before_give_away = nullptr;
}

void PooledArenas::OnRevoke(std::function<void(std::uint32_t)> fn) {
  base::MutexLock l(mu_);
  on_revoke_ = std::move(fn);
}

std::string PooledArenas::WindowSpec(std::uint64_t offset, std::uint64_t length) const {
  auto spec = pool::ParseSourceSpec(client_.pool_spec());
  if (!spec.ok()) return client_.pool_spec();  // OpenRegion reports the error
  spec->size_bytes = 0;                        // the pool exists: take its size
  spec->reserve = false;
  spec->offset += offset;  // the extent's place inside the pool, which may be a window itself
  spec->length = length;
  return spec->ToString();
}

absl::StatusOr<PooledArenas::Grown> PooledArenas::Grow(const pool::FormatOptions& options) {
  auto got = client_.Grow(1);
  if (!got.ok()) return got.status();
  if (got->empty()) return absl::ResourceExhaustedError("the orchestrator granted no extent");
  const GrantedExtent e = got->front();
  auto give_back = [&](absl::Status st) {
    (void)client_.Shrink({e.index});
    return st;
  };
  auto region = pool::OpenRegion(WindowSpec(e.offset, e.length));
  if (!region.ok()) {
    return give_back(
        absl::Status(region.status().code(),
                     absl::StrCat("extent ", e.index, " of domain pool '", client_.pool_spec(),
                                  "': ", region.status().message())));
  }
  const std::uint64_t tracked = (*region)->Track();  // for a revocation (RevokeLocked)
  pool::FormatOptions fo = options;
  fo.force = true;
  fo.exclusive = true;
  base::MutexLock l(mu_);
  // Formatting writes the extent: only while its lease holds.
  if (!client_.ExtentValid(e.index)) {
    return give_back(absl::UnavailableError(absl::StrCat(
        "extent ", e.index, ": the capacity lease lapsed before the arena was formatted")));
  }
  auto arena = pool::Arena::Format(*std::move(region), fo);
  if (!arena.ok()) return give_back(arena.status());
  Held h;
  h.region = tracked;
  h.length = e.length;
  h.uuid = (*arena)->uuid();
  h.revoked = std::make_unique<std::atomic<bool>>(false);
  Grown g;
  g.extent = e.index;
  g.revoked = h.revoked.get();
  g.arena = *std::move(arena);
  held_[e.index] = std::move(h);
  return g;
}

absl::StatusOr<PooledArenas::RawExtent> PooledArenas::GrowRaw(
    std::function<void(std::uint32_t)> revoke) {
  if (!revoke) return absl::InvalidArgumentError("a raw extent needs a revocation callback");
  auto got = client_.Grow(1);
  if (!got.ok()) return got.status();
  if (got->empty()) return absl::ResourceExhaustedError("the orchestrator granted no extent");
  const GrantedExtent e = got->front();
  Held h;
  h.length = e.length;
  h.revoked = std::make_unique<std::atomic<bool>>(false);
  h.revoke = std::move(revoke);
  base::MutexLock l(mu_);
  held_[e.index] = std::move(h);
  return RawExtent{e.index, e.length, WindowSpec(e.offset, e.length)};
}

absl::Status PooledArenas::Shrink(std::uint32_t extent) {
  bool revoked = false;
  {
    base::MutexLock l(mu_);
    auto it = held_.find(extent);
    if (it == held_.end()) {
      return absl::NotFoundError(absl::StrCat("extent ", extent, " was not grown here"));
    }
    revoked = it->second.revoked->load();
    held_.erase(it);
  }
  // Given back even when revoked here: the lease may have lapsed on this host's clock only
  // (or the host paused), and the orchestrator then still lends the extent to this host
  // (audit #14). If it had taken the extent back already, there is nothing to give.
  absl::Status st = client_.Shrink({extent});
  if (revoked && (absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st))) {
    return absl::OkStatus();  // not held by this host (incarnation) any more
  }
  return st;
}

void PooledArenas::RevokeLocked(std::uint32_t extent, Held& h) {
  // First whatever reaches the extent's pages without this process's page tables (a GPU
  // registration: pinned pages stay DMA targets after the mapping is swapped), while the
  // window is still the extent's.
  if (h.before_give_away) {
    h.before_give_away();
    h.before_give_away = nullptr;
  }
  if (h.revoke) {
    h.revoke(extent);  // a raw extent: the caller stops writing it and writes it back
  } else {
    // Atomically swap the window for private memory, so later stores of this process stay
    // in the process, and write every line of the extent back before it counts as revoked —
    // if the caller's arena still maps it: a closed arena's region wrote it back as it went,
    // and its address may hold something else by now.
    (void)pool::WithTrackedRegion(h.region, [](std::byte* addr, std::uint64_t len) {
      (void)pool::SwapAndWriteBack(addr, len,
                                   [&] { return pool::SwapForPrivateMemory(addr, len); });
    });
  }
  h.revoked->store(true);
  revocations_.fetch_add(1);
  if (on_revoke_) on_revoke_(extent);
}

void PooledArenas::Watch() {
  while (!stop_.load()) {
    {
      base::MutexLock l(mu_);
      for (auto& [extent, h] : held_) {
        if (h.revoked->load()) continue;
        // Each extent on its own deadline (a Grow renews only what it grants); not held any
        // more (fenced and rejoined) is not valid either.
        if (!client_.ExtentValid(extent)) RevokeLocked(extent, h);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

absl::Status PooledArenas::RefreshPeersLocked() {
  auto list = client_.ListExtents();
  if (!list.ok()) return list.status();
  for (const ExtentView& e : *list) {
    if (e.state != "assigned" || held_.count(e.index) != 0) {
      peers_.erase(e.index);
      continue;
    }
    auto it = peers_.find(e.index);
    if (it != peers_.end()) {
      // Still the same arena? (The extent may have been lent again and re-formatted.)
      const auto* base = it->second.arena->region().addr();
      coherence::Invalidate(base, sizeof(pool::ArenaHeader));
      pool::ArenaHeader hdr{};
      if (pool::ValidateHeaderBytes(base, e.length, "extent", &hdr).ok() &&
          std::memcmp(hdr.uuid, it->second.arena->uuid().data(), 16) == 0) {
        continue;
      }
      peers_.erase(it);
    }
    auto region = pool::OpenRegion(WindowSpec(e.offset, e.length));
    if (!region.ok()) continue;
    // Another host wrote the arena: what opening it reads (the header, then the owner table
    // and the map behind it) must come from memory, not from lines this host cached earlier.
    // Only that: a block is invalidated when it is read (PrefixHost::CopyOut, Resolve's map
    // word), after its lease. Invalidating the whole extent here faulted in and flushed every
    // page of it (a 1 GiB extent: 16 M lines, seconds on a busy host) while the caller held
    // leases it had just taken, which expired before the first copy (docs/coherence.md,
    // "Busy hosts").
    const std::byte* base = (*region)->addr();
    coherence::Invalidate(base, sizeof(pool::ArenaHeader));
    pool::ArenaHeader hdr{};
    if (!pool::ValidateHeaderBytes(base, (*region)->size_bytes(), "extent", &hdr).ok()) continue;
    coherence::Invalidate(base,
                          std::min<std::uint64_t>(hdr.metadata_bytes, (*region)->size_bytes()));
    pool::OpenOptions ro;
    ro.read_only = true;
    auto arena = pool::Arena::Open(*std::move(region), ro);
    if (!arena.ok()) continue;  // not formatted (yet): nothing of it can be published
    peers_[e.index] = Peer{*std::move(arena)};
  }
  return absl::OkStatus();
}

absl::StatusOr<std::byte*> PooledArenas::Resolve(const coherence::BlockRef& ref) {
  pool::Uuid id;
  std::memcpy(id.data(), ref.arena, id.size());
  base::MutexLock l(mu_);
  for (auto& [extent, h] : held_) {
    if (h.uuid != id) continue;
    if (h.revoked->load()) {
      return absl::UnavailableError(absl::StrCat("extent ", extent, " was revoked"));
    }
    // Our own arena: the caller has it; resolve through the mapping's header copy.
    break;
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& [extent, p] : peers_) {
      if (p.arena->uuid() != id) continue;
      return p.arena->Resolve(id, ref.index, ref.generation);
    }
    if (pass == 0) {
      if (auto st = RefreshPeersLocked(); !st.ok()) return st;
    }
  }
  return absl::NotFoundError(absl::StrCat("no assigned extent of pool '", client_.pool_spec(),
                                          "' holds arena ", pool::UuidToString(id)));
}

absl::StatusOr<PooledArenas::BlockSpan> PooledArenas::ResolveBlock(const coherence::BlockRef& ref) {
  auto addr = Resolve(ref);
  if (!addr.ok()) return addr.status();
  base::MutexLock l(mu_);
  for (auto& [extent, p] : peers_) {
    if (std::memcmp(p.arena->uuid().data(), ref.arena, 16) != 0) continue;
    for (std::uint32_t c = 0; c < p.arena->class_count(); ++c) {
      const pool::ClassRecord& k = p.arena->class_record(c);
      if (ref.index >= k.first_index && ref.index - k.first_index < k.block_count) {
        return BlockSpan{*addr, k.block_bytes};
      }
    }
  }
  pool::Uuid id;
  std::memcpy(id.data(), ref.arena, id.size());
  return absl::NotFoundError(absl::StrCat("arena ", pool::UuidToString(id),
                                          " left the extents meanwhile; look the block up again"));
}

}  // namespace cxlkv::orchestrator
