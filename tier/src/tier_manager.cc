// TierManager: placement into tiers, demotion, asynchronous promotion, watermarks, cool-down.
#include "cxlkv/tier/tier_manager.h"

#include <time.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cxlkv::tier {
namespace {

constexpr std::size_t kNoOp = static_cast<std::size_t>(-1);
// Weight of each watermark run in RetentionS()'s EWMA.
constexpr double kRetentionAlpha = 0.2;

std::string K(const Key& key) { return coherence::FormatKey(key); }

}  // namespace

const char* ResidenceName(Residence r) noexcept {
  switch (r) {
    case Residence::kCxl: return "in CXL";
    case Residence::kNvme: return "on NVMe";
    case Residence::kDemoting: return "being demoted to NVMe";
    case Residence::kPromoting: return "being promoted to CXL";
  }
  return "?";
}

const char* PromoteVerdictName(PromoteVerdict v) noexcept {
  switch (v) {
    case PromoteVerdict::kAllowed: return "allowed";
    case PromoteVerdict::kNotTracked: return "not tracked";
    case PromoteVerdict::kAlreadyInCxl: return "already in CXL";
    case PromoteVerdict::kInFlight: return "I/O in flight";
    case PromoteVerdict::kCoolingDown: return "cooling down";
  }
  return "?";
}

absl::Status PromotionBatch::first_error() const {
  for (const auto& st : status_) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TierManager>> TierManager::Create(
    std::unique_ptr<allocator::BlockAllocator> cxl, std::unique_ptr<NvmeStore> nvme,
    TierOptions options) {
  allocator::BlockAllocator* a = cxl.get();
  return Make(a, std::move(cxl), std::move(nvme), std::move(options));
}

absl::StatusOr<std::unique_ptr<TierManager>> TierManager::Create(allocator::BlockAllocator& cxl,
                                                                 std::unique_ptr<NvmeStore> nvme,
                                                                 TierOptions options) {
  return Make(&cxl, nullptr, std::move(nvme), std::move(options));
}

absl::StatusOr<std::unique_ptr<TierManager>> TierManager::Make(
    allocator::BlockAllocator* cxl, std::unique_ptr<allocator::BlockAllocator> owned,
    std::unique_ptr<NvmeStore> nvme, TierOptions options) {
  if (cxl == nullptr || nvme == nullptr) {
    return absl::InvalidArgumentError("TierManager: needs both a CXL allocator and an NVMe store");
  }
  const std::uint32_t cls = options.size_class;
  if (cls >= cxl->class_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TierManager: size class ", cls, " is out of range: the arena has ", cxl->class_count()));
  }
  const std::uint64_t bytes = cxl->block_bytes(cls);
  if (bytes > nvme->payload_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TierManager: CXL blocks of class ", cls, " are ", bytes, " bytes but the NVMe store at ",
        nvme->dir(), " holds blocks of at most ", nvme->payload_bytes(),
        "; open the store with payload_bytes=", bytes));
  }
  const std::uint64_t class_blocks = cxl->arena().class_record(cls).block_count;
  if (options.low_watermark_blocks > options.high_watermark_blocks ||
      options.high_watermark_blocks > class_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TierManager: watermarks low ", options.low_watermark_blocks, " / high ",
        options.high_watermark_blocks, " must satisfy low <= high <= ", class_blocks,
        " (the blocks of class ", cls, ")"));
  }
  std::unique_ptr<TierManager> m(new TierManager());
  m->cls_ = cls;
  m->block_bytes_ = bytes;
  m->options_ = std::move(options);
  {
    base::MutexLock l(m->mu_);
    for (const Key& key : nvme->Keys()) {
      Entry e;
      e.where = Residence::kNvme;
      auto [it, inserted] = m->entries_.emplace(key, e);
      m->EnterNvmeLocked(key, it->second);
    }
  }
  m->owned_cxl_ = std::move(owned);
  m->cxl_ = cxl;
  m->nvme_ = std::move(nvme);
  return m;
}

TierManager::~TierManager() {
  // Promotions in flight call back into this object: finish them while it is whole.
  nvme_->Drain();
  base::MutexLock l(mu_);
  for (auto& [key, e] : entries_) {
    if (e.where != Residence::kNvme) cxl_->Free(e.block);
  }
}

std::int64_t TierManager::Now() const {
  if (options_.now_ms) return options_.now_ms();
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// ---- placement ------------------------------------------------------------------------------

void TierManager::EnterNvmeLocked(const Key& key, Entry& e) {
  nvme_lru_.push_front(key);
  e.nvme_lru = nvme_lru_.begin();
}

void TierManager::LeaveNvmeLocked(Entry& e) { nvme_lru_.erase(e.nvme_lru); }

void TierManager::EvictNvmeLocked() {
  const std::uint64_t cap = options_.nvme_capacity_blocks;
  if (cap == 0) return;
  while (nvme_lru_.size() > cap) {
    const Key victim = nvme_lru_.back();
    nvme_lru_.pop_back();
    entries_.erase(victim);
    // Delete does no waiting (see Move): safe under the lock. A read in flight finishes
    // first; the slot is retired after it.
    (void)nvme_->Delete(victim);
    ++stats_.nvme_evicted;
  }
}

void TierManager::ReleaseCxl(const Key& key, allocator::BlockHandle h) {
  if (options_.release_cxl) {
    options_.release_cxl(key, h);
  } else {
    cxl_->Free(h);
  }
}

absl::Status TierManager::Place(const Key& key, allocator::BlockHandle block, Tier target) {
  return Place(std::span<const Key>(&key, 1), std::span<const allocator::BlockHandle>(&block, 1),
               target);
}

absl::Status TierManager::Place(std::span<const Key> keys,
                                std::span<const allocator::BlockHandle> blocks, Tier target,
                                std::vector<absl::Status>* results) {
  std::vector<absl::Status> local;
  std::vector<absl::Status>& res = results != nullptr ? *results : local;
  res.assign(keys.size(), absl::OkStatus());
  if (keys.size() != blocks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Place: ", keys.size(), " keys but ", blocks.size(), " blocks"));
  }
  const std::int64_t now = Now();
  std::vector<Key> placed;  // entered in CXL (for kNvme: to be written)
  std::vector<std::size_t> placed_at;
  std::vector<allocator::BlockHandle> to_free;
  {
    base::MutexLock l(mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const Key& key = keys[i];
      if (!blocks[i].valid()) {
        res[i] = absl::InvalidArgumentError(absl::StrCat("Place(", K(key), "): invalid block handle"));
        continue;
      }
      if (auto it = entries_.find(key); it != entries_.end()) {
        res[i] = absl::AlreadyExistsError(absl::StrCat(
            "Place(", K(key), "): the key is already tracked (", ResidenceName(it->second.where),
            "); Move it, or drop it first"));
        continue;
      }
      if (target == Tier::kDrop) {
        ++stats_.dropped;
        to_free.push_back(blocks[i]);
        continue;
      }
      lru_.push_front(key);
      Entry e;
      e.where = Residence::kCxl;
      e.block = blocks[i];
      e.used_at_ms = now;
      e.lru = lru_.begin();
      entries_.emplace(key, e);
      ++cxl_resident_;
      placed.push_back(key);
      placed_at.push_back(i);
    }
  }
  // A dropped new block was never resident: nobody else can know it.
  for (auto h : to_free) cxl_->Free(h);
  if (IsCxl(target) && !placed.empty()) MaybeEnforce();
  if (target == Tier::kNvme && !placed.empty()) {
    // Written straight to NVMe by the placement rule: no cool-down (it was never in use).
    std::vector<absl::Status> written;
    (void)DemoteKeys(placed, &written, /*cooldown=*/false);
    for (std::size_t j = 0; j < placed.size(); ++j) res[placed_at[j]] = std::move(written[j]);
  }
  for (const auto& st : res) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status TierManager::Move(const Key& key, Tier target) {
  if (IsCxl(target)) {
    if (Where(key) == Residence::kCxl) return absl::OkStatus();
    return Promote(key);
  }
  if (target == Tier::kNvme) {
    if (Where(key) == Residence::kNvme) return absl::OkStatus();
    return Demote(key);
  }
  allocator::BlockHandle to_free;
  {
    base::MutexLock l(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("Move(", K(key), ", drop): not tracked"));
    }
    Entry& e = it->second;
    if (e.where == Residence::kDemoting || e.where == Residence::kPromoting || e.pins != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Move(", K(key), ", drop): the block is ", ResidenceName(e.where), " with ", e.pins,
          " pins; drop it after the I/O completes and every Acquire is released"));
    }
    if (e.where == Residence::kCxl) {
      to_free = e.block;
      lru_.erase(e.lru);
      --cxl_resident_;
    } else {
      // Delete completes without waiting for I/O (the slot is retired in the background), so
      // calling into the store under this lock cannot wait on a callback that needs it.
      absl::Status st = nvme_->Delete(key);
      if (!st.ok() && !absl::IsNotFound(st)) return st;
      LeaveNvmeLocked(e);
    }
    entries_.erase(it);
    ++stats_.dropped;
  }
  if (to_free.valid()) ReleaseCxl(key, to_free);
  return absl::OkStatus();
}

// ---- demotion -------------------------------------------------------------------------------

absl::Status TierManager::Demote(std::span<const Key> keys, std::vector<absl::Status>* results) {
  return DemoteKeys(keys, results, /*cooldown=*/true);
}

absl::Status TierManager::DemoteKeys(std::span<const Key> keys,
                                     std::vector<absl::Status>* results, bool cooldown) {
  std::vector<absl::Status> local;
  std::vector<absl::Status>& res = results != nullptr ? *results : local;
  res.assign(keys.size(), absl::OkStatus());
  std::vector<std::size_t> go;  // indexes into keys, in batch order
  NvmeBatch batch;
  {
    base::MutexLock l(mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = entries_.find(keys[i]);
      if (it == entries_.end()) {
        res[i] = absl::NotFoundError(absl::StrCat("Demote(", K(keys[i]), "): not tracked"));
        continue;
      }
      Entry& e = it->second;
      if (e.where != Residence::kCxl || e.pins != 0) {
        res[i] = absl::FailedPreconditionError(absl::StrCat(
            "Demote(", K(keys[i]), "): the block is ", ResidenceName(e.where), " with ", e.pins,
            " pins; only an unpinned CXL block can be demoted"));
        continue;
      }
      e.where = Residence::kDemoting;
      go.push_back(i);
      batch.AddPut(keys[i], cxl_->Addr(e.block), block_bytes_);
    }
  }
  if (!go.empty()) {
    if (absl::Status st = nvme_->Submit(batch); !st.ok()) {
      base::MutexLock l(mu_);
      for (std::size_t i : go) {
        entries_[keys[i]].where = Residence::kCxl;
        res[i] = st;
      }
      return st;
    }
    nvme_->Wait(batch);
  }
  std::vector<std::pair<Key, allocator::BlockHandle>> to_free;
  {
    base::MutexLock l(mu_);
    const std::int64_t now = Now();
    for (std::size_t j = 0; j < go.size(); ++j) {
      const std::size_t i = go[j];
      Entry& e = entries_[keys[i]];
      if (batch.status(j).ok()) {
        to_free.emplace_back(keys[i], e.block);
        e.block = {};
        e.where = Residence::kNvme;
        e.demoted_at_ms = now;
        e.cooldown = cooldown;
        lru_.erase(e.lru);
        EnterNvmeLocked(keys[i], e);
        --cxl_resident_;
        ++(cooldown ? stats_.demotions : stats_.placed_nvme);
      } else {
        // The NVMe copy was not stored: the CXL block is untouched and stays in use.
        e.where = Residence::kCxl;
        ++stats_.demotion_failures;
        const absl::Status& st = batch.status(j);
        res[i] = absl::Status(st.code(), absl::StrCat("Demote(", K(keys[i]),
                                                      "): the block stays in CXL: ",
                                                      st.message()));
      }
    }
    EvictNvmeLocked();
  }
  for (const auto& [key, h] : to_free) ReleaseCxl(key, h);
  for (const auto& st : res) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// ---- promotion ------------------------------------------------------------------------------

PromoteCheck TierManager::CheckLocked(const Key& key, std::int64_t now) const {
  PromoteCheck c;
  auto it = entries_.find(key);
  if (it == entries_.end()) return c;
  const Entry& e = it->second;
  if (e.where == Residence::kCxl) {
    c.verdict = PromoteVerdict::kAlreadyInCxl;
  } else if (e.where != Residence::kNvme) {
    c.verdict = PromoteVerdict::kInFlight;
  } else if (e.cooldown && now - e.demoted_at_ms < options_.cooldown_ms) {
    c.verdict = PromoteVerdict::kCoolingDown;
    c.demoted_ms_ago = now - e.demoted_at_ms;
    c.retry_after_ms = options_.cooldown_ms - c.demoted_ms_ago;
  } else {
    c.verdict = PromoteVerdict::kAllowed;
    if (e.cooldown) c.demoted_ms_ago = now - e.demoted_at_ms;
  }
  return c;
}

PromoteCheck TierManager::CheckPromote(const Key& key) const {
  base::MutexLock l(mu_);
  return CheckLocked(key, Now());
}

absl::Status TierManager::RefusalStatus(const Key& key, const PromoteCheck& c) const {
  switch (c.verdict) {
    case PromoteVerdict::kNotTracked:
      return absl::NotFoundError(absl::StrCat("Promote(", K(key), "): not tracked"));
    case PromoteVerdict::kCoolingDown:
      return absl::FailedPreconditionError(absl::StrCat(
          "Promote(", K(key), "): refused (anti-thrash): demoted ", c.demoted_ms_ago,
          " ms ago, cool-down is ", options_.cooldown_ms, " ms; retry in ", c.retry_after_ms,
          " ms or lower TierOptions::cooldown_ms"));
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          "Promote(", K(key), "): refused: ", PromoteVerdictName(c.verdict)));
  }
}

absl::Status TierManager::Prefetch(std::span<const Key> keys, PromotionBatch& batch,
                                   absl::AnyInvocable<void(PromotionBatch&)> done) {
  if (!batch.done()) {
    return absl::FailedPreconditionError(
        "TierManager::Prefetch: the batch is still in flight; Wait for it before reusing it");
  }
  batch.keys_.assign(keys.begin(), keys.end());
  batch.status_.assign(keys.size(), absl::OkStatus());
  batch.io_op_.assign(keys.size(), kNoOp);
  batch.blocks_.assign(keys.size(), allocator::BlockHandle{});
  batch.io_.Clear();
  batch.callback_ = std::move(done);
  {
    base::MutexLock l(mu_);
    const std::int64_t now = Now();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const PromoteCheck c = CheckLocked(keys[i], now);
      if (!c.allowed()) {
        if (c.verdict == PromoteVerdict::kCoolingDown) ++stats_.promotions_refused;
        batch.status_[i] = RefusalStatus(keys[i], c);
        continue;
      }
      const allocator::BlockHandle h = cxl_->Alloc(cls_);
      if (!h.valid()) {
        ++stats_.promotion_failures;
        batch.status_[i] = absl::ResourceExhaustedError(absl::StrCat(
            "Promote(", K(keys[i]), "): no free CXL block of class ", cls_, " (",
            cxl_->ExplainAllocFailure(cls_).message(),
            "); demote blocks (EnforceWatermarks) or give the arena more memory"));
        continue;
      }
      Entry& e = entries_[keys[i]];
      LeaveNvmeLocked(e);
      e.where = Residence::kPromoting;
      e.block = h;
      ++cxl_resident_;
      batch.blocks_[i] = h;
      batch.io_op_[i] = batch.io_.size();
      batch.io_.AddGet(keys[i], cxl_->Addr(h), block_bytes_);
    }
  }
  if (batch.io_.size() == 0) {
    if (batch.callback_) {
      auto cb = std::move(batch.callback_);
      batch.callback_ = nullptr;
      cb(batch);
    }
    return absl::OkStatus();
  }
  return nvme_->Submit(batch.io_, [this, &batch](NvmeBatch&) { FinishPromotion(batch); });
}

void TierManager::FinishPromotion(PromotionBatch& batch) {
  std::vector<allocator::BlockHandle> to_free;
  const std::int64_t now = Now();
  {
    base::MutexLock l(mu_);
    for (std::size_t i = 0; i < batch.keys_.size(); ++i) {
      if (batch.io_op_[i] == kNoOp) continue;
      const Key& key = batch.keys_[i];
      const absl::Status& st = batch.io_.status(batch.io_op_[i]);
      Entry& e = entries_[key];
      if (st.ok()) {
        e.where = Residence::kCxl;
        e.cooldown = false;
        e.used_at_ms = now;
        lru_.push_front(key);
        e.lru = lru_.begin();
        ++stats_.promotions;
        // The tiers are exclusive: the NVMe copy goes. Delete does no waiting (see Move).
        (void)nvme_->Delete(key);
        continue;
      }
      to_free.push_back(e.block);
      e.block = {};
      --cxl_resident_;
      ++stats_.promotion_failures;
      if (absl::IsDataLoss(st)) {
        entries_.erase(key);  // the store dropped it: nothing left to promote
        ++stats_.dropped;
      } else {
        e.where = Residence::kNvme;
        EnterNvmeLocked(key, e);
      }
      batch.status_[i] = st;
    }
  }
  for (auto h : to_free) cxl_->Free(h);
  if (batch.callback_) {
    auto cb = std::move(batch.callback_);
    batch.callback_ = nullptr;
    cb(batch);
  }
}

void TierManager::Wait(PromotionBatch& batch) { nvme_->Wait(batch.io_); }

absl::Status TierManager::Read(std::span<const Key> keys, std::span<void* const> dests,
                               std::uint64_t dest_bytes, std::vector<absl::Status>* results) {
  std::vector<absl::Status> local;
  std::vector<absl::Status>& res = results != nullptr ? *results : local;
  res.assign(keys.size(), absl::OkStatus());
  if (keys.size() != dests.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Read: ", keys.size(), " keys but ", dests.size(), " destinations"));
  }
  NvmeBatch batch;
  std::vector<std::size_t> go;
  {
    base::MutexLock l(mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = entries_.find(keys[i]);
      if (it == entries_.end()) {
        res[i] = absl::NotFoundError(absl::StrCat("Read(", K(keys[i]), "): not tracked"));
        continue;
      }
      Entry& e = it->second;
      if (e.where != Residence::kNvme) {
        res[i] = absl::FailedPreconditionError(absl::StrCat(
            "Read(", K(keys[i]), "): the block is ", ResidenceName(e.where),
            e.where == Residence::kCxl ? "; Acquire it there" : "; retry when done"));
        continue;
      }
      nvme_lru_.splice(nvme_lru_.begin(), nvme_lru_, e.nvme_lru);
      go.push_back(i);
      batch.AddGet(keys[i], dests[i], dest_bytes);
    }
  }
  if (go.empty()) return res.empty() ? absl::OkStatus() : res[0];
  // The store pins each slot it reads: a concurrent drop or eviction retires it afterwards.
  if (absl::Status st = nvme_->Submit(batch); !st.ok()) return st;
  nvme_->Wait(batch);
  {
    base::MutexLock l(mu_);
    for (std::size_t j = 0; j < go.size(); ++j) {
      const std::size_t i = go[j];
      const absl::Status& st = batch.status(j);
      if (st.ok()) {
        ++stats_.nvme_reads;
        continue;
      }
      res[i] = st;
      if (absl::IsDataLoss(st)) {  // the store dropped it
        auto it = entries_.find(keys[i]);
        if (it != entries_.end() && it->second.where == Residence::kNvme) {
          LeaveNvmeLocked(it->second);
          entries_.erase(it);
          ++stats_.dropped;
        }
      }
    }
  }
  for (const auto& st : res) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status TierManager::Promote(const Key& key) {
  PromotionBatch b;
  if (absl::Status st = Prefetch(std::span<const Key>(&key, 1), b); !st.ok()) return st;
  Wait(b);
  if (b.status(0).ok()) MaybeEnforce();
  return b.status(0);
}

// ---- use and watermarks ---------------------------------------------------------------------

absl::StatusOr<std::byte*> TierManager::Acquire(const Key& key) {
  base::MutexLock l(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("Acquire(", K(key), "): not tracked"));
  }
  Entry& e = it->second;
  if (e.where != Residence::kCxl) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Acquire(", K(key), "): the block is ", ResidenceName(e.where),
        e.where == Residence::kNvme ? "; Prefetch or Promote it first" : "; retry when done"));
  }
  ++e.pins;
  e.used_at_ms = Now();
  lru_.splice(lru_.begin(), lru_, e.lru);
  return cxl_->Addr(e.block);
}

void TierManager::Release(const Key& key) {
  base::MutexLock l(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.pins != 0) --it->second.pins;
}

std::size_t TierManager::Touch(std::span<const Key> keys) {
  const std::int64_t now = Now();
  base::MutexLock l(mu_);
  std::size_t n = 0;
  for (auto k = keys.rbegin(); k != keys.rend(); ++k) {  // the last spliced ends up first
    auto it = entries_.find(*k);
    if (it == entries_.end()) continue;
    Entry& e = it->second;
    if (e.where == Residence::kCxl) {
      e.used_at_ms = now;
      lru_.splice(lru_.begin(), lru_, e.lru);
    } else if (e.where == Residence::kNvme) {
      nvme_lru_.splice(nvme_lru_.begin(), nvme_lru_, e.nvme_lru);
    } else {
      continue;
    }
    ++n;
  }
  return n;
}

absl::StatusOr<std::size_t> TierManager::EnforceWatermarks() {
  if (options_.high_watermark_blocks == 0) return 0;
  std::vector<Key> victims;
  const std::int64_t now = Now();
  {
    base::MutexLock l(mu_);
    if (cxl_resident_ <= options_.high_watermark_blocks) return 0;
    ++stats_.watermark_runs;
    const std::uint64_t need = cxl_resident_ - options_.low_watermark_blocks;
    std::int64_t youngest_idle_ms = -1;
    for (auto it = lru_.rbegin(); it != lru_.rend() && victims.size() < need; ++it) {
      const Entry& e = entries_[*it];
      if (e.where == Residence::kCxl && e.pins == 0) {
        victims.push_back(*it);
        youngest_idle_ms = now - e.used_at_ms;  // the list runs from oldest use to newest
      }
    }
    if (youngest_idle_ms >= 0) {
      const double idle = static_cast<double>(youngest_idle_ms);
      retention_ewma_ms_ = retention_ewma_ms_ < 0
                               ? idle
                               : retention_ewma_ms_ + kRetentionAlpha * (idle - retention_ewma_ms_);
      last_eviction_ms_ = now;
    }
  }
  std::size_t gone = 0;
  if (options_.victim_tier) {
    std::vector<Key> demote;
    for (const Key& key : victims) {
      if (options_.victim_tier(key) != Tier::kDrop) {
        demote.push_back(key);
      } else if (Move(key, Tier::kDrop).ok()) {  // pinned since: it stays
        ++gone;
        base::MutexLock l(mu_);
        ++stats_.victims_dropped;
      }
    }
    victims.swap(demote);
  }
  std::vector<absl::Status> results;
  absl::Status first = DemoteKeys(victims, &results, /*cooldown=*/true);
  for (const auto& st : results) gone += st.ok() ? 1 : 0;
  if (gone == 0 && !first.ok()) return first;
  return gone;
}

void TierManager::MaybeEnforce() {
  if (options_.auto_enforce) (void)EnforceWatermarks();
}

double TierManager::RetentionS() const {
  const std::int64_t now = Now();
  base::MutexLock l(mu_);
  if (retention_ewma_ms_ < 0) return std::numeric_limits<double>::infinity();
  return std::max(retention_ewma_ms_, static_cast<double>(now - last_eviction_ms_)) * 1e-3;
}

std::optional<Residence> TierManager::Where(const Key& key) const {
  base::MutexLock l(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.where;
}

std::optional<allocator::BlockHandle> TierManager::CxlBlock(const Key& key) const {
  base::MutexLock l(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.where != Residence::kCxl) return std::nullopt;
  return it->second.block;
}

TierStats TierManager::Stats() const {
  base::MutexLock l(mu_);
  TierStats s = stats_;
  s.cxl_blocks = cxl_resident_;
  // The LRU list holds the blocks in CXL and being demoted; the rest are on NVMe (some of
  // them being read back into CXL).
  s.nvme_blocks = entries_.size() - lru_.size();
  return s;
}

}  // namespace cxlkv::tier
