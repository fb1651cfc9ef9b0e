// The C API's domain half: the shared prefix domain of a CXL pool (cxlkv.h: cxlkv_domain_*,
// cxlkv_prefix_*, cxlkv_lease_*, cxlkv_owner_*) — membership through the orchestrator's
// client, arenas in lent extents, the prefix index, leases and the owner role — a thin
// translation to coherence/ and orchestrator/client.
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "capi_internal.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/pooled_arenas.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

struct cxlkv_domain {
  // Set when the domain was joined through its orchestrator: membership and heartbeats,
  // and the arenas this host keeps in extents of the domain's pool (destroyed first).
  std::unique_ptr<cxlkv::orchestrator::HostClient> client;
  std::unique_ptr<cxlkv::orchestrator::PooledArenas> arenas;
  cxlkv::base::Mutex grown_mu;
  std::vector<cxlkv_arena*> grown ABSL_GUARDED_BY(grown_mu);
  std::unique_ptr<cxlkv::pool::Region> region;
  std::unique_ptr<cxlkv::coherence::DirectMem> mem;
  cxlkv::coherence::SteadyClock clock;
  std::unique_ptr<cxlkv::coherence::PrefixHost> host;
  // host->stats() as of the caller's last heartbeat (cxlkv_domain_heartbeat, at least every
  // host_ttl/4), for the client's heartbeat thread to send (the host is the caller's thread's
  // alone); not refreshed on the copy-out path, which stays free of the lock.
  cxlkv::base::Mutex stats_mu;
  cxlkv::coherence::PrefixHost::Stats stats_seen ABSL_GUARDED_BY(stats_mu);
  void NoteStats() {
    cxlkv::base::MutexLock l(stats_mu);
    stats_seen = host->stats();
  }
};

struct cxlkv_owner {
  std::unique_ptr<cxlkv::pool::Region> region;
  std::unique_ptr<cxlkv::coherence::DirectMem> mem;
  cxlkv::coherence::SteadyClock clock;
  std::unique_ptr<cxlkv::coherence::PrefixOwner> owner;
};

namespace {

// cxlkv_domain_shrink: closes arena a, grown in domain d, and gives its extent back.
int ShrinkDomainArena(cxlkv_domain* d, cxlkv_arena* a) {
  if (d == nullptr || a == nullptr || a->domain != d) {
    return cxlkv::capi::Fail(CXLKV_E_INVALID, "domain and an arena grown in it must be set");
  }
  {
    cxlkv::base::MutexLock l(d->grown_mu);
    std::erase(d->grown, a);
  }
  const std::uint32_t extent = a->extent;
  // In order: a revocation no longer touches the window (waiting out one in progress); the
  // GPU and other users of the memory let go of it; the arena closes — its last stores, then
  // the window sealed and written back as its region goes (pool/give_away.h); and only then
  // does the orchestrator hear that the extent is free.
  d->arenas->Closing(extent);
  cxlkv::capi::DropMemoryUsers(a);
  delete a;
  return cxlkv::capi::FromStatus(d->arenas->Shrink(extent));
}

}  // namespace

namespace {

using cxlkv::allocator::BlockHandle;
using cxlkv::allocator::FreeResult;
using cxlkv::capi::Fail;
using cxlkv::capi::FromLayout;
using cxlkv::capi::FromStatus;
using cxlkv::capi::LastError;
using cxlkv::capi::Revoked;
using cxlkv::capi::SameArena;

namespace co = cxlkv::coherence;

co::DomainGeometry Geometry(const cxlkv_domain_geometry* g) {
  co::DomainGeometry d;
  if (g == nullptr) return d;
  if (g->max_hosts) d.max_hosts = g->max_hosts;
  if (g->index_entries) d.index_entries = g->index_entries;
  if (g->lease_rows) d.lease_rows = g->lease_rows;
  if (g->ring_slots) d.ring_slots = g->ring_slots;
  if (g->lease_ttl_ms) d.lease_ttl_ms = g->lease_ttl_ms;
  if (g->host_ttl_ms) d.host_ttl_ms = g->host_ttl_ms;
  if (g->grace_ms) d.grace_ms = g->grace_ms;
  return d;
}

co::BlockRef ToCo(const cxlkv_block_ref& r) {
  co::BlockRef o{};
  std::memcpy(o.arena, r.arena_uuid, 16);
  o.index = r.index;
  o.generation = r.generation;
  return o;
}

cxlkv_block_ref FromCo(const co::BlockRef& r) {
  cxlkv_block_ref o{};
  std::memcpy(o.arena_uuid, r.arena, 16);
  o.index = r.index;
  o.generation = r.generation;
  return o;
}

co::Lease ToLease(const cxlkv_lease& l) {
  return co::Lease{l.row, l.entry, l.entry_gen, ToCo(l.ref), l.deadline_ms, l.id};
}

cxlkv_lease FromLease(const co::Lease& l) {
  return cxlkv_lease{l.row, l.entry, l.entry_gen, FromCo(l.ref), l.deadline_ms, l.id};
}

absl::StatusOr<std::unique_ptr<cxlkv::pool::Region>> OpenDomainRegion(const char* spec) {
  if (spec == nullptr) return absl::InvalidArgumentError("spec must be set");
  return cxlkv::pool::OpenRegion(spec);
}

}  // namespace

CXLKV_API uint64_t cxlkv_domain_bytes(const cxlkv_domain_geometry* g) {
  return co::DomainBytes(Geometry(g));
}

CXLKV_API int cxlkv_domain_format(const char* spec, const cxlkv_domain_geometry* g) {
  auto region = OpenDomainRegion(spec);
  if (!region.ok()) return FromStatus(region.status());
  co::DirectMem mem((*region)->addr(), (*region)->size_bytes());
  return FromStatus(co::FormatDomain(mem, Geometry(g)));
}

CXLKV_API int cxlkv_domain_join(const char* spec, uint32_t host_id, cxlkv_domain** out) {
  if (out == nullptr) return Fail(CXLKV_E_INVALID, "out must be set");
  auto d = std::make_unique<cxlkv_domain>();
  constexpr absl::string_view kOrchestrator = "orchestrator:";
  std::string domain_spec = spec != nullptr ? spec : "";
  if (absl::StartsWith(domain_spec, kOrchestrator)) {
    // A pooled domain run by cxlkv-orchestrator: join it there (membership, heartbeats on a
    // thread of the client's), then map the prefix domain it names.
    auto client =
        cxlkv::orchestrator::HostClient::Connect(domain_spec.substr(kOrchestrator.size()), host_id);
    if (!client.ok()) return FromStatus(client.status());
    d->client = std::move(*client);
    cxlkv_domain* dp = d.get();
    d->client->StartHeartbeats([dp] {
      cxlkv::orchestrator::HostCounters c;
      cxlkv::base::MutexLock l(dp->stats_mu);
      c.lease = dp->stats_seen;
      return c;
    });
    d->arenas = std::make_unique<cxlkv::orchestrator::PooledArenas>(*d->client);
    domain_spec = d->client->domain_spec();
  }
  auto region = OpenDomainRegion(domain_spec.c_str());
  if (!region.ok()) return FromStatus(region.status());
  d->region = std::move(*region);
  d->mem = std::make_unique<co::DirectMem>(d->region->addr(), d->region->size_bytes());
  // A process on real memory: an acquire that finds no fresh acknowledgement waits for one
  // (a host descheduled, stopped or fenced leases again at once, docs/coherence.md).
  co::PrefixHost::Options ho;
  ho.ack_wait_ms = co::PrefixHost::kRealAckWaitMs;
  auto host = co::PrefixHost::Join(*d->mem, d->clock, host_id, ho);
  if (!host.ok()) return FromStatus(host.status());
  d->host = std::move(*host);
  *out = d.release();
  return CXLKV_OK;
}

CXLKV_API void cxlkv_domain_leave(cxlkv_domain* d) {
  if (d == nullptr) return;
  std::vector<cxlkv_arena*> grown;
  {
    cxlkv::base::MutexLock l(d->grown_mu);
    grown = d->grown;
  }
  for (cxlkv_arena* a : grown) (void)ShrinkDomainArena(d, a);  // arenas still open: closed here
  d->arenas.reset();
  delete d;
}

CXLKV_API int cxlkv_domain_grow(cxlkv_domain* d, const cxlkv_arena_options* o, cxlkv_arena** out) {
  if (d == nullptr || out == nullptr) return Fail(CXLKV_E_INVALID, "domain and out must be set");
  if (d->arenas == nullptr) {
    return Fail(
        CXLKV_E_INVALID,
        "this domain was not joined through an orchestrator (join \"orchestrator:<socket>\")"
        " and has no pooled capacity to grow into");
  }
  cxlkv::pool::FormatOptions fo;
  if (o != nullptr) {
    fo.layout = FromLayout(o->layout);
    fo.owner_slots = o->owner_slots == 0 ? 256 : o->owner_slots;
    for (int c = 0; c < CXLKV_MAX_CLASSES && o->class_tokens[c] != 0; ++c) {
      fo.classes.push_back(
          {o->class_tokens[c], 0, o->class_weights[c] == 0 ? 1 : o->class_weights[c]});
    }
  }
  auto grown = d->arenas->Grow(fo);
  if (!grown.ok()) return FromStatus(grown.status());
  auto alloc = cxlkv::allocator::BlockAllocator::Create(std::move(grown->arena));
  if (!alloc.ok()) {
    (void)d->arenas->Shrink(grown->extent);
    return FromStatus(alloc.status());
  }
  auto* a =
      new (std::nothrow) cxlkv_arena{nullptr, std::move(*alloc), d, grown->extent, grown->revoked};
  if (a == nullptr) return Fail(CXLKV_E_INTERNAL, "out of memory");
  a->close = [d](cxlkv_arena* arena) { (void)ShrinkDomainArena(d, arena); };
  {
    cxlkv::base::MutexLock l(d->grown_mu);
    d->grown.push_back(a);
  }
  // A revocation ends the arena's other users of the memory before it swaps the window.
  d->arenas->OnGiveAway(grown->extent, [a] { cxlkv::capi::DropMemoryUsers(a); });
  *out = a;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_domain_shrink(cxlkv_domain* d, cxlkv_arena* a) {
  return ShrinkDomainArena(d, a);
}

CXLKV_API int cxlkv_domain_grow_extent(cxlkv_domain* d, cxlkv_revoke_fn on_revoke, void* ctx,
                                       uint32_t* extent, uint64_t* length, char* spec,
                                       size_t spec_len) {
  if (d == nullptr || on_revoke == nullptr || extent == nullptr || length == nullptr ||
      spec == nullptr) {
    return Fail(CXLKV_E_INVALID, "domain, on_revoke, extent, length and spec must be set");
  }
  if (d->arenas == nullptr) {
    return Fail(
        CXLKV_E_INVALID,
        "this domain was not joined through an orchestrator (join \"orchestrator:<socket>\")"
        " and has no pooled capacity to grow into");
  }
  auto raw = d->arenas->GrowRaw([on_revoke, ctx](std::uint32_t e) { on_revoke(ctx, e); });
  if (!raw.ok()) return FromStatus(raw.status());
  if (raw->spec.size() + 1 > spec_len) {
    (void)d->arenas->Shrink(raw->extent);
    *length = raw->spec.size() + 1;
    return Fail(CXLKV_E_INVALID, "spec_len is too small for the extent's spec");
  }
  std::memcpy(spec, raw->spec.c_str(), raw->spec.size() + 1);
  *extent = raw->extent;
  *length = raw->length;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_domain_shrink_extent(cxlkv_domain* d, uint32_t extent) {
  if (d == nullptr || d->arenas == nullptr) {
    return Fail(CXLKV_E_INVALID, "a domain joined through an orchestrator must be set");
  }
  return FromStatus(d->arenas->Shrink(extent));
}

CXLKV_API int cxlkv_domain_resolve(cxlkv_domain* d, const cxlkv_block_ref* ref, const void** addr) {
  if (d == nullptr || ref == nullptr || addr == nullptr) {
    return Fail(CXLKV_E_INVALID, "domain, ref and addr must be set");
  }
  {
    cxlkv::base::MutexLock l(d->grown_mu);
    for (cxlkv_arena* a : d->grown) {
      if (SameArena(a, ref)) {
        void* p = nullptr;
        const int rc = cxlkv::capi::RefToAddr(a, ref, &p);
        *addr = p;
        return rc;
      }
    }
  }
  if (d->arenas == nullptr) {
    return Fail(CXLKV_E_INVALID, "this domain was not joined through an orchestrator");
  }
  auto p = d->arenas->Resolve(ToCo(*ref));
  if (!p.ok()) {
    const int code = FromStatus(p.status());
    return code == CXLKV_E_MISMATCH ? Fail(CXLKV_E_STALE, LastError()) : code;
  }
  *addr = *p;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_domain_heartbeat(cxlkv_domain* d, cxlkv_arena* arena, size_t* freed) {
  if (d == nullptr) return Fail(CXLKV_E_INVALID, "domain must be set");
  std::vector<co::BlockRef> back;
  const absl::Status st = d->host->Heartbeat(&back);
  d->NoteStats();
  size_t n = 0;
  cxlkv::base::MutexLock l(d->grown_mu);
  for (const co::BlockRef& r : back) {
    // The arena named, or whichever of this host's extent arenas holds the block.
    cxlkv_arena* into = nullptr;
    if (arena != nullptr && std::memcmp(r.arena, arena->alloc->arena().uuid().data(), 16) == 0) {
      into = arena;
    }
    for (cxlkv_arena* g : d->grown) {
      if (into == nullptr && std::memcmp(r.arena, g->alloc->arena().uuid().data(), 16) == 0)
        into = g;
    }
    if (into == nullptr || Revoked(into)) continue;
    n += into->alloc->Free(BlockHandle{r.index, r.generation}) == FreeResult::kOk;
  }
  if (freed != nullptr) *freed = n;
  if (absl::IsAborted(st)) return Fail(CXLKV_E_MISMATCH, std::string(st.message()));
  return FromStatus(st);
}

CXLKV_API uint64_t cxlkv_namespace(const char* tenant, const char* model, const char* kv_layout) {
  return co::MakeNamespace(tenant ? tenant : "", model ? model : "", kv_layout ? kv_layout : "");
}

CXLKV_API cxlkv_prefix_key cxlkv_prefix_key_chain(uint64_t ns, const cxlkv_prefix_key* parent,
                                                  const uint32_t* tokens, size_t n_tokens) {
  const co::PrefixKey p = parent ? co::PrefixKey{parent->lo, parent->hi} : co::PrefixKey{};
  const co::PrefixKey k = co::ChainKey(ns, p, std::span<const uint32_t>(tokens, n_tokens));
  return cxlkv_prefix_key{k.lo, k.hi};
}

CXLKV_API int cxlkv_prefix_lookup(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* key,
                                  cxlkv_prefix_hit* hit) {
  if (d == nullptr || key == nullptr || hit == nullptr) {
    return Fail(CXLKV_E_INVALID, "domain, key and hit must be set");
  }
  const auto h = d->host->Lookup(ns, co::PrefixKey{key->lo, key->hi});
  if (!h) return Fail(CXLKV_E_NOT_FOUND, "no published block for this prefix in this namespace");
  *hit = cxlkv_prefix_hit{h->entry, h->entry_gen, FromCo(h->ref), h->publisher};
  return CXLKV_OK;
}

CXLKV_API int cxlkv_prefix_publish(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* key,
                                   const cxlkv_prefix_key* parent, cxlkv_arena* arena,
                                   const cxlkv_block_ref* ref) {
  if (d == nullptr || key == nullptr || arena == nullptr || ref == nullptr) {
    return Fail(CXLKV_E_INVALID, "domain, key, arena and ref must be set");
  }
  if (!SameArena(arena, ref)) return Fail(CXLKV_E_FOREIGN, "block ref names another arena");
  const co::PrefixKey p = parent ? co::PrefixKey{parent->lo, parent->hi} : co::PrefixKey{};
  absl::Status persist = absl::OkStatus();
  const absl::Status st = d->host->Publish(ns, co::PrefixKey{key->lo, key->hi}, p, ToCo(*ref), [&] {
    persist = arena->alloc->Persist(BlockHandle{ref->index, ref->generation});
    return persist.ok();
  });
  if (!persist.ok()) return FromStatus(persist);
  if (absl::IsUnavailable(st)) return Fail(CXLKV_E_FULL, std::string(st.message()));
  return FromStatus(st);
}

CXLKV_API int cxlkv_prefix_publish_chain(cxlkv_domain* d, uint64_t ns,
                                         const cxlkv_publish_item* items, size_t n,
                                         cxlkv_arena* arena, uint32_t timeout_ms) {
  if (d == nullptr || arena == nullptr || (items == nullptr && n != 0)) {
    return Fail(CXLKV_E_INVALID, "domain, items and arena must be set");
  }
  if (n == 0) return CXLKV_OK;
  if (n > d->host->header().ring_slots) {
    return Fail(CXLKV_E_INVALID, "a chain of " + std::to_string(n) +
                                     " blocks does not fit the domain's request ring of " +
                                     std::to_string(d->host->header().ring_slots) +
                                     " slots; publish it in parts");
  }
  std::vector<co::PublishItem> chain(n);
  for (size_t i = 0; i < n; ++i) {
    if (!SameArena(arena, &items[i].ref)) {
      return Fail(CXLKV_E_FOREIGN, "block ref " + std::to_string(i) + " names another arena");
    }
    chain[i] =
        co::PublishItem{co::PrefixKey{items[i].key.lo, items[i].key.hi},
                        co::PrefixKey{items[i].parent.lo, items[i].parent.hi}, ToCo(items[i].ref)};
  }
  absl::Status persist = absl::OkStatus();
  auto commit = [&] {
    for (size_t i = 0; i < n && persist.ok(); ++i) {
      persist = arena->alloc->Persist(BlockHandle{items[i].ref.index, items[i].ref.generation});
    }
    return persist.ok();
  };
  absl::Status st = d->host->PublishChain(ns, chain, commit);
  if (absl::IsUnavailable(st) && timeout_ms != 0) {
    // The ring had too little room: wait for the owner (polling its line), then once more.
    const absl::Status wait = d->host->WaitForRingRoom(static_cast<std::uint32_t>(n), timeout_ms);
    if (wait.ok()) {
      st = d->host->PublishChain(ns, chain, commit);
    } else if (!absl::IsDeadlineExceeded(wait)) {
      st = wait;  // fenced
    }
  }
  if (!persist.ok()) return FromStatus(persist);
  if (absl::IsUnavailable(st) || absl::IsAborted(st)) {
    return Fail(CXLKV_E_FULL, std::string(st.message()));
  }
  return FromStatus(st);
}

CXLKV_API int cxlkv_lease_acquire(cxlkv_domain* d, const cxlkv_prefix_hit* hit,
                                  cxlkv_lease* lease) {
  if (d == nullptr || hit == nullptr || lease == nullptr) {
    return Fail(CXLKV_E_INVALID, "domain, hit and lease must be set");
  }
  auto l = d->host->Acquire(co::Hit{hit->entry, hit->entry_gen, ToCo(hit->ref), hit->publisher});
  if (!l.ok()) {
    if (absl::IsNotFound(l.status())) return Fail(CXLKV_E_STALE, std::string(l.status().message()));
    if (absl::IsUnavailable(l.status()) || absl::IsResourceExhausted(l.status())) {
      return Fail(CXLKV_E_FULL, std::string(l.status().message()));
    }
    return FromStatus(l.status());
  }
  *lease = FromLease(*l);
  return CXLKV_OK;
}

CXLKV_API int cxlkv_lease_acquire_chain(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* keys,
                                        size_t n, cxlkv_lease* leases, size_t* n_leased) {
  if (d == nullptr || (n != 0 && (keys == nullptr || leases == nullptr)) || n_leased == nullptr) {
    return Fail(CXLKV_E_INVALID, "domain, keys, leases and n_leased must be set");
  }
  *n_leased = 0;
  std::vector<co::PrefixKey> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = co::PrefixKey{keys[i].lo, keys[i].hi};
  std::vector<co::Lease> out;
  auto got = d->host->AcquireChain(ns, k, &out);
  if (!got.ok()) {
    if (absl::IsUnavailable(got.status()) || absl::IsResourceExhausted(got.status())) {
      return Fail(CXLKV_E_FULL, std::string(got.status().message()));
    }
    return FromStatus(got.status());
  }
  for (size_t i = 0; i < out.size(); ++i) leases[i] = FromLease(out[i]);
  *n_leased = out.size();
  return CXLKV_OK;
}

CXLKV_API int cxlkv_lease_release_many(cxlkv_domain* d, cxlkv_lease* leases, size_t n) {
  if (d == nullptr || (n != 0 && leases == nullptr)) {
    return Fail(CXLKV_E_INVALID, "domain and leases must be set");
  }
  std::vector<co::Lease> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = ToLease(leases[i]);
  d->host->ReleaseAll(l);
  return CXLKV_OK;
}

CXLKV_API int cxlkv_lease_renew(cxlkv_domain* d, cxlkv_lease* lease) {
  if (d == nullptr || lease == nullptr)
    return Fail(CXLKV_E_INVALID, "domain and lease must be set");
  co::Lease l = ToLease(*lease);
  const absl::Status st = d->host->Renew(l);
  if (absl::IsDeadlineExceeded(st)) return Fail(CXLKV_E_STALE, std::string(st.message()));
  if (!st.ok()) return FromStatus(st);
  lease->deadline_ms = l.deadline_ms;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_lease_release(cxlkv_domain* d, cxlkv_lease* lease) {
  if (d == nullptr || lease == nullptr)
    return Fail(CXLKV_E_INVALID, "domain and lease must be set");
  co::Lease l = ToLease(*lease);
  d->host->Release(l);
  return CXLKV_OK;
}

CXLKV_API int cxlkv_lease_validate(cxlkv_domain* d, const cxlkv_lease* lease) {
  if (d == nullptr || lease == nullptr)
    return Fail(CXLKV_E_INVALID, "domain and lease must be set");
  const absl::Status st = d->host->ValidateAfterCopy(ToLease(*lease));
  if (!st.ok()) return Fail(CXLKV_E_STALE, std::string(st.message()));
  return CXLKV_OK;
}

CXLKV_API int cxlkv_prefix_retire(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* key) {
  if (d == nullptr || key == nullptr) return Fail(CXLKV_E_INVALID, "domain and key must be set");
  const absl::Status st = d->host->Retire(ns, co::PrefixKey{key->lo, key->hi});
  if (absl::IsUnavailable(st)) return Fail(CXLKV_E_FULL, std::string(st.message()));
  return FromStatus(st);
}

namespace {

// The bytes [offset, offset + len) of a leased block in this process, after the argument,
// deadline and block checks of cxlkv_lease_copy_out / cxlkv_block_invalidate (cxlkv.h).
// A copy-out (`in_place` false) may start past the deadline: ReadLeased takes the lease again.
int LeasedRange(cxlkv_domain* d, const cxlkv_arena* arena, const cxlkv_lease* lease,
                uint64_t offset, size_t len, const std::byte** out, bool in_place) {
  if (d == nullptr || lease == nullptr)
    return Fail(CXLKV_E_INVALID, "domain and lease must be set");
  if (len == 0) return Fail(CXLKV_E_INVALID, "len must be at least 1 byte");
  if (in_place && d->clock.NowMs() > lease->deadline_ms) {
    return Fail(CXLKV_E_STALE, "the lease's deadline has passed (" +
                                   std::to_string(lease->deadline_ms) +
                                   " ms): nothing was read; acquire the block again");
  }
  const cxlkv_block_ref& ref = lease->ref;
  const cxlkv_arena* in = arena;
  if (in != nullptr && !SameArena(in, &ref)) {
    return Fail(CXLKV_E_FOREIGN, "the lease's block is not in this arena (another arena uuid)");
  }
  void* addr = nullptr;
  std::uint64_t bytes = 0;
  if (in == nullptr) {
    cxlkv::base::MutexLock l(d->grown_mu);
    for (cxlkv_arena* a : d->grown) {
      if (SameArena(a, &ref)) in = a;
    }
    if (in != nullptr) {
      if (const int rc = cxlkv::capi::RefToAddr(in, &ref, &addr); rc != CXLKV_OK) return rc;
      bytes = cxlkv::capi::BlockBytes(cxlkv::capi::ArenaOf(in), ref.index);
    }
  } else {
    if (const int rc = cxlkv::capi::RefToAddr(in, &ref, &addr); rc != CXLKV_OK) return rc;
    bytes = cxlkv::capi::BlockBytes(cxlkv::capi::ArenaOf(in), ref.index);
  }
  if (in == nullptr) {
    if (d->arenas == nullptr) {
      return Fail(CXLKV_E_INVALID,
                  "arena is NULL, but this domain was not joined through an orchestrator: pass "
                  "the arena handle that maps the block's arena in this process");
    }
    auto span = d->arenas->ResolveBlock(ToCo(ref));
    if (!span.ok()) {
      const int code = FromStatus(span.status());
      return code == CXLKV_E_MISMATCH ? Fail(CXLKV_E_STALE, LastError()) : code;
    }
    addr = span->addr;
    bytes = span->bytes;
  }
  if (offset > bytes || len > bytes - offset) {
    return Fail(CXLKV_E_INVALID, std::to_string(len) + " bytes at offset " +
                                     std::to_string(offset) + " are not inside block " +
                                     std::to_string(ref.index) + " of " + std::to_string(bytes) +
                                     " bytes");
  }
  *out = static_cast<const std::byte*>(addr) + offset;
  return CXLKV_OK;
}

// cxlkv_lease_copy_out, which cxlkv_lease_copy_out_many runs for each item (a call inside the
// library, not through the exported symbol: capi_internal.h's rule).
int CopyOut(cxlkv_domain* d, const cxlkv_arena* arena, cxlkv_lease* lease, uint64_t offset,
            void* dst, size_t len) {
  if (dst == nullptr) return Fail(CXLKV_E_INVALID, "dst must be set");
  const std::byte* src = nullptr;
  if (const int rc = LeasedRange(d, arena, lease, offset, len, &src, /*in_place=*/false);
      rc != CXLKV_OK) {
    return rc;
  }
  // The protocol's read step (invalidate, copy, validate the generation), with the lease kept
  // for the whole copy on a busy host: PrefixHost::ReadLeased. The lease comes back updated.
  co::Lease l = ToLease(*lease);
  const absl::Status st = d->host->ReadLeased(l, src, dst, len);
  *lease = FromLease(l);
  if (!st.ok()) return Fail(CXLKV_E_STALE, std::string(st.message()));
  return CXLKV_OK;
}

}  // namespace

CXLKV_API int cxlkv_lease_copy_out(cxlkv_domain* d, const cxlkv_arena* arena, cxlkv_lease* lease,
                                   uint64_t offset, void* dst, size_t len) {
  return CopyOut(d, arena, lease, offset, dst, len);
}

CXLKV_API int cxlkv_lease_copy_out_many(cxlkv_domain* d, const cxlkv_copy_out_item* items, size_t n,
                                        int* results) {
  if (d == nullptr) return Fail(CXLKV_E_INVALID, "domain must be set");
  if (n == 0) return CXLKV_OK;
  if (items == nullptr || results == nullptr) {
    return Fail(CXLKV_E_INVALID, "items and results must be set when n > 0");
  }
  // Each item is one cxlkv_lease_copy_out: the same checks, the same read step and the same
  // validation after its own copy. Failures are cold; the one reported keeps its message.
  size_t reported = n;
  std::string message;
  for (size_t i = 0; i < n; ++i) {
    const cxlkv_copy_out_item& it = items[i];
    const int rc = CopyOut(d, it.arena, it.lease, it.offset, it.dst, it.len);
    results[i] = rc;
    if (rc == CXLKV_OK) continue;
    // The first non-stale failure outranks a stale one reported before it.
    if (reported == n || (results[reported] == CXLKV_E_STALE && rc != CXLKV_E_STALE)) {
      reported = i;
      message = LastError();
    }
  }
  if (reported == n) return CXLKV_OK;
  return Fail(results[reported], "item " + std::to_string(reported) + ": " + message);
}

CXLKV_API int cxlkv_domain_lease_stats(cxlkv_domain* d, cxlkv_lease_stats* out) {
  if (d == nullptr || out == nullptr) return Fail(CXLKV_E_INVALID, "domain and out must be set");
  const co::PrefixHost::Stats s = d->host->stats();
  *out = cxlkv_lease_stats{
      s.leases_refused_late, s.leases_renewed_for_copy, s.leases_retaken,      s.copies_retried,
      s.copies_discarded,    s.pauses_detected,         s.rejoins_after_fence, s.ack_waits};
  return CXLKV_OK;
}

CXLKV_API int cxlkv_region_object(const cxlkv_block_ref* ref, uint64_t* offset, uint64_t* length,
                                  uint64_t* generation, uint32_t* region_tag) {
  if (ref == nullptr) return Fail(CXLKV_E_INVALID, "ref must be set");
  const auto o = co::AsRegionObject(ToCo(*ref));
  if (!o.has_value()) {
    return Fail(CXLKV_E_INVALID,
                "not a region object's ref: an arena block (read it with cxlkv_lease_copy_out)");
  }
  if (offset != nullptr) *offset = o->offset;
  if (length != nullptr) *length = o->length;
  if (generation != nullptr) *generation = o->generation;
  if (region_tag != nullptr) *region_tag = o->region_tag;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_lease_copy_out_region(cxlkv_domain* d, cxlkv_lease* lease, const void* region,
                                          uint64_t region_bytes, uint64_t offset, void* dst,
                                          size_t len) {
  if (d == nullptr || lease == nullptr || region == nullptr || dst == nullptr) {
    return Fail(CXLKV_E_INVALID, "domain, lease, region and dst must be set");
  }
  const auto o = co::AsRegionObject(ToCo(lease->ref));
  if (!o.has_value()) {
    return Fail(CXLKV_E_INVALID,
                "the lease is on an arena block, not a region object: use cxlkv_lease_copy_out");
  }
  if (len == 0 || offset > o->length || len > o->length - offset) {
    return Fail(CXLKV_E_INVALID, "the range [" + std::to_string(offset) + ", +" +
                                     std::to_string(len) + ") is not inside the object (" +
                                     std::to_string(o->length) + " bytes)");
  }
  if (o->offset > region_bytes || o->length > region_bytes - o->offset) {
    return Fail(CXLKV_E_INVALID,
                "the object (at " + std::to_string(o->offset) + ", " + std::to_string(o->length) +
                    " bytes) is not inside the region passed (" + std::to_string(region_bytes) +
                    " bytes): map the whole region (LMCache's: region_offset and "
                    "capacity_bytes of /cxlkv/v1/stats)");
  }
  const auto* src = static_cast<const std::byte*>(region) + o->offset + offset;
  co::Lease l = ToLease(*lease);
  const absl::Status st = d->host->ReadLeased(l, src, dst, len);
  *lease = FromLease(l);
  if (!st.ok()) return Fail(CXLKV_E_STALE, std::string(st.message()));
  return CXLKV_OK;
}

CXLKV_API int cxlkv_block_invalidate(cxlkv_domain* d, const cxlkv_arena* arena,
                                     const cxlkv_lease* lease, uint64_t offset, size_t len,
                                     const void** addr) {
  if (addr == nullptr) return Fail(CXLKV_E_INVALID, "addr must be set");
  const std::byte* p = nullptr;
  if (const int rc = LeasedRange(d, arena, lease, offset, len, &p, /*in_place=*/true);
      rc != CXLKV_OK) {
    return rc;
  }
  co::Invalidate(p, len);
  *addr = p;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_owner_open(const char* spec, cxlkv_owner** out) {
  if (out == nullptr) return Fail(CXLKV_E_INVALID, "out must be set");
  auto region = OpenDomainRegion(spec);
  if (!region.ok()) return FromStatus(region.status());
  auto o = std::make_unique<cxlkv_owner>();
  o->region = std::move(*region);
  o->mem = std::make_unique<co::DirectMem>(o->region->addr(), o->region->size_bytes());
  auto owner = co::PrefixOwner::Open(*o->mem, o->clock);
  if (!owner.ok()) return FromStatus(owner.status());
  o->owner = std::move(*owner);
  *out = o.release();
  return CXLKV_OK;
}

CXLKV_API void cxlkv_owner_step(cxlkv_owner* o) {
  if (o != nullptr) o->owner->Step();
}

CXLKV_API void cxlkv_owner_close(cxlkv_owner* o) { delete o; }
