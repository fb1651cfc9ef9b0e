// Arena format, open, owner attach/detach, batch claim/release and recovery.
#include "cxlkv/pool/arena.h"

#include <pthread.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/coherence/cache.h"
#include "owner.h"

namespace cxlkv::pool {
namespace {

constexpr std::uint64_t RoundUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint64_t HintWords(std::uint64_t blocks) { return (blocks + 63) / 64; }

std::uint64_t NowUnixNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// Bumped in every forked child, so EnsureAttached() can tell "still the process that
// attached" without a getpid() system call on each batch.
std::atomic<std::uint64_t> fork_epoch{0};
void OnForkChild() { fork_epoch.fetch_add(1, std::memory_order_relaxed); }
std::uint64_t ForkEpoch() {
  static const bool registered = [] {
    return ::pthread_atfork(nullptr, nullptr, &OnForkChild) == 0;
  }();
  (void)registered;
  return fork_epoch.load(std::memory_order_relaxed);
}

std::atomic<std::uint64_t>* Hints(std::byte* base, const ClassRecord& k) {
  return reinterpret_cast<std::atomic<std::uint64_t>*>(base + k.hint_offset);
}

// Lays out header, owner table, map, hints and class data for `counts`.
void PlaceGeometry(ArenaHeader& h, const std::vector<std::uint32_t>& counts) {
  h.owner_table_offset = kHeaderReservedBytes;
  h.map_offset =
      RoundUp(h.owner_table_offset + std::uint64_t{h.owner_slots} * sizeof(OwnerSlot), 64);
  std::uint64_t total = 0;
  for (auto c : counts) total += c;
  h.total_blocks = static_cast<std::uint32_t>(total);
  std::uint64_t at = RoundUp(h.map_offset + total * 8, 64);
  std::uint32_t first = 0;
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    h.classes[c].block_count = counts[c];
    h.classes[c].first_index = first;
    h.classes[c].hint_offset = at;
    first += counts[c];
    at = RoundUp(at + HintWords(counts[c]) * 8, 64);
  }
  h.metadata_bytes = at;
  at = RoundUp(at, h.data_align_bytes);
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    h.classes[c].data_offset = at;
    at += std::uint64_t{counts[c]} * h.classes[c].stride_bytes;
  }
  h.data_end_offset = at;
}

absl::StatusOr<ArenaHeader> PlanHeader(const Region& region, const FormatOptions& o) {
  if (auto st = o.layout.Validate(); !st.ok()) return st;
  if (o.owner_slots == 0 || o.owner_slots > kMaxOwnerSlots) {
    return absl::InvalidArgumentError(absl::StrCat(region.name(), ": owner_slots ", o.owner_slots,
                                                   " must be in 1..", kMaxOwnerSlots));
  }
  std::vector<ClassSpec> specs = o.classes;
  if (specs.empty()) specs.push_back(ClassSpec{o.layout.tokens_per_block, 0, 1});
  if (specs.size() > kMaxClasses) {
    return absl::InvalidArgumentError(absl::StrCat(region.name(), ": at most ", kMaxClasses,
                                                   " size classes, got ", specs.size()));
  }
  ArenaHeader h{};
  h.region_bytes = region.size_bytes();
  h.data_align_bytes = kBlockAlignBytes;
  h.owner_slots = o.owner_slots;
  h.class_count = static_cast<std::uint32_t>(specs.size());
  h.layout = o.layout.ToRecord();
  h.created_unix_ns = NowUnixNs();
  std::uint64_t weight_sum = 0;
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    const ClassSpec& s = specs[c];
    std::uint64_t bytes = s.block_bytes;
    if (s.tokens_per_block != 0) bytes = o.layout.BytesPerToken() * s.tokens_per_block;
    if (bytes == 0 || bytes % 64 != 0 || bytes > (4ull << 30) || s.weight == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(region.name(), ": size class ", c, " (", bytes, " bytes, weight ", s.weight,
                       ") needs a block size that is a non-zero multiple of 64 "
                       "bytes up to 4 GiB and a weight > 0"));
    }
    h.classes[c].block_bytes = bytes;
    h.classes[c].stride_bytes = RoundUp(bytes, kBlockAlignBytes);
    h.classes[c].tokens_per_block = s.tokens_per_block;
    weight_sum += s.weight;
  }
  // Metadata depends on the block counts and the counts on the space metadata leaves;
  // the counts only shrink, so a few rounds reach the fixed point.
  std::vector<std::uint32_t> counts(h.class_count, 0);
  for (int round = 0; round < 8; ++round) {
    PlaceGeometry(h, counts);
    const std::uint64_t data_start = RoundUp(h.metadata_bytes, h.data_align_bytes);
    if (data_start >= h.region_bytes) break;
    const std::uint64_t avail = h.region_bytes - data_start;
    std::vector<std::uint32_t> next(h.class_count);
    for (std::uint32_t c = 0; c < h.class_count; ++c) {
      const std::uint64_t share = static_cast<std::uint64_t>(static_cast<long double>(avail) *
                                                             specs[c].weight / weight_sum);
      next[c] = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(share / h.classes[c].stride_bytes, kMaxBlocks / kMaxClasses));
    }
    if (round > 0 && next == counts) break;
    counts = next;
  }
  PlaceGeometry(h, counts);
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    if (counts[c] == 0 || h.data_end_offset > h.region_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(region.name(), ": region of ", base::FormatBytes(h.region_bytes),
                       " is too small for size class ", c, " (blocks of ",
                       base::FormatBytes(h.classes[c].block_bytes),
                       "); use a larger size= or fewer/smaller classes"));
    }
  }
  std::uint8_t uuid[16];
  if (::getrandom(uuid, sizeof(uuid), 0) != sizeof(uuid)) {
    return base::ErrnoStatus(errno, region.name(), "getrandom");
  }
  uuid[6] = static_cast<std::uint8_t>((uuid[6] & 0x0F) | 0x40);  // RFC 4122 version 4
  uuid[8] = static_cast<std::uint8_t>((uuid[8] & 0x3F) | 0x80);
  std::memcpy(h.uuid, uuid, sizeof(uuid));
  coherence::Seal(h, kArenaMagic, kArenaVersion, 1);
  return h;
}

// Whether the region may be formatted: blank, interrupted format, or forced.
absl::Status CheckOverwrite(const Region& region, bool force, bool exclusive) {
  std::uint64_t raw_magic = 0;
  if (region.size_bytes() >= sizeof(raw_magic))
    std::memcpy(&raw_magic, region.addr(), sizeof(raw_magic));
  if (raw_magic == kFormattingMagic) return absl::OkStatus();  // interrupted format
  ArenaHeader existing{};
  absl::Status st =
      ValidateHeaderBytes(region.addr(), region.size_bytes(), region.name(), &existing);
  if (absl::IsNotFound(st)) return absl::OkStatus();
  if (st.ok()) {
    if (!force) {
      return absl::AlreadyExistsError(
          absl::StrCat(region.name(), ": already holds arena ",
                       UuidToString(*reinterpret_cast<const Uuid*>(existing.uuid)), " (layout ",
                       KvLayout::FromRecord(existing.layout).ToString(),
                       "); open it instead, or format with --force to discard its blocks"));
    }
    if (exclusive) return absl::OkStatus();
    const auto* slots =
        reinterpret_cast<const OwnerSlot*>(region.addr() + existing.owner_table_offset);
    const internal::Identity self = internal::SelfIdentity();
    for (std::uint32_t s = 0; s < existing.owner_slots; ++s) {
      const std::uint64_t w = slots[s].state.load(std::memory_order_acquire);
      if (SlotWordState(w) == kSlotFree || internal::OwnerIsDead(slots[s], w, self)) continue;
      return absl::FailedPreconditionError(
          absl::StrCat(region.name(), ": arena is in use by pid ", SlotWordPid(w), " (owner slot ",
                       s, "); stop that process before reformatting, even with --force"));
    }
    return absl::OkStatus();
  }
  if (force) return absl::OkStatus();
  return absl::Status(st.code(),
                      absl::StrCat(st.message(), "; refusing to format over it without --force"));
}

}  // namespace

std::string UuidToString(const Uuid& u) {
  return absl::StrFormat("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                         u[12], u[13], u[14], u[15]);
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Format(std::unique_ptr<Region> region,
                                                     const FormatOptions& options) {
  if (auto st = CheckOverwrite(*region, options.force, options.exclusive); !st.ok()) return st;
  auto planned = PlanHeader(*region, options);
  if (!planned.ok()) return planned.status();
  const ArenaHeader& h = *planned;
  std::byte* base = region->addr();

  // 1. Mark the region as being formatted: a crash from here on leaves kFormattingMagic,
  //    which Open refuses and Format accepts without --force.
  auto* magic = reinterpret_cast<std::atomic<std::uint64_t>*>(base);
  magic->store(kFormattingMagic, std::memory_order_release);
  coherence::Flush(base, sizeof(std::uint64_t));
  coherence::Fence();

  // 2. Owner table, map (every block free, generation 0, its class) and hints.
  std::memset(base + h.owner_table_offset, 0, std::uint64_t{h.owner_slots} * sizeof(OwnerSlot));
  auto* words = reinterpret_cast<std::uint64_t*>(base + h.map_offset);
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    const ClassRecord& k = h.classes[c];
    const std::uint64_t free_word = PackWord(kFree, 0, 0, c);
    std::fill_n(words + k.first_index, k.block_count, free_word);
    auto* hints = reinterpret_cast<std::uint64_t*>(base + k.hint_offset);
    const std::uint64_t n = HintWords(k.block_count);
    std::fill_n(hints, n, ~0ull);
    if (k.block_count % 64 != 0) hints[n - 1] = (1ull << (k.block_count % 64)) - 1;
  }
  coherence::Flush(base + h.owner_table_offset, h.metadata_bytes - h.owner_table_offset);
  coherence::Fence();

  // 3. The sealed header, magic last: until the 8-byte magic store lands, readers still see
  //    kFormattingMagic; after it, a header whose checksum covers the final magic.
  std::memcpy(base + sizeof(std::uint64_t),
              reinterpret_cast<const std::byte*>(&h) + sizeof(std::uint64_t),
              sizeof(ArenaHeader) - sizeof(std::uint64_t));
  std::memset(base + sizeof(ArenaHeader), 0, kHeaderReservedBytes - sizeof(ArenaHeader));
  coherence::Flush(base, kHeaderReservedBytes);
  coherence::Fence();
  magic->store(kArenaMagic, std::memory_order_release);
  coherence::Flush(base, sizeof(std::uint64_t));
  coherence::Fence();
  return Open(std::move(region), OpenOptions{});
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Open(std::unique_ptr<Region> region,
                                                   const OpenOptions& options) {
  std::unique_ptr<Arena> a(new Arena());
  if (auto st =
          ValidateHeaderBytes(region->addr(), region->size_bytes(), region->name(), &a->header_);
      !st.ok()) {
    return st;
  }
  if (options.expect_layout && !(*options.expect_layout == a->layout())) {
    return absl::FailedPreconditionError(
        absl::StrCat(region->name(), ": arena was formatted for KV layout ", a->layout().ToString(),
                     " but ", options.expect_layout->ToString(),
                     " was asked for; open it with its layout or format another region"));
  }
  if (auto st = ValidateMap(a->header_, region->addr(), region->name()); !st.ok()) return st;
  std::memcpy(a->uuid_.data(), a->header_.uuid, a->uuid_.size());
  a->words_ = reinterpret_cast<BlockWord*>(region->addr() + a->header_.map_offset);
  a->slots_ = reinterpret_cast<OwnerSlot*>(region->addr() + a->header_.owner_table_offset);
  for (std::uint32_t c = 0; c < a->header_.class_count; ++c) {
    const ClassRecord& k = a->header_.classes[c];
    a->block_bias_[c] = reinterpret_cast<std::uintptr_t>(region->addr()) + k.data_offset -
                        std::uint64_t{k.first_index} * k.stride_bytes;
  }
  a->region_ = std::move(region);
  a->read_only_ = options.read_only;
  a->cache_ops_ = options.cache_ops;
  if (a->read_only_) return a;
  a->Recover();
  {
    base::MutexLock lock(a->attach_mu_);
    if (auto st = a->Attach(); !st.ok()) return st;
  }
  return a;
}

Arena::~Arena() {
  base::MutexLock lock(attach_mu_);
  Detach();
}

absl::Status Arena::Attach() {
  const internal::Identity self = internal::SelfIdentity();
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (std::uint32_t s = 0; s < header_.owner_slots; ++s) {
      OwnerSlot& slot = slots_[s];
      std::uint64_t w = slot.state.load(std::memory_order_acquire);
      if (SlotWordState(w) != kSlotFree) continue;
      const std::uint32_t epoch = SlotWordEpoch(w) + 1;
      // Claim: other attachers skip the slot from here; a crash here leaves kSlotClaiming
      // with our pid, which Recover() frees once the pid is gone.
      if (!slot.state.compare_exchange_strong(w, SlotWord(kSlotClaiming, self.pid, epoch),
                                              std::memory_order_acq_rel)) {
        continue;
      }
      internal::StampSlot(slot, self);
      // Identity fields happen-before the active state (release).
      slot.state.store(SlotWord(kSlotActive, self.pid, epoch), std::memory_order_release);
      owner_id_.store(s + 1, std::memory_order_relaxed);
      attached_pid_ = self.pid;
      attached_fork_epoch_.store(ForkEpoch(), std::memory_order_relaxed);
      return absl::OkStatus();
    }
    Recover();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      region_->name(), ": all ", header_.owner_slots,
      " owner slots are held by live processes; close some, or reformat with more owner slots"));
}

void Arena::Detach() {
  const std::uint32_t owner = owner_id_.load(std::memory_order_relaxed);
  if (owner == 0 || attached_pid_ != static_cast<std::uint32_t>(::getpid())) return;
  OwnerSlot& slot = slots_[owner - 1];
  std::uint64_t w = slot.state.load(std::memory_order_acquire);
  if (SlotWordState(w) != kSlotActive ||
      !slot.state.compare_exchange_strong(
          w, SlotWord(kSlotReclaiming, attached_pid_, SlotWordEpoch(w)),
          std::memory_order_acq_rel)) {
    return;
  }
  ReclaimOwners({owner - 1});
  owner_id_.store(0, std::memory_order_relaxed);
}

absl::Status Arena::EnsureAttached() {
  if (read_only_) {
    return absl::FailedPreconditionError(
        absl::StrCat(region_->name(), ": arena was opened read-only; it cannot allocate"));
  }
  base::MutexLock lock(attach_mu_);
  if (attached_fork_epoch_.load(std::memory_order_relaxed) == ForkEpoch() &&
      owner_id_.load(std::memory_order_relaxed) != 0) {
    return absl::OkStatus();
  }
  owner_id_.store(0, std::memory_order_relaxed);  // forked child: the parent's slot is not ours
  return Attach();
}

std::uint32_t Arena::ReclaimOwners(const std::vector<std::uint32_t>& slots) {
  std::uint32_t reclaimed = 0;
  std::uint64_t owner_mask[kMaxOwnerSlots / 64 + 1] = {};
  for (auto s : slots) owner_mask[(s + 1) / 64] |= 1ull << ((s + 1) % 64);
  for (std::uint32_t c = 0; c < header_.class_count; ++c) {
    const ClassRecord& k = header_.classes[c];
    auto* hints = Hints(region_->addr(), k);
    for (std::uint32_t i = 0; i < k.block_count; ++i) {
      BlockWord& word = words_[k.first_index + i];
      std::uint64_t w = word.load(std::memory_order_acquire);
      for (;;) {
        const std::uint32_t owner = WordOwner(w);
        if (owner == 0 || !((owner_mask[owner / 64] >> (owner % 64)) & 1)) break;
        // Allocated blocks get a new generation so refs taken from them stop resolving.
        const std::uint32_t gen = WordGen(w) + (WordState(w) == kAllocated ? 1 : 0);
        if (word.compare_exchange_weak(w, PackWord(kFree, 0, gen, c), std::memory_order_acq_rel)) {
          hints[i / 64].fetch_or(1ull << (i % 64), std::memory_order_release);
          ++reclaimed;
          break;
        }
      }
    }
  }
  // Only now may the slot be reused: no word names it any more.
  for (auto s : slots) {
    std::uint64_t w = slots_[s].state.load(std::memory_order_acquire);
    slots_[s].state.store(SlotWord(kSlotFree, 0, SlotWordEpoch(w)), std::memory_order_release);
  }
  return reclaimed;
}

RecoveryReport Arena::MaybeRecover() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const std::int64_t now = ts.tv_sec * 1000000000ll + ts.tv_nsec;
  std::int64_t last = last_recover_ns_.load(std::memory_order_relaxed);
  if (now - last < 1000000 ||
      !last_recover_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    return RecoveryReport{};
  }
  return Recover();
}

RecoveryReport Arena::Recover() {
  RecoveryReport report;
  const internal::Identity self = internal::SelfIdentity();
  std::vector<std::uint32_t> dead;
  for (std::uint32_t s = 0; s < header_.owner_slots; ++s) {
    std::uint64_t w = slots_[s].state.load(std::memory_order_acquire);
    if (SlotWordState(w) == kSlotFree || SlotWordPid(w) == self.pid) continue;
    if (!internal::OwnerIsDead(slots_[s], w, self)) continue;
    // Take the reclaim over; a reclaimer that dies mid-way is itself judged dead later.
    if (slots_[s].state.compare_exchange_strong(
            w, SlotWord(kSlotReclaiming, self.pid, SlotWordEpoch(w)), std::memory_order_acq_rel)) {
      dead.push_back(s);
    }
  }
  if (!dead.empty()) {
    report.owners_reclaimed = static_cast<std::uint32_t>(dead.size());
    report.blocks_reclaimed = ReclaimOwners(dead);
  }
  // Repair hints lost between a claimer's fetch_and and its CAS. Setting a bit for a free
  // word is always safe: claimers confirm with a CAS on the word.
  for (std::uint32_t c = 0; c < header_.class_count; ++c) {
    const ClassRecord& k = header_.classes[c];
    auto* hints = Hints(region_->addr(), k);
    for (std::uint32_t i = 0; i < k.block_count; ++i) {
      if (WordState(words_[k.first_index + i].load(std::memory_order_relaxed)) != kFree) continue;
      const std::uint64_t bit = 1ull << (i % 64);
      if (!(hints[i / 64].load(std::memory_order_relaxed) & bit)) {
        hints[i / 64].fetch_or(bit, std::memory_order_release);
        ++report.hints_repaired;
      }
    }
  }
  return report;
}

std::size_t Arena::ClaimBatch(std::uint32_t cls, std::uint32_t* out, std::size_t n) noexcept {
  if (cls >= header_.class_count || n == 0) return 0;
  // Unlocked fast check; the slow path (first call after fork) takes the mutex.
  if ((attached_fork_epoch_.load(std::memory_order_relaxed) != ForkEpoch() ||
       owner_id_.load(std::memory_order_relaxed) == 0) &&
      !EnsureAttached().ok()) {
    return 0;
  }
  const std::uint32_t owner = owner_id_.load(std::memory_order_relaxed);
  const ClassRecord& k = header_.classes[cls];
  auto* hints = Hints(region_->addr(), k);
  const std::uint64_t nwords = HintWords(k.block_count);
  const std::uint64_t start = cursor_[cls].load(std::memory_order_relaxed) % nwords;
  std::size_t got = 0;
  for (std::uint64_t step = 0; step < nwords && got < n; ++step) {
    const std::uint64_t hw = (start + step) % nwords;
    std::uint64_t bits = hints[hw].load(std::memory_order_relaxed);
    while (bits != 0 && got < n) {
      std::uint64_t take = bits;
      for (auto extra = std::popcount(take) - static_cast<int>(n - got); extra > 0 && take != 0;
           --extra) {
        take &= ~(1ull << (63 - std::countl_zero(take)));  // keep the lowest n - got bits
      }
      const std::uint64_t taken = hints[hw].fetch_and(~take, std::memory_order_acq_rel) & take;
      for (std::uint64_t t = taken; t != 0; t &= t - 1) {
        const auto bit = static_cast<std::uint32_t>(std::countr_zero(t));
        const std::uint32_t index = k.first_index + static_cast<std::uint32_t>(hw * 64) + bit;
        std::uint64_t w = words_[index].load(std::memory_order_acquire);
        // A crash between the fetch_and above and this CAS leaves a free word without its
        // hint bit; Recover() puts the bit back. A stale bit (word not free) is dropped.
        if (WordState(w) == kFree &&
            words_[index].compare_exchange_strong(w, PackWord(kCached, owner, WordGen(w), cls),
                                                  std::memory_order_acq_rel)) {
          out[got++] = index;
        }
      }
      bits = hints[hw].load(std::memory_order_relaxed);
    }
    if (got == n) {
      cursor_[cls].store(static_cast<std::uint32_t>(hw), std::memory_order_relaxed);
    }
  }
  return got;
}

std::int64_t Arena::ClaimRun(std::uint32_t cls, std::uint32_t n,
                            std::uint64_t align_bytes) noexcept {
  if (cls >= header_.class_count || n == 0) return -1;
  if ((attached_fork_epoch_.load(std::memory_order_relaxed) != ForkEpoch() ||
       owner_id_.load(std::memory_order_relaxed) == 0) &&
      !EnsureAttached().ok()) {
    return -1;
  }
  const std::uint32_t owner = owner_id_.load(std::memory_order_relaxed);
  const ClassRecord& k = header_.classes[cls];
  if (n > k.block_count) return -1;
  auto* hints = Hints(region_->addr(), k);
  const auto hinted = [&](std::uint32_t i) {
    return (hints[i / 64].load(std::memory_order_relaxed) >> (i % 64)) & 1;
  };
  const auto aligned = [&](std::uint32_t i) {
    if (align_bytes <= 1) return true;
    const auto addr = reinterpret_cast<std::uintptr_t>(region_->addr()) + k.data_offset +
                      std::uint64_t{i} * k.stride_bytes;
    return addr % align_bytes == 0;
  };
  std::uint32_t start = 0;
  while (start + n <= k.block_count) {
    if (!aligned(start) || !hinted(start)) {
      ++start;
      continue;
    }
    // Candidate: the hints say [start, start + n) is free. Claim word by word (a hint is only
    // a hint); on the first word another claimer holds, give the claimed ones back.
    std::uint32_t got = 0;
    while (got < n && hinted(start + got)) {
      const std::uint32_t index = k.first_index + start + got;
      std::uint64_t w = words_[index].load(std::memory_order_acquire);
      if (WordState(w) != kFree ||
          !words_[index].compare_exchange_strong(w, PackWord(kCached, owner, WordGen(w), cls),
                                                 std::memory_order_acq_rel)) {
        break;
      }
      ++got;
    }
    if (got == n) {
      // Words first, then hints: a ClaimBatch that took a bit meanwhile finds the word
      // cached and drops the bit; a crash in between leaves cached words of this owner,
      // which Recover() returns once the process is gone.
      for (std::uint32_t i = start; i < start + n;) {
        const std::uint32_t hw = i / 64;
        const std::uint32_t end = std::min<std::uint32_t>(start + n, (hw + 1) * 64);
        std::uint64_t mask = 0;
        for (std::uint32_t b = i; b < end; ++b) mask |= 1ull << (b % 64);
        hints[hw].fetch_and(~mask, std::memory_order_acq_rel);
        i = end;
      }
      return std::int64_t{k.first_index} + start;
    }
    std::uint32_t back[64];
    for (std::uint32_t done = 0; done < got;) {
      const std::uint32_t m = std::min<std::uint32_t>(64, got - done);
      for (std::uint32_t j = 0; j < m; ++j) back[j] = k.first_index + start + done + j;
      ReleaseCached(back, m);
      done += m;
    }
    start += got + 1;
  }
  return -1;
}

void Arena::ReleaseCached(const std::uint32_t* indexes, std::size_t n) noexcept {
  const std::uint32_t owner = owner_id_.load(std::memory_order_relaxed);
  // Hint bits are set after their words, one fetch_or per run of indexes that share a hint
  // word (a drained magazine is mostly such runs).
  std::atomic<std::uint64_t>* pending_word = nullptr;
  std::uint64_t pending_bits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t index = indexes[i];
    const std::uint64_t w = words_[index].load(std::memory_order_relaxed);
    if (WordState(w) != kCached || WordOwner(w) != owner) continue;
    const std::uint32_t cls = WordClass(w);
    const ClassRecord& k = header_.classes[cls];
    // Word first, then hint: a crash in between leaves a free word without a hint (repaired),
    // never a hint for a block someone owns.
    words_[index].store(PackWord(kFree, 0, WordGen(w), cls), std::memory_order_release);
    const std::uint32_t i_in = index - k.first_index;
    std::atomic<std::uint64_t>* hint = &Hints(region_->addr(), k)[i_in / 64];
    if (hint != pending_word) {
      if (pending_word != nullptr) pending_word->fetch_or(pending_bits, std::memory_order_release);
      pending_word = hint;
      pending_bits = 0;
    }
    pending_bits |= 1ull << (i_in % 64);
  }
  if (pending_word != nullptr) pending_word->fetch_or(pending_bits, std::memory_order_release);
}

bool Arena::Persist(std::uint32_t index, std::uint32_t gen) noexcept {
  if (index >= header_.total_blocks) return false;
  const std::uint32_t owner = owner_id_.load(std::memory_order_relaxed);
  std::uint64_t w = words_[index].load(std::memory_order_acquire);
  if (owner == 0 || WordState(w) != kAllocated || WordOwner(w) != owner || WordGen(w) != gen) {
    return false;
  }
  if (!words_[index].compare_exchange_strong(w, PackWord(kAllocated, 0, gen, WordClass(w)),
                                             std::memory_order_acq_rel)) {
    return false;
  }
  // The block now outlives this process; it must outlive this host too. A CXL device keeps
  // memory when its host dies, but not the host's cache: until the word is written back,
  // memory still says "cached" or "owned by a process", the next Recover frees the block, and
  // it is reused while the prefix index publishes it. Write it back and fence before
  // returning, so nothing that announces the block (PrefixHost::Publish runs this as its
  // commit step) can reach memory first.
  cache_ops_.flush(&words_[index], sizeof(BlockWord));
  cache_ops_.fence();
  return true;
}

bool Arena::FreeShared(std::uint32_t index, std::uint32_t gen) noexcept {
  if (index >= header_.total_blocks) return false;
  std::uint64_t w = words_[index].load(std::memory_order_acquire);
  while (WordState(w) == kAllocated && WordGen(w) == gen) {
    const std::uint32_t cls = WordClass(w);
    if (words_[index].compare_exchange_weak(w, PackWord(kFree, 0, gen + 1, cls),
                                            std::memory_order_acq_rel)) {
      // Written back like Persist's word: a free lost with this host's cache would leave the
      // block persisted, which nothing ever frees; and peers (Resolve) see the new generation.
      cache_ops_.flush(&words_[index], sizeof(BlockWord));
      cache_ops_.fence();
      const ClassRecord& k = header_.classes[cls];
      const std::uint32_t i_in = index - k.first_index;
      Hints(region_->addr(), k)[i_in / 64].fetch_or(1ull << (i_in % 64), std::memory_order_release);
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::byte*> Arena::Resolve(const Uuid& arena, std::uint32_t index,
                                          std::uint32_t generation) const {
  if (arena != uuid_) {
    return absl::InvalidArgumentError(absl::StrCat("block ref names arena ", UuidToString(arena),
                                                   ", but this is arena ", UuidToString(uuid_),
                                                   "; resolve it with the arena that issued it"));
  }
  if (index >= header_.total_blocks) {
    return absl::OutOfRangeError(absl::StrCat("block ref index ", index, " is beyond the ",
                                              header_.total_blocks, " blocks of this arena"));
  }
  // A read-only view is how another host opens this arena, and nothing is coherent between
  // hosts: its cached copy of the word may predate the publisher's Persist. Drop it and read
  // memory, where Persist and FreeShared write the word back before they return. (This
  // process's own attached arena needs no such step: same host, same caches.)
  if (read_only_) cache_ops_.invalidate(&words_[index], sizeof(BlockWord));
  const std::uint64_t v = words_[index].load(std::memory_order_acquire);
  if (WordState(v) != kAllocated || WordGen(v) != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("block ", index, " generation ", generation,
                     " is stale (the block was freed; current generation ", WordGen(v), ")"));
  }
  const std::uint32_t cls = WordClass(v);
  if (cls >= header_.class_count) {
    return absl::DataLossError(absl::StrCat("block ", index, ": map word names size class ", cls,
                                            " of ", header_.class_count, "; the map is corrupt"));
  }
  return reinterpret_cast<std::byte*>(block_bias_[cls] +
                                      std::uint64_t{index} * header_.classes[cls].stride_bytes);
}

std::int64_t Arena::IndexOfAddr(const void* addr) const noexcept {
  const auto* p = static_cast<const std::byte*>(addr);
  const std::byte* base = region_->addr();
  if (p < base || p >= base + header_.data_end_offset) return -1;
  const auto off = static_cast<std::uint64_t>(p - base);
  for (std::uint32_t c = 0; c < header_.class_count; ++c) {
    const ClassRecord& k = header_.classes[c];
    const std::uint64_t end = k.data_offset + std::uint64_t{k.block_count} * k.stride_bytes;
    if (off < k.data_offset || off >= end) continue;
    const std::uint64_t rel = off - k.data_offset;
    if (rel % k.stride_bytes != 0) return -1;
    return static_cast<std::int64_t>(k.first_index + rel / k.stride_bytes);
  }
  return -1;
}

ArenaUsage Arena::Usage() const { return ScanUsage(header_, region_->addr()); }

}  // namespace cxlkv::pool
