// The C API's arena half: pools, KV arenas and their blocks (cxlkv.h: cxlkv_pool_*,
// cxlkv_arena_*, cxlkv_alloc*, cxlkv_free*, block refs and stats), a thin translation to
// pool/ and allocator/.
#include "cxlkv/pool/arena.h"

#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "capi_internal.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/pool/region.h"

namespace {

using cxlkv::allocator::BlockHandle;
using cxlkv::allocator::FreeResult;
using cxlkv::capi::Fail;
using cxlkv::capi::FailRevoked;
using cxlkv::capi::FromLayout;
using cxlkv::capi::FromStatus;
using cxlkv::capi::LastError;
using cxlkv::capi::Revoked;
using cxlkv::capi::SameArena;

int FromFree(FreeResult r, const cxlkv_block_ref* ref) {
  switch (r) {
    case FreeResult::kOk:
      return CXLKV_OK;
    case FreeResult::kDoubleFree:
      return Fail(CXLKV_E_DOUBLE_FREE, "double free of block " + std::to_string(ref->index) +
                                           " generation " + std::to_string(ref->generation));
    case FreeResult::kStaleGeneration:
      return Fail(CXLKV_E_STALE, "block " + std::to_string(ref->index) + " generation " +
                                     std::to_string(ref->generation) +
                                     " is stale: it was freed and reused since");
    case FreeResult::kForeign:
      return Fail(CXLKV_E_FOREIGN,
                  "block index " + std::to_string(ref->index) + " is not in this arena");
  }
  return CXLKV_E_INTERNAL;
}

void ToRef(const cxlkv_arena* a, BlockHandle h, cxlkv_block_ref* ref) {
  std::memcpy(ref->arena_uuid, a->alloc->arena().uuid().data(), 16);
  ref->index = h.index;
  ref->generation = h.generation;
}

cxlkv::allocator::BlockRef FromRef(const cxlkv_block_ref* ref) {
  cxlkv::allocator::BlockRef r;
  std::memcpy(r.arena.data(), ref->arena_uuid, 16);
  r.index = ref->index;
  r.generation = ref->generation;
  return r;
}

int Adopt(cxlkv_pool* pool, absl::StatusOr<std::unique_ptr<cxlkv::pool::Arena>> arena,
          cxlkv_arena** out) {
  if (!arena.ok()) return FromStatus(arena.status());
  auto alloc = cxlkv::allocator::BlockAllocator::Create(std::move(*arena));
  if (!alloc.ok()) return FromStatus(alloc.status());
  auto* a = new (std::nothrow) cxlkv_arena{pool, std::move(*alloc)};
  if (a == nullptr) return Fail(CXLKV_E_INTERNAL, "out of memory");
  pool->arena_open = true;
  *out = a;
  return CXLKV_OK;
}

// The arena gets its own mapping of the pool's memory, so a memfd pool keeps its contents
// across arena close/open for as long as the pool is open.
absl::StatusOr<std::unique_ptr<cxlkv::pool::Region>> TakeRegion(cxlkv_pool* pool) {
  if (pool->arena_open) {
    return absl::FailedPreconditionError(
        "this pool already has an open arena; close it first (one arena per pool)");
  }
  return pool->region->Duplicate();
}

int Free(cxlkv_arena* a, const cxlkv_block_ref* ref) {
  if (a == nullptr || ref == nullptr) return Fail(CXLKV_E_INVALID, "arena and ref must be set");
  if (Revoked(a)) return FailRevoked(a);
  if (!SameArena(a, ref)) return Fail(CXLKV_E_FOREIGN, "block ref names another arena");
  return FromFree(a->alloc->Free(BlockHandle{ref->index, ref->generation}), ref);
}

}  // namespace

namespace cxlkv::capi {

const pool::Arena& ArenaOf(const cxlkv_arena* arena) { return arena->alloc->arena(); }

bool SameArena(const cxlkv_arena* a, const cxlkv_block_ref* ref) {
  return std::memcmp(ref->arena_uuid, a->alloc->arena().uuid().data(), 16) == 0;
}

cxlkv::pool::KvLayout FromLayout(const cxlkv_kv_layout& l) {
  return cxlkv::pool::KvLayout{l.layers,
                               l.kv_heads,
                               l.head_dim,
                               l.dtype_bytes,
                               l.tokens_per_block,
                               l.layer_separate ? cxlkv::pool::KvLayoutKind::kLayerSeparate
                                                : cxlkv::pool::KvLayoutKind::kContiguous};
}

int FailRevoked(const cxlkv_arena* a) {
  return Fail(CXLKV_E_REVOKED,
              absl::StrCat("arena ", cxlkv::pool::UuidToString(a->alloc->arena().uuid()),
                           " lived in extent ", a->extent,
                           " whose capacity lease lapsed (the orchestrator was unreachable or "
                           "this host was fenced); its blocks are gone: close it and grow again"));
}

std::uint64_t BlockBytes(const pool::Arena& arena, std::uint32_t index) {
  for (std::uint32_t c = 0; c < arena.class_count(); ++c) {
    const pool::ClassRecord& k = arena.class_record(c);
    if (index >= k.first_index && index - k.first_index < k.block_count) return k.block_bytes;
  }
  return 0;
}

namespace {

struct MemoryUser {
  const cxlkv_arena* arena;
  const void* owner;
  std::uint64_t id;
  std::function<void()> drop;
};
cxlkv::base::Mutex memory_users_mu;
std::vector<MemoryUser>& MemoryUsers() {
  static auto* users = new std::vector<MemoryUser>();  // never destroyed: used at exit
  return *users;
}

}  // namespace

void AddMemoryUser(const cxlkv_arena* a, const void* owner, std::uint64_t id,
                   std::function<void()> drop) {
  cxlkv::base::MutexLock l(memory_users_mu);
  MemoryUsers().push_back(MemoryUser{a, owner, id, std::move(drop)});
}

void RemoveMemoryUser(const void* owner, std::uint64_t id) {
  cxlkv::base::MutexLock l(memory_users_mu);
  std::erase_if(MemoryUsers(), [&](const MemoryUser& u) { return u.owner == owner && u.id == id; });
}

void RemoveMemoryUsers(const void* owner) {
  cxlkv::base::MutexLock l(memory_users_mu);
  std::erase_if(MemoryUsers(), [&](const MemoryUser& u) { return u.owner == owner; });
}

void DropMemoryUsers(const cxlkv_arena* a) {
  // Under the lock throughout: an owner removing its uses (a gpu handle closing) waits until
  // a drop that uses it has finished.
  cxlkv::base::MutexLock l(memory_users_mu);
  auto& users = MemoryUsers();
  for (auto it = users.begin(); it != users.end();) {
    if (it->arena != a) {
      ++it;
      continue;
    }
    it->drop();
    it = users.erase(it);
  }
}

int RefToAddr(const cxlkv_arena* a, const cxlkv_block_ref* ref, void** addr) {
  if (a == nullptr || ref == nullptr || addr == nullptr) {
    return Fail(CXLKV_E_INVALID, "arena, ref and addr must be set");
  }
  if (Revoked(a)) return FailRevoked(a);
  auto p = a->alloc->Resolve(FromRef(ref));
  if (!p.ok()) {
    const int code = FromStatus(p.status());
    return code == CXLKV_E_MISMATCH  ? Fail(CXLKV_E_STALE, LastError())
           : code == CXLKV_E_INVALID ? Fail(CXLKV_E_FOREIGN, LastError())
                                     : code;
  }
  *addr = *p;
  return CXLKV_OK;
}

}  // namespace cxlkv::capi

CXLKV_API int cxlkv_pool_open(const char* spec, cxlkv_pool** out) {
  if (spec == nullptr || out == nullptr) return Fail(CXLKV_E_INVALID, "spec and out must be set");
  auto region = cxlkv::pool::OpenRegion(spec);
  if (!region.ok()) return FromStatus(region.status());
  *out = new (std::nothrow) cxlkv_pool{std::move(*region), false};
  return *out == nullptr ? Fail(CXLKV_E_INTERNAL, "out of memory") : CXLKV_OK;
}

CXLKV_API void cxlkv_pool_close(cxlkv_pool* pool) { delete pool; }

CXLKV_API int cxlkv_arena_create(cxlkv_pool* pool, const cxlkv_arena_options* o,
                                 cxlkv_arena** out) {
  if (pool == nullptr || o == nullptr || out == nullptr) {
    return Fail(CXLKV_E_INVALID, "pool, options and out must be set");
  }
  cxlkv::pool::FormatOptions fo;
  fo.layout = FromLayout(o->layout);
  fo.owner_slots = o->owner_slots == 0 ? 256 : o->owner_slots;
  fo.force = (o->flags & CXLKV_FORMAT_FORCE) != 0;
  for (int c = 0; c < CXLKV_MAX_CLASSES && o->class_tokens[c] != 0; ++c) {
    fo.classes.push_back(
        {o->class_tokens[c], 0, o->class_weights[c] == 0 ? 1 : o->class_weights[c]});
  }
  auto region = TakeRegion(pool);
  if (!region.ok()) return FromStatus(region.status());
  return Adopt(pool, cxlkv::pool::Arena::Format(std::move(*region), fo), out);
}

CXLKV_API int cxlkv_arena_open(cxlkv_pool* pool, const cxlkv_kv_layout* expect, cxlkv_arena** out) {
  if (pool == nullptr || out == nullptr) return Fail(CXLKV_E_INVALID, "pool and out must be set");
  cxlkv::pool::OpenOptions oo;
  if (expect != nullptr) oo.expect_layout = FromLayout(*expect);
  auto region = TakeRegion(pool);
  if (!region.ok()) return FromStatus(region.status());
  return Adopt(pool, cxlkv::pool::Arena::Open(std::move(*region), oo), out);
}

CXLKV_API void cxlkv_arena_close(cxlkv_arena* arena) {
  if (arena == nullptr) return;
  if (arena->close) {  // its maker closes it (a domain's arena: the extent goes back)
    const std::function<void(cxlkv_arena*)> close = std::move(arena->close);
    close(arena);
    return;
  }
  cxlkv::capi::DropMemoryUsers(arena);  // before the mapping goes
  arena->pool->arena_open = false;
  delete arena;
}

CXLKV_API uint64_t cxlkv_block_size(const cxlkv_arena* a, uint32_t cls) {
  if (a == nullptr || cls >= a->alloc->class_count()) return 0;
  return a->alloc->block_bytes(cls);
}

CXLKV_API int cxlkv_alloc(cxlkv_arena* a, uint32_t cls, cxlkv_block_ref* ref, void** addr) {
  if (a == nullptr || ref == nullptr) return Fail(CXLKV_E_INVALID, "arena and ref must be set");
  if (Revoked(a)) return FailRevoked(a);
  const BlockHandle h = a->alloc->Alloc(cls);
  if (!h.valid()) return FromStatus(a->alloc->ExplainAllocFailure(cls));
  ToRef(a, h, ref);
  if (addr != nullptr) *addr = a->alloc->Addr(h);
  return CXLKV_OK;
}

CXLKV_API int cxlkv_free(cxlkv_arena* a, const cxlkv_block_ref* ref) { return Free(a, ref); }

CXLKV_API int cxlkv_alloc_bulk(cxlkv_arena* a, uint32_t cls, size_t n, cxlkv_block_ref* refs,
                               void** addrs) {
  if (a == nullptr || (refs == nullptr && n != 0)) {
    return Fail(CXLKV_E_INVALID, "arena and refs must be set");
  }
  if (Revoked(a)) return FailRevoked(a);
  std::unique_ptr<BlockHandle[]> hs(new (std::nothrow) BlockHandle[n]);
  if (hs == nullptr) return Fail(CXLKV_E_INTERNAL, "out of memory");
  if (!a->alloc->AllocBulk(cls, n, hs.get())) {
    return FromStatus(a->alloc->ExplainAllocFailure(cls));
  }
  for (size_t i = 0; i < n; ++i) {
    ToRef(a, hs[i], &refs[i]);
    if (addrs != nullptr) addrs[i] = a->alloc->Addr(hs[i]);
  }
  return CXLKV_OK;
}

CXLKV_API int cxlkv_free_bulk(cxlkv_arena* a, const cxlkv_block_ref* refs, size_t n) {
  int first = CXLKV_OK;
  for (size_t i = 0; i < n; ++i) {
    const int rc = Free(a, &refs[i]);
    if (rc != CXLKV_OK && first == CXLKV_OK) first = rc;
  }
  return first;
}

CXLKV_API int cxlkv_block_persist(cxlkv_arena* a, const cxlkv_block_ref* ref) {
  if (a == nullptr || ref == nullptr) return Fail(CXLKV_E_INVALID, "arena and ref must be set");
  if (Revoked(a)) return FailRevoked(a);
  if (!SameArena(a, ref)) return Fail(CXLKV_E_FOREIGN, "block ref names another arena");
  return FromStatus(a->alloc->Persist(BlockHandle{ref->index, ref->generation}));
}

CXLKV_API int cxlkv_ref_to_addr(const cxlkv_arena* a, const cxlkv_block_ref* ref, void** addr) {
  return cxlkv::capi::RefToAddr(a, ref, addr);
}

CXLKV_API int cxlkv_addr_to_ref(const cxlkv_arena* a, const void* addr, cxlkv_block_ref* ref) {
  if (a == nullptr || ref == nullptr) return Fail(CXLKV_E_INVALID, "arena and ref must be set");
  auto r = a->alloc->RefOf(addr);
  if (!r.ok()) {
    return FromStatus(r.status()) == CXLKV_E_INVALID ? Fail(CXLKV_E_FOREIGN, LastError())
                                                     : CXLKV_E_STALE;
  }
  std::memcpy(ref->arena_uuid, r->arena.data(), 16);
  ref->index = r->index;
  ref->generation = r->generation;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_arena_stats_get(const cxlkv_arena* a, cxlkv_arena_stats* s) {
  if (a == nullptr || s == nullptr) return Fail(CXLKV_E_INVALID, "arena and stats must be set");
  const cxlkv::allocator::AllocatorStats st = a->alloc->Stats();
  std::memset(s, 0, sizeof(*s));
  std::memcpy(s->arena_uuid, a->alloc->arena().uuid().data(), 16);
  s->region_bytes = st.usage.region_bytes;
  s->metadata_bytes = st.usage.metadata_bytes;
  s->owners_active = st.usage.owners_active;
  s->class_count = a->alloc->class_count();
  s->bad_frees = st.bad_frees;
  for (uint32_t c = 0; c < s->class_count; ++c) {
    const auto& u = st.usage.classes[c];
    cxlkv_class_stats& o = s->classes[c];
    o.block_bytes = u.block_bytes;
    o.total_blocks = u.total;
    o.free_blocks = u.free;
    o.cached_blocks = u.cached;
    o.allocated_blocks = u.allocated;
    o.persisted_blocks = u.persisted;
    o.largest_free_run = u.largest_free_run;
    o.allocs = st.classes[c].allocs;
    o.frees = st.classes[c].frees;
    o.failed_allocs = st.classes[c].failed_allocs;
  }
  return CXLKV_OK;
}

CXLKV_API void cxlkv_copy_to_block(void* block, const void* src, size_t len) {
  cxlkv::coherence::CopyNt(block, src, len);
}
