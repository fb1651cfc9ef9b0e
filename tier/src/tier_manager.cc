// TierManager: placement into tiers, demotion, asynchronous promotion, watermarks, cool-down.
#include "cxlkv/tier/tier_manager.h"

#include <time.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace cxlkv::tier {
namespace {

constexpr std::size_t kNoOp = static_cast<std::size_t>(-1);

std::string K(const Key& key) { return pool::NvmeKeyToString(key); }

}  // namespace

const char* TierName(Tier t) noexcept {
  switch (t) {
    case Tier::kCxl: return "cxl";
    case Tier::kNvme: return "nvme";
    case Tier::kDrop: return "drop";
  }
  return "?";
}

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
    std::unique_ptr<allocator::BlockAllocator> cxl, std::unique_ptr<pool::NvmeStore> nvme,
    TierOptions options) {
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
    absl::MutexLock l(&m->mu_);
    for (const Key& key : nvme->Keys()) {
      Entry e;
      e.where = Residence::kNvme;
      m->entries_.emplace(key, e);
    }
  }
  m->cxl_ = std::move(cxl);
  m->nvme_ = std::move(nvme);
  return m;
}

TierManager::~TierManager() {
  // Promotions in flight call back into this object: finish them while it is whole.
  nvme_->Drain();
  absl::MutexLock l(&mu_);
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

absl::Status TierManager::Place(const Key& key, allocator::BlockHandle block, Tier target) {
  if (!block.valid()) {
    return absl::InvalidArgumentError(absl::StrCat("Place(", K(key), "): invalid block handle"));
  }
  {
    absl::MutexLock l(&mu_);
    if (entries_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "Place(", K(key), "): the key is already tracked (", ResidenceName(entries_[key].where),
          "); Move it, or drop it first"));
    }
    if (target == Tier::kDrop) {
      ++stats_.dropped;
    } else {
      lru_.push_front(key);
      Entry e;
      e.where = Residence::kCxl;
      e.block = block;
      e.lru = lru_.begin();
      entries_.emplace(key, e);
      ++cxl_resident_;
    }
  }
  switch (target) {
    case Tier::kDrop:
      cxl_->Free(block);
      return absl::OkStatus();
    case Tier::kCxl:
      MaybeEnforce();
      return absl::OkStatus();
    case Tier::kNvme: {
      // Written straight to NVMe by the placement rule: no cool-down (it was never in use).
      return DemoteKeys(std::span<const Key>(&key, 1), nullptr, /*cooldown=*/false);
    }
  }
  return absl::OkStatus();
}

absl::Status TierManager::Move(const Key& key, Tier target) {
  if (target == Tier::kCxl) {
    if (Where(key) == Residence::kCxl) return absl::OkStatus();
    return Promote(key);
  }
  if (target == Tier::kNvme) {
    if (Where(key) == Residence::kNvme) return absl::OkStatus();
    return Demote(key);
  }
  allocator::BlockHandle to_free;
  {
    absl::MutexLock l(&mu_);
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
    }
    entries_.erase(it);
    ++stats_.dropped;
  }
  if (to_free.valid()) cxl_->Free(to_free);
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
  pool::NvmeBatch batch;
  {
    absl::MutexLock l(&mu_);
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
      absl::MutexLock l(&mu_);
      for (std::size_t i : go) {
        entries_[keys[i]].where = Residence::kCxl;
        res[i] = st;
      }
      return st;
    }
    nvme_->Wait(batch);
  }
  std::vector<allocator::BlockHandle> to_free;
  {
    absl::MutexLock l(&mu_);
    const std::int64_t now = Now();
    for (std::size_t j = 0; j < go.size(); ++j) {
      const std::size_t i = go[j];
      Entry& e = entries_[keys[i]];
      if (batch.status(j).ok()) {
        to_free.push_back(e.block);
        e.block = {};
        e.where = Residence::kNvme;
        e.demoted_at_ms = now;
        e.cooldown = cooldown;
        lru_.erase(e.lru);
        --cxl_resident_;
        ++stats_.demotions;
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
  }
  for (auto h : to_free) cxl_->Free(h);
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
  absl::MutexLock l(&mu_);
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
    absl::MutexLock l(&mu_);
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
  return nvme_->Submit(batch.io_, [this, &batch](pool::NvmeBatch&) { FinishPromotion(batch); });
}

void TierManager::FinishPromotion(PromotionBatch& batch) {
  std::vector<allocator::BlockHandle> to_free;
  {
    absl::MutexLock l(&mu_);
    for (std::size_t i = 0; i < batch.keys_.size(); ++i) {
      if (batch.io_op_[i] == kNoOp) continue;
      const Key& key = batch.keys_[i];
      const absl::Status& st = batch.io_.status(batch.io_op_[i]);
      Entry& e = entries_[key];
      if (st.ok()) {
        e.where = Residence::kCxl;
        e.cooldown = false;
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

absl::Status TierManager::Promote(const Key& key) {
  PromotionBatch b;
  if (absl::Status st = Prefetch(std::span<const Key>(&key, 1), b); !st.ok()) return st;
  Wait(b);
  if (b.status(0).ok()) MaybeEnforce();
  return b.status(0);
}

// ---- use and watermarks ---------------------------------------------------------------------

absl::StatusOr<std::byte*> TierManager::Acquire(const Key& key) {
  absl::MutexLock l(&mu_);
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
  lru_.splice(lru_.begin(), lru_, e.lru);
  return cxl_->Addr(e.block);
}

void TierManager::Release(const Key& key) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.pins != 0) --it->second.pins;
}

absl::StatusOr<std::size_t> TierManager::EnforceWatermarks() {
  if (options_.high_watermark_blocks == 0) return 0;
  std::vector<Key> victims;
  {
    absl::MutexLock l(&mu_);
    if (cxl_resident_ <= options_.high_watermark_blocks) return 0;
    ++stats_.watermark_runs;
    const std::uint64_t need = cxl_resident_ - options_.low_watermark_blocks;
    for (auto it = lru_.rbegin(); it != lru_.rend() && victims.size() < need; ++it) {
      const Entry& e = entries_[*it];
      if (e.where == Residence::kCxl && e.pins == 0) victims.push_back(*it);
    }
  }
  std::vector<absl::Status> results;
  absl::Status first = DemoteKeys(victims, &results, /*cooldown=*/true);
  std::size_t demoted = 0;
  for (const auto& st : results) demoted += st.ok() ? 1 : 0;
  if (demoted == 0 && !first.ok()) return first;
  return demoted;
}

void TierManager::MaybeEnforce() {
  if (options_.auto_enforce) (void)EnforceWatermarks();
}

std::optional<Residence> TierManager::Where(const Key& key) const {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.where;
}

TierStats TierManager::Stats() const {
  absl::MutexLock l(&mu_);
  TierStats s = stats_;
  s.cxl_blocks = cxl_resident_;
  // The LRU list holds the blocks in CXL and being demoted; the rest are on NVMe (some of
  // them being read back into CXL).
  s.nvme_blocks = entries_.size() - lru_.size();
  return s;
}

}  // namespace cxlkv::tier
