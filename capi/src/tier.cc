// The C API's tiering half (cxlkv.h: cxlkv_tier_*): handles, argument checks and status mapping
// over a tier::TieredStore (tier/tiered_store.h), which holds the store itself:
// one size class of an arena and an NVMe store under the placement rule.
//
// Locks: cxlkv_tier::life is shared by every call and exclusive when the tier ends (closed,
// or its arena's memory going); the store's own locks are below it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "capi_internal.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/tier/tiered_store.h"

namespace {

namespace ti = cxlkv::tier;
using cxlkv::capi::Fail;
using cxlkv::capi::FromStatus;
using Key = cxlkv::coherence::PrefixKey;

// The (arena, class) pairs that have a tier: one tier per class.
cxlkv::base::Mutex registry_mu;
std::vector<std::pair<const cxlkv_arena*, std::uint32_t>>& Registry() {
  static auto* r = new std::vector<std::pair<const cxlkv_arena*, std::uint32_t>>();
  return *r;
}

}  // namespace

struct cxlkv_tier {
  const cxlkv_arena* arena = nullptr;  // do not touch once `s` is null: it may be gone
  std::uint32_t cls = 0;
  std::string name;  // "tier over arena <uuid> class <n>", for messages

  std::shared_mutex life;
  std::unique_ptr<ti::TieredStore> s;  // null once the tier ended
  std::string ended;                   // why it ended
};

namespace {

using Tier = cxlkv_tier;

// ---- status mapping --------------------------------------------------------------------------

// A per-key status as a code: kFailedPrecondition means "not now" here (in flight, pinned,
// cooling down).
int CodeOf(const absl::Status& st) {
  if (absl::IsFailedPrecondition(st)) return Fail(CXLKV_E_BUSY, std::string(st.message()));
  return FromStatus(st);
}

int ResidenceCode(ti::Outcome o) {
  switch (o) {
    case ti::Outcome::kMissing:
      return CXLKV_TIER_MISSING;
    case ti::Outcome::kCxl:
      return CXLKV_TIER_IN_CXL;
    case ti::Outcome::kNvme:
      return CXLKV_TIER_ON_NVME;
    case ti::Outcome::kDemoting:
      return CXLKV_TIER_DEMOTING;
    case ti::Outcome::kPromoting:
      return CXLKV_TIER_PROMOTING;
    case ti::Outcome::kDropped:
      return CXLKV_TIER_DROPPED;
  }
  return CXLKV_TIER_MISSING;
}

// Per-key results into `out` (may be null); the first failure's code and message (prefixed
// with the call) become the return value and this thread's last error.
int Results(const std::vector<ti::KeyResult>& res, const char* call, int* out) {
  int first = CXLKV_OK;
  std::string message;
  for (std::size_t i = 0; i < res.size(); ++i) {
    int rc = ResidenceCode(res[i].outcome);
    if (!res[i].status.ok()) {
      rc = CodeOf(res[i].status);
      if (first == CXLKV_OK) {
        first = rc;
        message = absl::StrCat(call, ": ", res[i].status.message());
      }
    }
    if (out != nullptr) out[i] = rc;
  }
  return first == CXLKV_OK ? CXLKV_OK : Fail(first, message);
}

// ---- life ------------------------------------------------------------------------------------

// Ends the tier: NVMe I/O drained (prefetch callbacks run), CXL blocks freed, store closed.
// Runs when the tier closes, or from DropMemoryUsers before its arena's memory goes.
void End(Tier* t, const std::string& why) {
  std::unique_lock l(t->life);
  if (t->s == nullptr) return;
  t->s.reset();
  t->ended = why;
  cxlkv::base::MutexLock rl(registry_mu);
  std::erase(Registry(), std::make_pair(t->arena, t->cls));
}

int FailEnded(const Tier* t) {
  return Fail(CXLKV_E_INVALID, absl::StrCat(t->name, " is closed: ", t->ended,
                                            "; cxlkv_tier_close it and open a new tier"));
}

// Every call but open and close: holds the tier's life shared while it runs.
class Use {
 public:
  explicit Use(Tier* t) : l_(t->life) {}

 private:
  std::shared_lock<std::shared_mutex> l_;
};

// ---- argument checks -------------------------------------------------------------------------

std::vector<Key> Keys(const cxlkv_prefix_key* keys, std::size_t n) {
  std::vector<Key> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = Key{keys[i].lo, keys[i].hi};
  return out;
}

int CheckRequest(const Tier* t, const cxlkv_tier_request* r) {
  if (t == nullptr || r == nullptr) return Fail(CXLKV_E_INVALID, "tier and request must be set");
  if (r->chain == nullptr || r->n == 0 || r->first >= r->n) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat("request: chain must hold n >= 1 keys and first < n (n ", r->n,
                             ", first ", r->first, ")"));
  }
  if (r->pin < 0 || r->pin > 3) {
    return Fail(CXLKV_E_INVALID, absl::StrCat("request: pin ", r->pin,
                                              " is out of range [0, 3] (as [[namespace]] pin)"));
  }
  return CXLKV_OK;
}

int CheckLen(const Tier* t, std::size_t len, const char* what) {
  if (len != t->s->block_bytes()) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat(what, ": len is ", len, " bytes but ", t->name, " keeps blocks of ",
                             t->s->block_bytes(), " bytes (cxlkv_tier_block_size)"));
  }
  return CXLKV_OK;
}

// The store's request for a C one; `keys` holds its chain.
ti::StoreRequest Request(const cxlkv_tier_request* r, const std::vector<Key>& keys) {
  ti::StoreRequest q;
  q.ns = r->ns;
  q.chain = keys;
  q.first = r->first;
  q.tokens = r->tokens;
  q.queue_depth = r->queue_depth;
  q.pin = r->pin;
  if ((r->flags & CXLKV_TIER_RECORD_USE) != 0) q.record_use_from = r->first;
  q.force = (r->flags & CXLKV_TIER_PREFETCH_FORCE) != 0;
  return q;
}

void FillRef(const Tier* t, const cxlkv::allocator::BlockHandle& h, cxlkv_block_ref* ref) {
  std::memcpy(ref->arena_uuid, t->s->arena_uuid().data(), 16);
  ref->index = h.index;
  ref->generation = h.generation;
}

// ---- open ------------------------------------------------------------------------------------

int Open(cxlkv_arena* arena, const cxlkv_tier_options* o, Tier* t) {
  if (o->cxl_kind != CXLKV_TIER_CXL_EXPANDED && o->cxl_kind != CXLKV_TIER_CXL_POOLED) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat("cxlkv_tier_open: cxl_kind ", o->cxl_kind,
                             " is not a CXL tier: pass CXLKV_TIER_CXL_EXPANDED (0) or "
                             "CXLKV_TIER_CXL_POOLED (1)"));
  }
  if (o->nvme_dir == nullptr || o->nvme_dir[0] == '\0') {
    return Fail(CXLKV_E_INVALID,
                "cxlkv_tier_open: nvme_dir must name the NVMe store's directory (on a local "
                "file system with O_DIRECT: ext4, xfs)");
  }
  constexpr std::uint32_t kKnownFlags =
      CXLKV_TIER_NVME_DSYNC | CXLKV_TIER_NVME_STAGE_READS | CXLKV_TIER_NVME_DIRECT_READS;
  if ((o->flags & ~kKnownFlags) != 0) {
    return Fail(CXLKV_E_INVALID, absl::StrCat("cxlkv_tier_open: unknown flags 0x",
                                              absl::Hex(o->flags & ~kKnownFlags),
                                              "; pass CXLKV_TIER_NVME_* flags only"));
  }
  if ((o->flags & CXLKV_TIER_NVME_STAGE_READS) != 0 &&
      (o->flags & CXLKV_TIER_NVME_DIRECT_READS) != 0) {
    return Fail(CXLKV_E_INVALID,
                "cxlkv_tier_open: flags CXLKV_TIER_NVME_STAGE_READS and "
                "CXLKV_TIER_NVME_DIRECT_READS contradict each other; pass one, or neither to "
                "let the store measure its disk");
  }
  cxlkv::allocator::BlockAllocator& alloc = *arena->alloc;
  t->arena = arena;
  t->cls = o->size_class;
  t->name = absl::StrCat("tier over arena ", cxlkv::pool::UuidToString(alloc.arena().uuid()),
                         " class ", o->size_class);

  // The rule: the config's [placement] table (or the defaults), then its calibration.
  auto placement = ti::LoadPlacement(o->config_path);
  if (!placement.ok()) {
    return Fail(FromStatus(placement.status()),
                absl::StrCat("cxlkv_tier_open: ", placement.status().message()));
  }
  ti::TieredStoreOptions so;
  so.name = t->name;
  so.size_class = o->size_class;
  so.cxl_tier =
      o->cxl_kind == CXLKV_TIER_CXL_EXPANDED ? ti::Tier::kCxlExpanded : ti::Tier::kCxlPooled;
  so.cxl_blocks = o->cxl_blocks;
  so.nvme_blocks = o->nvme_blocks;
  so.placer.params = placement->config.params;
  so.placer.tracker = placement->config.reuse_tracker;
  so.nvme.dir = o->nvme_dir;
  so.nvme.capacity_bytes = o->nvme_bytes;
  if (o->nvme_queue_depth != 0) so.nvme.queue_depth = o->nvme_queue_depth;
  so.nvme.dsync = (o->flags & CXLKV_TIER_NVME_DSYNC) != 0;
  if ((o->flags & CXLKV_TIER_NVME_STAGE_READS) != 0) {
    so.nvme.read_staging = cxlkv::nvme::NvmeStoreOptions::ReadStaging::kAlways;
  } else if ((o->flags & CXLKV_TIER_NVME_DIRECT_READS) != 0) {
    so.nvme.read_staging = cxlkv::nvme::NvmeStoreOptions::ReadStaging::kNever;
  }

  const auto me = std::make_pair(static_cast<const cxlkv_arena*>(arena), t->cls);
  {
    cxlkv::base::MutexLock l(registry_mu);
    if (std::find(Registry().begin(), Registry().end(), me) != Registry().end()) {
      return Fail(CXLKV_E_EXISTS, absl::StrCat("cxlkv_tier_open: size class ", t->cls,
                                               " of this arena already has a tier; close it "
                                               "first (one tier per size class)"));
    }
    Registry().push_back(me);
  }
  auto s = ti::TieredStore::Open(alloc, std::move(so), placement->source);
  if (!s.ok()) {
    cxlkv::base::MutexLock l(registry_mu);
    std::erase(Registry(), me);
    if (absl::IsInvalidArgument(s.status())) {
      return Fail(CXLKV_E_INVALID, absl::StrCat("cxlkv_tier_open: ", s.status().message()));
    }
    return FromStatus(s.status());
  }
  t->s = std::move(*s);
  return CXLKV_OK;
}

}  // namespace

CXLKV_API int cxlkv_tier_open(cxlkv_arena* arena, const cxlkv_tier_options* o, cxlkv_tier** out) {
  if (arena == nullptr || o == nullptr || out == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_open: arena, options and out must be set");
  }
  if (cxlkv::capi::Revoked(arena)) return cxlkv::capi::FailRevoked(arena);
  std::unique_ptr<Tier> t(new (std::nothrow) Tier());
  if (t == nullptr) return Fail(CXLKV_E_INTERNAL, "out of memory");
  if (const int rc = Open(arena, o, t.get()); rc != CXLKV_OK) return rc;
  // Before the arena's memory goes (closed, shrunk, revoked), the tier ends: its I/O into
  // CXL blocks drained, its blocks freed while the arena can still take them.
  Tier* self = t.get();
  cxlkv::capi::AddMemoryUser(arena, self, 0, [self] {
    End(self, "its arena was closed, shrunk or revoked while the tier was open");
  });
  *out = t.release();
  return CXLKV_OK;
}

CXLKV_API void cxlkv_tier_close(cxlkv_tier* t) {
  if (t == nullptr) return;
  cxlkv::capi::RemoveMemoryUser(t, 0);  // waits for an End running from the arena's side
  End(t, "cxlkv_tier_close");
  delete t;
}

CXLKV_API uint64_t cxlkv_tier_block_size(const cxlkv_tier* t) {
  if (t == nullptr) return 0;
  auto* tt = const_cast<cxlkv_tier*>(t);
  Use use(tt);
  return tt->s == nullptr ? 0 : tt->s->block_bytes();
}

// ---- use, place ------------------------------------------------------------------------------

CXLKV_API int cxlkv_tier_use(cxlkv_tier* t, const cxlkv_tier_request* r) {
  if (const int rc = CheckRequest(t, r); rc != CXLKV_OK) return rc;
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  const std::vector<Key> keys = Keys(r->chain, r->n);
  t->s->Use(Request(r, keys));
  t->s->Touch(std::span<const Key>(keys).subspan(r->first));
  return CXLKV_OK;
}

CXLKV_API int cxlkv_tier_place(cxlkv_tier* t, const cxlkv_tier_request* r, const void* const* data,
                               size_t len, int* results) {
  if (const int rc = CheckRequest(t, r); rc != CXLKV_OK) return rc;
  if (data == nullptr) return Fail(CXLKV_E_INVALID, "cxlkv_tier_place: data must be set");
  for (std::size_t i = 0; i < r->n - r->first; ++i) {
    if (data[i] == nullptr) {
      return Fail(CXLKV_E_INVALID, absl::StrCat("cxlkv_tier_place: data[", i, "] is NULL"));
    }
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  if (const int rc = CheckLen(t, len, "cxlkv_tier_place"); rc != CXLKV_OK) return rc;
  const std::vector<Key> keys = Keys(r->chain, r->n);
  std::vector<ti::KeyResult> res;
  (void)t->s->Place(
      Request(r, keys), [data](std::size_t i) { return data[i]; }, &res);
  return Results(res, "cxlkv_tier_place", results);
}

CXLKV_API int cxlkv_tier_place_blocks(cxlkv_tier* t, const cxlkv_tier_request* r,
                                      const cxlkv_block_ref* refs, int* results) {
  if (const int rc = CheckRequest(t, r); rc != CXLKV_OK) return rc;
  if (refs == nullptr) return Fail(CXLKV_E_INVALID, "cxlkv_tier_place_blocks: refs must be set");
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  std::vector<cxlkv::allocator::BlockHandle> blocks(r->n - r->first);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const cxlkv_block_ref& ref = refs[i];
    if (!cxlkv::capi::SameArena(t->arena, &ref) || !t->s->HoldsBlockIndex(ref.index)) {
      return Fail(CXLKV_E_FOREIGN,
                  absl::StrCat("cxlkv_tier_place_blocks: refs[", i, "] (block ", ref.index,
                               ") is not a block of size class ", t->cls,
                               " of the tier's arena; "
                               "allocate it with cxlkv_alloc(arena, ",
                               t->cls, ", ...)"));
    }
    cxlkv::allocator::BlockRef br;
    std::memcpy(br.arena.data(), ref.arena_uuid, 16);
    br.index = ref.index;
    br.generation = ref.generation;
    if (auto st = t->s->CheckRef(br); !st.ok()) {
      return Fail(CXLKV_E_STALE, absl::StrCat("cxlkv_tier_place_blocks: refs[", i,
                                              "]: ", st.message(), "; nothing was taken"));
    }
    for (std::size_t k = 0; k < i; ++k) {
      if (blocks[k].index == ref.index) {
        return Fail(CXLKV_E_INVALID,
                    absl::StrCat("cxlkv_tier_place_blocks: refs[", k, "] and refs[", i,
                                 "] are the same block; nothing was taken"));
      }
    }
    blocks[i] = cxlkv::allocator::BlockHandle{ref.index, ref.generation};
  }
  const std::vector<Key> keys = Keys(r->chain, r->n);
  std::vector<ti::KeyResult> res;
  (void)t->s->PlaceBlocks(Request(r, keys), blocks, &res);
  return Results(res, "cxlkv_tier_place_blocks", results);
}

// ---- lookup, acquire, read -------------------------------------------------------------------

CXLKV_API int cxlkv_tier_lookup(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n,
                                cxlkv_tier_location* out) {
  if (t == nullptr || (n != 0 && (keys == nullptr || out == nullptr))) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_lookup: tier, keys and out must be set");
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  for (std::size_t i = 0; i < n; ++i) {
    const ti::StoreLocation loc = t->s->Lookup(Key{keys[i].lo, keys[i].hi});
    cxlkv_tier_location& o = out[i];
    o = cxlkv_tier_location{};
    o.residence = ResidenceCode(ti::OutcomeOf(loc.where));
    if (loc.block) {
      o.addr = loc.addr;
      FillRef(t, *loc.block, &o.ref);
    }
  }
  return CXLKV_OK;
}

CXLKV_API int cxlkv_tier_acquire(cxlkv_tier* t, const cxlkv_prefix_key* key, void** addr,
                                 cxlkv_block_ref* ref) {
  if (t == nullptr || key == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_acquire: tier and key must be set");
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  const Key k{key->lo, key->hi};
  auto p = t->s->Acquire(k);
  if (!p.ok()) return CodeOf(p.status());
  if (addr != nullptr) *addr = *p;
  if (ref != nullptr) {
    const ti::StoreLocation loc = t->s->Lookup(k);  // pinned: it cannot move
    FillRef(t, loc.block.value_or(cxlkv::allocator::BlockHandle{0, 0}), ref);
  }
  return CXLKV_OK;
}

CXLKV_API int cxlkv_tier_release(cxlkv_tier* t, const cxlkv_prefix_key* key) {
  if (t == nullptr || key == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_release: tier and key must be set");
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  const Key k{key->lo, key->hi};
  if (!t->s->Lookup(k).where) {
    return Fail(CXLKV_E_NOT_FOUND,
                absl::StrCat("cxlkv_tier_release(", cxlkv::coherence::FormatKey(k),
                             "): not held by ", t->name));
  }
  t->s->Release(k);
  return CXLKV_OK;
}

CXLKV_API int cxlkv_tier_read(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n,
                              void* const* dsts, size_t len, int* results) {
  if (t == nullptr || (n != 0 && (keys == nullptr || dsts == nullptr))) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_read: tier, keys and dsts must be set");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (dsts[i] == nullptr) {
      return Fail(CXLKV_E_INVALID, absl::StrCat("cxlkv_tier_read: dsts[", i, "] is NULL"));
    }
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  if (const int rc = CheckLen(t, len, "cxlkv_tier_read"); rc != CXLKV_OK) return rc;
  const std::vector<Key> k = Keys(keys, n);
  std::vector<ti::KeyResult> res;
  (void)t->s->Read(k, std::span<void* const>(dsts, n), len, &res);
  return Results(res, "cxlkv_tier_read", results);
}

// ---- prefetch, demote, drop ------------------------------------------------------------------

CXLKV_API int cxlkv_tier_prefetch(cxlkv_tier* t, const cxlkv_tier_request* r, uint64_t* ticket) {
  if (const int rc = CheckRequest(t, r); rc != CXLKV_OK) return rc;
  if (ticket == nullptr) return Fail(CXLKV_E_INVALID, "cxlkv_tier_prefetch: ticket must be set");
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  const std::vector<Key> keys = Keys(r->chain, r->n);
  auto tk = t->s->Prefetch(Request(r, keys));
  if (!tk.ok()) return FromStatus(tk.status());
  *ticket = *tk;
  return CXLKV_OK;
}

namespace {

// Per-key failures are in results (the last error names the first); the call succeeds.
int Collect(Tier* t, std::uint64_t ticket, int* results, bool block) {
  if (t == nullptr) return Fail(CXLKV_E_INVALID, "tier must be set");
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  std::vector<ti::KeyResult> res;
  const absl::Status st = block ? t->s->Wait(ticket, &res) : t->s->Poll(ticket, &res);
  if (absl::IsUnavailable(st)) return Fail(CXLKV_E_PENDING, std::string(st.message()));
  if (!st.ok()) return FromStatus(st);
  (void)Results(res, "cxlkv_tier_prefetch", results);
  return CXLKV_OK;
}

}  // namespace

CXLKV_API int cxlkv_tier_prefetch_poll(cxlkv_tier* t, uint64_t ticket, int* results) {
  return Collect(t, ticket, results, /*block=*/false);
}

CXLKV_API int cxlkv_tier_prefetch_wait(cxlkv_tier* t, uint64_t ticket, int* results) {
  return Collect(t, ticket, results, /*block=*/true);
}

CXLKV_API int cxlkv_tier_demote(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n,
                                int* results) {
  if (t == nullptr || (n != 0 && keys == nullptr)) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_demote: tier and keys must be set");
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  std::vector<ti::KeyResult> res;
  (void)t->s->Demote(Keys(keys, n), &res);
  return Results(res, "cxlkv_tier_demote", results);
}

CXLKV_API int cxlkv_tier_drop(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n, int* results) {
  if (t == nullptr || (n != 0 && keys == nullptr)) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_drop: tier and keys must be set");
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  std::vector<ti::KeyResult> res;
  (void)t->s->Drop(Keys(keys, n), &res);
  return Results(res, "cxlkv_tier_drop", results);
}

// ---- explain, stats --------------------------------------------------------------------------

CXLKV_API int cxlkv_tier_explain(cxlkv_tier* t, const cxlkv_prefix_key* key, uint32_t flags,
                                 char* buf, size_t len, size_t* needed) {
  if (t == nullptr || key == nullptr || (buf == nullptr && len != 0)) {
    return Fail(CXLKV_E_INVALID,
                "cxlkv_tier_explain: tier and key must be set (buf may be "
                "NULL only with len 0)");
  }
  if ((flags & ~CXLKV_TIER_EXPLAIN_JSON) != 0) {
    return Fail(CXLKV_E_INVALID, absl::StrCat("cxlkv_tier_explain: unknown flags 0x",
                                              absl::Hex(flags & ~CXLKV_TIER_EXPLAIN_JSON),
                                              "; pass 0 (text) or CXLKV_TIER_EXPLAIN_JSON"));
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  const std::string s = cxlkv::capi::RenderExplain(t->s->Explain(Key{key->lo, key->hi}),
                                                   (flags & CXLKV_TIER_EXPLAIN_JSON) != 0);
  if (needed != nullptr) *needed = s.size() + 1;
  if (buf == nullptr) return CXLKV_OK;
  const std::size_t n = std::min(s.size(), len - 1);
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
  if (n < s.size()) {
    return Fail(CXLKV_E_INVALID, absl::StrCat("cxlkv_tier_explain: the account is ", s.size() + 1,
                                              " bytes with its NUL; len is ", len));
  }
  return CXLKV_OK;
}

CXLKV_API int cxlkv_tier_stats_get(cxlkv_tier* t, cxlkv_tier_stats* s) {
  if (t == nullptr || s == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_stats_get: tier and stats must be set");
  }
  Use use(t);
  if (t->s == nullptr) return FailEnded(t);
  const ti::TieredStoreStats st = t->s->Stats();
  const ti::TierStats& m = st.tiers;
  std::memset(s, 0, sizeof(*s));
  s->block_bytes = st.block_bytes;
  s->cxl_capacity_blocks = st.cxl_capacity_blocks;
  s->high_watermark_blocks = st.high_watermark_blocks;
  s->low_watermark_blocks = st.low_watermark_blocks;
  s->cxl_blocks = m.cxl_blocks;
  s->nvme_blocks = m.nvme_blocks;
  s->demotions = m.demotions;
  s->demotion_failures = m.demotion_failures;
  s->promotions = m.promotions;
  s->promotion_failures = m.promotion_failures;
  s->promotions_refused = m.promotions_refused;
  s->watermark_runs = m.watermark_runs;
  s->victims_dropped = m.victims_dropped;
  s->nvme_evicted = m.nvme_evicted;
  s->dropped = m.dropped;
  s->nvme_reads = m.nvme_reads;
  s->nvme_file_bytes = st.nvme_file_bytes;
  s->nvme_data_loss = st.nvme.data_loss;
  s->retention_s = st.retention_s;
  s->placed_cxl = st.placed_cxl;
  s->placed_nvme = st.placed_nvme;
  s->placed_dropped = st.placed_dropped;
  s->already_held = st.already_held;
  s->nvme_write_failures = st.nvme_write_failures;
  s->prefetch_kept = st.prefetch_kept;
  s->cxl_reads = st.cxl_reads;
  s->uses = st.uses;
  s->decisions = st.placer.decisions;
  s->from_prior = st.placer.from_prior;
  s->from_ancestor = st.placer.from_ancestor;
  for (std::size_t c = 0; c < st.placer.clauses.size(); ++c) s->clauses[c] = st.placer.clauses[c];
  s->break_even_s = st.break_even_s;
  return CXLKV_OK;
}
