// PrefixOwner: the index's single writer and the domain's reclaimer (docs/coherence.md).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <set>
#include <tuple>

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

EntryState StateOf(const IndexEntry& e) { return static_cast<EntryState>(e.state); }

// Changes whenever any field of the row changes (every host write changes one).
std::uint64_t RowStamp(const HostRow& r) { return (r.incarnation << 32) ^ r.crc ^ r.heartbeat; }

}  // namespace

std::size_t PrefixOwner::ArenaHash::operator()(const ArenaId& a) const {
  std::uint64_t x, y;
  std::memcpy(&x, a.data(), 8);
  std::memcpy(&y, a.data() + 8, 8);
  return static_cast<std::size_t>((x * 31 + y) * 0x9E3779B97F4A7C15ull);
}

namespace {
PrefixOwner::ArenaId ArenaOf(const BlockRef& r) {
  PrefixOwner::ArenaId a;
  std::memcpy(a.data(), r.arena, a.size());
  return a;
}

std::uint64_t RefHash(const BlockRef& r) {
  std::uint64_t a, b;
  std::memcpy(&a, r.arena, 8);
  std::memcpy(&b, r.arena + 8, 8);
  const std::uint64_t x = (a * 31 + b) ^ (std::uint64_t{r.index} << 32 | r.generation);
  return (x ^ (x >> 29)) * 0xBF58476D1CE4E5B9ull;
}

// One byte of (ns, key): FindKey reads an entry's line only when its tag matches.
std::uint8_t KeyTag(Namespace ns, const PrefixKey& key) {
  return static_cast<std::uint8_t>(((key.hi ^ key.lo ^ ns) * 0x9E3779B97F4A7C15ull) >> 56);
}

constexpr std::uint32_t kChunkEntries = 4096;  // Open reads the index in chunks of this many

// A line never written (all zero bytes): LineValid's answer too, found without the CRC.
bool AllZero(const IndexEntry& e) {
  std::uint64_t w[sizeof(IndexEntry) / 8];
  std::memcpy(w, &e, sizeof(w));
  std::uint64_t any = 0;
  for (std::uint64_t x : w) any |= x;
  return any == 0;
}
}  // namespace

IndexEntry PrefixOwner::ReadEntry(std::uint32_t i) const {
  // The owner's own line, flushed when written: its cache or memory holds what it wrote (no
  // other host writes the index), so neither an invalidate nor a CRC check is needed.
  IndexEntry e;
  mem_.Read(EntryOff(h_, i), &e, sizeof(e));
  return e;
}

IndexEntry PrefixOwner::entry(std::uint32_t i) const {
  IndexEntry e = ReadEntry(i);
  // What this owner decides on (it wrote these; a line re-read from memory only repeats them).
  e.state = flags_[i] & kStateMask;
  e.entry_gen = gen_[i];
  e.publisher = publisher_[i];
  return e;
}

std::size_t PrefixOwner::bookkeeping_bytes() const {
  return flags_.capacity() + tags_.capacity() + publisher_.capacity() + fanout_.capacity() +
         gen_.capacity() * sizeof(gen_[0]) + retired_at_.capacity() * sizeof(retired_at_[0]) +
         score_.capacity() * sizeof(score_[0]) + named_.capacity() * sizeof(named_[0]) +
         probe_len_.capacity() * sizeof(probe_len_[0]);
}

std::uint32_t PrefixOwner::NamedHome(const BlockRef& ref) const {
  return static_cast<std::uint32_t>(RefHash(ref) >> 32) &
         static_cast<std::uint32_t>(named_.size() - 1);
}

bool PrefixOwner::IsNamed(const BlockRef& ref) const {
  const auto mask = static_cast<std::uint32_t>(named_.size() - 1);
  for (std::uint32_t s = NamedHome(ref);; s = (s + 1) & mask) {
    const std::uint32_t v = named_[s];
    if (v == 0) return false;
    if (ReadEntry(v - 1).ref == ref) return true;
  }
}

void PrefixOwner::NameAt(std::uint32_t i, std::uint32_t home) {
  // At most index_entries values in 2 × index_entries slots: an empty slot is always found.
  const auto mask = static_cast<std::uint32_t>(named_.size() - 1);
  std::uint32_t s = home;
  while (named_[s] != 0) s = (s + 1) & mask;
  named_[s] = i + 1;
}

void PrefixOwner::Name(std::uint32_t i, const BlockRef& ref) {
  NameAt(i, NamedHome(ref));
  if (!Own(i)) ++arena_refs_[ArenaOf(ref)];  // a region ref names no arena
}

void PrefixOwner::Unname(std::uint32_t i, const BlockRef& ref) {
  const auto mask = static_cast<std::uint32_t>(named_.size() - 1);
  std::uint32_t s = NamedHome(ref);
  while (named_[s] != i + 1) {
    if (named_[s] == 0) return;  // not named
    s = (s + 1) & mask;
  }
  // Backward-shift deletion: each later value of the run whose home is not in (hole, its
  // slot] moves into the hole, so every value stays reachable from its home without
  // tombstones. Homes come from the refs of named entries, which stay in the index as long
  // as they are named.
  std::uint32_t hole = s;
  for (std::uint32_t t = (s + 1) & mask; named_[t] != 0; t = (t + 1) & mask) {
    const std::uint32_t home = NamedHome(ReadEntry(named_[t] - 1).ref);
    if (((t - home) & mask) >= ((t - hole) & mask)) {
      named_[hole] = named_[t];
      hole = t;
    }
  }
  named_[hole] = 0;
  if (Own(i)) return;
  auto it = arena_refs_.find(ArenaOf(ref));
  if (it != arena_refs_.end() && --it->second == 0) arena_refs_.erase(it);
}

bool PrefixOwner::Revoked(const BlockRef& ref) const {
  return !revoked_.empty() && revoked_.count(ArenaOf(ref)) != 0;
}

std::uint32_t PrefixOwner::RevokeArena(ArenaId arena) {
  revoked_.insert(arena);
  if (arena_refs_.count(arena) == 0) return 0;
  std::uint32_t retired = 0;
  for (std::uint32_t i = 0; i < h_.index_entries; ++i) {
    if (entry_state(i) == EntryState::kPublished && !Own(i) && ArenaOf(ReadEntry(i).ref) == arena) {
      RetireEntry(i);
      ++retired;
    }
  }
  return retired;
}

std::uint32_t PrefixOwner::EntriesNaming(const ArenaId& arena) const {
  auto it = arena_refs_.find(arena);
  return (it == arena_refs_.end() ? 0 : it->second) + quarantined_count_;
}

PrefixOwner::PrefixOwner(Mem& mem, Clock& clock, const DomainHeader& h, const Options& o)
    : mem_(mem), clock_(clock), h_(h), options_(o) {}

absl::StatusOr<std::unique_ptr<PrefixOwner>> PrefixOwner::Open(Mem& mem, Clock& clock,
                                                               const Options& options) {
  auto h = ReadDomainHeader(mem);
  if (!h.ok()) return h.status();
  std::unique_ptr<PrefixOwner> o(new PrefixOwner(mem, clock, *h, options));
  // A clock id of its own: hosts never compare this owner's clock with an earlier owner's.
  OwnerClockLine last{};
  if (!ReadShared(mem, kOwnerClockOffset, &last)) last = OwnerClockLine{};
  o->clock_id_ = last.clock_id + 1 == 0 ? 1 : last.clock_id + 1;
  o->clock_seq_ = last.seq;
  const std::int64_t now = clock.NowMs();
  o->opened_ms_ = now;
  const std::uint32_t n = h->index_entries;
  o->flags_.assign(n, 0);
  o->tags_.assign(n, 0);
  o->publisher_.assign(n, 0);
  o->fanout_.assign(n, 0);
  o->probe_len_.assign(n, 1);
  o->gen_.assign(n, 0);
  o->retired_at_.assign(n, 0);
  o->score_.assign(n, 0.0f);
  o->named_.assign(std::size_t{n} * 2, 0);
  o->owner_lines_.resize(h->max_hosts);
  // A line that never validates was torn by a previous owner that died writing it (the owner
  // is the only writer of these lines). It is repaired, conservatively, instead of refusing
  // the domain for good: see Quarantine and RebuildOwnerLine.
  //
  // The index is read a chunk at a time: every line of the chunk is evicted, one full fence,
  // then each line is read once and its CRC checked — the same fresh read as ReadShared's
  // first attempt, without a fence per line. Only a line that fails its check gets
  // ReadShared's retries (a torn write still in flight) before it is quarantined. The blocks
  // of a chunk are named after it is read, their table slots prefetched meanwhile (one miss
  // per block, overlapped), and counted by arena with the last arena remembered.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> to_name;  // (entry, home slot)
  to_name.reserve(kChunkEntries);
  ArenaId last_arena{};
  std::uint32_t last_count = 0;
  auto count_arena = [&](const BlockRef& ref) {
    const ArenaId a = ArenaOf(ref);
    if (last_count != 0 && a == last_arena) {
      ++last_count;
      return;
    }
    if (last_count != 0) o->arena_refs_[last_arena] += last_count;
    last_arena = a;
    last_count = 1;
  };
  for (std::uint32_t first = 0; first < n; first += kChunkEntries) {
    const std::uint32_t count = std::min(kChunkEntries, n - first);
    mem.Evict(EntryOff(*h, first), std::size_t{count} * sizeof(IndexEntry));
    mem.FullFence();
    for (std::uint32_t i = first; i < first + count; ++i) {
      IndexEntry e;
      mem.Read(EntryOff(*h, i), &e, sizeof(e));
      if (AllZero(e)) continue;  // never written: empty, generation 0 (what the arrays hold)
      if (!LineValid(e) && !ReadShared(mem, EntryOff(*h, i), &e)) {
        o->Quarantine(i, e.entry_gen, now);
        continue;
      }
      const EntryState s = StateOf(e);
      o->flags_[i] = static_cast<std::uint8_t>(s);
      o->gen_[i] = e.entry_gen;
      o->publisher_[i] = e.publisher;
      if (s != EntryState::kPublished && s != EntryState::kRetired) continue;
      o->tags_[i] = KeyTag(e.ns, PrefixKey{e.key[0], e.key[1]});
      const bool named = s == EntryState::kPublished || e.publisher != kQuarantined;
      if (named) {
        // The probe length its home needs (0: past what the field holds, probe to EMPTY).
        const std::uint32_t key_home = o->HomeOf(e);
        std::uint16_t& need = o->probe_len_[key_home];
        const std::uint32_t len = ((i - key_home) & (n - 1)) + 1;
        if (need != 0) need = len > 0xFFFF ? 0 : std::max(need, static_cast<std::uint16_t>(len));
        const std::uint32_t home = o->NamedHome(e.ref);
        __builtin_prefetch(&o->named_[home], 1);
        to_name.emplace_back(i, home);
        if (e.publisher != kOwnerPublisher) count_arena(e.ref);
      }
      if (s == EntryState::kPublished) {
        ++o->published_count_;
        continue;
      }
      // After a restart every retired entry waits a full grace period again (conservative).
      o->retired_at_[i] = 0;  // RelativeMs(now)
      ++o->retired_count_;
      if (!named) {
        o->flags_[i] |= kQuarantinedF;
        ++o->quarantined_count_;  // quarantined by an earlier owner: its block is unknown
      }
    }
    for (const auto& [i, home] : to_name) o->NameAt(i, home);
    to_name.clear();
  }
  if (last_count != 0) o->arena_refs_[last_arena] += last_count;
  // Probe lengths (probe_len_, from the keyed entries above; a domain written before they
  // existed has 0, "unknown", on every line): every non-empty line whose length differs is
  // rewritten. A longer one covers what a reader must probe; a shorter one only drops slots
  // holding none of its keys. An EMPTY line is no key's home (every slot from a published
  // entry's home to it is non-empty) and a reader stops at it whatever its length says.
  for (std::uint32_t i = 0; i < n; ++i) {
    if (o->entry_state(i) != EntryState::kEmpty && o->ReadEntry(i).probe_len != o->probe_len_[i]) {
      o->WriteEntry(i, o->entry(i));
    }
  }
  for (std::uint32_t host = 0; host < h->max_hosts; ++host) {
    if (!ReadShared(mem, OwnerLineOff(*h, host), &o->owner_lines_[host])) {
      o->RebuildOwnerLine(host);
    }
  }
  // Timers start now: a host or lease looks alive for a full TTL after an owner restart.
  o->heartbeats_.assign(h->max_hosts, TimedValue{~0ull, now});
  o->lease_seqs_.assign(std::size_t{h->max_hosts} * h->lease_rows, TimedValue{~0ull, now});
  o->WriteClockLine();
  return o;
}

void PrefixOwner::Quarantine(std::uint32_t i, std::uint32_t torn_gen, std::int64_t now) {
  // The entry's last write never completed: what memory holds mixes its old and new versions
  // (one generation apart). Hosts skip it (its CRC fails), but a lease taken before the tear
  // may still be in use, on a block nobody can name now. So the entry becomes retired, with
  // no key and no block, at a generation above both versions: it is freed like any retired
  // entry once no lease row names it, without a return, and its block leaks.
  IndexEntry q{};
  q.entry_gen = torn_gen + 2;
  q.state = static_cast<std::uint8_t>(EntryState::kRetired);
  q.publisher = kQuarantined;
  WriteEntry(i, q);
  flags_[i] |= kQuarantinedF;
  fanout_[i] = 0;
  score_[i] = 0;
  retired_at_[i] = RelativeMs(now);
  ++retired_count_;
  ++quarantined_count_;
  ++stats_.quarantined;
}

void PrefixOwner::RebuildOwnerLine(std::uint32_t host) {
  // From the host's own lines, conservatively. Its current incarnation stays live (older ones
  // fenced). Requests it had pending are dropped, not replayed: which of them were applied is
  // unknown, and a replay could publish a block already returned and reused; their blocks
  // leak. Returns go on after the highest one its return ring holds (the host may get some
  // twice; its generation-checked free ignores the second). Acknowledgements start afresh.
  HostRow row{};
  const bool row_ok = ReadShared(mem_, HostRowOff(h_, host), &row);
  std::uint64_t ring_head = row_ok ? row.ring_tail : 0;
  std::uint64_t return_tail = row_ok ? row.return_head : 0;
  for (std::uint64_t seq = 1; seq <= h_.ring_slots; ++seq) {
    RequestSlot r;
    if (!row_ok && ReadShared(mem_, RequestSlotOff(h_, host, seq), &r)) {
      ring_head = std::max(ring_head, r.seq);
    }
    ReturnSlot back;
    if (ReadShared(mem_, ReturnSlotOff(h_, host, seq), &back)) {
      return_tail = std::max(return_tail, back.seq);
    }
  }
  OwnerHostLine l{};
  l.fenced_incarnation = row_ok && row.incarnation > 0 ? row.incarnation - 1 : 0;
  l.ring_head = ring_head;
  l.return_tail = return_tail;
  owner_lines_[host] = l;
  WriteOwnerLine(host);
  ++stats_.owner_lines_rebuilt;
}

void PrefixOwner::WriteEntry(std::uint32_t i, const IndexEntry& e) {
  // The state, generation and publisher kept here are what the owner decides on; the flags
  // that are not the state (leased, quarantined, grace over) are the callers'.
  flags_[i] = static_cast<std::uint8_t>((flags_[i] & ~kStateMask) | (e.state & kStateMask));
  gen_[i] = e.entry_gen;
  publisher_[i] = e.publisher;
  IndexEntry line = e;
  line.probe_len = probe_len_[i];
  if (!batch_writes_) {
    WriteShared(mem_, EntryOff(h_, i), line);
    return;
  }
  // In a batch (ApplyRequests): stored and its write-back started; the batch's one fence,
  // before its owner line, completes it. A host that looks meanwhile sees the old entry or
  // the new one (the CRC tells a half-written line, which it reads again).
  SealLine(line);
  mem_.Write(EntryOff(h_, i), &line, sizeof(IndexEntry));
  mem_.Flush(EntryOff(h_, i), sizeof(IndexEntry));
  unfenced_writes_ = true;
}

std::uint32_t PrefixOwner::HomeOf(const IndexEntry& e) const {
  return internal::ProbeStart(h_, e.ns, PrefixKey{e.key[0], e.key[1]});
}

void PrefixOwner::CoverSlot(std::uint32_t home, std::uint32_t slot) {
  const std::uint32_t len = ((slot - home) & (h_.index_entries - 1)) + 1;
  std::uint16_t& cur = probe_len_[home];
  if (cur == 0 || len <= cur) return;  // 0: unknown, readers probe to an EMPTY entry
  cur = len > 0xFFFF ? 0 : static_cast<std::uint16_t>(len);
  // The home line reaches memory (flush, store fence) before the caller stores the entry at
  // `slot`: a reader that sees the entry there may see the old length (and miss it, as if it
  // had looked a moment earlier), never a length that leaves out an entry it already sees,
  // and a crash never leaves the entry in memory without the length that covers it. Inside a
  // batch (batch_writes_) WriteEntry only stores and flushes, so the sfence is here: clwb's of
  // two lines are not ordered with each other (audit-ha #9; docs/coherence.md "Probe
  // lengths"). It costs one sfence per publish that lengthens a probe run, not per publish.
  if (home == slot) return;
  WriteEntry(home, entry(home));
  if (batch_writes_) mem_.Fence();
}

void PrefixOwner::TrimProbeLen(std::uint32_t home) {
  const std::uint32_t mask = h_.index_entries - 1;
  const std::uint32_t cur = probe_len_[home];
  std::uint32_t len = 1;
  for (std::uint32_t d = 0; d < (cur == 0 ? h_.index_entries : cur); ++d) {
    const std::uint32_t q = (home + d) & mask;
    const EntryState s = entry_state(q);
    if (cur == 0 && s == EntryState::kEmpty) break;
    if ((s == EntryState::kPublished || s == EntryState::kRetired) && !IsQuarantined(q) &&
        HomeOf(ReadEntry(q)) == home) {
      len = d + 1;
    }
  }
  if (len > 0xFFFF || len == cur) return;
  // Written after the entry that needed the longer length is gone: a reader with the old
  // length probes a few slots more, nothing else.
  probe_len_[home] = static_cast<std::uint16_t>(len);
  WriteEntry(home, entry(home));
}

void PrefixOwner::WriteClockLine() {
  OwnerClockLine c{};
  c.seq = ++clock_seq_;
  c.owner_ms = clock_.NowMs();  // read before the write: no reading is ahead of this clock
  c.clock_id = clock_id_;
  WriteShared(mem_, kOwnerClockOffset, c);
}

void PrefixOwner::WriteOwnerLine(std::uint32_t host) {
  OwnerHostLine& l = owner_lines_[host];
  ++l.owner_epoch;
  SealLine(l);
  WriteShared(mem_, OwnerLineOff(h_, host), l);
}

std::int64_t PrefixOwner::FindKey(Namespace ns, const PrefixKey& key, bool published_only) const {
  const std::uint32_t mask = h_.index_entries - 1;
  const std::uint32_t start = internal::ProbeStart(h_, ns, key);
  const std::uint8_t tag = KeyTag(ns, key);
  const std::uint32_t len = probe_len_[start] == 0 ? h_.index_entries : probe_len_[start];
  for (std::uint32_t p = 0; p < len; ++p) {
    const std::uint32_t i = (start + p) & mask;
    const EntryState s = entry_state(i);
    if (s == EntryState::kEmpty) return -1;
    if ((s == EntryState::kPublished || (!published_only && s == EntryState::kRetired)) &&
        tags_[i] == tag && !IsQuarantined(i) && internal::KeyMatches(ReadEntry(i), ns, key)) {
      return i;
    }
  }
  return -1;
}

std::int64_t PrefixOwner::FindFreeSlot(Namespace ns, const PrefixKey& key) const {
  const std::uint32_t mask = h_.index_entries - 1;
  const std::uint32_t start = internal::ProbeStart(h_, ns, key);
  for (std::uint32_t p = 0; p < h_.index_entries; ++p) {
    const EntryState s = entry_state((start + p) & mask);
    if (s == EntryState::kEmpty || s == EntryState::kTombstone) return (start + p) & mask;
  }
  return -1;
}

bool PrefixOwner::HostLive(std::uint32_t host, HostRow* row) {
  return ReadShared(mem_, HostRowOff(h_, host), row) && Live(host, *row);
}

void PrefixOwner::Step() {
  ApplyRequests();
  FenceExpiredHosts();
  // Evicting turns published entries into retired ones, which keep their index slots until
  // their grace has passed and they are reclaimed: it lowers the load only once those are
  // freed. So the published entries beyond max_load are evicted, once; the retired ones are
  // already on their way out (counting them evicted another excess at every step until the
  // reclaim, down to nothing published).
  const auto limit = static_cast<std::uint32_t>(options_.max_load * h_.index_entries);
  if (published_count_ > limit) Evict(published_count_ - limit);
  Reclaim();
}

std::uint32_t PrefixOwner::ApplyRequests() {
  std::uint32_t applied = 0;
  for (std::uint32_t host = 0; host < h_.max_hosts; ++host) {
    HostRow row;
    if (!HostLive(host, &row)) continue;  // fenced hosts' requests are ignored
    OwnerHostLine& l = owner_lines_[host];
    std::uint64_t head = l.ring_head;
    if (row.ring_tail < head) head = row.ring_tail;  // rejoined: nothing pending
    const std::uint64_t tail = std::min<std::uint64_t>(row.ring_tail, head + h_.ring_slots);
    const std::uint64_t return_tail = l.return_tail;
    // Every announced slot is read in one pass: all evicted, one full fence (their loads
    // stay behind it, and behind the host row's read), then read. A slot that does not
    // validate (torn, or half written back) is read again alone; one that still shows an
    // older sequence is not visible yet and waits for the next round with those after it.
    if (head < tail) {
      for (std::uint64_t seq = head + 1; seq <= tail; ++seq) {
        mem_.Evict(RequestSlotOff(h_, host, seq), sizeof(RequestSlot));
      }
      mem_.FullFence();
      // Read-ahead: each slot's key, unvalidated, only to start the loads of the slots and of
      // their home entries' bookkeeping together (no iteration depends on
      // another, so the misses overlap) instead of one after the other in the loop below.
      for (std::uint64_t seq = head + 1; seq <= tail; ++seq) {
        static_assert(offsetof(RequestSlot, ns) == 16 && offsetof(RequestSlot, key) == 24);
        std::uint64_t ahead[5];  // seq, incarnation, ns, key[0], key[1]
        mem_.Read(RequestSlotOff(h_, host, seq), ahead, sizeof(ahead));
        const std::uint32_t home =
            internal::ProbeStart(h_, ahead[2], PrefixKey{ahead[3], ahead[4]});
        __builtin_prefetch(&flags_[home]);
        __builtin_prefetch(&tags_[home]);
        __builtin_prefetch(&probe_len_[home]);
      }
    }
    // The index entries this batch writes are stored and flushed one by one, and fenced once,
    // before the owner line that consumes their requests (WriteEntry, batch_writes_).
    batch_writes_ = true;
    while (head < tail) {
      // A request may hand its block back: it is consumed only while the return ring has
      // room, so that the return is in shared memory before the request is acknowledged —
      // a crash of the owner in between replays the request, it never drops the block.
      if (ReturnRoom(host, row) == 0) break;
      RequestSlot r;
      const std::uint64_t off = RequestSlotOff(h_, host, head + 1);
      mem_.Read(off, &r, sizeof(r));
      if ((!LineValid(r) && !ReadShared(mem_, off, &r)) || r.seq != head + 1) {
        break;  // not visible yet: next round
      }
      if (r.incarnation == row.incarnation) {
        Apply(host, r);
      } else {
        // A late request of a fenced or crashed incarnation is not applied; its block goes
        // back so that nothing leaks — unless the index names it (an owner that died after
        // applying the request, before its owner line said so, did publish it: handing it
        // back would let the publisher reuse a published block), or its arena is revoked.
        ++stats_.rejected;
        if (r.op == static_cast<std::uint32_t>(RequestOp::kPublish) && !IsNamed(r.ref) &&
            !Revoked(r.ref)) {
          ReturnBlock(host, r.ref);
        }
      }
      ++head;
      ++applied;
    }
    batch_writes_ = false;
    if (head != l.ring_head || return_tail != l.return_tail) {
      // The batch's entries reach memory before the owner line that says their requests
      // were consumed: an owner that dies between the two leaves requests that the next one
      // applies again (finding the entries there), never consumed requests without entries.
      if (unfenced_writes_) mem_.Fence();
      unfenced_writes_ = false;
      l.ring_head = head;
      WriteOwnerLine(host);
    }
  }
  stats_.requests_applied += applied;
  return applied;
}

void PrefixOwner::Apply(std::uint32_t host, const RequestSlot& r) {
  const PrefixKey key{r.key[0], r.key[1]};
  if (r.ns == 0 || (key.lo == 0 && key.hi == 0)) {
    ++stats_.rejected;
    return;
  }
  if (r.op == static_cast<std::uint32_t>(RequestOp::kRetire)) {
    const std::int64_t i = FindKey(r.ns, key, true);
    if (i < 0 || publisher_[static_cast<std::uint32_t>(i)] != host) {
      ++stats_.rejected;  // only the publisher retires its entry
      return;
    }
    RetireEntry(static_cast<std::uint32_t>(i));
    return;
  }
  if (r.op != static_cast<std::uint32_t>(RequestOp::kPublish)) {
    ++stats_.rejected;
    return;
  }
  // A block may be named by one entry only: a second entry would hand it out twice.
#ifndef CXLKV_FAULT_NO_DUP_REF_CHECK  // defined only by a fault-injection test build
  if (IsNamed(r.ref)) {
    ++stats_.rejected;
    return;
  }
#endif
  // A block of a revoked arena: its memory is going back to the pool, nothing to return to.
  // A region ref: only the owner publishes those (PublishOwn); a host's would let readers
  // take a range of the owner's region for its object.
  if (Revoked(r.ref) || AsRegionObject(r.ref).has_value()) {
    ++stats_.rejected;
    return;
  }
  if (FindKey(r.ns, key, true) >= 0) {
    ++stats_.duplicates;  // someone published this prefix first: the copy goes back
    ReturnBlock(host, r.ref);
    return;
  }
  if (!InsertEntry(r.ns, key, PrefixKey{r.parent[0], r.parent[1]}, r.ref,
                   static_cast<std::uint8_t>(host))) {
    ++stats_.rejected;  // index full even after eviction: the block goes back
    ReturnBlock(host, r.ref);
  }
}

bool PrefixOwner::InsertEntry(Namespace ns, const PrefixKey& key, const PrefixKey& parent_key,
                              const BlockRef& ref, std::uint8_t publisher) {
  const std::int64_t slot = FindFreeSlot(ns, key);
  if (slot < 0) return false;
  const auto i = static_cast<std::uint32_t>(slot);
  IndexEntry e{};
  e.key[0] = key.lo;
  e.key[1] = key.hi;
  e.ns = ns;
  e.ref = ref;
  e.entry_gen = gen_[i] + 1;
  e.state = static_cast<std::uint8_t>(EntryState::kPublished);
  e.publisher = publisher;
  flags_[i] = 0;  // not leased, not quarantined; WriteEntry sets the state
  fanout_[i] = 0;
  score_[i] = 0;
  retired_at_[i] = 0;
  tags_[i] = KeyTag(ns, key);
  CoverSlot(internal::ProbeStart(h_, ns, key), i);
  WriteEntry(i, e);
  Name(i, ref);
  ++published_count_;
  ++stats_.published;
  if (!published_under_pin_.empty()) {
    auto pinned = published_under_pin_.find(ns);
    ++(pinned != published_under_pin_.end() ? pinned->second : published_under_others_);
  }
  const std::int64_t parent = FindKey(ns, parent_key, true);
  if (parent >= 0 && fanout_[static_cast<std::uint32_t>(parent)] < 0xFF) {
    ++fanout_[static_cast<std::uint32_t>(parent)];
  }
  return true;
}

absl::Status PrefixOwner::PublishOwn(Namespace ns, const PrefixKey& key, const BlockRef& ref) {
  if (h_.max_hosts > kOwnerPublisher) {
    return absl::FailedPreconditionError(
        "the domain was formatted for 255 hosts, so every publisher id is a host's and the "
        "owner cannot publish entries of its own: format it with max_hosts 254 or fewer");
  }
  if (ns == 0 || (key.lo == 0 && key.hi == 0)) {
    return absl::InvalidArgumentError("an own entry needs a non-zero namespace and key");
  }
  if (!AsRegionObject(ref).has_value()) {
    return absl::InvalidArgumentError("an own entry names a region object (a region ref)");
  }
  if (IsNamed(ref)) {
    return absl::InvalidArgumentError("the region ref is already named by an index entry");
  }
  if (FindKey(ns, key, true) >= 0) {
    return absl::AlreadyExistsError("the key is published in this namespace");
  }
  // Stored, flushed and fenced before this returns (not a batch): a host that looks after
  // the call finds the entry.
  if (!InsertEntry(ns, key, PrefixKey{}, ref, kOwnerPublisher)) {
    return absl::ResourceExhaustedError("the prefix index has no free entry");
  }
  ++stats_.own_published;
  return absl::OkStatus();
}

std::vector<BlockRef> PrefixOwner::TakeReclaimedOwn() {
  std::vector<BlockRef> out;
  out.swap(reclaimed_own_);
  return out;
}

std::vector<PrefixOwner::OwnEntry> PrefixOwner::OwnEntries() const {
  std::vector<OwnEntry> out;
  for (std::uint32_t i = 0; i < h_.index_entries; ++i) {
    const EntryState s = entry_state(i);
    if ((s != EntryState::kPublished && s != EntryState::kRetired) || !Own(i) || IsQuarantined(i)) {
      continue;
    }
    const IndexEntry e = ReadEntry(i);
    out.push_back(
        OwnEntry{e.ns, PrefixKey{e.key[0], e.key[1]}, e.ref, s == EntryState::kPublished});
  }
  return out;
}

void PrefixOwner::RetireEntry(std::uint32_t i) {
  IndexEntry e = ReadEntry(i);
  e.state = static_cast<std::uint8_t>(EntryState::kRetired);
  e.entry_gen = gen_[i] + 1;
  e.publisher = publisher_[i];
  // The lease scan that follows (after grace) must not load a row before this store is
  // visible (rule 4): its first read is an Invalidate, whose mfence keeps it behind.
  WriteEntry(i, e);
  flags_[i] &= static_cast<std::uint8_t>(~kGraceOver);
  retired_at_[i] = RelativeMs(clock_.NowMs());
  --published_count_;
  ++retired_count_;
  ++stats_.retired;
}

absl::Status PrefixOwner::RetireKey(Namespace ns, const PrefixKey& key) {
  const std::int64_t i = FindKey(ns, key, true);
  if (i < 0) return absl::NotFoundError("no published entry for this key in this namespace");
  RetireEntry(static_cast<std::uint32_t>(i));
  return absl::OkStatus();
}

std::uint32_t PrefixOwner::RetireNamespace(Namespace ns) {
  std::uint32_t n = 0;
  for (std::uint32_t i = 0; i < h_.index_entries; ++i) {
    if (entry_state(i) == EntryState::kPublished && ReadEntry(i).ns == ns) {
      RetireEntry(i);
      ++n;
    }
  }
  return n;
}

std::uint32_t PrefixOwner::FenceExpiredHosts() {
  WriteClockLine();
  std::uint32_t fenced = 0;
  for (std::uint32_t host = 0; host < h_.max_hosts; ++host) {
    // The clock is read on both sides of the row. A change is timed by the reading after it
    // (the beat was sent before that), "unchanged for host_ttl" by the reading before it (the
    // row was still unchanged when read, after that). Timing a change by a reading taken
    // before the row was read let an owner stall in between count against the host.
    const std::int64_t before = clock_.NowMs();
    HostRow row;
    if (!HostLive(host, &row)) continue;
    const std::int64_t after = clock_.NowMs();
    TimedValue& hb = heartbeats_[host];
    const std::uint64_t stamp = RowStamp(row);
    if (stamp != hb.value) {
      hb = TimedValue{stamp, after};
      OwnerHostLine& l = owner_lines_[host];
      if (l.acked_incarnation != row.incarnation || l.acked_heartbeat != row.heartbeat) {
        l.acked_incarnation = row.incarnation;
        l.acked_heartbeat = row.heartbeat;
        l.acked_at_ms = after;
        l.clock_id = clock_id_;
        WriteOwnerLine(host);
      }
    } else if (before - hb.changed_at_ms > static_cast<std::int64_t>(h_.host_ttl_ms)) {
      owner_lines_[host].fenced_incarnation = row.incarnation;
      WriteOwnerLine(host);
      ++fenced;
      ++stats_.hosts_fenced;
    }
  }
  return fenced;
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> PrefixOwner::ScanLeases() {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> held;
  for (float& score : score_) score *= 0.9f;
  for (std::uint8_t& f : flags_) f &= static_cast<std::uint8_t>(~kLeased);
  scan_rows_.resize(h_.lease_rows);
  scan_torn_.resize(h_.lease_rows);
  for (std::uint32_t host = 0; host < h_.max_hosts; ++host) {
    // Clock readings on both sides of the rows, as in FenceExpiredHosts: a change is timed by
    // the reading after the rows were read, expiry judged by the reading before.
    const std::int64_t before = clock_.NowMs();
    HostRow row;
    const bool row_readable = ReadShared(mem_, HostRowOff(h_, host), &row);
    // A torn host row (its writer died mid-line) hides which incarnation is current. Skipping
    // the host then freed blocks under its valid leases; instead every held, fresh row of an
    // incarnation not fenced counts — a superset of what the row would let count.
    if (row_readable && !Live(host, row)) continue;
    const std::uint64_t fenced = owner_lines_[host].fenced_incarnation;
    const std::uint64_t base = LeaseRowOff(h_, host, 0);
    mem_.Invalidate(base, std::uint64_t{h_.lease_rows} * sizeof(LeaseRow));
    for (std::uint32_t r = 0; r < h_.lease_rows; ++r) {
      LeaseRow& lr = scan_rows_[r];
      mem_.Read(base + std::uint64_t{r} * sizeof(LeaseRow), &lr, sizeof(lr));
      scan_torn_[r] = !LineValid(lr) && !ReadShared(mem_, LeaseRowOff(h_, host, r), &lr);
    }
    const std::int64_t after = clock_.NowMs();
    for (std::uint32_t r = 0; r < h_.lease_rows; ++r) {
      const LeaseRow& lr = scan_rows_[r];
      if (scan_torn_[r]) {
        // Torn for good: we cannot tell what it holds, so nothing may be freed this round.
        held.emplace_back(~0u, ~0u);
        continue;
      }
      TimedValue& tv = lease_seqs_[std::size_t{host} * h_.lease_rows + r];
      // lease_seq restarts with every incarnation of the host: the stamp must change with
      // any write of the row, so it includes the row's CRC (incarnation, entry, gen, held).
      const std::uint64_t stamp = (std::uint64_t{lr.crc} << 32) ^ lr.lease_seq;
      if (stamp != tv.value) tv = TimedValue{stamp, after};
      if (lr.held == 0) continue;
      if (row_readable ? lr.incarnation != row.incarnation : lr.incarnation <= fenced) continue;
      if (before - tv.changed_at_ms > static_cast<std::int64_t>(h_.lease_ttl_ms)) {
        ++stats_.leases_expired;  // counted each scan it stays expired
        continue;
      }
      if (lr.entry >= h_.index_entries) {
        held.emplace_back(lr.entry, lr.entry_gen);
        continue;
      }
      flags_[lr.entry] |= kLeased;
      score_[lr.entry] += 1.0f;
      // Only a retired entry's leases can keep anything from being freed (Reclaim frees
      // retired entries only, and nothing changes their states between this scan and its
      // checks): the rest are not kept, so the list sorted below is the few that matter, not
      // every lease of every host (the sort was most of a scan of many held rows).
      if (entry_state(lr.entry) == EntryState::kRetired) held.emplace_back(lr.entry, lr.entry_gen);
    }
  }
  std::sort(held.begin(), held.end());
  return held;
}

std::uint32_t PrefixOwner::Reclaim() {
  // Nothing retired, nothing to free: no pass over the index (Step runs this every round, and
  // a pass over a large index costs more than the round's requests).
  if (retired_count_ == 0) return 0;
  const std::int64_t now = clock_.NowMs();
  // An entry is due once its grace has passed and its publisher's return ring has room for
  // it: the block goes into that ring, and the owner line announcing it is written, before
  // the entry becomes a tombstone. An entry whose publisher's ring is full stays retired —
  // the index is where a return waits, so an owner restart loses none (a crash between the
  // two writes returns a block twice; the publisher's generation-checked free ignores the
  // second). Waiting entries cost no lease scan.
  const std::uint32_t now_rel = RelativeMs(now);
  std::vector<std::uint32_t> due;
  std::vector<std::int64_t> room(h_.max_hosts, -1);  // -1: row not read yet
  for (std::uint32_t i = 0; i < h_.index_entries; ++i) {
    if (entry_state(i) != EntryState::kRetired) continue;
    if ((flags_[i] & kGraceOver) == 0) {
      if (now_rel - retired_at_[i] < h_.grace_ms) continue;
      flags_[i] |= kGraceOver;  // from now on it stays due, however long it waits for room
    }
    // Reclaimed without a return, so no ring room needed: entries of a revoked arena, and
    // quarantined ones (their block is unknown).
    // Own entries go back to the owner's process (TakeReclaimedOwn), not to a host's ring.
    if (IsQuarantined(i) || Own(i) || (!revoked_.empty() && Revoked(ReadEntry(i).ref))) {
      due.push_back(i);
      continue;
    }
    const std::uint32_t host = publisher_[i];
    if (host >= h_.max_hosts) continue;
    if (room[host] < 0) {
      HostRow row{};
      if (!ReadShared(mem_, HostRowOff(h_, host), &row)) row = HostRow{};
      room[host] = ReturnRoom(host, row);
    }
    if (room[host] == 0) {
      ++stats_.returns_waiting;
      continue;
    }
    due.push_back(i);
  }
  if (due.empty()) return 0;
  const auto held = ScanLeases();
  if (!held.empty() && held.back().first == ~0u) return 0;  // an unreadable row: wait
  std::vector<std::uint32_t> free_now;
  std::vector<std::uint8_t> touched(h_.max_hosts, 0);
  for (std::uint32_t i : due) {
    const bool quarantined = IsQuarantined(i);
    if (quarantined) {
      // Leases on it name the generation it had before the tear, which is unknown: any held
      // row on the entry keeps it.
      const auto it = std::lower_bound(held.begin(), held.end(), std::make_pair(i, 0u));
      if (it != held.end() && it->first == i) continue;
    } else {
      const std::uint32_t leased_gen = gen_[i] - 1;  // the generation readers leased
      if (std::binary_search(held.begin(), held.end(), std::make_pair(i, leased_gen))) continue;
    }
    if (quarantined) {
      free_now.push_back(i);
      continue;
    }
    const BlockRef ref = ReadEntry(i).ref;
    if (Own(i)) {
      reclaimed_own_.push_back(ref);
      ++stats_.own_reclaimed;
    } else if (!Revoked(ref)) {
      const std::uint8_t publisher = publisher_[i];
      if (room[publisher] == 0) {
        ++stats_.returns_waiting;
        continue;
      }
      --room[publisher];
      ReturnBlock(publisher, ref);
      touched[publisher] = 1;
    }
    free_now.push_back(i);
  }
  for (std::uint32_t host = 0; host < h_.max_hosts; ++host) {
    if (touched[host]) WriteOwnerLine(host);
  }
  for (std::uint32_t i : free_now) {
    IndexEntry e = ReadEntry(i);
    if (IsQuarantined(i)) {
      --quarantined_count_;
    } else {
      Unname(i, e.ref);
    }
    --retired_count_;
    const bool keyed = !IsQuarantined(i);
    const std::uint32_t home = keyed ? HomeOf(e) : 0;
    e.state = static_cast<std::uint8_t>(EntryState::kTombstone);
    e.entry_gen = gen_[i] + 1;
    e.publisher = publisher_[i];
    flags_[i] = 0;
    WriteEntry(i, e);
    if (keyed) TrimProbeLen(home);
    ++stats_.reclaimed;
  }
  for (std::uint32_t i : free_now) ClearTombstones(i);
  return static_cast<std::uint32_t>(free_now.size());
}

bool PrefixOwner::OnAProbePath(std::uint32_t i) const {
  // Entry i lies on the probe sequence of a published entry at q when that entry's probe
  // start is at or before i (cyclically) and q after it. Such entries are in i's cluster:
  // the run of non-empty entries after i.
  const std::uint32_t mask = h_.index_entries - 1;
  for (std::uint32_t d = 1; d < h_.index_entries; ++d) {
    const std::uint32_t q = (i + d) & mask;
    const EntryState s = entry_state(q);
    if (s == EntryState::kEmpty) return false;
    if (s != EntryState::kPublished) continue;
    const IndexEntry e = ReadEntry(q);
    const std::uint32_t home = internal::ProbeStart(h_, e.ns, PrefixKey{e.key[0], e.key[1]});
    if (((q - home) & mask) >= d) return true;
  }
  return false;
}

void PrefixOwner::ClearTombstones(std::uint32_t i) {
  // A tombstone no published entry's probe sequence passes holds no chain together: it
  // becomes EMPTY, so that lookups of absent keys stop there instead of probing on. Hosts
  // find only published entries, and every entry between a published entry's probe start and
  // itself stays non-empty for as long as it is published (docs/coherence.md). Then the
  // tombstones just before it, each now followed by an EMPTY entry.
  const std::uint32_t mask = h_.index_entries - 1;
  for (std::uint32_t n = 0; n < h_.index_entries; ++n, i = (i - 1) & mask) {
    if (entry_state(i) != EntryState::kTombstone || OnAProbePath(i)) return;
    IndexEntry e{};
    e.entry_gen = gen_[i] + 1;  // generations only grow: no stale hit matches again
    e.state = static_cast<std::uint8_t>(EntryState::kEmpty);
    WriteEntry(i, e);
  }
}

std::uint32_t PrefixOwner::Evict(std::uint32_t n) {
  if (n == 0) return 0;
  ScanLeases();  // fresh `leased` marks and scores
  // The n lowest (level, score, entry) among unleased published entries: a max-heap of at
  // most n candidates, so the scan holds O(n) memory, not a candidate for every entry.
  using Candidate = std::tuple<int, double, std::uint32_t>;
  std::vector<Candidate> heap;
  for (std::uint32_t i = 0; i < h_.index_entries; ++i) {
    if (entry_state(i) != EntryState::kPublished || (flags_[i] & kLeased) != 0) continue;
    int level = 0;
    if (!pin_.empty()) {
      auto pin = pin_.find(ReadEntry(i).ns);
      if (pin != pin_.end()) level = pin->second;
    }
    const double score = double{score_[i]} + options_.fanout_weight * fanout_[i];
    const Candidate c(level, score, i);
    if (heap.size() < n) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end());
    } else if (c < heap.front()) {
      std::pop_heap(heap.begin(), heap.end());
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end());
    }
  }
  std::sort_heap(heap.begin(), heap.end());
  for (const auto& [level, score, i] : heap) {
    RetireEntry(i);
    ++stats_.evicted;
  }
  return static_cast<std::uint32_t>(heap.size());
}

std::uint32_t PrefixOwner::ReturnRoom(std::uint32_t host, const HostRow& row) const {
  const OwnerHostLine& l = owner_lines_[host];
  const std::uint64_t queued = l.return_tail - std::min(row.return_head, l.return_tail);
  return queued >= h_.ring_slots ? 0 : static_cast<std::uint32_t>(h_.ring_slots - queued);
}

void PrefixOwner::ReturnBlock(std::uint32_t host, const BlockRef& ref) {
  if (host >= h_.max_hosts) return;
  OwnerHostLine& l = owner_lines_[host];
  ReturnSlot s{};
  s.seq = l.return_tail + 1;
  s.ref = ref;
  WriteShared(mem_, ReturnSlotOff(h_, host, s.seq), s);
  ++l.return_tail;
}

}  // namespace cxlkv::coherence
