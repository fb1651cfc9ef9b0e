// TieredStore: a TierManager and a Placer driven per request (tiered_store.h).
#include "cxlkv/tier/tiered_store.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/tier/calibrate.h"

namespace cxlkv::tier {
namespace {

// Keys whose block left the store that Explain still remembers.
constexpr std::size_t kRememberGone = 4096;
// How long Read waits for I/O in flight on a key.
constexpr std::int64_t kReadWaitNs = 10'000'000'000;
// Allocation retries while the reclaim hook says blocks may come back.
constexpr int kReclaimRounds = 1000;

std::int64_t MonotonicNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

absl::StatusOr<std::string> ReadFile(const char* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string why = absl::StrCat("config_path ", path, ": ", base::ErrnoText(err));
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(why, " — pass the path of a domain.toml, or none for the defaults"));
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

KeyResult Failed(absl::Status st, Outcome now = Outcome::kMissing) {
  KeyResult k;
  k.outcome = now;
  k.status = std::move(st);
  return k;
}

KeyResult At(Outcome o) {
  KeyResult k;
  k.outcome = o;
  return k;
}

absl::Status FirstError(const std::vector<KeyResult>& res) {
  for (const KeyResult& k : res) {
    if (!k.status.ok()) return k.status;
  }
  return absl::OkStatus();
}

}  // namespace

// One prefetch ticket: the batch, and per key of the request its result.
struct TieredStore::Ticket {
  PromotionBatch batch;
  StoreRequest request;             // chain copied into keys
  std::vector<Key> keys;            // the request's chain
  std::vector<KeyResult> results;   // per key of the request (from first)
  std::vector<std::size_t> at;      // per key of the batch: its index in results
  std::vector<LastMove> decisions;  // per key of the batch
};

const char* StrategyName(Strategy s) noexcept {
  switch (s) {
    case Strategy::kRule:
      return "rule";
    case Strategy::kCxlLru:
      return "cxl-lru";
    case Strategy::kNvmeLru:
      return "nvme-lru";
    case Strategy::kLruSpill:
      return "lru-spill";
  }
  return "?";
}

const char* MoveEventName(MoveEvent e) noexcept {
  switch (e) {
    case MoveEvent::kPlaced:
      return "placed";
    case MoveEvent::kNvmeWriteFailed:
      return "nvme-write-failed";
    case MoveEvent::kVictim:
      return "watermark-victim";
    case MoveEvent::kDemoted:
      return "demoted-by-caller";
    case MoveEvent::kPromoted:
      return "promoted";
    case MoveEvent::kPromoteFailed:
      return "promotion-failed";
    case MoveEvent::kPrefetchKept:
      return "prefetch-kept-on-nvme";
    case MoveEvent::kDropped:
      return "dropped-by-caller";
  }
  return "?";
}

const char* ReuseSourceName(ReuseSource s) noexcept {
  switch (s) {
    case ReuseSource::kOwn:
      return "own";
    case ReuseSource::kPrior:
      return "namespace-prior";
    case ReuseSource::kAncestor:
      return "ancestor";
    case ReuseSource::kNone:
      return "none";
  }
  return "?";
}

Outcome OutcomeOf(std::optional<Residence> r) noexcept {
  if (!r) return Outcome::kMissing;
  switch (*r) {
    case Residence::kCxl:
      return Outcome::kCxl;
    case Residence::kNvme:
      return Outcome::kNvme;
    case Residence::kDemoting:
      return Outcome::kDemoting;
    case Residence::kPromoting:
      return Outcome::kPromoting;
  }
  return Outcome::kMissing;
}

std::uint64_t NvmeBytesFor(std::uint64_t blocks, std::uint64_t block_bytes) noexcept {
  const std::uint64_t slot = (block_bytes + 4095) / 4096 * 4096 + 4096;
  return (blocks + blocks / 4 + 256) * slot;
}

absl::StatusOr<LoadedPlacement> LoadPlacement(const char* path) {
  LoadedPlacement out;
  if (path == nullptr) return out;
  out.source = path;
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto parsed = ParsePlacementConfig(*text, path);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(parsed.status().message(),
                     " — fix that key (orchestrator/domain.example.toml lists every "
                     "[placement] key with its unit and range), or open without a config for "
                     "the defaults"));
  }
  out.config = std::move(*parsed);
  if (!out.config.calibration.empty()) {
    auto cal = LoadCalibration(out.config.calibration);
    if (!cal.ok()) {
      return absl::Status(cal.status().code(),
                          absl::StrCat(path, ": placement.calibration: ", cal.status().message()));
    }
    out.calibration = ApplyCalibration(*cal, &out.config.params);
  }
  return out;
}

// ---- open ------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TieredStore>> TieredStore::Open(allocator::BlockAllocator& alloc,
                                                               TieredStoreOptions options,
                                                               std::string config) {
  const pool::Arena& pa = alloc.arena();
  if (options.size_class >= alloc.class_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("size_class ", options.size_class, " is out of range: the arena has ",
                     alloc.class_count(), " size classes (0..", alloc.class_count() - 1, ")"));
  }
  if (!IsCxl(options.cxl_tier)) {
    return absl::InvalidArgumentError(absl::StrCat("cxl_tier ", TierName(options.cxl_tier),
                                                   " is not a CXL tier: expanded or pooled"));
  }
  const pool::ClassRecord& cr = pa.class_record(options.size_class);
  if (options.cxl_blocks > cr.block_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cxl_blocks ", options.cxl_blocks, " exceeds the ", cr.block_count,
        " blocks of size class ", options.size_class, "; pass at most that, or 0 for all of them"));
  }
  std::unique_ptr<TieredStore> s(new TieredStore(std::move(options)));
  TieredStoreOptions& o = s->o_;
  s->config_ = std::move(config);
  s->slot_ = static_cast<int>(o.cxl_tier);
  s->block_bytes_ = cr.block_bytes;
  s->rule_bytes_ = o.rule_block_bytes != 0 ? o.rule_block_bytes : cr.block_bytes;
  s->class_tokens_ = o.tokens_per_block != 0 ? o.tokens_per_block : cr.tokens_per_block;
  s->capacity_ = o.cxl_blocks != 0 ? o.cxl_blocks : cr.block_count;
  const PlacementParams& p = o.placer.params;
  if (o.strategy == Strategy::kRule) {
    if (!p.cxl[static_cast<std::size_t>(s->slot_)].present) {
      return absl::InvalidArgumentError(
          absl::StrCat(s->config_, ": placement.cxl_tiers does not list ",
                       s->slot_ == 0 ? "\"expanded\"" : "\"pooled\"",
                       ", the CXL tier this arena is; add it "
                       "there or open the store as the other CXL tier"));
    }
    auto placer = Placer::Create(o.placer);
    if (!placer.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(s->config_, ": ", placer.status().message()));
    }
    base::MutexLock l(s->mu_);  // nobody else has the store yet: for the analysis
    s->placer_.emplace(std::move(*placer));
  }

  TierOptions to;
  to.size_class = o.size_class;
  to.auto_enforce = true;
  to.nvme_capacity_blocks = o.nvme_blocks;
  to.cooldown_ms = 0;
  if (o.now_ns) {
    to.now_ms = [clock = o.now_ns] { return clock() / 1000000; };
  }
  to.release_cxl = o.release_cxl;
  TieredStore* self = s.get();
  switch (o.strategy) {
    case Strategy::kRule:
      // Watermarks in blocks of the capacity (at least one).
      s->high_ = std::max<std::uint64_t>(
          1, static_cast<std::uint64_t>(p.high_watermark * static_cast<double>(s->capacity_)));
      s->low_ = std::min<std::uint64_t>(
          s->high_,
          static_cast<std::uint64_t>(p.low_watermark * static_cast<double>(s->capacity_)));
      to.cooldown_ms = static_cast<std::int64_t>(p.cooldown_s * 1e3);
      to.victim_tier = [self](const Key& key) { return self->VictimTier(key); };
      break;
    case Strategy::kCxlLru:
      s->high_ = s->low_ = s->capacity_;
      to.victim_tier = [](const Key&) { return Tier::kDrop; };
      break;
    case Strategy::kLruSpill:
      s->high_ = s->low_ = s->capacity_;  // victims demoted
      break;
    case Strategy::kNvmeLru:
      break;  // CXL only stages new blocks for their NVMe write
  }
  to.high_watermark_blocks = s->high_;
  to.low_watermark_blocks = s->low_;

  nvme::NvmeStoreOptions so = o.nvme;
  so.payload_bytes = s->block_bytes_;
  if (so.capacity_bytes == 0 && o.nvme_blocks != 0) {
    so.capacity_bytes = NvmeBytesFor(o.nvme_blocks, s->block_bytes_);
  }
  auto store = nvme::NvmeStore::Open(so);
  if (!store.ok()) return store.status();
  // Promotions read into the arena's blocks. A device-dax arena is mapped in 2 MiB (or 1 GiB)
  // pages, where staging a read would only add a copy (NvmeStoreOptions::read_staging).
  if (const pool::Region& r = pa.region(); r.alignment() >= (2u << 20)) {
    (*store)->AddDirectDestination(r.addr(), r.size_bytes());
  }
  auto m = TierManager::Create(alloc, std::move(*store), std::move(to));
  if (!m.ok()) return m.status();
  s->m_ = std::move(*m);
  return s;
}

absl::StatusOr<std::unique_ptr<TieredStore>> TieredStore::Open(std::unique_ptr<pool::Arena> arena,
                                                               TieredStoreOptions options,
                                                               std::string config) {
  auto alloc = allocator::BlockAllocator::Create(std::move(arena));
  if (!alloc.ok()) return alloc.status();
  auto s = Open(**alloc, std::move(options), std::move(config));
  if (!s.ok()) return s.status();
  (*s)->owned_alloc_ = std::move(*alloc);
  return s;
}

absl::Status TieredStore::ReturnBlock(allocator::BlockHandle h) {
  const allocator::FreeResult fr = m_->allocator().Free(h);
  if (fr == allocator::FreeResult::kOk) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      o_.name, ": block ", h.index, " handed back did not free: ", allocator::FreeResultName(fr)));
}

TieredStore::~TieredStore() {
  m_.reset();  // drains I/O: the tickets' batches complete before they go
  base::MutexLock l(tickets_mu_);
  tickets_.clear();
}

// ---- the rule's view -------------------------------------------------------------------------

std::int64_t TieredStore::NowNs() const { return o_.now_ns ? o_.now_ns() : MonotonicNs(); }

std::uint32_t TieredStore::BlockTokens(const StoreRequest& r) const {
  return r.tokens != 0 ? r.tokens : class_tokens_;
}

// What the rule is told a hit of chain[pos] saves: the block's tokens, or its whole prefix's.
std::uint32_t TieredStore::TokensOf(const StoreRequest& r, std::size_t pos) const {
  const std::uint32_t t = BlockTokens(r);
  return o_.prefix_tokens ? t * static_cast<std::uint32_t>(pos + 1) : t;
}

PlacementQuery TieredStore::Query(coherence::Namespace ns, const Key& key, std::uint32_t tokens,
                                  std::int32_t pin) const {
  PlacementQuery q;
  q.ns = ns;
  q.key = key;
  q.size_bytes = rule_bytes_;
  q.tokens = tokens;
  q.pin_level = pin;
  return q;
}

// The tiers now, as the rule sees them: this arena's occupancy (plus what a placement adds)
// and retention; the other CXL tier absent. Takes the manager's lock.
TierState TieredStore::State(double add, std::uint32_t queue_depth) const {
  TierState s;
  const TierStats st = m_->Stats();
  s.occupancy[static_cast<std::size_t>(slot_)] =
      std::min(1.0, static_cast<double>(st.cxl_blocks) / static_cast<double>(capacity_) + add);
  if (o_.retention_pressure) s.retention_s[static_cast<std::size_t>(slot_)] = m_->RetentionS();
  s.queue_depth = queue_depth;
  return s;
}

// The rule's decision for chain[pos], remembered for Explain. mu_ held.
LastMove TieredStore::DecideLocked(const StoreRequest& r, std::size_t pos, MoveEvent event) {
  PlacementQuery q = Query(r.ns, r.chain[pos], TokensOf(r, pos), r.pin);
  q.chain = r.chain;
  q.pos = pos;
  const auto now = static_cast<std::uint64_t>(NowNs());
  LastMove mv;
  mv.event = event;
  mv.by_rule = true;
  mv.at_ns = static_cast<std::int64_t>(now);
  mv.source = placer_->ExpectedReuse(q, now).source;
  Explanation why;
  mv.decision =
      placer_->Decide(q, State(1.0 / static_cast<double>(capacity_), r.queue_depth), now, &why);
  mv.inputs = why.inputs;
  return mv;
}

void TieredStore::RememberLocked(const StoreRequest& r, std::size_t pos, LastMove mv) {
  KeyMeta& k = meta_[r.chain[pos]];
  k.parent = pos > 0 ? r.chain[pos - 1] : Key{};
  k.ns = r.ns;
  k.tokens = TokensOf(r, pos);
  k.pin = r.pin;
  k.last = std::move(mv);
}

// Forgets the keys whose block left the store, but the kRememberGone most recent, once the
// record has grown well past what the store holds. mu_ held.
void TieredStore::PruneLocked() {
  const TierStats s = m_->Stats();
  const std::uint64_t held = s.cxl_blocks + s.nvme_blocks;
  if (meta_.size() < std::max<std::uint64_t>(2 * kRememberGone, 2 * held + kRememberGone)) {
    return;
  }
  std::vector<std::pair<std::int64_t, Key>> gone;
  for (const auto& [key, k] : meta_) {
    if (!m_->Where(key)) gone.emplace_back(k.last.at_ns, key);
  }
  if (gone.size() <= kRememberGone) return;
  std::nth_element(gone.begin(), gone.begin() + static_cast<std::ptrdiff_t>(kRememberGone),
                   gone.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = kRememberGone; i < gone.size(); ++i) meta_.erase(gone[i].second);
}

// TierOptions::victim_tier (kRule): a block leaving CXL above the high watermark, re-decided
// with CXL full (Placer::DecideVictim): NVMe, or dropped when recomputing beats fetching it.
Tier TieredStore::VictimTier(const Key& key) {
  base::MutexLock l(mu_);
  KeyMeta& k = meta_[key];
  const PlacementQuery q = Query(k.ns, key, k.tokens, k.pin);
  const auto now = static_cast<std::uint64_t>(NowNs());
  const TierState state = State(0, queue_depth_);
  const Tier v = placer_->DecideVictim(q, state, now);
  // What DecideVictim looked at: the state with every CXL tier full.
  TierState full = state;
  full.occupancy.fill(1.0);
  LastMove mv;
  mv.event = MoveEvent::kVictim;
  mv.by_rule = true;
  mv.at_ns = static_cast<std::int64_t>(now);
  mv.source = placer_->ExpectedReuse(q, now).source;
  mv.inputs = placer_->Inputs(q, full, now);
  mv.decision = placer_->rule().Decide(mv.inputs);
  k.last = std::move(mv);
  return v;
}

// ---- use, place ------------------------------------------------------------------------------

void TieredStore::Use(const StoreRequest& r) {
  base::MutexLock l(mu_);
  queue_depth_ = r.queue_depth;
  const auto now = static_cast<std::uint64_t>(NowNs());
  for (std::size_t pos = r.first; pos < r.chain.size(); ++pos) {
    if (placer_) placer_->RecordUse(r.ns, r.chain[pos], now, rule_bytes_, BlockTokens(r));
    ++counts_.uses;
  }
}

std::size_t TieredStore::Touch(std::span<const Key> keys) { return m_->Touch(keys); }

absl::StatusOr<allocator::BlockHandle> TieredStore::AllocBlock(bool for_nvme) {
  allocator::BlockAllocator& alloc = m_->allocator();
  allocator::BlockHandle h = alloc.Alloc(o_.size_class);
  for (int rounds = 0; !h.valid() && o_.reclaim && rounds < kReclaimRounds && o_.reclaim();
       ++rounds) {
    h = alloc.Alloc(o_.size_class);
  }
  if (h.valid()) return h;
  const absl::Status why = alloc.ExplainAllocFailure(o_.size_class);
  return absl::ResourceExhaustedError(
      absl::StrCat(o_.name, ": no free block to ",
                   for_nvme ? "stage it for NVMe" : "keep it in CXL", " (", why.message(),
                   "): demote blocks, lower placement.high_watermark or cxl_blocks, or give the "
                   "arena more memory"));
}

absl::Status TieredStore::Place(const StoreRequest& r,
                                absl::FunctionRef<const void*(std::size_t)> data,
                                std::vector<KeyResult>* results) {
  return PlaceImpl(r, &data, {}, results);
}

absl::Status TieredStore::PlaceBlocks(const StoreRequest& r,
                                      std::span<const allocator::BlockHandle> blocks,
                                      std::vector<KeyResult>* results) {
  if (blocks.size() != r.chain.size() - std::min(r.first, r.chain.size())) {
    return absl::InvalidArgumentError(absl::StrCat("PlaceBlocks: ", blocks.size(), " blocks for ",
                                                   r.chain.size() - r.first, " keys"));
  }
  return PlaceImpl(r, nullptr, blocks, results);
}

absl::Status TieredStore::PlaceImpl(const StoreRequest& r,
                                    const absl::FunctionRef<const void*(std::size_t)>* data,
                                    std::span<const allocator::BlockHandle> blocks,
                                    std::vector<KeyResult>* results) {
  const std::span<const Key> chain = r.chain;
  const std::size_t first = std::min(r.first, chain.size());
  allocator::BlockAllocator& alloc = m_->allocator();
  const Tier cxl = o_.cxl_tier;
  std::vector<KeyResult> local;
  std::vector<KeyResult>& res = results != nullptr ? *results : local;
  res.assign(chain.size() - first, KeyResult{});
  std::vector<Key> pending_keys;
  std::vector<allocator::BlockHandle> pending_blocks;
  std::vector<std::size_t> pending_at;

  auto flush = [&] {
    if (pending_keys.empty()) return;
    std::vector<absl::Status> st;
    (void)m_->Place(pending_keys, pending_blocks, Tier::kNvme, &st);
    std::vector<Key> to_drop;
    {
      base::MutexLock l(mu_);
      for (std::size_t j = 0; j < pending_keys.size(); ++j) {
        const std::size_t i = pending_at[j];
        if (st[j].ok()) {
          res[i] = At(Outcome::kNvme);
          ++counts_.placed_nvme;
          continue;
        }
        if (absl::IsAlreadyExists(st[j])) {  // the same key twice in this batch
          alloc.Free(pending_blocks[j]);
          res[i] = At(OutcomeOf(m_->Where(pending_keys[j])));
          res[i].already_held = true;
          ++counts_.already_held;
          continue;
        }
        const std::optional<Residence> where = m_->Where(pending_keys[j]);
        if (where == Residence::kCxl) {
          ++counts_.nvme_write_failures;
          KeyMeta& k = meta_[pending_keys[j]];
          k.last.event = MoveEvent::kNvmeWriteFailed;
          k.last.note = std::string(st[j].message());
          if (o_.keep_failed_nvme_writes) {
            // The write failed (the store is full, an I/O error): the block stays in CXL,
            // where nothing is lost; the watermarks may demote it later.
            res[i] = At(Outcome::kCxl);
          } else {
            to_drop.push_back(pending_keys[j]);
            res[i] = At(Outcome::kDropped);
            ++counts_.placed_dropped;
          }
        } else {
          // Between entering the manager and its write, another thread's watermark run took
          // the staged block as a victim: it went to NVMe (or was dropped) that way instead.
          res[i] = At(where.has_value() ? OutcomeOf(where) : Outcome::kDropped);
          ++(where.has_value() ? counts_.placed_nvme : counts_.placed_dropped);
        }
      }
    }
    for (const Key& k : to_drop) {
      if (absl::Status s = m_->Move(k, Tier::kDrop); !s.ok()) {
        for (std::size_t j = 0; j < pending_keys.size(); ++j) {
          if (pending_keys[j] == k) res[pending_at[j]] = Failed(s, OutcomeOf(m_->Where(k)));
        }
      }
    }
    pending_keys.clear();
    pending_blocks.clear();
    pending_at.clear();
  };

  for (std::size_t pos = first; pos < chain.size(); ++pos) {
    const std::size_t i = pos - first;
    const Key& key = chain[pos];
    allocator::BlockHandle h = data == nullptr ? blocks[i] : allocator::BlockHandle{};
    if (const auto where = m_->Where(key); where.has_value()) {
      if (h.valid()) alloc.Free(h);
      res[i] = At(OutcomeOf(where));
      res[i].already_held = true;
      base::MutexLock l(mu_);
      ++counts_.already_held;
      continue;
    }
    Tier dest = o_.strategy == Strategy::kNvmeLru ? Tier::kNvme : cxl;
    {
      base::MutexLock l(mu_);
      queue_depth_ = r.queue_depth;
      if (pos >= r.record_use_from) {
        if (placer_) {
          placer_->RecordUse(r.ns, key, static_cast<std::uint64_t>(NowNs()), rule_bytes_,
                             BlockTokens(r));
        }
        ++counts_.uses;
      }
      LastMove mv;
      if (placer_) {
        mv = DecideLocked(r, pos, MoveEvent::kPlaced);
        dest = mv.decision.tier;
      } else {
        mv.at_ns = NowNs();
        mv.decision.tier = dest;
      }
      RememberLocked(r, pos, std::move(mv));
      if (dest == Tier::kDrop) ++counts_.placed_dropped;
    }
    if (dest == Tier::kDrop) {
      if (h.valid()) alloc.Free(h);
      res[i] = At(Outcome::kDropped);
      continue;
    }
    if (!h.valid()) {
      auto a = AllocBlock(dest == Tier::kNvme);
      if (!a.ok()) {
        res[i] = Failed(a.status());
        continue;
      }
      h = *a;
      const void* src = (*data)(i);
      if (dest == Tier::kNvme) {
        std::memcpy(alloc.Addr(h), src, block_bytes_);  // read back by the NVMe write
      } else {
        coherence::CopyNt(alloc.Addr(h), src, block_bytes_);
      }
    }
    if (dest == Tier::kNvme) {
      pending_keys.push_back(key);
      pending_blocks.push_back(h);
      pending_at.push_back(i);
      if (pending_keys.size() >= kNvmeBatch) flush();
      continue;
    }
    if (o_.on_cxl) {
      CxlEntry e;
      e.key = key;
      e.ns = r.ns;
      e.parent = pos > 0 ? chain[pos - 1] : Key{};
      e.pos = pos;
      e.block = h;
      e.addr = alloc.Addr(h);
      if (absl::Status st = o_.on_cxl(e); !st.ok()) {
        alloc.Free(h);
        res[i] = Failed(st);
        continue;
      }
    }
    // Kept in CXL; the watermarks run here, their victims re-decided by VictimTier.
    if (absl::Status st = m_->Place(key, h, dest); !st.ok()) {
      alloc.Free(h);  // another thread placed the key meanwhile
      res[i] = At(OutcomeOf(m_->Where(key)));
      res[i].already_held = true;
      base::MutexLock l(mu_);
      ++counts_.already_held;
      continue;
    }
    res[i] = At(Outcome::kCxl);
    base::MutexLock l(mu_);
    ++counts_.placed_cxl;
  }
  flush();
  // The chain root most recently used: LRU evicts its tail first.
  if (o_.chain_recency) m_->Touch(chain);
  {
    base::MutexLock l(mu_);
    PruneLocked();
  }
  return FirstError(res);
}

// ---- lookup, acquire, read -------------------------------------------------------------------

StoreLocation TieredStore::Lookup(const Key& key) const {
  StoreLocation loc;
  loc.where = m_->Where(key);
  if (loc.where == Residence::kCxl) {
    if (auto h = m_->CxlBlock(key)) {
      loc.block = h;
      loc.addr = m_->allocator().Addr(*h);
    } else {
      loc.where = m_->Where(key);  // it left CXL between the two looks
    }
  }
  return loc;
}

absl::StatusOr<std::byte*> TieredStore::Acquire(const Key& key) { return m_->Acquire(key); }

void TieredStore::Release(const Key& key) { m_->Release(key); }

absl::Status TieredStore::Read(std::span<const Key> keys, std::span<void* const> dsts,
                               std::size_t len, std::vector<KeyResult>* results) {
  std::vector<KeyResult> local;
  std::vector<KeyResult>& res = results != nullptr ? *results : local;
  res.assign(keys.size(), KeyResult{});
  if (dsts.size() != keys.size() || len != block_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("Read: ", keys.size(), " keys, ", dsts.size(),
                                                   " destinations of ", len, " bytes; ", o_.name,
                                                   " keeps blocks of ", block_bytes_, " bytes"));
  }
  std::vector<std::size_t> todo(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) todo[i] = i;
  const std::int64_t deadline = MonotonicNs() + kReadWaitNs;
  std::uint64_t cxl_reads = 0, nvme_reads = 0;
  while (!todo.empty()) {
    std::vector<std::size_t> again;
    std::vector<Key> nk;
    std::vector<void*> nd;
    std::vector<std::size_t> ni;
    for (std::size_t i : todo) {
      const Key& key = keys[i];
      const std::optional<Residence> where = m_->Where(key);
      if (!where) {
        res[i] = Failed(absl::NotFoundError(
            absl::StrCat(coherence::FormatKey(key), ": not held by ", o_.name)));
      } else if (*where == Residence::kCxl) {
        auto p = m_->Acquire(key);
        if (!p.ok()) {  // it moved meanwhile: look again
          again.push_back(i);
          continue;
        }
        std::memcpy(dsts[i], *p, len);
        m_->Release(key);
        res[i] = At(Outcome::kCxl);
        ++cxl_reads;
      } else if (*where == Residence::kNvme) {
        nk.push_back(key);
        nd.push_back(dsts[i]);
        ni.push_back(i);
      } else {
        again.push_back(i);  // in flight
      }
    }
    if (!nk.empty()) {
      std::vector<absl::Status> st;
      (void)m_->Read(nk, nd, len, &st);
      for (std::size_t j = 0; j < nk.size(); ++j) {
        const std::size_t i = ni[j];
        if (st[j].ok()) {
          res[i] = At(Outcome::kNvme);
          ++nvme_reads;
        } else if (absl::IsFailedPrecondition(st[j])) {
          again.push_back(i);  // promoted meanwhile
        } else {
          res[i] = Failed(st[j]);  // kDataLoss: the store dropped it
        }
      }
    }
    if (again.empty()) break;
    if (MonotonicNs() > deadline) {
      for (std::size_t i : again) {
        res[i] = Failed(absl::FailedPreconditionError(
            absl::StrCat(o_.name, ": the block's I/O did not finish within 10 s; retry")));
      }
      break;
    }
    (void)m_->store().Poll();  // a promotion in flight completes when someone reaps it
    ::sched_yield();
    todo.swap(again);
  }
  {
    base::MutexLock l(mu_);
    counts_.cxl_reads += cxl_reads;
    counts_.nvme_reads += nvme_reads;
  }
  return FirstError(res);
}

// ---- prefetch --------------------------------------------------------------------------------

absl::StatusOr<std::uint64_t> TieredStore::Prefetch(const StoreRequest& req) {
  auto t = std::make_shared<Ticket>();
  t->keys.assign(req.chain.begin(), req.chain.end());
  t->request = req;
  t->request.chain = t->keys;
  const StoreRequest& r = t->request;
  const std::size_t first = std::min(r.first, r.chain.size());
  t->results.assign(r.chain.size() - first, KeyResult{});
  std::vector<Key> promote;
  {
    base::MutexLock l(mu_);
    queue_depth_ = r.queue_depth;
    for (std::size_t pos = first; pos < r.chain.size(); ++pos) {
      const std::size_t i = pos - first;
      const Key& key = r.chain[pos];
      const std::optional<Residence> where = m_->Where(key);
      if (where != Residence::kNvme) {
        t->results[i] = At(OutcomeOf(where));
        continue;
      }
      // The fetch is the promotion: the rule decides it as a new block.
      LastMove mv;
      bool up = r.force || o_.strategy == Strategy::kLruSpill;
      if (!up && placer_) {
        mv = DecideLocked(r, pos, MoveEvent::kPrefetchKept);
        const PromoteCheck c = m_->CheckPromote(key);
        if (IsCxl(mv.decision.tier)) {
          if (c.verdict == PromoteVerdict::kCoolingDown) ++counts_.cooldown_holds;
          if (!c.allowed()) {
            mv.note = absl::StrCat("the rule wants it in CXL, but promotion is ",
                                   PromoteVerdictName(c.verdict));
          }
          up = c.allowed();
        }
      }
      if (!up) {
        if (mv.at_ns == 0) {
          mv.event = MoveEvent::kPrefetchKept;
          mv.at_ns = NowNs();
        }
        RememberLocked(r, pos, std::move(mv));
        t->results[i] = At(Outcome::kNvme);
        ++counts_.prefetch_kept;
        continue;
      }
      if (!mv.by_rule) mv.at_ns = NowNs();
      RememberLocked(r, pos, mv);
      promote.push_back(key);
      t->at.push_back(i);
      t->decisions.push_back(std::move(mv));
    }
  }
  if (absl::Status st = m_->Prefetch(promote, t->batch); !st.ok()) return st;
  base::MutexLock l(tickets_mu_);
  const std::uint64_t ticket = next_ticket_++;
  tickets_.emplace(ticket, std::move(t));
  return ticket;
}

absl::Status TieredStore::Poll(std::uint64_t ticket, std::vector<KeyResult>* results) {
  return Collect(ticket, /*block=*/false, results);
}

absl::Status TieredStore::Wait(std::uint64_t ticket, std::vector<KeyResult>* results) {
  return Collect(ticket, /*block=*/true, results);
}

absl::Status TieredStore::Collect(std::uint64_t ticket, bool block,
                                  std::vector<KeyResult>* results) {
  std::shared_ptr<Ticket> t;
  {
    base::MutexLock l(tickets_mu_);
    auto it = tickets_.find(ticket);
    if (it != tickets_.end()) t = it->second;
  }
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(o_.name, ": no prefetch ticket ", ticket,
                                            " (never issued, or already collected by a poll or "
                                            "wait)"));
  }
  if (!t->batch.done()) {
    if (block) {
      m_->Wait(t->batch);
    } else {
      (void)m_->store().Poll();
      if (!t->batch.done()) return absl::UnavailableError("the prefetch's reads are running");
    }
  }
  {
    base::MutexLock l(tickets_mu_);
    if (tickets_.erase(ticket) == 0) {
      return absl::NotFoundError(
          absl::StrCat(o_.name, ": prefetch ticket ", ticket, " was collected by another thread"));
    }
  }
  // Results, what Explain remembers, the promoted blocks announced, then the watermarks.
  const StoreRequest& r = t->request;
  const std::size_t first = std::min(r.first, r.chain.size());
  for (std::size_t j = 0; j < t->batch.size(); ++j) {
    const absl::Status& st = t->batch.status(j);
    const std::size_t i = t->at[j];
    const Key& key = t->batch.key(j);
    LastMove mv = std::move(t->decisions[j]);
    if (st.ok()) {
      t->results[i] = At(Outcome::kCxl);
      mv.event = MoveEvent::kPromoted;
      if (o_.on_cxl) {
        if (const auto h = m_->CxlBlock(key)) {
          CxlEntry e;
          e.key = key;
          e.ns = r.ns;
          const std::size_t pos = first + i;
          e.parent = pos > 0 ? r.chain[pos - 1] : Key{};
          e.pos = pos;
          e.block = *h;
          e.addr = m_->allocator().Addr(*h);
          e.promoted = true;
          if (absl::Status hs = o_.on_cxl(e); !hs.ok()) t->results[i] = Failed(hs, Outcome::kCxl);
        } else {
          t->results[i] = Failed(absl::InternalError(absl::StrCat(coherence::FormatKey(key),
                                                                  ": promoted but not in CXL")),
                                 OutcomeOf(m_->Where(key)));
        }
      }
    } else {
      // kNotFound: dropped meanwhile; kDataLoss: the store's message says it was dropped.
      t->results[i] =
          absl::IsNotFound(st) ? At(Outcome::kMissing) : Failed(st, OutcomeOf(m_->Where(key)));
      mv.event = MoveEvent::kPromoteFailed;
      mv.note = std::string(st.message());
    }
    base::MutexLock l(mu_);
    if (st.ok()) ++counts_.promoted;
    meta_[key].last = std::move(mv);
  }
  // Promotions raise residency: the watermarks run after them, as after a placement.
  if (t->batch.size() > 0) (void)m_->EnforceWatermarks();
  if (results != nullptr) *results = std::move(t->results);
  return absl::OkStatus();
}

// ---- demote, drop ----------------------------------------------------------------------------

absl::Status TieredStore::Demote(std::span<const Key> keys, std::vector<KeyResult>* results) {
  std::vector<KeyResult> local;
  std::vector<KeyResult>& res = results != nullptr ? *results : local;
  res.assign(keys.size(), At(Outcome::kNvme));
  std::vector<Key> go;
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (m_->Where(keys[i]) == Residence::kNvme) continue;  // there already
    go.push_back(keys[i]);
    at.push_back(i);
  }
  std::vector<absl::Status> st;
  (void)m_->Demote(go, &st);
  base::MutexLock l(mu_);
  for (std::size_t j = 0; j < go.size(); ++j) {
    if (!st[j].ok()) {
      res[at[j]] = Failed(st[j], OutcomeOf(m_->Where(go[j])));
      continue;
    }
    LastMove mv;
    mv.event = MoveEvent::kDemoted;
    mv.at_ns = NowNs();
    meta_[go[j]].last = std::move(mv);
  }
  return FirstError(res);
}

absl::Status TieredStore::Drop(std::span<const Key> keys, std::vector<KeyResult>* results) {
  std::vector<KeyResult> local;
  std::vector<KeyResult>& res = results != nullptr ? *results : local;
  res.assign(keys.size(), KeyResult{});
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status st = m_->Move(keys[i], Tier::kDrop); !st.ok()) {
      res[i] = Failed(st, OutcomeOf(m_->Where(keys[i])));
      continue;
    }
    base::MutexLock l(mu_);
    LastMove mv;
    mv.event = MoveEvent::kDropped;
    mv.at_ns = NowNs();
    meta_[keys[i]].last = std::move(mv);
  }
  return FirstError(res);
}

// ---- explain, stats --------------------------------------------------------------------------

const pool::Uuid& TieredStore::arena_uuid() const noexcept {
  return m_->allocator().arena().uuid();
}

bool TieredStore::HoldsBlockIndex(std::uint64_t index) const noexcept {
  const pool::ClassRecord& cr = m_->allocator().arena().class_record(o_.size_class);
  return index >= cr.first_index && index - cr.first_index < cr.block_count;
}

absl::Status TieredStore::CheckRef(const allocator::BlockRef& ref) const {
  return m_->allocator().Resolve(ref).status();
}

absl::Status TieredStore::Persist(const allocator::BlockHandle& block) {
  return m_->allocator().Persist(block);
}

pool::ArenaUsage TieredStore::ArenaUsage() const { return m_->allocator().arena().Usage(); }

TierStats TieredStore::ManagerStats() const { return m_->Stats(); }

void TieredStore::DrainNvme() { m_->store().Drain(); }

ExplainReport TieredStore::Explain(const Key& key) {
  ExplainReport e;
  e.key = key;
  e.store = o_.name;
  e.config = config_;
  e.now_ns = NowNs();
  e.where = m_->Where(key);
  if (e.where == Residence::kCxl) {
    e.cxl_block = m_->CxlBlock(key);
  } else if (e.where == Residence::kNvme) {
    if (auto loc = m_->store().Locate(key); loc.ok()) e.nvme = std::move(*loc);
  }
  if (e.where.has_value()) e.promotion = m_->CheckPromote(key);

  base::MutexLock l(mu_);
  const auto now = static_cast<std::uint64_t>(e.now_ns);
  if (placer_) {
    e.reuse = placer_->tracker().Find(key);
    if (e.reuse) {
      e.idle_s = now > e.reuse->last_seen_ns
                     ? static_cast<double>(now - e.reuse->last_seen_ns) * 1e-9
                     : 0.0;
    }
  }
  auto it = meta_.find(key);
  if (it == meta_.end()) return e;
  const KeyMeta& k = it->second;
  e.has_last = true;
  e.last = k.last;
  e.last_s_ago = static_cast<double>(e.now_ns - k.last.at_ns) * 1e-9;
  e.ns = k.ns;
  e.tokens = k.tokens;
  e.pin = k.pin;
  if (!placer_) return e;
  if (k.last.by_rule) (void)placer_->rule().Decide(k.last.inputs, &e.last_why);
  // What the rule would say now, with the ancestors the store remembers (parent links of the
  // keys it was placed with, as far as the Placer looks up a chain).
  std::vector<Key> chain = {key};
  for (Key up = k.parent; !(up == Key{}) && chain.size() <= placer_->options().max_ancestors;) {
    chain.push_back(up);
    auto pit = meta_.find(up);
    if (pit == meta_.end()) break;
    up = pit->second.parent;
  }
  std::reverse(chain.begin(), chain.end());
  PlacementQuery q = Query(k.ns, key, k.tokens, k.pin);
  q.chain = chain;
  q.pos = chain.size() - 1;
  const bool in_cxl = e.where == Residence::kCxl;
  const TierState state = State(in_cxl ? 0.0 : 1.0 / static_cast<double>(capacity_), queue_depth_);
  e.has_now = true;
  e.now_reuse = placer_->ExpectedReuse(q, now);
  e.now = placer_->rule().Decide(placer_->Inputs(q, state, now), &e.now_why);
  e.now_occupancy = state.occupancy[static_cast<std::size_t>(slot_)];
  return e;
}

TieredStoreStats TieredStore::Stats() {
  TieredStoreStats s;
  s.tiers = m_->Stats();
  s.nvme = m_->store().Stats();
  s.nvme_file_bytes = s.nvme.slots_in_file * m_->store().slot_bytes();
  s.retention_s = m_->RetentionS();
  const double occupancy =
      std::min(1.0, static_cast<double>(s.tiers.cxl_blocks) / static_cast<double>(capacity_));
  base::MutexLock l(mu_);
  s.placed_cxl = counts_.placed_cxl;
  s.placed_nvme = counts_.placed_nvme;
  s.placed_dropped = counts_.placed_dropped;
  s.already_held = counts_.already_held;
  s.nvme_write_failures = counts_.nvme_write_failures;
  s.prefetch_kept = counts_.prefetch_kept;
  s.cooldown_holds = counts_.cooldown_holds;
  s.promoted = counts_.promoted;
  s.cxl_reads = counts_.cxl_reads;
  s.nvme_reads = counts_.nvme_reads;
  s.uses = counts_.uses;
  s.block_bytes = block_bytes_;
  s.cxl_capacity_blocks = capacity_;
  s.high_watermark_blocks = high_;
  s.low_watermark_blocks = low_;
  if (placer_) {
    s.placer = placer_->stats();
    s.break_even_s = placer_->rule().BreakEvenS(o_.cxl_tier, rule_bytes_, occupancy);
  }
  return s;
}

}  // namespace cxlkv::tier
