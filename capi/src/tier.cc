// The C API's tiering half (cxlkv.h: cxlkv_tier_*): one size class of an arena and an NVMe
// store, with the CXL-vs-NVMe placement rule deciding where each block lives. A
// tier::TierManager moves the blocks (placement, batched NVMe writes, watermarks, cool-down,
// promotion, reads); a tier::Placer decides them (rule, reuse tracker, namespace prior,
// chain inheritance, retention pressure). They are driven as bench/replay drives them
// (replay.cc, Engine): every new block decided with its request's chain and the CXL
// occupancy it adds, NVMe-bound blocks staged in CXL and written in one batch, watermark
// victims re-decided with CXL full, NVMe blocks promoted only where the rule wants them in
// CXL and the cool-down allows, the chain marked used root first after a placement.
//
// Locks, in the order they may be taken: Tier::life (shared by every call, exclusive when
// the tier ends) > Tier::mu (the Placer and what the tier remembers per key) > the manager's
// own lock. Tier::mu is never held across a TierManager call that can run the watermarks
// (Place, Prefetch, EnforceWatermarks): those call back into VictimTier, which takes it.
#include "cxlkv/tier/tier.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "capi_internal.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/nvme/nvme_store.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/tier/calibrate.h"
#include "cxlkv/tier/placement.h"
#include "cxlkv/tier/placement_config.h"
#include "cxlkv/tier/placer.h"
#include "cxlkv/tier/tier_manager.h"
#include "nlohmann/json.hpp"

namespace {

namespace ti = cxlkv::tier;
using cxlkv::allocator::BlockHandle;
using cxlkv::capi::Fail;
using cxlkv::capi::FromStatus;
using cxlkv::pool::ErrnoText;
using Key = cxlkv::coherence::PrefixKey;
using KeyHash = cxlkv::coherence::PrefixKeyHash;

// New NVMe-bound blocks written per batch (replay.cc flushes at the same count).
constexpr std::size_t kNvmeBatch = 128;
// Keys whose block left the tier that explain still remembers.
constexpr std::size_t kRememberGone = 4096;
// How long cxlkv_tier_read waits for I/O in flight on a key.
constexpr std::int64_t kReadWaitNs = 10'000'000'000;

std::int64_t NowNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The tier's last move of a key, what cxlkv_tier_explain reports.
enum class Event : std::uint8_t {
  kPlaced,           // a new block, where the rule sent it
  kNvmeWriteFailed,  // the rule sent it to NVMe, the write failed: kept in CXL
  kVictim,           // left CXL above the high watermark, re-decided by the rule
  kDemoted,          // cxlkv_tier_demote
  kPromoted,         // a prefetch read it back into CXL
  kPromoteFailed,
  kPrefetchKept,  // a prefetch left it on NVMe (the rule, or the cool-down)
  kDropped,       // cxlkv_tier_drop
};

const char* EventName(Event e) {
  switch (e) {
    case Event::kPlaced:
      return "placed";
    case Event::kNvmeWriteFailed:
      return "nvme-write-failed";
    case Event::kVictim:
      return "watermark-victim";
    case Event::kDemoted:
      return "demoted-by-caller";
    case Event::kPromoted:
      return "promoted";
    case Event::kPromoteFailed:
      return "promotion-failed";
    case Event::kPrefetchKept:
      return "prefetch-kept-on-nvme";
    case Event::kDropped:
      return "dropped-by-caller";
  }
  return "?";
}

const char* SourceName(ti::ReuseSource s) {
  switch (s) {
    case ti::ReuseSource::kOwn:
      return "own";
    case ti::ReuseSource::kPrior:
      return "namespace-prior";
    case ti::ReuseSource::kAncestor:
      return "ancestor";
    case ti::ReuseSource::kNone:
      return "none";
  }
  return "?";
}

const char* ResidenceName(int r) {
  switch (r) {
    case CXLKV_TIER_MISSING:
      return "missing";
    case CXLKV_TIER_IN_CXL:
      return "cxl";
    case CXLKV_TIER_ON_NVME:
      return "nvme";
    case CXLKV_TIER_DEMOTING:
      return "demoting";
    case CXLKV_TIER_PROMOTING:
      return "promoting";
    case CXLKV_TIER_DROPPED:
      return "dropped";
  }
  return "?";
}

int FromResidence(std::optional<ti::Residence> r) {
  if (!r) return CXLKV_TIER_MISSING;
  switch (*r) {
    case ti::Residence::kCxl:
      return CXLKV_TIER_IN_CXL;
    case ti::Residence::kNvme:
      return CXLKV_TIER_ON_NVME;
    case ti::Residence::kDemoting:
      return CXLKV_TIER_DEMOTING;
    case ti::Residence::kPromoting:
      return CXLKV_TIER_PROMOTING;
  }
  return CXLKV_TIER_MISSING;
}

struct LastMove {
  Event event = Event::kPlaced;
  bool by_rule = false;  // inputs, decision and source are the rule's
  ti::ReuseSource source = ti::ReuseSource::kNone;
  std::int64_t at_ns = 0;
  ti::BlockInputs inputs;
  ti::Decision decision;
  std::string note;  // a failure's message; empty otherwise
};

// What the tier knows of a key beyond the manager's record: what the rule is told about it
// when it is decided outside a request (a watermark victim, explain) and its last move.
struct KeyMeta {
  Key parent;  // the block before it in the chain it was placed or prefetched with; 0: none
  std::uint64_t ns = 0;
  std::uint32_t tokens = 0;
  std::int32_t pin = 0;
  LastMove last;
};

// One prefetch ticket.
struct Prefetch {
  ti::PromotionBatch batch;
  std::vector<int> results;         // per key of the request
  std::vector<std::size_t> at;      // per key of the batch: its index in results
  std::vector<LastMove> decisions;  // per key of the batch
};

// One first error across the keys of a call: its code and message survive the later keys'.
struct FirstError {
  int code = CXLKV_OK;
  std::string message;
  void Note(int c, const std::string& m) {
    if (code == CXLKV_OK && c < 0) {
      code = c;
      message = m;
    }
  }
  int Return() const { return code == CXLKV_OK ? CXLKV_OK : Fail(code, message); }
};

// A per-key status as a code: the manager's kFailedPrecondition means "not now" here (in
// flight, pinned, cooling down).
int CodeOf(const absl::Status& st) {
  if (absl::IsFailedPrecondition(st)) {
    return Fail(CXLKV_E_BUSY, std::string(st.message()));
  }
  return FromStatus(st);
}

// The (arena, class) pairs that have a tier: one tier per class.
std::mutex registry_mu;
std::vector<std::pair<const cxlkv_arena*, std::uint32_t>>& Registry() {
  static auto* r = new std::vector<std::pair<const cxlkv_arena*, std::uint32_t>>();
  return *r;
}

}  // namespace

struct cxlkv_tier {
  cxlkv_arena* arena = nullptr;  // do not touch once `m` is null: the arena may be gone
  std::uint32_t cls = 0;
  int slot = 0;  // the rule's CXL tier the arena is (index of occupancy and retention)
  std::uint64_t capacity = 0;
  std::uint64_t high = 0, low = 0;
  std::uint64_t block_bytes = 0;
  std::uint32_t class_tokens = 0;
  std::string name;                      // "tier over arena <uuid> class <n>", for messages
  std::string config;                    // the config's path, or "defaults"
  std::vector<std::string> calibration;  // what the calibration replaced

  std::shared_mutex life;
  std::unique_ptr<ti::TierManager> m;  // null once the tier ended
  std::string ended;                   // why it ended

  std::mutex mu;  // guards everything below
  std::optional<ti::Placer> placer;
  absl::flat_hash_map<Key, KeyMeta, KeyHash> meta;
  std::uint32_t queue_depth = 0;  // the latest request's, for victims
  std::uint64_t placed_cxl = 0, placed_nvme = 0, placed_dropped = 0, already_held = 0;
  std::uint64_t nvme_write_failures = 0, prefetch_kept = 0, cxl_reads = 0, uses = 0;

  std::mutex tickets_mu;
  std::uint64_t next_ticket = 1;
  absl::flat_hash_map<std::uint64_t, std::shared_ptr<Prefetch>> tickets;
};

namespace {

using Tier = cxlkv_tier;

ti::Tier CxlTier(const Tier* t) {
  return t->slot == 0 ? ti::Tier::kCxlExpanded : ti::Tier::kCxlPooled;
}

// Ends the tier: NVMe I/O drained (prefetch callbacks run), CXL blocks freed, store closed.
// Runs when the tier closes, or from DropMemoryUsers before its arena's memory goes.
void End(Tier* t, const std::string& why) {
  std::unique_lock l(t->life);
  if (t->m == nullptr) return;
  t->m.reset();
  {
    std::lock_guard tl(t->tickets_mu);
    t->tickets.clear();
  }
  t->ended = why;
  std::lock_guard rl(registry_mu);
  std::erase(Registry(), std::make_pair(static_cast<const cxlkv_arena*>(t->arena), t->cls));
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

// The tiers now, as the rule sees them: this arena's occupancy (plus what a placement adds)
// and retention; the other CXL tier absent (occupancy 1). Takes the manager's lock.
ti::TierState State(const Tier* t, double add, std::uint32_t queue_depth) {
  ti::TierState s;
  const ti::TierStats st = t->m->Stats();
  s.occupancy[t->slot] =
      std::min(1.0, static_cast<double>(st.cxl_blocks) / static_cast<double>(t->capacity) + add);
  s.retention_s[t->slot] = t->m->RetentionS();
  s.queue_depth = queue_depth;
  return s;
}

ti::PlacementQuery Query(const Tier* t, std::uint64_t ns, const Key& key, std::uint32_t tokens,
                         std::int32_t pin) {
  ti::PlacementQuery q;
  q.ns = ns;
  q.key = key;
  q.size_bytes = t->block_bytes;
  q.tokens = tokens;
  q.pin_level = pin;
  return q;
}

std::uint32_t TokensOf(const Tier* t, const cxlkv_tier_request* r) {
  return r->tokens != 0 ? r->tokens : t->class_tokens;
}

// The rule's decision for chain[pos] of a request, remembered for explain. t->mu held.
LastMove DecideLocked(Tier* t, const cxlkv_tier_request* r, std::span<const Key> chain,
                      std::size_t pos, double add, Event event) {
  ti::PlacementQuery q = Query(t, r->ns, chain[pos], TokensOf(t, r), r->pin);
  q.chain = chain;
  q.pos = pos;
  const auto now = static_cast<std::uint64_t>(NowNs());
  LastMove mv;
  mv.event = event;
  mv.by_rule = true;
  mv.at_ns = static_cast<std::int64_t>(now);
  mv.source = t->placer->ExpectedReuse(q, now).source;
  ti::Explanation why;
  mv.decision = t->placer->Decide(q, State(t, add, r->queue_depth), now, &why);
  mv.inputs = why.inputs;
  return mv;
}

void RememberLocked(Tier* t, std::span<const Key> chain, std::size_t pos,
                    const cxlkv_tier_request* r, LastMove mv) {
  KeyMeta& k = t->meta[chain[pos]];
  if (r != nullptr) {
    k.parent = pos > 0 ? chain[pos - 1] : Key{};
    k.ns = r->ns;
    k.tokens = TokensOf(t, r);
    k.pin = r->pin;
  }
  k.last = std::move(mv);
}

// Forgets the keys whose block left the tier, but the kRememberGone most recent, once the
// record has grown well past what the tier holds. t->mu held.
void PruneLocked(Tier* t) {
  const ti::TierStats s = t->m->Stats();
  const std::uint64_t held = s.cxl_blocks + s.nvme_blocks;
  if (t->meta.size() < std::max<std::uint64_t>(2 * kRememberGone, 2 * held + kRememberGone)) {
    return;
  }
  std::vector<std::pair<std::int64_t, Key>> gone;
  for (const auto& [key, k] : t->meta) {
    if (!t->m->Where(key)) gone.emplace_back(k.last.at_ns, key);
  }
  if (gone.size() <= kRememberGone) return;
  std::nth_element(gone.begin(), gone.begin() + static_cast<std::ptrdiff_t>(kRememberGone),
                   gone.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = kRememberGone; i < gone.size(); ++i) t->meta.erase(gone[i].second);
}

// TierOptions::victim_tier: a block leaving CXL above the high watermark, re-decided with
// CXL full (Placer::DecideVictim): NVMe, or dropped when recomputing beats fetching it.
ti::Tier VictimTier(Tier* t, const Key& key) {
  std::lock_guard l(t->mu);
  KeyMeta& k = t->meta[key];
  const ti::PlacementQuery q = Query(t, k.ns, key, k.tokens, k.pin);
  const auto now = static_cast<std::uint64_t>(NowNs());
  const ti::TierState state = State(t, 0, t->queue_depth);
  const ti::Tier v = t->placer->DecideVictim(q, state, now);
  // What DecideVictim looked at: the state with every CXL tier full.
  ti::TierState full = state;
  full.occupancy.fill(1.0);
  LastMove mv;
  mv.event = Event::kVictim;
  mv.by_rule = true;
  mv.at_ns = static_cast<std::int64_t>(now);
  mv.source = t->placer->ExpectedReuse(q, now).source;
  mv.inputs = t->placer->Inputs(q, full, now);
  mv.decision = t->placer->rule().Decide(mv.inputs);
  k.last = std::move(mv);
  return v;
}

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
  if (len != t->block_bytes) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat(what, ": len is ", len, " bytes but ", t->name, " keeps blocks of ",
                             t->block_bytes, " bytes (cxlkv_tier_block_size)"));
  }
  return CXLKV_OK;
}

// ---- placement ------------------------------------------------------------------------------

// cxlkv_tier_place and cxlkv_tier_place_blocks: `data` (copied in) or `blocks` (adopted).
int Place(Tier* t, const cxlkv_tier_request* r, const void* const* data,
          std::vector<BlockHandle> blocks, int* results) {
  const std::vector<Key> keys = Keys(r->chain, r->n);
  const std::span<const Key> chain(keys);
  const bool adopt = data == nullptr;
  cxlkv::allocator::BlockAllocator& alloc = t->m->allocator();
  const double add = 1.0 / static_cast<double>(t->capacity);
  FirstError first;
  std::vector<int> res(r->n - r->first, CXLKV_TIER_MISSING);
  std::vector<Key> pending_keys;
  std::vector<BlockHandle> pending_blocks;
  std::vector<std::size_t> pending_at;

  auto flush = [&] {
    if (pending_keys.empty()) return;
    std::vector<absl::Status> st;
    (void)t->m->Place(pending_keys, pending_blocks, ti::Tier::kNvme, &st);
    std::lock_guard l(t->mu);
    for (std::size_t j = 0; j < pending_keys.size(); ++j) {
      const std::size_t i = pending_at[j];
      if (st[j].ok()) {
        res[i] = CXLKV_TIER_ON_NVME;
        ++t->placed_nvme;
        continue;
      }
      if (absl::IsAlreadyExists(st[j])) {  // the same key twice in this batch
        alloc.Free(pending_blocks[j]);
        res[i] = FromResidence(t->m->Where(pending_keys[j]));
        ++t->already_held;
        continue;
      }
      const std::optional<ti::Residence> where = t->m->Where(pending_keys[j]);
      if (where == ti::Residence::kCxl) {
        // The write failed (the store is full, an I/O error): the block stays in CXL, where
        // nothing is lost; the watermarks may demote it later.
        res[i] = CXLKV_TIER_IN_CXL;
        ++t->nvme_write_failures;
        KeyMeta& k = t->meta[pending_keys[j]];
        k.last.event = Event::kNvmeWriteFailed;
        k.last.note = std::string(st[j].message());
      } else {
        // Between entering the manager and its write, another thread's watermark run took the
        // staged block as a victim: it went to NVMe (or was dropped) that way instead.
        res[i] = where.has_value() ? FromResidence(where) : CXLKV_TIER_DROPPED;
        ++(where.has_value() ? t->placed_nvme : t->placed_dropped);
      }
    }
    pending_keys.clear();
    pending_blocks.clear();
    pending_at.clear();
  };

  for (std::size_t pos = r->first; pos < r->n; ++pos) {
    const std::size_t i = pos - r->first;
    const Key& key = chain[pos];
    BlockHandle h = adopt ? blocks[i] : BlockHandle{};
    if (const auto where = t->m->Where(key); where.has_value()) {
      if (h.valid()) alloc.Free(h);
      res[i] = FromResidence(where);
      std::lock_guard l(t->mu);
      ++t->already_held;
      continue;
    }
    LastMove mv;
    {
      std::lock_guard l(t->mu);
      t->queue_depth = r->queue_depth;
      if ((r->flags & CXLKV_TIER_RECORD_USE) != 0) {
        t->placer->RecordUse(r->ns, key, static_cast<std::uint64_t>(NowNs()), t->block_bytes,
                             TokensOf(t, r));
        ++t->uses;
      }
      mv = DecideLocked(t, r, chain, pos, add, Event::kPlaced);
      const ti::Tier dest = mv.decision.tier;
      RememberLocked(t, chain, pos, r, mv);
      if (dest == ti::Tier::kDrop) ++t->placed_dropped;
    }
    const ti::Tier dest = mv.decision.tier;
    if (dest == ti::Tier::kDrop) {
      if (h.valid()) alloc.Free(h);
      res[i] = CXLKV_TIER_DROPPED;
      continue;
    }
    if (!h.valid()) {
      h = alloc.Alloc(t->cls);
      if (!h.valid()) {
        const absl::Status why = alloc.ExplainAllocFailure(t->cls);
        res[i] = Fail(CXLKV_E_FULL,
                      absl::StrCat(t->name, ": no free block to ",
                                   dest == ti::Tier::kNvme ? "stage it for NVMe" : "keep it in CXL",
                                   " (", why.message(),
                                   "): demote blocks, lower placement.high_watermark or "
                                   "cxl_blocks, or give the arena more memory"));
        first.Note(res[i], cxlkv::capi::LastError());
        continue;
      }
      if (dest == ti::Tier::kNvme) {
        std::memcpy(alloc.Addr(h), data[i], t->block_bytes);  // read back by the NVMe write
      } else {
        cxlkv::coherence::CopyNt(alloc.Addr(h), data[i], t->block_bytes);
      }
    }
    if (dest == ti::Tier::kNvme) {
      pending_keys.push_back(key);
      pending_blocks.push_back(h);
      pending_at.push_back(i);
      if (pending_keys.size() >= kNvmeBatch) flush();
      continue;
    }
    // Kept in CXL; the watermarks run here, their victims re-decided by VictimTier.
    if (absl::Status st = t->m->Place(key, h, CxlTier(t)); !st.ok()) {
      alloc.Free(h);  // another thread placed the key meanwhile
      res[i] = FromResidence(t->m->Where(key));
      std::lock_guard l(t->mu);
      ++t->already_held;
      continue;
    }
    res[i] = CXLKV_TIER_IN_CXL;
    std::lock_guard l(t->mu);
    ++t->placed_cxl;
  }
  flush();
  // The chain root most recently used: LRU evicts its tail first (replay's chain_recency).
  t->m->Touch(chain);
  {
    std::lock_guard l(t->mu);
    PruneLocked(t);
  }
  if (results != nullptr) std::copy(res.begin(), res.end(), results);
  return first.Return();
}

// ---- prefetch -------------------------------------------------------------------------------

// A promoted key's result; a failure's message becomes this thread's last error.
int PrefetchResult(const absl::Status& st) {
  if (st.ok()) return CXLKV_TIER_IN_CXL;
  if (absl::IsNotFound(st)) return CXLKV_TIER_MISSING;  // dropped meanwhile
  return CodeOf(st);  // kDataLoss: CXLKV_E_CORRUPT, the store's message says it was dropped
}

// Finishes a prefetch whose reads are done: results, what explain remembers, watermarks.
// Per-key failures are in results (the last error names the first); the call succeeds.
int Finish(Tier* t, Prefetch& p, int* results) {
  FirstError first;
  bool promoted = false;
  {
    std::lock_guard l(t->mu);
    for (std::size_t j = 0; j < p.batch.size(); ++j) {
      const absl::Status& st = p.batch.status(j);
      const std::size_t i = p.at[j];
      p.results[i] = PrefetchResult(st);
      first.Note(p.results[i], cxlkv::capi::LastError());
      LastMove mv = std::move(p.decisions[j]);
      if (st.ok()) {
        promoted = true;
        mv.event = Event::kPromoted;
      } else {
        mv.event = Event::kPromoteFailed;
        mv.note = std::string(st.message());
      }
      t->meta[p.batch.key(j)].last = std::move(mv);
    }
  }
  // Promotions raise residency: the watermarks run after them, as after a placement.
  if (promoted) (void)t->m->EnforceWatermarks();
  if (results != nullptr) std::copy(p.results.begin(), p.results.end(), results);
  if (first.code != CXLKV_OK) (void)first.Return();
  return CXLKV_OK;
}

int Collect(Tier* t, std::uint64_t ticket, int* results, bool block) {
  if (t == nullptr) return Fail(CXLKV_E_INVALID, "tier must be set");
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  std::shared_ptr<Prefetch> p;
  {
    std::lock_guard l(t->tickets_mu);
    auto it = t->tickets.find(ticket);
    if (it != t->tickets.end()) p = it->second;
  }
  if (p == nullptr) {
    return Fail(CXLKV_E_NOT_FOUND,
                absl::StrCat(t->name, ": no prefetch ticket ", ticket,
                             " (never issued, or already collected by a poll or wait)"));
  }
  if (!p->batch.done()) {
    if (block) {
      t->m->Wait(p->batch);
    } else {
      (void)t->m->store().Poll();
      if (!p->batch.done()) return Fail(CXLKV_E_PENDING, "the prefetch's reads are running");
    }
  }
  {
    std::lock_guard l(t->tickets_mu);
    if (t->tickets.erase(ticket) == 0) {
      return Fail(CXLKV_E_NOT_FOUND, absl::StrCat(t->name, ": prefetch ticket ", ticket,
                                                  " was collected by another thread"));
    }
  }
  return Finish(t, *p, results);
}

// ---- explain --------------------------------------------------------------------------------

std::string Seconds(double s) {
  if (std::isinf(s)) return "inf";
  if (s < 1e-3) return absl::StrFormat("%.1f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.1f ms", s * 1e3);
  return absl::StrFormat("%.2f s", s);
}

nlohmann::json JsonSeconds(double s) {
  return std::isfinite(s) ? nlohmann::json(s) : nlohmann::json(nullptr);
}

std::string Indent(const std::string& text) {
  std::string out = "  " + absl::StrReplaceAll(text, {{"\n", "\n  "}});
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (!out.empty() && out.back() != '\n') out.push_back('\n');
  return out;
}

std::string Explain(Tier* t, const Key& key, bool json) {
  const std::string key_hex = ti::FormatPrefixKey(key);
  const std::int64_t now_ns = NowNs();
  const std::optional<ti::Residence> where = t->m->Where(key);
  const int residence = FromResidence(where);
  nlohmann::json j;
  std::string text;
  j["key"] = key_hex;
  j["tier"] = t->name;
  j["config"] = t->config;
  j["residence"] = ResidenceName(residence);
  absl::StrAppend(&text, "key ", key_hex, " in ", t->name, " (placement config: ", t->config,
                  ")\n");
  // Where it is.
  if (where == ti::Residence::kCxl) {
    if (auto h = t->m->CxlBlock(key)) {
      j["cxl_block"] = {{"index", h->index}, {"generation", h->generation}};
      absl::StrAppend(&text, "where: in CXL, block ", h->index, " generation ", h->generation,
                      "\n");
    }
  } else if (where == ti::Residence::kNvme) {
    if (auto loc = t->m->store().Locate(key); loc.ok()) {
      j["nvme"] = {{"file", loc->file}, {"slot", loc->slot}, {"offset", loc->offset}};
      absl::StrAppend(&text, "where: on NVMe, ", loc->file, " slot ", loc->slot, " (offset ",
                      loc->offset, ")\n");
    }
  } else if (where.has_value()) {
    absl::StrAppend(&text, "where: ", ti::ResidenceName(*where), " (I/O in flight)\n");
  } else {
    absl::StrAppend(&text, "where: not held by this tier\n");
  }
  if (where.has_value()) {
    const ti::PromoteCheck c = t->m->CheckPromote(key);
    j["promotion"] = {{"verdict", ti::PromoteVerdictName(c.verdict)},
                      {"demoted_ms_ago", c.demoted_ms_ago},
                      {"retry_after_ms", c.retry_after_ms}};
    absl::StrAppend(&text, "promotion now: ", ti::PromoteVerdictName(c.verdict));
    if (c.verdict == ti::PromoteVerdict::kCoolingDown) {
      absl::StrAppend(&text, " (demoted ", c.demoted_ms_ago, " ms ago; retry in ", c.retry_after_ms,
                      " ms; placement.cooldown_ms sets it)");
    }
    absl::StrAppend(&text, "\n");
  }

  std::lock_guard l(t->mu);
  // Its reuse history.
  if (auto st = t->placer->tracker().Find(key)) {
    const auto now = static_cast<std::uint64_t>(now_ns);
    const double idle_s =
        now > st->last_seen_ns ? static_cast<double>(now - st->last_seen_ns) * 1e-9 : 0.0;
    j["reuse"] = {{"uses", st->uses},
                  {"ewma_interval_s", JsonSeconds(st->ewma_interval_s)},
                  {"last_use_s_ago", idle_s}};
    absl::StrAppend(&text, "reuse: ", st->uses, st->uses == 1 ? " use" : " uses",
                    " recorded, EWMA interval ",
                    std::isinf(st->ewma_interval_s) ? "none yet" : Seconds(st->ewma_interval_s),
                    ", last use ", Seconds(idle_s), " ago\n");
  } else {
    j["reuse"] = nullptr;
    absl::StrAppend(&text,
                    "reuse: no use recorded (cxlkv_tier_use, or place with "
                    "CXLKV_TIER_RECORD_USE, records them)\n");
  }
  // Its last move, with the rule's inputs and verdict then.
  auto it = t->meta.find(key);
  if (it == t->meta.end()) {
    j["last_move"] = nullptr;
    j["now"] = nullptr;
    absl::StrAppend(&text, where.has_value()
                               ? "last move: none by this tier (found on NVMe when it opened)\n"
                               : "last move: none remembered (never placed here, or forgotten)\n");
  } else {
    const KeyMeta& k = it->second;
    const LastMove& mv = k.last;
    const double ago_s = static_cast<double>(now_ns - mv.at_ns) * 1e-9;
    nlohmann::json m = {
        {"event", EventName(mv.event)}, {"s_ago", ago_s},
        {"by_rule", mv.by_rule},        {"namespace", absl::StrFormat("0x%016x", k.ns)},
        {"tokens", k.tokens},           {"pin", k.pin}};
    absl::StrAppend(&text, "last move, ", Seconds(ago_s), " ago: ", EventName(mv.event));
    if (!mv.note.empty()) {
      m["note"] = mv.note;
      absl::StrAppend(&text, " (", mv.note, ")");
    }
    if (mv.by_rule) {
      ti::Explanation why;
      (void)t->placer->rule().Decide(mv.inputs, &why);
      m["reuse_source"] = SourceName(mv.source);
      m["verdict"] = {{"tier", ti::TierName(mv.decision.tier)},
                      {"clause", ti::ClauseName(mv.decision.clause)}};
      m["explanation"] = nlohmann::json::parse(why.ToJson(-1));
      absl::StrAppend(&text, ": the rule chose ", ti::TierName(mv.decision.tier), " (",
                      ti::ClauseName(mv.decision.clause), "; reuse interval from ",
                      SourceName(mv.source), ")\n", Indent(why.ToText()));
    } else {
      absl::StrAppend(&text, " (not the rule's decision)\n");
    }
    j["last_move"] = std::move(m);
    // What the rule would say now, with the ancestors the tier remembers (parent links of the
    // keys it was placed with, as far as the Placer looks up a chain).
    std::vector<Key> chain = {key};
    for (Key up = k.parent; !(up == Key{}) && chain.size() <= t->placer->options().max_ancestors;) {
      chain.push_back(up);
      auto pit = t->meta.find(up);
      if (pit == t->meta.end()) break;
      up = pit->second.parent;
    }
    std::reverse(chain.begin(), chain.end());
    ti::PlacementQuery q = Query(t, k.ns, key, k.tokens, k.pin);
    q.chain = chain;
    q.pos = chain.size() - 1;
    const bool in_cxl = where == ti::Residence::kCxl;
    const ti::TierState state =
        State(t, in_cxl ? 0.0 : 1.0 / static_cast<double>(t->capacity), t->queue_depth);
    const auto now = static_cast<std::uint64_t>(now_ns);
    const ti::ReuseEstimate est = t->placer->ExpectedReuse(q, now);
    ti::Explanation why;
    const ti::Decision d = t->placer->rule().Decide(t->placer->Inputs(q, state, now), &why);
    j["now"] = {{"reuse_source", SourceName(est.source)},
                {"verdict", {{"tier", ti::TierName(d.tier)}, {"clause", ti::ClauseName(d.clause)}}},
                {"explanation", nlohmann::json::parse(why.ToJson(-1))}};
    absl::StrAppend(&text, "if decided now: ", ti::TierName(d.tier), " (", ti::ClauseName(d.clause),
                    "; reuse interval ", Seconds(est.interval_s), " from ", SourceName(est.source),
                    ", break-even ", Seconds(why.break_even_s), ", CXL occupancy ",
                    absl::StrFormat("%.3f", state.occupancy[static_cast<std::size_t>(t->slot)]),
                    ")\n");
  }
  return json ? j.dump(2) + "\n" : text;
}

}  // namespace

// ---- open and close -------------------------------------------------------------------------

namespace {

absl::StatusOr<std::string> ReadConfig(const char* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string why = absl::StrCat("config_path ", path, ": ", ErrnoText(err));
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(why, " — pass the path of a domain.toml, or NULL for the defaults"));
    }
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::InvalidArgumentError(why);
  }
  std::string text;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) return absl::InvalidArgumentError(absl::StrCat("config_path ", path, ": read failed"));
  return text;
}

int Open(cxlkv_arena* arena, const cxlkv_tier_options* o, std::unique_ptr<Tier>& t) {
  cxlkv::allocator::BlockAllocator& alloc = *arena->alloc;
  const cxlkv::pool::Arena& pa = alloc.arena();
  if (o->size_class >= alloc.class_count()) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat("cxlkv_tier_open: size_class ", o->size_class,
                             " is out of range: the arena has ", alloc.class_count(),
                             " size classes (0..", alloc.class_count() - 1, ")"));
  }
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
  const cxlkv::pool::ClassRecord& cr = pa.class_record(o->size_class);
  t->arena = arena;
  t->cls = o->size_class;
  t->slot = static_cast<int>(o->cxl_kind);
  t->block_bytes = cr.block_bytes;
  t->class_tokens = cr.tokens_per_block;
  t->capacity = o->cxl_blocks != 0 ? o->cxl_blocks : cr.block_count;
  t->name = absl::StrCat("tier over arena ", cxlkv::pool::UuidToString(pa.uuid()), " class ",
                         o->size_class);
  if (t->capacity > cr.block_count) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat("cxlkv_tier_open: cxl_blocks ", o->cxl_blocks, " exceeds the ",
                             cr.block_count, " blocks of size class ", o->size_class,
                             "; pass at most that, or 0 for all of them"));
  }

  // The rule: the config's [placement] table (or the defaults), then its calibration.
  ti::PlacementConfig cfg;
  t->config = "defaults";
  if (o->config_path != nullptr) {
    t->config = o->config_path;
    auto text = ReadConfig(o->config_path);
    if (!text.ok()) return FromStatus(text.status());
    auto parsed = ti::ParsePlacementConfig(*text, o->config_path);
    if (!parsed.ok()) {
      return Fail(CXLKV_E_INVALID,
                  absl::StrCat("cxlkv_tier_open: ", parsed.status().message(),
                               " — fix that key (orchestrator/domain.example.toml lists every "
                               "[placement] key with its unit and range), or pass config_path "
                               "NULL for the defaults"));
    }
    cfg = std::move(*parsed);
    if (!cfg.calibration.empty()) {
      auto cal = ti::LoadCalibration(cfg.calibration);
      if (!cal.ok()) {
        const int code = FromStatus(cal.status());
        return Fail(code, absl::StrCat("cxlkv_tier_open: ", o->config_path,
                                       ": placement.calibration: ", cal.status().message()));
      }
      t->calibration = ti::ApplyCalibration(*cal, &cfg.params);
    }
  }
  if (!cfg.params.cxl[static_cast<std::size_t>(t->slot)].present) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat("cxlkv_tier_open: ", t->config, ": placement.cxl_tiers does not list ",
                             t->slot == 0 ? "\"expanded\"" : "\"pooled\"",
                             ", the CXL tier this arena is (cxl_kind ", o->cxl_kind,
                             "); add it there or pass the other cxl_kind"));
  }
  ti::PlacerOptions po;
  po.params = cfg.params;
  po.tracker = cfg.reuse_tracker;
  auto placer = ti::Placer::Create(po);
  if (!placer.ok()) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat("cxlkv_tier_open: ", t->config, ": ", placer.status().message()));
  }
  t->placer.emplace(std::move(*placer));

  // Watermarks in blocks of the capacity, as replay.cc sets them for the rule.
  t->high = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(cfg.params.high_watermark * static_cast<double>(t->capacity)));
  t->low = std::min<std::uint64_t>(
      t->high,
      static_cast<std::uint64_t>(cfg.params.low_watermark * static_cast<double>(t->capacity)));

  {
    std::lock_guard l(registry_mu);
    const auto me = std::make_pair(static_cast<const cxlkv_arena*>(arena), t->cls);
    if (std::find(Registry().begin(), Registry().end(), me) != Registry().end()) {
      return Fail(CXLKV_E_EXISTS, absl::StrCat("cxlkv_tier_open: size class ", t->cls,
                                               " of this arena already has a tier; close it "
                                               "first (one tier per size class)"));
    }
    Registry().push_back(me);
  }
  auto unregister = [&] {
    std::lock_guard l(registry_mu);
    std::erase(Registry(), std::make_pair(static_cast<const cxlkv_arena*>(arena), t->cls));
  };

  cxlkv::nvme::NvmeStoreOptions so;
  so.dir = o->nvme_dir;
  so.payload_bytes = t->block_bytes;
  so.capacity_bytes = o->nvme_bytes;
  if (so.capacity_bytes == 0 && o->nvme_blocks != 0) {
    // Room for nvme_blocks, with slack for slots being retired in the background (replay.cc).
    const std::uint64_t slot = (t->block_bytes + 4095) / 4096 * 4096 + 4096;
    so.capacity_bytes = (o->nvme_blocks + o->nvme_blocks / 4 + 256) * slot;
  }
  if (o->nvme_queue_depth != 0) so.queue_depth = o->nvme_queue_depth;
  so.dsync = (o->flags & CXLKV_TIER_NVME_DSYNC) != 0;
  if ((o->flags & CXLKV_TIER_NVME_STAGE_READS) != 0) {
    so.read_staging = cxlkv::nvme::NvmeStoreOptions::ReadStaging::kAlways;
  } else if ((o->flags & CXLKV_TIER_NVME_DIRECT_READS) != 0) {
    so.read_staging = cxlkv::nvme::NvmeStoreOptions::ReadStaging::kNever;
  }
  auto store = cxlkv::nvme::NvmeStore::Open(so);
  if (!store.ok()) {
    unregister();
    return FromStatus(store.status());
  }
  // Promotions read into the arena's blocks. A device-dax arena is mapped in 2 MiB (or 1 GiB)
  // pages, where staging a read would only add a copy (NvmeStoreOptions::read_staging).
  if (const cxlkv::pool::Region& r = alloc.arena().region(); r.alignment() >= (2u << 20)) {
    (*store)->AddDirectDestination(r.addr(), r.size_bytes());
  }

  ti::TierOptions to;
  to.size_class = t->cls;
  to.high_watermark_blocks = t->high;
  to.low_watermark_blocks = t->low;
  to.auto_enforce = true;
  to.cooldown_ms = static_cast<std::int64_t>(cfg.params.cooldown_s * 1e3);
  to.nvme_capacity_blocks = o->nvme_blocks;
  Tier* self = t.get();
  to.victim_tier = [self](const Key& key) { return VictimTier(self, key); };
  auto m = ti::TierManager::Create(alloc, std::move(*store), std::move(to));
  if (!m.ok()) {
    unregister();
    return FromStatus(m.status());
  }
  t->m = std::move(*m);
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
  if (const int rc = Open(arena, o, t); rc != CXLKV_OK) return rc;
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
  return tt->m == nullptr ? 0 : tt->block_bytes;
}

// ---- use, place -----------------------------------------------------------------------------

CXLKV_API int cxlkv_tier_use(cxlkv_tier* t, const cxlkv_tier_request* r) {
  if (const int rc = CheckRequest(t, r); rc != CXLKV_OK) return rc;
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  const std::vector<Key> keys = Keys(r->chain, r->n);
  const std::span<const Key> chain(keys);
  {
    std::lock_guard l(t->mu);
    t->queue_depth = r->queue_depth;
    const auto now = static_cast<std::uint64_t>(NowNs());
    for (std::size_t pos = r->first; pos < r->n; ++pos) {
      t->placer->RecordUse(r->ns, chain[pos], now, t->block_bytes, TokensOf(t, r));
      ++t->uses;
    }
  }
  t->m->Touch(chain.subspan(r->first));
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
  if (t->m == nullptr) return FailEnded(t);
  if (const int rc = CheckLen(t, len, "cxlkv_tier_place"); rc != CXLKV_OK) return rc;
  return Place(t, r, data, std::vector<BlockHandle>(r->n - r->first), results);
}

CXLKV_API int cxlkv_tier_place_blocks(cxlkv_tier* t, const cxlkv_tier_request* r,
                                      const cxlkv_block_ref* refs, int* results) {
  if (const int rc = CheckRequest(t, r); rc != CXLKV_OK) return rc;
  if (refs == nullptr) return Fail(CXLKV_E_INVALID, "cxlkv_tier_place_blocks: refs must be set");
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  const cxlkv::allocator::BlockAllocator& alloc = t->m->allocator();
  const cxlkv::pool::ClassRecord& cr = alloc.arena().class_record(t->cls);
  std::vector<BlockHandle> blocks(r->n - r->first);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const cxlkv_block_ref& ref = refs[i];
    if (!cxlkv::capi::SameArena(t->arena, &ref) || ref.index < cr.first_index ||
        ref.index - cr.first_index >= cr.block_count) {
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
    if (auto p = alloc.Resolve(br); !p.ok()) {
      return Fail(CXLKV_E_STALE, absl::StrCat("cxlkv_tier_place_blocks: refs[", i,
                                              "]: ", p.status().message(), "; nothing was taken"));
    }
    for (std::size_t k = 0; k < i; ++k) {
      if (blocks[k].index == ref.index) {
        return Fail(CXLKV_E_INVALID,
                    absl::StrCat("cxlkv_tier_place_blocks: refs[", k, "] and refs[", i,
                                 "] are the same block; nothing was taken"));
      }
    }
    blocks[i] = BlockHandle{ref.index, ref.generation};
  }
  return Place(t, r, nullptr, std::move(blocks), results);
}

// ---- lookup, acquire, read ------------------------------------------------------------------

CXLKV_API int cxlkv_tier_lookup(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n,
                                cxlkv_tier_location* out) {
  if (t == nullptr || (n != 0 && (keys == nullptr || out == nullptr))) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_lookup: tier, keys and out must be set");
  }
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  const cxlkv::allocator::BlockAllocator& alloc = t->m->allocator();
  for (std::size_t i = 0; i < n; ++i) {
    const Key key{keys[i].lo, keys[i].hi};
    cxlkv_tier_location& loc = out[i];
    loc = cxlkv_tier_location{};
    std::optional<ti::Residence> where = t->m->Where(key);
    if (where == ti::Residence::kCxl) {
      if (auto h = t->m->CxlBlock(key)) {
        loc.addr = alloc.Addr(*h);
        std::memcpy(loc.ref.arena_uuid, alloc.arena().uuid().data(), 16);
        loc.ref.index = h->index;
        loc.ref.generation = h->generation;
      } else {
        where = t->m->Where(key);  // it left CXL between the two looks
      }
    }
    loc.residence = FromResidence(where);
  }
  return CXLKV_OK;
}

CXLKV_API int cxlkv_tier_acquire(cxlkv_tier* t, const cxlkv_prefix_key* key, void** addr,
                                 cxlkv_block_ref* ref) {
  if (t == nullptr || key == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_acquire: tier and key must be set");
  }
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  const Key k{key->lo, key->hi};
  auto p = t->m->Acquire(k);
  if (!p.ok()) return CodeOf(p.status());
  if (addr != nullptr) *addr = *p;
  if (ref != nullptr) {
    const cxlkv::allocator::BlockAllocator& alloc = t->m->allocator();
    const std::optional<BlockHandle> h = t->m->CxlBlock(k);  // pinned: it cannot move
    std::memcpy(ref->arena_uuid, alloc.arena().uuid().data(), 16);
    ref->index = h ? h->index : 0;
    ref->generation = h ? h->generation : 0;
  }
  return CXLKV_OK;
}

CXLKV_API int cxlkv_tier_release(cxlkv_tier* t, const cxlkv_prefix_key* key) {
  if (t == nullptr || key == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_release: tier and key must be set");
  }
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  const Key k{key->lo, key->hi};
  if (!t->m->Where(k)) {
    return Fail(CXLKV_E_NOT_FOUND, absl::StrCat("cxlkv_tier_release(", ti::FormatPrefixKey(k),
                                                "): not held by ", t->name));
  }
  t->m->Release(k);
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
  if (t->m == nullptr) return FailEnded(t);
  if (const int rc = CheckLen(t, len, "cxlkv_tier_read"); rc != CXLKV_OK) return rc;
  FirstError first;
  std::vector<int> res(n, CXLKV_TIER_MISSING);
  std::vector<std::size_t> todo(n);
  for (std::size_t i = 0; i < n; ++i) todo[i] = i;
  const std::int64_t deadline = NowNs() + kReadWaitNs;
  std::uint64_t cxl_reads = 0;
  while (!todo.empty()) {
    std::vector<std::size_t> again;
    std::vector<Key> nk;
    std::vector<void*> nd;
    std::vector<std::size_t> ni;
    for (std::size_t i : todo) {
      const Key key{keys[i].lo, keys[i].hi};
      const std::optional<ti::Residence> where = t->m->Where(key);
      if (!where) {
        res[i] = Fail(CXLKV_E_NOT_FOUND, absl::StrCat("cxlkv_tier_read(", ti::FormatPrefixKey(key),
                                                      "): not held by ", t->name));
        first.Note(res[i], cxlkv::capi::LastError());
      } else if (*where == ti::Residence::kCxl) {
        auto p = t->m->Acquire(key);
        if (!p.ok()) {  // it moved meanwhile: look again
          again.push_back(i);
          continue;
        }
        std::memcpy(dsts[i], *p, len);
        t->m->Release(key);
        res[i] = CXLKV_TIER_IN_CXL;
        ++cxl_reads;
      } else if (*where == ti::Residence::kNvme) {
        nk.push_back(key);
        nd.push_back(dsts[i]);
        ni.push_back(i);
      } else {
        again.push_back(i);  // in flight
      }
    }
    if (!nk.empty()) {
      std::vector<absl::Status> st;
      (void)t->m->Read(nk, nd, len, &st);
      for (std::size_t j = 0; j < nk.size(); ++j) {
        const std::size_t i = ni[j];
        if (st[j].ok()) {
          res[i] = CXLKV_TIER_ON_NVME;
        } else if (absl::IsFailedPrecondition(st[j])) {
          again.push_back(i);  // promoted meanwhile
        } else {
          res[i] = FromStatus(st[j]);  // kDataLoss: CXLKV_E_CORRUPT (the store dropped it)
          first.Note(res[i], cxlkv::capi::LastError());
        }
      }
    }
    if (again.empty()) break;
    if (NowNs() > deadline) {
      for (std::size_t i : again) {
        res[i] = Fail(CXLKV_E_BUSY, absl::StrCat("cxlkv_tier_read: ", t->name,
                                                 ": the block's I/O did not finish within 10 s; "
                                                 "retry"));
        first.Note(res[i], cxlkv::capi::LastError());
      }
      break;
    }
    (void)t->m->store().Poll();  // a promotion in flight completes when someone reaps it
    ::sched_yield();
    todo.swap(again);
  }
  {
    std::lock_guard l(t->mu);
    t->cxl_reads += cxl_reads;
  }
  if (results != nullptr) std::copy(res.begin(), res.end(), results);
  return first.Return();
}

// ---- prefetch, demote, drop -----------------------------------------------------------------

CXLKV_API int cxlkv_tier_prefetch(cxlkv_tier* t, const cxlkv_tier_request* r, uint64_t* ticket) {
  if (const int rc = CheckRequest(t, r); rc != CXLKV_OK) return rc;
  if (ticket == nullptr) return Fail(CXLKV_E_INVALID, "cxlkv_tier_prefetch: ticket must be set");
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  const std::vector<Key> keys = Keys(r->chain, r->n);
  const std::span<const Key> chain(keys);
  const bool force = (r->flags & CXLKV_TIER_PREFETCH_FORCE) != 0;
  const double add = 1.0 / static_cast<double>(t->capacity);
  auto p = std::make_shared<Prefetch>();
  p->results.assign(r->n - r->first, CXLKV_TIER_MISSING);
  std::vector<Key> promote;
  {
    std::lock_guard l(t->mu);
    t->queue_depth = r->queue_depth;
    for (std::size_t pos = r->first; pos < r->n; ++pos) {
      const std::size_t i = pos - r->first;
      const Key& key = chain[pos];
      const std::optional<ti::Residence> where = t->m->Where(key);
      if (where != ti::Residence::kNvme) {
        p->results[i] = FromResidence(where);
        continue;
      }
      // The fetch is the promotion: the rule decides it as a new block (replay.cc's NVMe run).
      LastMove mv;
      if (!force) {
        mv = DecideLocked(t, r, chain, pos, add, Event::kPrefetchKept);
        const ti::PromoteCheck c = t->m->CheckPromote(key);
        if (!ti::IsCxl(mv.decision.tier) || !c.allowed()) {
          if (ti::IsCxl(mv.decision.tier)) {
            mv.note = absl::StrCat("the rule wants it in CXL, but promotion is ",
                                   ti::PromoteVerdictName(c.verdict));
          }
          RememberLocked(t, chain, pos, r, std::move(mv));
          p->results[i] = CXLKV_TIER_ON_NVME;
          ++t->prefetch_kept;
          continue;
        }
      } else {
        mv.at_ns = NowNs();
      }
      RememberLocked(t, chain, pos, r, mv);
      promote.push_back(key);
      p->at.push_back(i);
      p->decisions.push_back(std::move(mv));
    }
  }
  if (absl::Status st = t->m->Prefetch(promote, p->batch); !st.ok()) return FromStatus(st);
  std::lock_guard l(t->tickets_mu);
  *ticket = t->next_ticket++;
  t->tickets.emplace(*ticket, std::move(p));
  return CXLKV_OK;
}

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
  if (t->m == nullptr) return FailEnded(t);
  FirstError first;
  std::vector<int> res(n, CXLKV_TIER_ON_NVME);
  std::vector<Key> go;
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < n; ++i) {
    const Key key{keys[i].lo, keys[i].hi};
    if (t->m->Where(key) == ti::Residence::kNvme) continue;  // there already
    go.push_back(key);
    at.push_back(i);
  }
  std::vector<absl::Status> st;
  (void)t->m->Demote(go, &st);
  std::lock_guard l(t->mu);
  for (std::size_t j = 0; j < go.size(); ++j) {
    if (!st[j].ok()) {
      res[at[j]] = CodeOf(st[j]);
      first.Note(res[at[j]], std::string(st[j].message()));
      continue;
    }
    LastMove mv;
    mv.event = Event::kDemoted;
    mv.at_ns = NowNs();
    t->meta[go[j]].last = std::move(mv);
  }
  if (results != nullptr) std::copy(res.begin(), res.end(), results);
  return first.Return();
}

CXLKV_API int cxlkv_tier_drop(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n, int* results) {
  if (t == nullptr || (n != 0 && keys == nullptr)) {
    return Fail(CXLKV_E_INVALID, "cxlkv_tier_drop: tier and keys must be set");
  }
  Use use(t);
  if (t->m == nullptr) return FailEnded(t);
  FirstError first;
  for (std::size_t i = 0; i < n; ++i) {
    const Key key{keys[i].lo, keys[i].hi};
    int rc = CXLKV_TIER_MISSING;
    if (absl::Status st = t->m->Move(key, ti::Tier::kDrop); !st.ok()) {
      rc = CodeOf(st);
      first.Note(rc, std::string(st.message()));
    } else {
      std::lock_guard l(t->mu);
      LastMove mv;
      mv.event = Event::kDropped;
      mv.at_ns = NowNs();
      t->meta[key].last = std::move(mv);
    }
    if (results != nullptr) results[i] = rc;
  }
  return first.Return();
}

// ---- explain, stats -------------------------------------------------------------------------

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
  if (t->m == nullptr) return FailEnded(t);
  const std::string s = Explain(t, Key{key->lo, key->hi}, (flags & CXLKV_TIER_EXPLAIN_JSON) != 0);
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
  if (t->m == nullptr) return FailEnded(t);
  const ti::TierStats m = t->m->Stats();
  const cxlkv::nvme::NvmeStats ns = t->m->store().Stats();
  std::memset(s, 0, sizeof(*s));
  s->block_bytes = t->block_bytes;
  s->cxl_capacity_blocks = t->capacity;
  s->high_watermark_blocks = t->high;
  s->low_watermark_blocks = t->low;
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
  s->nvme_file_bytes = ns.slots_in_file * t->m->store().slot_bytes();
  s->nvme_data_loss = ns.data_loss;
  s->retention_s = t->m->RetentionS();
  const double occupancy =
      std::min(1.0, static_cast<double>(m.cxl_blocks) / static_cast<double>(t->capacity));
  std::lock_guard l(t->mu);
  s->placed_cxl = t->placed_cxl;
  s->placed_nvme = t->placed_nvme;
  s->placed_dropped = t->placed_dropped;
  s->already_held = t->already_held;
  s->nvme_write_failures = t->nvme_write_failures;
  s->prefetch_kept = t->prefetch_kept;
  s->cxl_reads = t->cxl_reads;
  s->uses = t->uses;
  const ti::PlacerStats& ps = t->placer->stats();
  s->decisions = ps.decisions;
  s->from_prior = ps.from_prior;
  s->from_ancestor = ps.from_ancestor;
  for (std::size_t c = 0; c < ps.clauses.size(); ++c) s->clauses[c] = ps.clauses[c];
  s->break_even_s = t->placer->rule().BreakEvenS(CxlTier(t), t->block_bytes, occupancy);
  return CXLKV_OK;
}
