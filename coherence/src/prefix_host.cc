// PrefixHost: lookups, leases, requests and heartbeat of one host (docs/coherence.md).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/prefix.h"
#include "domain_internal.h"

namespace cxlkv::coherence {

using internal::EntryOff;
using internal::HostRowOff;
using internal::LeaseRowOff;
using internal::OwnerLineOff;
using internal::ReadShared;
using internal::RequestSlotOff;
using internal::ReturnSlotOff;
using internal::WriteShared;

namespace {

// Clock rates of two hosts differ by less than this (per mille): the allowance for drift
// when the host compares the owner's clock with its own. Real clocks differ by well under
// 0.1 per mille; the simulator's by up to 10.
constexpr std::int64_t kDriftPerMille = 20;
std::int64_t Drift(std::int64_t elapsed_ms) {
  return elapsed_ms > 0 ? elapsed_ms * kDriftPerMille / 1000 : 0;
}

// A spin-wait hint: lets the sibling hyper-thread run and saves power while polling.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Sent heartbeats remembered until one is acknowledged: the newest ones. The owner
// acknowledges the latest beat it read, which is among them unless it is far behind.
constexpr std::size_t kMaxSentBeats = 64;

}  // namespace

PrefixHost::PrefixHost(Mem& mem, Clock& clock, const DomainHeader& h, std::uint32_t host,
                       std::uint32_t margin_ms, std::uint32_t pause_tolerance_ms,
                       std::uint32_t ack_wait_ms)
    : mem_(mem),
      clock_(clock),
      h_(h),
      host_(host),
      margin_ms_(margin_ms),
      pause_tolerance_ms_(pause_tolerance_ms),
      ack_wait_ms_(ack_wait_ms) {}

absl::StatusOr<std::unique_ptr<PrefixHost>> PrefixHost::Join(Mem& mem, Clock& clock,
                                                             std::uint32_t host_id,
                                                             const Options& options) {
  auto h = ReadDomainHeader(mem);
  if (!h.ok()) return h.status();
  if (host_id >= h->max_hosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("host id ", host_id, " is outside the domain's ", h->max_hosts, " host rows"));
  }
  const std::uint32_t margin = options.margin_ms != 0 ? options.margin_ms : h->lease_ttl_ms / 4;
  if (margin >= h->lease_ttl_ms) {
    return absl::InvalidArgumentError("lease margin must be below the domain's lease TTL");
  }
  const std::uint32_t tolerance =
      options.pause_tolerance_ms != 0 ? options.pause_tolerance_ms : margin / 2;
  std::unique_ptr<PrefixHost> p(
      new PrefixHost(mem, clock, *h, host_id, margin, tolerance, options.ack_wait_ms));
  if (auto st = p->Rejoin(); !st.ok()) return st;
  return p;
}

absl::Status PrefixHost::Rejoin() {
  HostRow row{};
  const bool row_ok = ReadShared(mem_, HostRowOff(h_, host_), &row);
  OwnerHostLine o{};
  if (!ReadOwnerLine(&o)) {
    return absl::UnavailableError(absl::StrCat("host ", host_, ": owner line unreadable"));
  }
  if (row_ok) {
    incarnation_ = std::max(row.incarnation, o.fenced_incarnation) + 1;
  } else {
    // Our own row is torn: a process of this host died writing it. What it said is rebuilt
    // from what survives. The incarnation goes above every one the owner or our own lease
    // rows and requests know of (reusing the dead process's would let its requests and rows
    // pass for ours). Requests resume at what the owner consumed (those still in the ring
    // are announced below). Returns restart a full ring back from what the owner sent: the
    // blocks the dead process may not have freed come again (delivery is at least once),
    // and the owner, which waits for ring room, sees room again once they are taken.
    std::uint64_t seen = std::max({incarnation_, o.fenced_incarnation, o.acked_incarnation});
    for (std::uint32_t r = 0; r < h_.lease_rows; ++r) {
      LeaseRow lr;
      if (ReadShared(mem_, LeaseRowOff(h_, host_, r), &lr)) seen = std::max(seen, lr.incarnation);
    }
    for (std::uint64_t seq = 1; seq <= h_.ring_slots; ++seq) {
      RequestSlot slot;
      if (ReadShared(mem_, RequestSlotOff(h_, host_, seq), &slot)) {
        seen = std::max(seen, slot.incarnation);
      }
    }
    incarnation_ = seen + 1;
    row = HostRow{};
    row.heartbeat = o.acked_heartbeat;
    row.ring_tail = o.ring_head;
    row.return_head = o.return_tail - std::min<std::uint64_t>(o.return_tail, h_.ring_slots);
  }
  alive_until_ms_ = 0;  // nothing acknowledged for this incarnation yet
  sent_beats_.clear();
  offset_known_ = false;
  rows_.assign(h_.lease_rows, Lease{});  // a fenced incarnation's leases are void
  held_ = 0;
  free_rows_.clear();
  // Rows of the old incarnation are cleared (the owner ignores them once it sees the new
  // incarnation, but a clean table is what a restarted owner must find). The host row's
  // fence below completes these write-backs too; until then the old rows only keep blocks
  // a little longer, never less.
  for (std::uint32_t r = h_.lease_rows; r-- > 0;) {
    StoreLeaseRow(r, 0, 0, false);
    free_rows_.push_back(r);
  }
  heartbeat_ = row.heartbeat + 1;
  // Requests of the old incarnation stay in the ring: the owner returns their blocks. One
  // written but not announced before a crash is announced now, for the same reason.
  ring_tail_ = std::max(row.ring_tail, o.ring_head);
  RequestSlot next;
  while (ring_tail_ - o.ring_head < h_.ring_slots &&
         ReadShared(mem_, RequestSlotOff(h_, host_, ring_tail_ + 1), &next) &&
         next.seq == ring_tail_ + 1 && next.incarnation != 0 && next.incarnation < incarnation_) {
    ++ring_tail_;
  }
  // A new process starts from what the last one acknowledged (returns it was handed but
  // may not have freed come again); a rejoin after fencing keeps its own positions.
  if (!attached_) {
    return_head_ = handed_head_ = acked_head_ = row.return_head;
    attached_ = true;
  }
  WriteHostRow();
  return absl::OkStatus();
}

bool PrefixHost::ReadEntry(std::uint32_t i, IndexEntry* e) {
  return ReadShared(mem_, EntryOff(h_, i), e);
}

bool PrefixHost::ReadOwnerLine(OwnerHostLine* o) {
  if (!ReadShared(mem_, OwnerLineOff(h_, host_), o)) return false;
  owner_ring_head_ = o->ring_head;
  NoteOwnerLine(*o, clock_.NowMs());
  return true;
}

bool PrefixHost::ReadEntryAndClock(std::uint32_t i, IndexEntry* e, OwnerClockLine* c) {
  mem_.Evict(EntryOff(h_, i), sizeof(IndexEntry));
  mem_.Evict(kOwnerClockOffset, sizeof(OwnerClockLine));
  mem_.FullFence();
  mem_.Read(kOwnerClockOffset, c, sizeof(*c));
  if (!LineValid(*c) && !ReadShared(mem_, kOwnerClockOffset, c)) *c = OwnerClockLine{};
  mem_.Read(EntryOff(h_, i), e, sizeof(*e));
  return LineValid(*e) || ReadEntry(i, e);
}

void PrefixHost::NoteOwnerLine(const OwnerHostLine& o, std::int64_t read_ms) {
  if (o.acked_incarnation != incarnation_) return;
  // The acknowledgement's time is a reading of the owner's clock from before this read.
  if (StoodStill(o.acked_at_ms, o.clock_id, read_ms)) {
    DropAfterPause();
    return;
  }
  // Credit comes from the newest remembered beat at or before the acknowledged one: an
  // earlier beat left earlier, so its credit is never more than the acknowledged beat's.
  std::size_t k = 0;
  while (k < sent_beats_.size() && sent_beats_[k].first <= o.acked_heartbeat) ++k;
  if (k == 0) return;
  const std::int64_t sent_ms = sent_beats_[k - 1].second;
  const std::int64_t credit = sent_ms + static_cast<std::int64_t>(h_.host_ttl_ms) - margin_ms_;
  if (credit > alive_until_ms_) {
    alive_until_ms_ = credit;
    last_ack_seen_ms_ = read_ms;
    owner_silent_ = false;
  }
  if (o.clock_id != 0) NoteOffsetBound(o.acked_at_ms, o.clock_id, sent_ms);
  sent_beats_.erase(sent_beats_.begin(), sent_beats_.begin() + static_cast<std::ptrdiff_t>(k - 1));
}

// The owner read its clock after it saw the beat, and the beat left after this host read
// its clock for sent_ms: so (owner clock - host clock) at that moment was at most
// acked_at_ms - sent_ms. Later readings of the owner's clock are never ahead of it; if one
// shows the offset grown by more than drift and the tolerance, this host's clock lost time.
void PrefixHost::NoteOffsetBound(std::int64_t acked_at_ms, std::uint32_t clock_id,
                                 std::int64_t sent_ms) {
  const std::int64_t bound = acked_at_ms - sent_ms;
  if (offset_known_ && offset_clock_ == clock_id) {
    // The older bound, carried forward by drift, may still be the tighter one.
    const std::int64_t carried = offset_bound_ms_ + Drift(sent_ms - offset_at_ms_);
    if (carried <= bound) {
      offset_bound_ms_ = carried;
      offset_at_ms_ = std::max(offset_at_ms_, sent_ms);
      return;
    }
  }
  offset_known_ = true;
  offset_clock_ = clock_id;
  offset_bound_ms_ = bound;
  offset_at_ms_ = sent_ms;
}

bool PrefixHost::StoodStill(std::int64_t owner_ms, std::uint32_t clock_id,
                            std::int64_t host_ms) const {
  if (clock_id == 0 || !offset_known_ || clock_id != offset_clock_) return false;
  const std::int64_t at_least = owner_ms - host_ms;  // the offset now is at least this
  return at_least - offset_bound_ms_ >
         static_cast<std::int64_t>(pause_tolerance_ms_) + Drift(host_ms - offset_at_ms_);
}

void PrefixHost::DropAfterPause() {
  bool any = false;
  for (std::uint32_t row = 0; row < rows_.size(); ++row) {
    if (rows_[row].id == 0) continue;
    StoreLeaseRow(row, 0, 0, false);
    ForgetRow(row);
    any = true;
  }
  if (any) mem_.Fence();
  alive_until_ms_ = 0;
  sent_beats_.clear();  // beats sent before the pause earn no credit
  offset_known_ = false;
  ++pauses_;
}

void PrefixHost::ClearLeaseRow(std::uint32_t row) {
  StoreLeaseRow(row, 0, 0, false);
  // A store fence: the cleared row is on its way to memory when the call returns, so the
  // owner may reclaim at once. Nothing needs it before a later load: a row seen held a little
  // longer only delays a reclaim, and x86 never moves the lease's data loads past a store.
  mem_.Fence();
}

void PrefixHost::StoreLeaseRow(std::uint32_t row, std::uint32_t entry, std::uint32_t gen,
                               bool held) {
  // A row differs from the sealed rows of this incarnation with lease_seq, entry and gen zero
  // (held or not) only in those two words, so its CRC is that row's CRC XOR the two words'
  // deltas: the same CRC32C as SealLine computes over its 60 bytes, without the 8-step
  // dependency chain of crc32 instructions through them (two such seals a block leased).
  static_assert(offsetof(LeaseRow, lease_seq) == 8 && offsetof(LeaseRow, entry) == 16 &&
                offsetof(LeaseRow, entry_gen) == 20 && offsetof(LeaseRow, crc) == 60);
  static constexpr Crc32cWordDelta kSeqDelta(offsetof(LeaseRow, crc) - 16);
  static constexpr Crc32cWordDelta kEntryDelta(offsetof(LeaseRow, crc) - 24);
  if (row_crc_incarnation_ != incarnation_ || !row_crc_ready_) {
    for (std::uint32_t h = 0; h < 2; ++h) {
      LeaseRow base{};
      base.incarnation = incarnation_;
      base.held = h;
      row_crc_base_[h] = LineCrc(base);
    }
    row_crc_incarnation_ = incarnation_;
    row_crc_ready_ = true;
  }
  LeaseRow r{};
  r.incarnation = incarnation_;
  r.lease_seq = ++lease_seq_;
  r.entry = entry;
  r.entry_gen = gen;
  r.held = held ? 1 : 0;
  r.crc = row_crc_base_[r.held] ^ kSeqDelta(r.lease_seq) ^
          kEntryDelta(std::uint64_t{entry} | std::uint64_t{gen} << 32);
  const std::uint64_t off = LeaseRowOff(h_, host_, row);
#ifndef CXLKV_FAULT_DROP_LEASE_FLUSH  // defined only by the fault-injection test build
  // A streaming store of the whole line: no read for ownership of a line this host only
  // writes, and no separate write-back; it is in memory once the caller's fence returns (the
  // store fence of a release, the mfence before an acquire's re-validation loads). Until
  // then the owner may see the row's previous value, which only keeps a block longer.
  mem_.WriteNt(off, &r, sizeof(r));
#else
  mem_.Write(off, &r, sizeof(r));  // the fault: the row stays in this host's cache
#endif
}

void PrefixHost::WriteHostRow() {
  // Remember when each heartbeat left (before it could be seen): once the owner
  // acknowledges it, we are live until that time + host_ttl - margin.
  if (sent_beats_.empty() || sent_beats_.back().first != heartbeat_) {
    // While nothing is acknowledged (the owner is down) beats pile up: keep the newest.
    if (sent_beats_.size() >= kMaxSentBeats) {
      sent_beats_.erase(sent_beats_.begin(),
                        sent_beats_.begin() + static_cast<std::ptrdiff_t>(kMaxSentBeats / 2));
    }
    sent_beats_.emplace_back(heartbeat_, clock_.NowMs());
  }
  HostRow r{};
  r.incarnation = incarnation_;
  r.heartbeat = heartbeat_;
  r.ring_tail = ring_tail_;
  r.return_head = acked_head_;
  WriteShared(mem_, HostRowOff(h_, host_), r);
}

std::optional<Hit> PrefixHost::Lookup(Namespace ns, const PrefixKey& key) {
  if (ProbeRun(ns, std::span<const PrefixKey>(&key, 1)) == 0) return std::nullopt;
  const IndexEntry& e = chain_read_[0];
  return Hit{chain_entries_[0], e.entry_gen, e.ref, e.publisher};
}

std::size_t PrefixHost::ProbeRun(Namespace ns, std::span<const PrefixKey> keys) {
  // Linear probing from each key's start slot, all keys at once, in rounds: a round evicts
  // the next `window` slots of every key still open, fences once (mfence: no load below
  // passes the evictions), then reads them. The first window is 4 slots: at 70 % load a
  // chain of 8 keys probed 2 slots each needs a second round (a second round trip to
  // memory) almost always, and two more lines a key cost little once the round's loads
  // overlap (Mem::Preload); the windows double for the few keys that need more. A slot read
  // after the fence holds what memory held at some point after this call began, as the
  // one-slot Invalidate did. A key's probe ends at an EMPTY entry or after its start slot's
  // probe_len slots (read with the start slot in the first round), whichever comes first:
  // after churn, tombstones no longer lengthen a miss (docs/coherence.md, "Probe lengths").
  // `limit` is the run's end so far: keys past a miss are not probed any more.
  constexpr std::uint32_t kFirstWindow = 4;
  constexpr std::uint32_t kMaxWindow = 64;
  constexpr std::uint32_t kFound = ~0u;
  const std::uint32_t mask = h_.index_entries - 1;
  std::size_t limit = keys.size();
  chain_entries_.resize(limit);
  chain_read_.resize(limit);
  chain_next_.resize(limit);
  chain_bound_.resize(limit);
  for (std::size_t i = 0; i < limit; ++i) {
    chain_entries_[i] = internal::ProbeStart(h_, ns, keys[i]);
    chain_next_[i] = 0;
    chain_bound_[i] = h_.index_entries;  // until the start slot's probe_len is read
  }
  for (std::uint32_t window = kFirstWindow;; window = std::min(window * 2, kMaxWindow)) {
    bool open = false;
    preload_.clear();
    for (std::size_t i = 0; i < limit; ++i) {
      if (chain_next_[i] == kFound) continue;
      const std::uint32_t end = std::min(chain_next_[i] + window, chain_bound_[i]);
      // Slots next..end of the probe: one range, or two where it wraps past the last slot.
      for (std::uint32_t p = chain_next_[i]; p < end;) {
        const std::uint32_t slot = (chain_entries_[i] + p) & mask;
        const std::uint32_t run = std::min(end - p, h_.index_entries - slot);
        mem_.Evict(EntryOff(h_, slot), std::size_t{run} * sizeof(IndexEntry));
        for (std::uint32_t k = 0; k < run; ++k) preload_.push_back(EntryOff(h_, slot + k));
        p += run;
      }
      open = true;
    }
    if (!open) return limit;
    mem_.FullFence();
    mem_.Preload(preload_);  // every line of the round on its way before the first Read
    // Every line of the round is loaded before any is looked at: the loads are independent,
    // so their misses overlap instead of waiting on each line's checks in turn.
    chain_lines_.resize(limit * window);
    for (std::size_t i = 0; i < limit; ++i) {
      if (chain_next_[i] == kFound) continue;
      const std::uint32_t end = std::min(chain_next_[i] + window, chain_bound_[i]);
      for (std::uint32_t p = chain_next_[i]; p < end;) {
        const std::uint32_t slot = (chain_entries_[i] + p) & mask;
        const std::uint32_t run = std::min(end - p, h_.index_entries - slot);
        mem_.Read(EntryOff(h_, slot), &chain_lines_[i * window + (p - chain_next_[i])],
                  std::size_t{run} * sizeof(IndexEntry));
        p += run;
      }
    }
    for (std::size_t i = 0; i < limit; ++i) {
      if (chain_next_[i] == kFound) continue;
      const std::uint32_t end = std::min(chain_next_[i] + window, chain_bound_[i]);
      IndexEntry& e = chain_read_[i];
      bool missed = false;
      for (std::uint32_t p = chain_next_[i]; p < end; ++p) {
        const std::uint32_t slot = (chain_entries_[i] + p) & mask;
        e = chain_lines_[i * window + (p - chain_next_[i])];
        // Only a line acted on is checked (a match, or an EMPTY that ends the probe): a torn
        // line passed over is what an unreadable one is, a slot to probe past.
        const auto state = static_cast<EntryState>(e.state);
        const bool acts = state == EntryState::kEmpty ||
                          (state == EntryState::kPublished && internal::KeyMatches(e, ns, keys[i]));
        if (!acts) continue;
        if (!LineValid(e) && !ReadEntry(slot, &e)) continue;  // unreadable: keep probing
        if (static_cast<EntryState>(e.state) == EntryState::kEmpty) {
          missed = true;
          break;
        }
        if (static_cast<EntryState>(e.state) == EntryState::kPublished &&
            internal::KeyMatches(e, ns, keys[i])) {
          chain_entries_[i] = slot;
          chain_next_[i] = kFound;
          missed = false;
          break;
        }
      }
      if (chain_next_[i] == kFound) continue;
      if (!missed && chain_next_[i] == 0) {
        // Not found in the first window: the start slot says how far this key's entry can be
        // (0: not known, or a line that never validated: probe until an EMPTY entry). Only
        // now is it checked, so a key found in its first window pays one CRC, not two. A
        // length read a moment late only makes this lookup miss an entry published meanwhile.
        IndexEntry start = chain_lines_[i * window];
        if ((LineValid(start) || ReadEntry(chain_entries_[i], &start)) && start.probe_len != 0) {
          chain_bound_[i] = std::min<std::uint32_t>(start.probe_len, h_.index_entries);
        }
      }
      if (missed || end >= chain_bound_[i]) {
        // An EMPTY entry, or past the probe length: the run ends here; later keys do not
        // matter.
        limit = i;
        break;
      }
      chain_next_[i] = end;
    }
  }
}

absl::Status PrefixHost::EnsureAlive(std::int64_t* now_ms) {
  *now_ms = clock_.NowMs();
  if (*now_ms <= alive_until_ms_) return absl::OkStatus();
  // No acknowledged heartbeat recent enough to promise a lease: beat, and look again — after
  // waiting for the owner's acknowledgement (a host that was descheduled or stopped leases
  // again within one owner round, docs/coherence.md "Busy hosts").
  // kAborted (fenced, or a pause found): the caller learns its leases are gone; its retry
  // waits for the new incarnation's acknowledgement here.
  if (auto st = Heartbeat(nullptr); !st.ok()) return st;
  if (!BeatUntilAlive(clock_.NowMs(), /*beat=*/false)) {
    ++stats_.leases_refused_late;
    *now_ms = clock_.NowMs();
    return absl::UnavailableError(
        absl::StrCat("host ", host_,
                     ": the owner has not acknowledged a recent heartbeat (down or "
                     "behind); no lease can be promised — retry after Heartbeat()"));
  }
  *now_ms = clock_.NowMs();
  return absl::OkStatus();
}

bool PrefixHost::BeatUntilAlive(std::int64_t until_ms, bool beat) {
  if (alive_until_ms_ >= until_ms) return true;
  // An owner that let a whole wait pass without acknowledging anything is taken for down or
  // far behind: no more waits until it acknowledges again (callers fail fast meanwhile).
  if (ack_wait_ms_ == 0 || owner_silent_) return false;
  // A beat sent now, once acknowledged, covers now + host_ttl - margin: enough for any
  // `until_ms` below that. One beat suffices (the owner acknowledges the newest it reads).
  if (beat) {
    (void)Heartbeat(nullptr);  // a fence found here rejoins; the new incarnation's beat counts
    if (alive_until_ms_ >= until_ms) return true;
  }
  ++stats_.ack_waits;
  const std::int64_t start = clock_.NowMs();
  // Polls of the owner's line (an Invalidate and a load each), 100 us apart; bounded by the
  // count too, so a clock that does not move (a test's) cannot hold the wait forever.
  for (std::uint32_t polls = 0;; ++polls) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    OwnerHostLine o{};
    if (ReadOwnerLine(&o) && o.fenced_incarnation >= incarnation_) (void)Heartbeat(nullptr);
    if (alive_until_ms_ >= until_ms) return true;
    if (clock_.NowMs() - start >= static_cast<std::int64_t>(ack_wait_ms_) ||
        polls >= ack_wait_ms_ * 10) {
      owner_silent_ = true;
      return false;
    }
  }
}

absl::StatusOr<Lease> PrefixHost::Acquire(const Hit& hit) {
  if (hit.entry >= h_.index_entries) return absl::InvalidArgumentError("hit names no entry");
  std::int64_t now;  // read before the row can be seen: a deadline counted from it is safe
  if (auto st = EnsureAlive(&now); !st.ok()) return st;
  if (free_rows_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host ", host_, " holds all ", h_.lease_rows, " lease rows; release some"));
  }
  const std::uint32_t row = free_rows_.back();
  // The row's store and write-back, then the re-read of the entry: the mfence inside
  // ReadEntryAndClock is this side's fence of rule 4 (no load of the entry passes the row).
  StoreLeaseRow(row, hit.entry, hit.entry_gen, true);
  IndexEntry e;
  OwnerClockLine c;
  const bool entry_ok = ReadEntryAndClock(hit.entry, &e, &c);
  if (StoodStill(c)) {
    ClearLeaseRow(row);
    DropAfterPause();
    return absl::UnavailableError(
        absl::StrCat("host ", host_,
                     ": its clock stood still (a VM stop or suspend); leases dropped — "
                     "retry after Heartbeat()"));
  }
  if (!entry_ok || static_cast<EntryState>(e.state) != EntryState::kPublished ||
      e.entry_gen != hit.entry_gen) {
    ClearLeaseRow(row);
    return absl::NotFoundError("the block was retired before the lease took hold");
  }
  free_rows_.pop_back();
  Lease lease{row, hit.entry, hit.entry_gen, hit.ref, Deadline(now), lease_seq_};
  rows_[row] = lease;
  ++held_;
  return lease;
}

absl::StatusOr<Lease> PrefixHost::LookupAndAcquire(Namespace ns, const PrefixKey& key) {
  const std::optional<Hit> hit = Lookup(ns, key);
  if (!hit) return absl::NotFoundError("no published block for this prefix key");
  return Acquire(*hit);
}

// The same steps as Lookup + Acquire for each key, with each step's cache-line work for all
// keys issued before the one fence it needs: evictions overlap, and so do the misses.
absl::StatusOr<std::size_t> PrefixHost::AcquireChain(Namespace ns, std::span<const PrefixKey> keys,
                                                     std::vector<Lease>* out) {
  if (keys.empty()) return 0;
  // The clock read before the lookup: before any row can be seen, so a deadline counted from
  // it is safe (the lease ends a lookup's time earlier than one counted from after it).
  std::int64_t now;
  if (auto st = EnsureAlive(&now); !st.ok()) return st;
  const std::size_t want = std::min(keys.size(), std::size_t{h_.lease_rows});
  // 1. Lookup: every key probed at once, one fence a round (ProbeRun).
  std::size_t n = ProbeRun(ns, keys.first(want));
  if (n == 0) return 0;
  if (free_rows_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host ", host_, " holds all ", h_.lease_rows, " lease rows; release some"));
  }
  n = std::min(n, free_rows_.size());
  // 2. Lease rows: a streaming store each.
  const std::size_t first_row = free_rows_.size() - n;  // rows taken from the back
  for (std::size_t i = 0; i < n; ++i) {
    StoreLeaseRow(free_rows_[first_row + n - 1 - i], chain_entries_[i], chain_read_[i].entry_gen,
                  true);
  }
  const std::uint64_t first_id = lease_seq_ - n + 1;  // StoreLeaseRow numbered them in order
  // 3. Re-validate every entry: evict all (and the owner's clock line), one full fence, read;
  //    a torn line is read again alone. That fence is also rule 4's fence between the rows
  //    and the re-validation loads: it drains the rows and completes their write-backs first.
  preload_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    mem_.Evict(EntryOff(h_, chain_entries_[i]), sizeof(IndexEntry));
    preload_.push_back(EntryOff(h_, chain_entries_[i]));
  }
  mem_.Evict(kOwnerClockOffset, sizeof(OwnerClockLine));
  preload_.push_back(kOwnerClockOffset);
  mem_.FullFence();
  mem_.Preload(preload_);  // loads after the fence, as the Reads below: their misses overlap
  OwnerClockLine c;
  mem_.Read(kOwnerClockOffset, &c, sizeof(c));
  if (!LineValid(c) && !ReadShared(mem_, kOwnerClockOffset, &c)) c = OwnerClockLine{};
  if (StoodStill(c)) {
    for (std::size_t i = 0; i < n; ++i)
      StoreLeaseRow(free_rows_[first_row + n - 1 - i], 0, 0, false);
    mem_.Fence();
    DropAfterPause();
    return absl::UnavailableError(
        absl::StrCat("host ", host_,
                     ": its clock stood still (a VM stop or suspend); leases dropped — "
                     "retry after Heartbeat()"));
  }
  // All entries loaded first (their misses overlap), then checked in order.
  chain_lines_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    mem_.Read(EntryOff(h_, chain_entries_[i]), &chain_lines_[i], sizeof(IndexEntry));
  }
  std::size_t held = 0;
  for (; held < n; ++held) {
    IndexEntry& e = chain_lines_[held];
    // Byte for byte the line the lookup validated and found PUBLISHED with this gen: the same
    // bytes have the same CRC, state and gen, so that check is already done (docs/coherence.md,
    // "Re-validation by comparison"). Any other bytes get the full check.
    if (std::memcmp(&e, &chain_read_[held], sizeof(IndexEntry)) == 0) continue;
    if (!LineValid(e) && !ReadEntry(chain_entries_[held], &e)) break;
    if (static_cast<EntryState>(e.state) != EntryState::kPublished ||
        e.entry_gen != chain_read_[held].entry_gen) {
      break;  // retired before the lease took hold: the run ends here
    }
  }
  // Rows past the run are cleared again (one store fence: a row seen held a little longer
  // only delays a reclaim).
  for (std::size_t i = held; i < n; ++i)
    StoreLeaseRow(free_rows_[first_row + n - 1 - i], 0, 0, false);
  if (held < n) mem_.Fence();
  const std::int64_t deadline = Deadline(now);
  out->reserve(out->size() + held);
  for (std::size_t i = 0; i < held; ++i) {
    const std::uint32_t row = free_rows_[first_row + n - 1 - i];
    Lease lease{row,      chain_entries_[i], chain_read_[i].entry_gen, chain_read_[i].ref,
                deadline, first_id + i};
    rows_[row] = lease;
    out->push_back(lease);
  }
  held_ += held;
  // Taken rows leave the free list; rows of keys that fell out of the run go back to it.
  std::vector<std::uint32_t> back;
  for (std::size_t i = held; i < n; ++i) back.push_back(free_rows_[first_row + n - 1 - i]);
  free_rows_.resize(first_row);
  free_rows_.insert(free_rows_.end(), back.begin(), back.end());
  return held;
}

absl::Status PrefixHost::Renew(Lease& lease) {
  if (!Holds(lease)) return absl::FailedPreconditionError("not a lease this host holds");
  const std::int64_t now = clock_.NowMs();
  if (now > lease.deadline_ms) {
    Release(lease);
    return absl::DeadlineExceededError("the lease expired on this host's clock; acquire again");
  }
  if (now > alive_until_ms_) {
    if (auto st = Heartbeat(nullptr); !st.ok()) return st;  // fenced: the lease is gone
    if (clock_.NowMs() > alive_until_ms_) {
      return absl::UnavailableError("the owner has not acknowledged a recent heartbeat");
    }
  }
  StoreLeaseRow(lease.row, lease.entry, lease.entry_gen, true);
  // The entry and the owner's clock, read after the row is in memory (the mfence inside
  // ReadEntryAndClock drains the row's store and completes its write-back first).
  IndexEntry e;
  OwnerClockLine c;
  const bool entry_ok = ReadEntryAndClock(lease.entry, &e, &c);
  // A second look at the clock, now that the new row is in memory. If this host stalled
  // between the clock sample and the write long enough for the old deadline to pass, the
  // owner may have judged the old row expired and reclaimed the block while the write was
  // on its way: the lease is lost even though the row now looks fresh (coherence/model:
  // RENEW_AS_CODED is this step without the second look, and SPIN finds the reclaim).
  const std::int64_t after = clock_.NowMs();
  // That look is only as good as this host's clock: one that stood still (a VM stop, a
  // suspend) passes it after the owner fenced this host or expired the row.
  if (StoodStill(c.owner_ms, c.clock_id, after)) {
    DropAfterPause();
    return absl::DeadlineExceededError(
        absl::StrCat("host ", host_,
                     ": its clock stood still (a VM stop or suspend) and the lease may have "
                     "been reclaimed; every lease is dropped — acquire again after Heartbeat()"));
  }
  // The entry must still hold the leased generation: published, or retired since (a lease
  // keeps a retired block until it ends). Anything else means the block was reclaimed.
  const auto state = static_cast<EntryState>(e.state);
  const bool entry_holds = entry_ok && e.publisher != kQuarantined &&
                           ((state == EntryState::kPublished && e.entry_gen == lease.entry_gen) ||
                            (state == EntryState::kRetired && e.entry_gen == lease.entry_gen + 1));
  if (!entry_holds) {
    Release(lease);
    return absl::DeadlineExceededError("the block was reclaimed; the lease is lost");
  }
  if (after > lease.deadline_ms || after > alive_until_ms_) {
    Release(lease);
    return absl::DeadlineExceededError(
        "this host stalled during the renewal and the lease may have been reclaimed; "
        "acquire again");
  }
  lease.deadline_ms = Deadline(now);
  rows_[lease.row].deadline_ms = lease.deadline_ms;
  return absl::OkStatus();
}

void PrefixHost::Release(Lease& lease) {
  if (!Holds(lease)) return;
  ClearLeaseRow(lease.row);
  ForgetRow(lease.row);
}

void PrefixHost::ReleaseAll(std::span<Lease> leases) {
  bool any = false;
  for (Lease& lease : leases) {
    if (!Holds(lease)) continue;
    StoreLeaseRow(lease.row, 0, 0, false);
    ForgetRow(lease.row);
    any = true;
  }
  if (any) mem_.Fence();
}

void PrefixHost::ForgetRow(std::uint32_t row) {
  rows_[row] = Lease{};
  --held_;
  free_rows_.push_back(row);
}

namespace {
// The read step on a real mapping, written once for CopyOut and ReadLeased: under the lease
// the block is immutable, so after the invalidation (clflushopt, then mfence before any load)
// every line comes from memory, i.e. holds the published bytes.
void ReadRange(const void* src, void* dst, std::size_t len) {
  Invalidate(src, len);
  std::memcpy(dst, src, len);
}
}  // namespace

absl::Status PrefixHost::CopyOut(const Lease& lease, const void* src, void* dst, std::size_t len) {
  ReadRange(src, dst, len);
  // Whether the copy counts: the entry still published with the lease's generation, and the
  // deadline not passed during the copy.
  absl::Status st = ValidateAfterCopy(lease);
  if (!st.ok()) ++stats_.copies_discarded;
  return st;
}

absl::Status PrefixHost::CopyOut(const Lease& lease, Mem& block_mem, std::uint64_t offset,
                                 void* dst, std::size_t len) {
  block_mem.Invalidate(offset, len);
  block_mem.Read(offset, dst, len);
  absl::Status st = ValidateAfterCopy(lease);
  if (!st.ok()) ++stats_.copies_discarded;
  return st;
}

absl::Status PrefixHost::ReadLeased(Lease& lease, const void* src, void* dst, std::size_t len) {
  const auto* from = static_cast<const std::byte*>(src);
  auto* to = static_cast<std::byte*>(dst);
  return ReadLeasedParts(
      lease, len, [&](std::size_t off, std::size_t n) { ReadRange(from + off, to + off, n); });
}

absl::Status PrefixHost::ReadLeased(Lease& lease, Mem& block_mem, std::uint64_t offset, void* dst,
                                    std::size_t len) {
  auto* to = static_cast<std::byte*>(dst);
  return ReadLeasedParts(lease, len, [&](std::size_t off, std::size_t n) {
    block_mem.Invalidate(offset + off, n);
    block_mem.Read(offset + off, to + off, n);
  });
}

absl::Status PrefixHost::ReadLeasedParts(
    Lease& lease, std::size_t len, const std::function<void(std::size_t, std::size_t)>& read) {
  // What a lease must have left before a part is read, beyond the part's expected copy time:
  // an eighth of a lease's life covers a scheduling delay or two on a busy host.
  const std::int64_t slack = std::max<std::int64_t>(1, (h_.lease_ttl_ms - margin_ms_) / 8);
  absl::Status last;
  for (std::uint32_t attempt = 1; attempt <= kReadAttempts; ++attempt) {
    for (std::size_t off = 0; off < len;) {
      const std::size_t n = std::min(kReadPartBytes, len - off);
      if (auto st = KeepLease(lease, ExpectedCopyMs(n) + slack); !st.ok()) {
        ++stats_.copies_discarded;
        return st;
      }
      const std::int64_t t0 = clock_.NowMs();
      read(off, n);
      NoteCopy(n, clock_.NowMs() - t0);
      off += n;
    }
    // The copy counts only if the lease held throughout: validated as CopyOut's is.
    last = ValidateAfterCopy(lease);
    if (last.ok()) return last;
    // Expired during the copy (descheduled, stopped), or dropped after a pause: copy again
    // under a lease taken again. A retired or reclaimed block is a miss: stop.
    if (!absl::IsDeadlineExceeded(last) && !absl::IsFailedPrecondition(last)) break;
    ++stats_.copies_retried;
  }
  ++stats_.copies_discarded;
  return last;
}

absl::Status PrefixHost::KeepLease(Lease& lease, std::int64_t need_ms) {
  // Never more than half a fresh lease's life: a part that needs more is read anyway and
  // validated after (a slower copy than that is retried, not promised).
  need_ms = std::min<std::int64_t>(need_ms, (h_.lease_ttl_ms - margin_ms_) / 2);
  const std::int64_t now = clock_.NowMs();
  if (Holds(lease) && now + need_ms <= lease.deadline_ms) return absl::OkStatus();
  // The renewal's deadline is capped by the liveness credit: get a fresh one first.
  (void)BeatUntilAlive(now + need_ms);
  if (Holds(lease) && clock_.NowMs() <= lease.deadline_ms) {
    absl::Status st = Renew(lease);
    if (st.ok()) {
      ++stats_.leases_renewed_for_copy;
      return st;
    }
    if (absl::IsUnavailable(st)) return st;  // no liveness: the owner is down or behind
    // Expired meanwhile, or reclaimed: Renew released it. Taking it again tells which.
  }
  if (Holds(lease)) Release(lease);
  auto again = Acquire(Hit{lease.entry, lease.entry_gen, lease.ref, 0});
  if (!again.ok()) {
    if (absl::IsNotFound(again.status())) {
      return absl::AbortedError("the block was retired before the lease could be taken again");
    }
    return again.status();
  }
  lease = *again;
  ++stats_.leases_retaken;
  return absl::OkStatus();
}

std::int64_t PrefixHost::ExpectedCopyMs(std::size_t len) const {
  std::uint64_t slowest = 0;
  for (std::uint64_t r : copy_rates_) {
    if (r != 0 && (slowest == 0 || r < slowest)) slowest = r;
  }
  if (slowest == 0) return 0;
  return static_cast<std::int64_t>((len + slowest - 1) / slowest);
}

void PrefixHost::NoteCopy(std::size_t len, std::int64_t ms) {
  if (ms <= 0) return;  // under a millisecond: nothing a deadline in ms must allow for
  copy_rates_[copy_rate_next_] = std::max<std::uint64_t>(1, len / static_cast<std::uint64_t>(ms));
  copy_rate_next_ = (copy_rate_next_ + 1) % copy_rates_.size();
}

absl::Status PrefixHost::ValidateAfterCopy(const Lease& lease) {
  if (!Holds(lease)) {
    return absl::FailedPreconditionError(
        "this host no longer holds the lease (released, expired, fenced or dropped after a "
        "pause); discard the copy");
  }
  if (clock_.NowMs() > lease.deadline_ms) {
    return absl::DeadlineExceededError("the lease expired during the copy; discard it");
  }
  IndexEntry e;
  if (!ReadEntry(lease.entry, &e) || static_cast<EntryState>(e.state) != EntryState::kPublished ||
      e.entry_gen != lease.entry_gen) {
    return absl::AbortedError("the block was retired during the copy; discard it");
  }
  return absl::OkStatus();
}

absl::Status PrefixHost::PostRequests(std::span<RequestSlot> slots,
                                      const std::function<bool()>& commit) {
  const std::uint64_t n = slots.size();
  if (RingRoom() < n) {
    // The last line read shows too little room: read it again (the owner may have moved on).
    OwnerHostLine o{};
    if (!ReadOwnerLine(&o)) return absl::UnavailableError("owner line unreadable; retry");
    if (RingRoom() < n) {
      return absl::UnavailableError(absl::StrCat(
          "host ", host_, ": request ring full (", ring_tail_ - std::min(o.ring_head, ring_tail_),
          " of ", h_.ring_slots, " pending, ", n,
          " to post); the owner is behind or down — WaitForRingRoom, then retry"));
    }
  }
  // Every slot is written and its write-back started; one store fence then orders them all
  // (and every earlier store, the blocks' streaming stores included) before `commit`'s stores
  // and the host row that announces them. An owner that reads the row finds every slot it
  // announces in memory. A crash before the fence leaves slots that were never announced (a
  // rejoin announces the leading run of them it finds whole; no block of theirs was committed).
  for (std::uint64_t i = 0; i < n; ++i) {
    RequestSlot& slot = slots[i];
    slot.seq = ring_tail_ + 1 + i;
    slot.incarnation = incarnation_;
    SealLine(slot);
    const std::uint64_t off = RequestSlotOff(h_, host_, slot.seq);
    mem_.Write(off, &slot, sizeof(slot));
    mem_.Flush(off, sizeof(slot));
  }
  mem_.Fence();
  if (commit && !commit()) {
    return absl::AbortedError("publication abandoned by the caller before it was announced");
  }
  ring_tail_ += n;
  WriteHostRow();
  return absl::OkStatus();
}

namespace {
RequestSlot PublishSlot(Namespace ns, const PrefixKey& key, const PrefixKey& parent,
                        const BlockRef& ref) {
  RequestSlot s{};
  s.op = static_cast<std::uint32_t>(RequestOp::kPublish);
  s.ns = ns;
  s.key[0] = key.lo;
  s.key[1] = key.hi;
  s.parent[0] = parent.lo;
  s.parent[1] = parent.hi;
  s.ref = ref;
  return s;
}
}  // namespace

absl::Status PrefixHost::Publish(Namespace ns, const PrefixKey& key, const PrefixKey& parent,
                                 const BlockRef& ref, const std::function<bool()>& commit) {
  // No fence of its own for the block's bytes: the store fence after the request slot (in
  // PostRequests, before `commit` and before the host row that announces the slot) orders
  // every earlier store, streaming ones included, before the announcement. A slot that lands
  // without its block (a crash before that fence) is announced only by a later incarnation's
  // Rejoin, and the owner returns a stale incarnation's block instead of publishing it.
  RequestSlot s = PublishSlot(ns, key, parent, ref);
  return PostRequests(std::span(&s, 1), commit);
}

absl::Status PrefixHost::PublishChain(Namespace ns, std::span<const PublishItem> items,
                                      const std::function<bool()>& commit) {
  if (items.size() > h_.ring_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chain of ", items.size(), " blocks does not fit host ", host_,
                     "'s request ring of ", h_.ring_slots, " slots; publish it in parts"));
  }
  if (items.empty()) return absl::OkStatus();
  post_scratch_.clear();
  for (const PublishItem& it : items)
    post_scratch_.push_back(PublishSlot(ns, it.key, it.parent, it.ref));
  return PostRequests(post_scratch_, commit);
}

absl::Status PrefixHost::WaitForRingRoom(std::uint32_t slots, std::uint32_t timeout_ms) {
  if (slots > h_.ring_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("room for ", slots, " requests asked of a ring of ", h_.ring_slots, " slots"));
  }
  const std::int64_t start = clock_.NowMs();
  std::uint32_t pauses = 8;  // between polls while spinning: grows to kMaxPauses
  constexpr std::uint32_t kMaxPauses = 1024;
  for (;;) {
    if (RingRoom() >= slots) return absl::OkStatus();
    OwnerHostLine o{};
    if (ReadOwnerLine(&o)) {
      if (o.fenced_incarnation >= incarnation_) {
        return absl::AbortedError(absl::StrCat(
            "host ", host_, " was fenced; its ring is not drained — Heartbeat() rejoins it"));
      }
      if (RingRoom() >= slots) return absl::OkStatus();
    }
    if (clock_.NowMs() - start >= static_cast<std::int64_t>(timeout_ms)) {
      return absl::DeadlineExceededError(absl::StrCat("host ", host_, ": no room for ", slots,
                                                      " requests after ", timeout_ms,
                                                      " ms; the owner is behind or down"));
    }
    // Each poll is a load from shared memory (on CXL, from the device): spin a little between
    // them, longer each time, then let other threads run (on a shared core, the owner).
    if (pauses < kMaxPauses) {
      for (std::uint32_t i = 0; i < pauses; ++i) CpuRelax();
      pauses *= 2;
    } else {
      std::this_thread::yield();
    }
  }
}

std::uint64_t PrefixHost::RequestsPending(bool refresh) {
  if (refresh) {
    OwnerHostLine o{};
    (void)ReadOwnerLine(&o);
  }
  return ring_tail_ - std::min(owner_ring_head_, ring_tail_);
}

absl::Status PrefixHost::Retire(Namespace ns, const PrefixKey& key) {
  RequestSlot s{};
  s.op = static_cast<std::uint32_t>(RequestOp::kRetire);
  s.ns = ns;
  s.key[0] = key.lo;
  s.key[1] = key.hi;
  return PostRequests(std::span(&s, 1), {});
}

absl::Status PrefixHost::Heartbeat(std::vector<BlockRef>* returned) {
  // The caller has freed what the last call handed out: this call's row write (or the
  // rejoin's) acknowledges it.
  acked_head_ = handed_head_;
  const std::uint64_t pauses = pauses_;
  OwnerHostLine o{};
  const bool owner_ok = ReadOwnerLine(&o);
  if (owner_ok && o.fenced_incarnation >= incarnation_) {
    const std::uint64_t old = incarnation_;
    ++stats_.rejoins_after_fence;
    owner_silent_ = false;  // a new incarnation: its first beat is worth a wait
    if (auto st = Rejoin(); !st.ok()) return st;
    return absl::AbortedError(absl::StrCat("host ", host_, " was fenced as incarnation ", old,
                                           "; its leases are gone; rejoined as ", incarnation_));
  }
  // The owner's clock: if this host's clock stood still since the last acknowledgement, it
  // shows here even when no lease operation comes first.
  OwnerClockLine c;
  if (ReadShared(mem_, kOwnerClockOffset, &c) && StoodStill(c)) DropAfterPause();
  if (owner_ok) {
    while (return_head_ < o.return_tail) {
      ReturnSlot r;
      if (!ReadShared(mem_, ReturnSlotOff(h_, host_, return_head_ + 1), &r) ||
          r.seq != return_head_ + 1) {
        break;  // not visible yet
      }
      returned_.push_back(r.ref);
      ++return_head_;
    }
  }
  // Leases past their local deadline are dead: free their rows.
  const std::int64_t now = clock_.NowMs();
  for (std::uint32_t row = 0; row < rows_.size(); ++row) {
    if (rows_[row].id != 0 && now > rows_[row].deadline_ms) {
      ClearLeaseRow(row);
      ForgetRow(row);
    }
  }
  ++heartbeat_;
  WriteHostRow();
  if (returned != nullptr) {
    returned->insert(returned->end(), returned_.begin(), returned_.end());
    returned_.clear();
    handed_head_ = return_head_;
  }
  if (pauses_ != pauses) {
    return absl::AbortedError(
        absl::StrCat("host ", host_,
                     ": its clock stood still (a VM stop or suspend); its leases are gone; "
                     "leases again once this heartbeat is acknowledged"));
  }
  return absl::OkStatus();
}

std::int64_t PrefixHost::Deadline(std::int64_t now) const {
  return std::min(now + static_cast<std::int64_t>(h_.lease_ttl_ms - margin_ms_), alive_until_ms_);
}

}  // namespace cxlkv::coherence
