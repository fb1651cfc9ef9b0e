// cxlkv/coherence/prefix.h — shared prefix blocks across the hosts of a CXL domain.
//
// The protocol of docs/coherence.md: a shared prefix index with one writer (PrefixOwner, the
// domain's reclaimer), hosts (PrefixHost) that look blocks up without writing, take leases
// in rows only they write, and post publish/retire requests to their own ring. Blocks are
// values (BlockRef); the owner hands a reclaimed block back to its publisher through the
// publisher's return ring, and the publisher frees it in its own arena.
//
// Every shared access goes through a Mem (mem.h), so the same code runs on a mapping and on
// the non-coherent simulator (sim.h). PrefixHost and PrefixOwner are not thread-safe: one
// thread drives each (a process or a simulated host). Any number of hosts and one owner may
// run at once, in any processes, on any hosts mapping the region.
#ifndef CXLKV_COHERENCE_PREFIX_H_
#define CXLKV_COHERENCE_PREFIX_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/coherence/mem.h"

namespace cxlkv::coherence {

// ---- keys (the types: key.h) -----------------------------------------------------------------

Namespace MakeNamespace(absl::string_view tenant, absl::string_view model,
                        absl::string_view kv_layout);

// XXH3-128 of (namespace, parent key, token ids of this block). The first block of a
// sequence chains from the all-zero key.
PrefixKey ChainKey(Namespace ns, const PrefixKey& parent, std::span<const std::uint32_t> tokens);

// ---- region objects -------------------------------------------------------------------------
//
// An object the owner's process keeps in a region of the pool outside every host's arena (the
// LMCache coordinator's region, docs/lmcache.md "Keys in the domain's index") and publishes in
// the index itself (PrefixOwner::PublishOwn). Its BlockRef is a *region ref*, 24 bytes read as:
//   arena[0..6)   offset in the region, 48-bit little-endian
//   arena[6]      0xE0: the mark (an arena id is an RFC 4122 version-4 UUID: 0x4? there)
//   arena[7]      0
//   arena[8..16)  the object's 64-bit generation, little-endian
//   index         length in bytes
//   generation    the region's tag (the owner's process picks it: LMCache's, CRC32C of
//                 region_id), so a reader checks the ref names the region it mapped
// Hosts never publish one (the owner rejects the request), so a region ref in the index is the
// owner's. A lease on its entry keeps the range from reuse exactly as for an arena block.
struct RegionObject {
  std::uint64_t offset = 0;      // < 2^48
  std::uint64_t length = 0;      // 1 .. 2^32 - 1
  std::uint64_t generation = 0;  // != 0
  std::uint32_t region_tag = 0;
  bool operator==(const RegionObject&) const = default;
};
// kInvalidArgument naming the field out of range.
absl::StatusOr<BlockRef> RegionRef(const RegionObject& o);
// nullopt unless `ref` is a region ref.
std::optional<RegionObject> AsRegionObject(const BlockRef& ref);

// ---- domain geometry ------------------------------------------------------------------------

struct DomainGeometry {
  std::uint32_t max_hosts = 8;
  std::uint32_t index_entries = 4096;  // rounded up to a power of two
  std::uint32_t lease_rows = 256;      // per host: leases one host may hold at once
  std::uint32_t ring_slots = 64;       // per host: requests in flight
  std::uint32_t lease_ttl_ms = 2000;
  std::uint32_t host_ttl_ms = 2000;
  std::uint32_t grace_ms = 100;
};

// Bytes a domain of this geometry needs.
std::uint64_t DomainBytes(const DomainGeometry& g);
// Writes a fresh domain (all tables empty) at offset 0 of mem. Owner role, once.
absl::Status FormatDomain(Mem& mem, const DomainGeometry& g);
// Reads and validates the header (kNotFound: no domain; kDataLoss: corrupt).
absl::StatusOr<DomainHeader> ReadDomainHeader(Mem& mem);

// The domain's publish secret (DomainKeyLine) as its text form, 64 lowercase hex digits; ""
// while the domain has none. kDataLoss when the line stays torn (its writer died writing it:
// the owner writes a new one with CreateDomainKey). Any role may read it.
absl::StatusOr<std::string> ReadDomainKey(Mem& mem);
// The owner, when ReadDomainKey found none (or a torn line): a new secret from getrandom,
// sealed, stored, flushed and fenced, then read back (kUnavailable when the store did not
// land: a fenced view that dropped it). Returns its text form.
absl::StatusOr<std::string> CreateDomainKey(Mem& mem, std::int64_t now_ms);

// ---- hosts ----------------------------------------------------------------------------------

struct Hit {
  std::uint32_t entry = 0;
  std::uint32_t entry_gen = 0;
  BlockRef ref{};
  std::uint32_t publisher = 0;
};

struct Lease {
  std::uint32_t row = 0;
  std::uint32_t entry = 0;
  std::uint32_t entry_gen = 0;
  BlockRef ref{};
  std::int64_t deadline_ms = 0;  // on this host's clock; the data may not be used after it
  std::uint64_t id = 0;          // which acquisition: a stale copy of a released lease whose
                                 // row was reused never releases or renews the new one
};

// One block of a chain publish (PrefixHost::PublishChain).
struct PublishItem {
  PrefixKey key;
  PrefixKey parent;  // the key this one chains on (all-zero for a sequence's first block)
  BlockRef ref;
};

class PrefixHost {
 public:
  struct Options {
    // Safety margin under lease_ttl for the local deadline (clock-rate drift between hosts).
    std::uint32_t margin_ms = 0;  // 0: lease_ttl / 4
    // How far this host's clock may fall behind the owner's, beyond rate drift, before the
    // host takes it for a pause (a stop of its clock) and drops its leases.
    std::uint32_t pause_tolerance_ms = 0;  // 0: margin / 2
    // How long an acquire (or ReadLeased) that finds no acknowledged heartbeat recent enough
    // waits for the owner to acknowledge a fresh one before it gives up with kUnavailable,
    // polling the owner's line (docs/coherence.md, "Busy hosts"). A host that was
    // descheduled, stopped or fenced then leases again in one owner round instead of failing
    // until its next periodic heartbeat. It waits only while the owner acknowledged a beat in
    // the last host_ttl (an owner that is down costs no wait). 0: no wait (the simulator,
    // whose owner runs in the same thread). Processes on real memory pass kRealAckWaitMs.
    std::uint32_t ack_wait_ms = 0;
  };
  // The ack wait of hosts on real memory: one heartbeat period of the default timing.
  static constexpr std::uint32_t kRealAckWaitMs = 250;

  // What this host met that a busy or stopped machine causes, counted since it joined
  // (every incarnation): what an operator reads to see that sharing suffers, and why.
  struct Stats {
    std::uint64_t leases_refused_late = 0;      // no acknowledged heartbeat recent enough
    std::uint64_t leases_renewed_for_copy = 0;  // ReadLeased renewed so the lease lasts a copy
    std::uint64_t leases_retaken = 0;           // ReadLeased took an expired lease again
    std::uint64_t copies_retried = 0;           // the lease expired during a copy: copied again
    std::uint64_t copies_discarded = 0;     // copies that did not validate (ReadLeased, CopyOut)
    std::uint64_t pauses_detected = 0;      // this host's clock stood still: leases dropped
    std::uint64_t rejoins_after_fence = 0;  // the owner fenced this host (it stopped beating)
    std::uint64_t ack_waits = 0;            // acquires that waited for an acknowledgement
  };

  // Joins the domain as host `host_id` with a new incarnation: clears this host's lease
  // rows, drops requests the owner never applied, and collects nothing yet.
  static absl::StatusOr<std::unique_ptr<PrefixHost>> Join(Mem& mem, Clock& clock,
                                                          std::uint32_t host_id,
                                                          const Options& options);
  static absl::StatusOr<std::unique_ptr<PrefixHost>> Join(Mem& mem, Clock& clock,
                                                          std::uint32_t host_id) {
    return Join(mem, clock, host_id, Options{});
  }

  // Finds a published block; writes nothing and takes no lease.
  std::optional<Hit> Lookup(Namespace ns, const PrefixKey& key);
  // Takes a lease: writes this host's lease row, then re-validates the entry.
  // kNotFound: retired meanwhile; kResourceExhausted: no free lease row;
  // kAborted: this host was fenced (it rejoined; take the lease again), or its clock stood
  // still (its leases are dropped; take the lease again);
  // kUnavailable: the owner has not acknowledged a recent heartbeat of this host (it is
  // down or behind), or this host's clock stood still just now, so no lease can be
  // promised; retry after Heartbeat().
  absl::StatusOr<Lease> Acquire(const Hit& hit);
  // Lookup + Acquire; kNotFound on a miss.
  absl::StatusOr<Lease> LookupAndAcquire(Namespace ns, const PrefixKey& key);
  // Leases a request's prefix in one pass. keys[0..n) are the blocks of one prefix in
  // order (each key chained on the one before, as ChainKey builds them); the longest leading
  // run of published keys is leased. The lookups' evictions, the lease rows' flushes and the
  // re-validations each share one fence instead of one per block, so a chain costs far less
  // per block than Lookup + Acquire one by one. Appends the leases to `out` in key order and
  // returns how many leading keys are leased (0: the first key misses). The run also ends
  // at a key retired between lookup and lease, or when lease rows run out (kResourceExhausted
  // only if not even the first can be leased). kAborted / kUnavailable as Acquire.
  absl::StatusOr<std::size_t> AcquireChain(Namespace ns, std::span<const PrefixKey> keys,
                                           std::vector<Lease>* out);
  // Extends the lease. kDeadlineExceeded if it already expired locally, if it expired while
  // the renewal was being written (a stall: the owner may have reclaimed the block), if the
  // entry no longer holds the leased generation (reclaimed), or if this host's clock stood
  // still (every lease is dropped then); either way the lease is released: acquire again.
  absl::Status Renew(Lease& lease);
  void Release(Lease& lease);
  // Releases several leases: every row cleared (streaming stores), then one store fence.
  void ReleaseAll(std::span<Lease> leases);
  // After copying the block out: OK only if this host still holds the lease, it is still
  // valid on this host's clock, and the entry still names this generation (else discard the
  // copy).
  absl::Status ValidateAfterCopy(const Lease& lease);
  // The read step of a leased block, written once for every caller (the C API, tools,
  // benchmarks, the simulator): invalidate the block's range (another host wrote it: every
  // line must come from memory, not from this host's cache), copy it to dst, then
  // ValidateAfterCopy. OK: dst holds the published bytes. Otherwise dst must be discarded
  // (the status as ValidateAfterCopy's). `src` is where the block's bytes are mapped in this
  // process; the second form reads them through a Mem view at `offset` (the simulator).
  absl::Status CopyOut(const Lease& lease, const void* src, void* dst, std::size_t len);
  absl::Status CopyOut(const Lease& lease, Mem& block_mem, std::uint64_t offset, void* dst,
                       std::size_t len);
  // The read a serving host uses: CopyOut that keeps working on a busy host. Before each
  // part of the copy (parts of at most kReadPartBytes) the lease must last that part at the
  // slowest copy rate this host has measured plus a slack; if it would not, the lease is
  // renewed first (after a fresh acknowledged heartbeat when the host's liveness credit is
  // short too). A lease that expired anyway (the host was descheduled or stopped during the
  // copy) is taken again on the same entry and generation — if the entry still publishes
  // them — and the block copied again, up to kReadAttempts times. `lease` is updated in place
  // (deadline; row and id when taken again): release it as usual afterwards. OK: dst holds
  // the published bytes. kAborted/kNotFound: the block was retired or reclaimed (a real miss:
  // discard dst); kDeadlineExceeded/kUnavailable: the host could not keep a lease (the owner
  // is down, or every attempt expired) — discard dst. Never honours a lease past its
  // deadline: every copy that counts was validated under a lease that held (ValidateAfterCopy).
  absl::Status ReadLeased(Lease& lease, const void* src, void* dst, std::size_t len);
  absl::Status ReadLeased(Lease& lease, Mem& block_mem, std::uint64_t offset, void* dst,
                          std::size_t len);
  static constexpr std::size_t kReadPartBytes = 4u << 20;
  static constexpr std::uint32_t kReadAttempts = 3;

  // Asks the owner to publish a block this host wrote (and will not modify again).
  // kUnavailable: the request ring is full (the owner is behind or down); retry later.
  // `commit`, when given, runs after the request is durable in the ring and before it is
  // announced: make the block outlive this process there (e.g. Persist it in the arena).
  // A crash on either side of it leaks nothing: a rejoining host announces a request it
  // wrote but did not announce, and the owner returns the blocks of requests from an old
  // incarnation instead of applying them. If `commit` returns false nothing is announced.
  absl::Status Publish(Namespace ns, const PrefixKey& key, const PrefixKey& parent,
                       const BlockRef& ref, const std::function<bool()>& commit = {});
  // Publishes several blocks (typically one request's new prefix blocks, in chain order) in
  // one ring transaction: every request slot is written and flushed, one store fence, then
  // `commit` (once, for all of them), then one host-row write announces them all. The owner
  // sees all of them or none. All or nothing here too: kUnavailable, with nothing written,
  // when the ring has no room for every item (WaitForRingRoom(items.size()), then retry);
  // kInvalidArgument when there are more items than the ring has slots (split the chain).
  // An empty span is OK and posts nothing. Crashes leak nothing, as for Publish: a crash
  // before the fence leaves no committed block; after it every slot is in memory, and a
  // rejoining host announces them all (the owner returns a stale incarnation's blocks).
  // Cost: one fence and one host-row write for the chain instead of one each per block.
  absl::Status PublishChain(Namespace ns, std::span<const PublishItem> items,
                            const std::function<bool()>& commit = {});
  absl::Status Retire(Namespace ns, const PrefixKey& key);
  // Waits until this host's request ring has room for `slots` more requests. Hosts are other
  // machines than the owner, so nothing local can signal: it polls the owner's line for this
  // host in shared memory (an Invalidate and a load a poll), spinning with a growing pause
  // between polls at first, then yielding the CPU between them (an owner on the same core
  // gets to run). kDeadlineExceeded after `timeout_ms` on this host's clock (at least one
  // poll is made; the clock must advance for a timeout to end a wait); kAborted if the line
  // shows this host fenced (Heartbeat() rejoins it; its ring is never drained till then);
  // kInvalidArgument for more slots than the ring has.
  absl::Status WaitForRingRoom(std::uint32_t slots, std::uint32_t timeout_ms);
  // Requests posted and not yet consumed by the owner, as this host last saw its line
  // (reading the line again when `refresh`).
  std::uint64_t RequestsPending(bool refresh);

  // Bumps the heartbeat, collects blocks the owner returned (appended to `returned`, or
  // kept for the next call when it is null), frees rows of locally expired leases, and
  // checks for fencing: kAborted when this host was fenced — it has dropped every lease and
  // rejoined with a new incarnation — or when it found that its clock stood still (a VM
  // stop, a suspend): it has dropped every lease, and takes leases again once the owner
  // acknowledges a heartbeat sent after that (docs/coherence.md, "Paused hosts"). Call it
  // at least every host_ttl / 4.
  // Returned blocks must be freed before the next call, which acknowledges them to the
  // owner; a process that dies in between gets them again after it joins (at-least-once
  // delivery: free by ref, whose generation check ignores a second delivery).
  absl::Status Heartbeat(std::vector<BlockRef>* returned);

  std::uint32_t host_id() const { return host_; }
  std::uint64_t incarnation() const { return incarnation_; }
  const DomainHeader& header() const { return h_; }
  std::size_t leases_held() const { return held_; }
  // Heartbeats sent and remembered (with their send times) until the owner acknowledges one.
  std::size_t unacked_heartbeats() const { return sent_beats_.size(); }
  // Times this host found that its clock stood still and dropped its leases.
  std::uint64_t pauses_detected() const { return pauses_; }
  Stats stats() const {
    Stats s = stats_;
    s.pauses_detected = pauses_;
    return s;
  }

 private:
  PrefixHost(Mem& mem, Clock& clock, const DomainHeader& h, std::uint32_t host,
             std::uint32_t margin_ms, std::uint32_t pause_tolerance_ms, std::uint32_t ack_wait_ms);
  absl::Status Rejoin();
  bool ReadEntry(std::uint32_t i, IndexEntry* e);
  // Probes for keys[0..k) together and returns the length of the leading run found: for
  // i below it, chain_entries_[i] is the slot and chain_read_[i] the entry as read.
  std::size_t ProbeRun(Namespace ns, std::span<const PrefixKey> keys);
  bool ReadOwnerLine(OwnerHostLine* o);
  // Re-reads an entry after this host's lease row write, and the owner's clock line with it
  // (evictions of both, one fence). False if the entry never validated; a clock line that
  // does not validate reads as never written.
  bool ReadEntryAndClock(std::uint32_t i, IndexEntry* e, OwnerClockLine* c);
  // Pause detection (docs/coherence.md, "Paused hosts"). `owner_ms` is a reading of the
  // owner's clock `clock_id` that was taken before it was read here, at `host_ms` (a host
  // clock reading taken after). True if this host's clock fell behind the owner's by more
  // than the tolerance and rate drift since the last acknowledgement bounded their offset.
  bool StoodStill(std::int64_t owner_ms, std::uint32_t clock_id, std::int64_t host_ms) const;
  bool StoodStill(const OwnerClockLine& c) {
    return StoodStill(c.owner_ms, c.clock_id, clock_.NowMs());
  }
  // An acknowledgement of a beat sent at host time `sent_ms`, taken at owner time
  // `acked_at_ms`: the owner's clock minus ours was at most their difference then.
  void NoteOffsetBound(std::int64_t acked_at_ms, std::uint32_t clock_id, std::int64_t sent_ms);
  // After a pause: every lease and the liveness credit were counted on a clock that lost
  // time. Drops them all; leases again once a heartbeat sent from now on is acknowledged.
  void DropAfterPause();
  // Clears a row: streaming store, store fence (the row is in memory on return).
  void ClearLeaseRow(std::uint32_t row);
  // The row's streaming store, no fence (ClearLeaseRow and the callers that batch fence).
  void StoreLeaseRow(std::uint32_t row, std::uint32_t entry, std::uint32_t gen, bool held);
  // kUnavailable unless an acknowledged heartbeat covers now (beats once to get one, and
  // waits up to ack_wait_ms for its acknowledgement). `now_ms`: this host's clock as last
  // read here.
  absl::Status EnsureAlive(std::int64_t* now_ms);
  // Beats (unless the caller just did) and waits (up to ack_wait_ms, polling the owner's
  // line) until the liveness credit reaches `until_ms` on this host's clock. False if not.
  bool BeatUntilAlive(std::int64_t until_ms, bool beat = true);
  // ReadLeased's steps: make `lease` last `need_ms` more (renew, or take it again), and the
  // copy time expected for `len` bytes at the slowest rate measured.
  absl::Status KeepLease(Lease& lease, std::int64_t need_ms);
  std::int64_t ExpectedCopyMs(std::size_t len) const;
  void NoteCopy(std::size_t len, std::int64_t ms);
  absl::Status ReadLeasedParts(Lease& lease, std::size_t len,
                               const std::function<void(std::size_t off, std::size_t n)>& read);
  bool Holds(const Lease& lease) const {
    return lease.row < rows_.size() && rows_[lease.row].id != 0 && rows_[lease.row].id == lease.id;
  }
  void ForgetRow(std::uint32_t row);
  void WriteHostRow();
  // Posts slots[0..n) as one transaction: each slot written and flushed, one store fence,
  // `commit`, the ring tail moved past all of them in one host-row write.
  absl::Status PostRequests(std::span<RequestSlot> slots, const std::function<bool()>& commit);
  // Free request slots as far as this host knows (from owner_ring_head_, a lower bound on
  // what the owner has consumed).
  std::uint64_t RingRoom() const {
    return h_.ring_slots - std::min<std::uint64_t>(
                               h_.ring_slots, ring_tail_ - std::min(owner_ring_head_, ring_tail_));
  }
  // A lease taken at `now` ends at min(now + lease_ttl, alive_until) - margin.
  std::int64_t Deadline(std::int64_t now) const;

  Mem& mem_;
  Clock& clock_;
  DomainHeader h_;
  std::uint32_t host_;
  std::uint32_t margin_ms_;
  std::uint32_t pause_tolerance_ms_;
  std::uint32_t ack_wait_ms_;
  Stats stats_;
  // This host's clock when it last saw a new acknowledgement (the owner was acking then).
  std::int64_t last_ack_seen_ms_ = 0;
  bool owner_silent_ = false;  // a whole ack wait passed without an acknowledgement
  // Copy rates measured by ReadLeased (bytes per ms, copies of at least a millisecond): the
  // slowest of the last few decides how long a lease must last before a copy.
  std::array<std::uint64_t, 16> copy_rates_{};
  std::size_t copy_rate_next_ = 0;
  std::uint64_t incarnation_ = 0;
  std::uint64_t heartbeat_ = 0;
  std::uint64_t ring_tail_ = 0;
  // The owner's ring_head for this host as last read from its line: the owner never moves it
  // back, so room computed from it is never more than there is, and a post that fits needs
  // no read of the line.
  std::uint64_t owner_ring_head_ = 0;
  std::vector<RequestSlot> post_scratch_;  // PublishChain's slots
  // Returns: read up to return_head_; handed to the caller up to handed_head_; acknowledged
  // to the owner (the host row) up to acked_head_ — one heartbeat after they were handed
  // out, when the caller has freed them (delivery is at least once).
  std::uint64_t return_head_ = 0;
  std::uint64_t handed_head_ = 0;
  std::uint64_t acked_head_ = 0;
  bool attached_ = false;  // Rejoin has run once in this process
  std::uint64_t lease_seq_ = 0;
  // CRCs of this incarnation's lease row with lease_seq, entry and gen zero, not held [0] and
  // held [1] (StoreLeaseRow reseals from them).
  std::uint64_t row_crc_incarnation_ = 0;
  bool row_crc_ready_ = false;
  std::uint32_t row_crc_base_[2] = {};
  // This host cannot be fenced before this time (from heartbeats the owner acknowledged).
  std::int64_t alive_until_ms_ = 0;
  std::vector<std::pair<std::uint64_t, std::int64_t>> sent_beats_;  // heartbeat, local send time
  // `read_ms`: this host's clock, read after the line was.
  void NoteOwnerLine(const OwnerHostLine& o, std::int64_t read_ms);
  // The least upper bound known on (owner's clock - this host's clock) at host time
  // offset_at_ms_, on the owner clock offset_clock_ (valid when offset_known_).
  bool offset_known_ = false;
  std::uint32_t offset_clock_ = 0;
  std::int64_t offset_bound_ms_ = 0;
  std::int64_t offset_at_ms_ = 0;
  std::uint64_t pauses_ = 0;
  std::vector<BlockRef> returned_;  // returned blocks not yet handed to the caller
  std::vector<std::uint32_t> free_rows_;
  std::vector<Lease> rows_;  // by row; id 0: the row is free
  std::size_t held_ = 0;
  std::vector<std::uint32_t> chain_entries_;  // AcquireChain's scratch
  std::vector<IndexEntry> chain_read_;
  std::vector<std::uint32_t> chain_next_;   // ProbeRun's next probe of each key
  std::vector<std::uint32_t> chain_bound_;  // ... and how far its probe goes (probe_len)
  std::vector<IndexEntry> chain_lines_;     // the lines one round loads, before they are checked
  std::vector<std::uint64_t> preload_;      // offsets of the lines a fence's Reads will load
};

// ---- the owner (reclaimer) ------------------------------------------------------------------

class PrefixOwner {
 public:
  struct Options {
    // Evict (once) the published entries beyond this fraction of the index entries; retired
    // ones keep their slots until reclaimed and are not counted again.
    double max_load = 0.75;
    // Weight of fan-out (children published under an entry) against recent lease takes.
    double fanout_weight = 4.0;
  };
  struct Stats {
    std::uint64_t requests_applied = 0;
    std::uint64_t published = 0;
    std::uint64_t duplicates = 0;  // publish of a key already present: block returned
    std::uint64_t rejected = 0;    // malformed, foreign namespace or stale requests
    std::uint64_t retired = 0;
    std::uint64_t reclaimed = 0;
    std::uint64_t evicted = 0;
    std::uint64_t hosts_fenced = 0;
    std::uint64_t leases_expired = 0;
    std::uint64_t returns_waiting = 0;  // reclaims deferred: the publisher's return ring was full
    // Found by Open: index entries that never validated (a torn owner write). Each is
    // quarantined — kept retired until no lease can name it, then freed without a return —
    // and its block, which nobody can name any more, is leaked.
    std::uint64_t quarantined = 0;
    std::uint64_t own_published = 0;  // PublishOwn's entries
    std::uint64_t own_reclaimed = 0;  // ... handed back through TakeReclaimedOwn
    // Found by Open: owner lines that never validated, rebuilt from the host's own lines.
    // Requests the host had pending then are dropped (their blocks leak).
    std::uint64_t owner_lines_rebuilt = 0;
  };

  static absl::StatusOr<std::unique_ptr<PrefixOwner>> Open(Mem& mem, Clock& clock,
                                                           const Options& options);
  static absl::StatusOr<std::unique_ptr<PrefixOwner>> Open(Mem& mem, Clock& clock) {
    return Open(mem, clock, Options{});
  }

  // One round of everything below. Cheap when nothing changed.
  void Step();
  // Applies the hosts' publish/retire requests. Returns how many.
  std::uint32_t ApplyRequests();
  // Fences hosts whose heartbeat did not change for host_ttl on this clock.
  std::uint32_t FenceExpiredHosts();
  // Frees retired entries older than grace that no live, unexpired lease names.
  std::uint32_t Reclaim();
  // Retires up to n unleased published entries, lowest score first (soft-pinned last).
  std::uint32_t Evict(std::uint32_t n);
  // Retires the entry of (ns, key) if published. kNotFound otherwise.
  absl::Status RetireKey(Namespace ns, const PrefixKey& key);

  // Publishes an entry of the owner's own (publisher kOwnerPublisher) for a region object:
  // `ref` a region ref (RegionRef). Hosts find and lease it like any entry; the owner's
  // process retires it with RetireKey (or the owner evicts it under pressure), and once it is
  // reclaimed — no lease names it and none can again — its ref is handed back through
  // TakeReclaimedOwn, never through a host's ring: only then may the range be reused.
  // kAlreadyExists: the key is published; kResourceExhausted: no free index slot;
  // kInvalidArgument: not a region ref, a zero namespace or key, or the ref already named;
  // kFailedPrecondition: a domain of 255 hosts (kOwnerPublisher would be a host id).
  absl::Status PublishOwn(Namespace ns, const PrefixKey& key, const BlockRef& ref);
  // Refs of own entries reclaimed since the last call, oldest first.
  std::vector<BlockRef> TakeReclaimedOwn();
  // The own entries in the index, published or retired (not yet reclaimed): what a restarted
  // owner's process reconciles its objects with (after Open they are what the index holds).
  struct OwnEntry {
    Namespace ns = 0;
    PrefixKey key;
    BlockRef ref{};
    bool published = false;
  };
  std::vector<OwnEntry> OwnEntries() const;
  // Retires every published entry of a namespace (an operator's evict). Returns how many.
  std::uint32_t RetireNamespace(Namespace ns);
  // Entry i as the owner last wrote it (read back from the shared index: the owner keeps no
  // copy of the index, see "The owner's memory" in docs/orchestrator.md). i < index_entries.
  IndexEntry entry(std::uint32_t i) const;
  EntryState entry_state(std::uint32_t i) const {
    return static_cast<EntryState>(flags_[i] & kStateMask);
  }
  // Private memory the owner holds for its index entries (capacity of every per-entry table):
  // about kBookkeepingBytesPerEntry × index_entries, whatever the load.
  std::size_t bookkeeping_bytes() const;
  static constexpr std::size_t kBookkeepingBytesPerEntry = 26;
  std::uint32_t retired_entries() const { return retired_count_; }
  // Pin level of a namespace: entries of higher levels are evicted later (0 = none).
  void SetPinLevel(Namespace ns, int level) {
    pin_[ns] = level;
    published_under_pin_.try_emplace(ns, 0);
  }
  // Publications this owner applied since Open under a namespace given a pin level (0 for
  // one never given), and under every namespace never given one: a configured namespace that
  // matches nothing while others fill is a name that differs from the one the hosts build (a
  // `layout` typo), which the orchestrator reports. Counted only once a pin level was set.
  std::uint64_t published_under(Namespace ns) const {
    auto it = published_under_pin_.find(ns);
    return it == published_under_pin_.end() ? 0 : it->second;
  }
  std::uint64_t published_under_others() const { return published_under_others_; }

  // An arena's memory is going back to the pool (the capacity lease of the extent it lives
  // in ended, or its host gave the extent back). Retires every published entry naming one of
  // its blocks; from now on such entries are reclaimed without a return (there is no arena
  // left to free the block in, and a dead publisher's full return ring must not hold the
  // extent forever), and publishes of its blocks are rejected. Idempotent. Owner memory
  // only: after an owner restart it must be said again (the orchestrator keeps revoked
  // extents in its state file and does). Returns how many entries it retired now.
  using ArenaId = std::array<std::uint8_t, 16>;
  // By value: the retires below store to the domain, and whatever runs meanwhile (a caller's
  // fence hook) may change the container the caller's id came from.
  std::uint32_t RevokeArena(ArenaId arena);
  // Published and retired entries that still name a block of `arena`. Once this is 0 after
  // RevokeArena, no lease on a block of the arena is valid any more and its memory may be
  // lent again. Quarantined entries (Stats::quarantined) name a block nobody knows, which may
  // be in any arena: each counts for every arena until it is freed.
  std::uint32_t EntriesNaming(const ArenaId& arena) const;

  const Stats& stats() const { return stats_; }
  std::uint32_t published_entries() const { return published_count_; }
  const DomainHeader& header() const { return h_; }

 private:
  PrefixOwner(Mem& mem, Clock& clock, const DomainHeader& h, const Options& o);
  struct TimedValue {
    std::uint64_t value = ~0ull;
    std::int64_t changed_at_ms = 0;
  };
  // flags_[i]: the entry's state (EntryState, authoritative: the owner is the index's only
  // writer) and what the owner knows of it besides.
  static constexpr std::uint8_t kStateMask = 0x3;
  static constexpr std::uint8_t kLeased = 0x4;        // a live lease named it at the last scan
  static constexpr std::uint8_t kQuarantinedF = 0x8;  // retired by Open as torn (kQuarantined)
  static constexpr std::uint8_t kGraceOver = 0x10;    // retired for grace_ms or more
  // Writes entry i, with slot i's probe length (probe_len_) stamped on it.
  void WriteEntry(std::uint32_t i, const IndexEntry& e);
  // Reads entry i back from the shared index (the owner's own line: no invalidate, no CRC).
  IndexEntry ReadEntry(std::uint32_t i) const;
  // The probe start of a published or retired entry's key.
  std::uint32_t HomeOf(const IndexEntry& e) const;
  // Raises home's probe length to cover `slot`, writing the home line if it changed; called
  // before the entry at `slot` is written, so no reader sees the entry outside the length.
  void CoverSlot(std::uint32_t home, std::uint32_t slot);
  // Recomputes home's probe length after an entry starting there left, lowering it (and
  // writing the home line) to what the entries still there need.
  void TrimProbeLen(std::uint32_t home);
  void WriteOwnerLine(std::uint32_t host);
  // Publishes the owner's clock (OwnerClockLine) for hosts to notice their own stopping.
  void WriteClockLine();
  // Open's repairs of lines a dead owner left torn (Stats::quarantined, owner_lines_rebuilt).
  void Quarantine(std::uint32_t i, std::uint32_t torn_gen, std::int64_t now);
  void RebuildOwnerLine(std::uint32_t host);
  bool IsQuarantined(std::uint32_t i) const { return (flags_[i] & kQuarantinedF) != 0; }
  // Frees tombstone i — and the tombstones just before it — back to EMPTY where no published
  // entry's probe sequence passes it (docs/coherence.md, "Index entries and their states").
  void ClearTombstones(std::uint32_t i);
  bool OnAProbePath(std::uint32_t i) const;
  std::int64_t FindKey(Namespace ns, const PrefixKey& key, bool published_only) const;
  std::int64_t FindFreeSlot(Namespace ns, const PrefixKey& key) const;
  void Apply(std::uint32_t host, const RequestSlot& r);
  // Writes a published entry for (ns, key) at a free slot: Apply's publish and PublishOwn's.
  // False when the index has no free slot.
  bool InsertEntry(Namespace ns, const PrefixKey& key, const PrefixKey& parent, const BlockRef& ref,
                   std::uint8_t publisher);
  bool Own(std::uint32_t i) const { return publisher_[i] == kOwnerPublisher; }
  void RetireEntry(std::uint32_t i);
  // Free slots in `host`'s return ring as its row (`row`, read earlier) last showed them.
  std::uint32_t ReturnRoom(std::uint32_t host, const HostRow& row) const;
  // Writes a return slot (the caller checked ReturnRoom and writes the owner line after).
  void ReturnBlock(std::uint32_t host, const BlockRef& ref);
  bool HostLive(std::uint32_t host, HostRow* row);
  bool Live(std::uint32_t host, const HostRow& row) const {
    return row.incarnation != 0 && row.incarnation > owner_lines_[host].fenced_incarnation;
  }
  // Scans every live lease row: marks leased entries (and scores them), returns the (entry,
  // gen) pairs held on retired entries, sorted — plus rows naming no entry, (~0u, ~0u) for a
  // row that stays torn.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ScanLeases();
  // Milliseconds since this owner opened (retired_at_), wrapping after 49 days: an entry is
  // timed only until kGraceOver is set, and a wrap can only make it wait longer.
  std::uint32_t RelativeMs(std::int64_t now_ms) const {
    return static_cast<std::uint32_t>(now_ms - opened_ms_);
  }

  Mem& mem_;
  Clock& clock_;
  DomainHeader h_;
  Options options_;
  Stats stats_;
  std::int64_t opened_ms_ = 0;
  // Per index entry, 26 bytes in all (kBookkeepingBytesPerEntry; the index itself, 64 bytes
  // an entry, is read from the shared domain). The generation and publisher are kept because
  // reclaim decisions must rest on what this owner wrote, never on a line re-read from memory.
  std::vector<std::uint8_t> flags_;
  std::vector<std::uint8_t> tags_;        // KeyTag of a published/retired entry's (ns, key)
  std::vector<std::uint8_t> publisher_;   // host id (kQuarantined for quarantined entries)
  std::vector<std::uint8_t> fanout_;      // children published under it, saturating at 255
  std::vector<std::uint16_t> probe_len_;  // by slot: IndexEntry::probe_len, 0 never (see Open)
  std::vector<std::uint32_t> gen_;        // entry_gen as last written
  std::vector<std::uint32_t> retired_at_;  // RelativeMs of the retire, until kGraceOver
  std::vector<float> score_;               // decayed lease acquisitions seen in scans
  std::vector<OwnerHostLine> owner_lines_;
  std::vector<TimedValue> heartbeats_;  // per host
  std::vector<TimedValue> lease_seqs_;  // per host x row
  std::vector<LeaseRow> scan_rows_;     // ScanLeases' scratch: one host's rows
  std::vector<std::uint8_t> scan_torn_;
  std::map<Namespace, int> pin_;
  std::map<Namespace, std::uint64_t> published_under_pin_;
  std::uint64_t published_under_others_ = 0;
  std::uint32_t published_count_ = 0;
  std::uint32_t retired_count_ = 0;
  std::uint32_t quarantined_count_ = 0;  // quarantined entries not freed yet
  // Inside ApplyRequests: index entries are stored and flushed without a fence each; the
  // batch fences once before its owner line (unfenced_writes_: one is waiting for it).
  bool batch_writes_ = false;
  bool unfenced_writes_ = false;
  std::uint32_t clock_id_ = 0;           // this owner's OwnerClockLine::clock_id
  std::uint64_t clock_seq_ = 0;
  struct ArenaHash {
    std::size_t operator()(const ArenaId& a) const;
  };
  // The blocks named by published and retired entries, to refuse a block published twice:
  // an open-addressing table (linear probing, 2 slots an index entry) of entry numbers + 1
  // (0: empty), placed by the hash of the entry's BlockRef, which is read back from the index.
  std::vector<std::uint32_t> named_;
  std::uint32_t NamedHome(const BlockRef& ref) const;
  bool IsNamed(const BlockRef& ref) const;
  void Name(std::uint32_t i, const BlockRef& ref);
  void NameAt(std::uint32_t i, std::uint32_t home);  // Name's table half (Open counts arenas)
  void Unname(std::uint32_t i, const BlockRef& ref);
  bool Revoked(const BlockRef& ref) const;
  std::unordered_map<ArenaId, std::uint32_t, ArenaHash> arena_refs_;  // named_, by arena
  std::unordered_set<ArenaId, ArenaHash> revoked_;
  std::vector<BlockRef> reclaimed_own_;  // TakeReclaimedOwn's
};

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_PREFIX_H_
