// cxlkv/coherence/domain_layout.h — the shared lines of a CXL domain (docs/coherence.md).
//
// Every struct is one or two 64-byte lines with a single writer (named on each struct), a
// generation or sequence, and a CRC32C in its last 4 bytes over the bytes before it. All
// positions are offsets into the domain region.
#ifndef CXLKV_COHERENCE_DOMAIN_LAYOUT_H_
#define CXLKV_COHERENCE_DOMAIN_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/coherence/record.h"

namespace cxlkv::coherence {

inline constexpr std::uint64_t kDomainMagic = MakeMagic("CXLKVDOM");
inline constexpr std::uint32_t kDomainVersion = 1;
inline constexpr std::uint64_t kLine = 64;

// A block as the protocol knows it: a value, resolvable by the host that owns the arena.
struct BlockRef {
  std::uint8_t arena[16];
  std::uint32_t index;
  std::uint32_t generation;
  bool operator==(const BlockRef&) const = default;
};
static_assert(sizeof(BlockRef) == 24);

// Written once by FormatDomain (the owner role). Sealed record.
struct DomainHeader {
  RecordHead head;
  std::uint32_t max_hosts;
  std::uint32_t index_entries;  // power of two
  std::uint32_t lease_rows;     // per host
  std::uint32_t ring_slots;     // per host, request and return rings alike
  std::uint32_t lease_ttl_ms;
  std::uint32_t host_ttl_ms;
  std::uint32_t grace_ms;
  std::uint32_t reserved0;
  std::uint64_t owner_area_offset;
  std::uint64_t host_rows_offset;
  std::uint64_t request_rings_offset;
  std::uint64_t return_rings_offset;
  std::uint64_t lease_rows_offset;
  std::uint64_t index_offset;
  std::uint64_t end_offset;
};
static_assert(sizeof(DomainHeader) <= 4096);

// Writer: the owner. One line per host.
struct alignas(64) OwnerHostLine {
  std::uint64_t fenced_incarnation;  // rows and requests of incarnations <= this are ignored
  std::uint64_t ring_head;           // requests of this host applied so far
  std::uint64_t return_tail;         // blocks returned to this host so far
  std::uint64_t owner_epoch;         // bumped on every write of this line
  // The last heartbeat of incarnation `acked_incarnation` the owner has seen. The owner
  // cannot fence that incarnation earlier than host_ttl after seeing it, so the host may
  // count on being live until (its send time of that heartbeat) + host_ttl - margin.
  std::uint64_t acked_incarnation;
  std::uint64_t acked_heartbeat;
  // The owner's clock, read after it saw acked_heartbeat (so not before that beat was
  // sent), and whose clock that is (OwnerClockLine::clock_id; 0: none). The host compares
  // it with its own clock to notice that its clock stood still (docs/coherence.md).
  std::int64_t acked_at_ms;
  std::uint32_t clock_id;
  std::uint32_t crc;
};

// Writer: the owner. One line in the header's page, after the header: the owner's clock,
// written on every liveness round (PrefixOwner::FenceExpiredHosts). A reading is never ahead
// of the owner's clock at the moment it is read (the owner reads its clock, then writes), so
// a host that finds it far ahead of its own clock, compared with an earlier acknowledgement,
// knows its own clock stood still meanwhile (docs/coherence.md, "Paused hosts").
struct alignas(64) OwnerClockLine {
  std::uint64_t seq;       // writes so far; 0: never written (no owner has opened the domain)
  std::int64_t owner_ms;   // the owner's clock, read before this write
  std::uint32_t clock_id;  // changes with each owner that opens the domain (clocks differ)
  std::uint8_t reserved[40];
  std::uint32_t crc;
};
inline constexpr std::uint64_t kOwnerClockOffset = 4096 - sizeof(OwnerClockLine);
static_assert(sizeof(DomainHeader) <= kOwnerClockOffset);

// Writer: the orchestrator elected through etcd (orchestrator HA, docs/ha.md). One line in the
// header's page, just before the owner's clock line: which leadership term owns the domain.
// A new leader writes its epoch here (sealed, flushed, fenced) before any other write to the
// domain; every owner write batch re-reads the line and stops if it names another epoch; after
// each batch the leader rewrites it with `batches` bumped, so a reader sampling the line sees
// which epoch wrote when (the HA tests audit that an old epoch never reappears once a newer
// one did). All zero (valid: the initial state) until the first elected leader writes it; a
// single orchestrator never writes it, refuses a domain where it is not zero, and stops owning
// one where it finds it written (SingleOwnerLine). Added in
// place of zero padding: domains formatted before it read as never elected, and readers that
// do not know it never look at it, so kDomainVersion stays 1.
struct alignas(64) OwnerFenceLine {
  // The term's epoch: above its leader key's create revision in etcd and above every epoch the
  // domain recorded before (docs/ha.md "Election and epoch"); 0: never elected.
  std::uint64_t epoch;
  std::uint64_t cluster_id;   // the etcd cluster that revision belongs to
  std::uint64_t batches;      // owner write batches under this epoch so far
  std::int64_t took_over_ms;  // the leader's clock when it wrote this epoch (diagnostics)
  std::uint32_t version;      // kOwnerFenceVersion (0 only in the all-zero line)
  std::uint32_t node;         // a hash of the leader's node name (diagnostics)
  // The generation of the domain's control state (etcd's P/state) this leader last saved
  // (0: not known, lines written before it existed). A successor refuses a state older than
  // this: etcd restored from a backup or rebuilt (docs/ha.md).
  std::uint64_t state_gen;
  // CRC32C of the etcd keys the leaders are elected under ("/cxlkv/v1/<cluster>/domains/
  // <domain>"); 0: not known (lines written before it existed). A candidate elected under
  // other keys (a wrong etcd.cluster/etcd.domain) refuses the domain.
  std::uint32_t keys;
  std::uint8_t reserved[8];
  std::uint32_t crc;
};
inline constexpr std::uint32_t kOwnerFenceVersion = 1;
inline constexpr std::uint64_t kOwnerFenceOffset = kOwnerClockOffset - sizeof(OwnerFenceLine);
static_assert(sizeof(DomainHeader) <= kOwnerFenceOffset);

// Writer: an elected orchestrator that stopped owning the domain, or its node's write-back
// agent on its behalf (orchestrator HA, docs/ha.md "Release"). One line in the header's page,
// just before the fence line: "every store the owner of epoch `epoch` made is in memory (the
// domain range was written back from that machine's caches after its last store), and no
// process of that term stores to the domain again". A successor waits for the release of the
// epoch the fence line names before it writes anything (the fence line included), so a
// deposed owner's stores, late write-backs included, land before the successor's first. All
// zero until the first release; zero padding before, like the fence line.
struct alignas(64) OwnerReleaseLine {
  std::uint64_t epoch;       // the term released; 0: none yet
  std::uint64_t cluster_id;  // the etcd cluster of that term (as in its fence line)
  std::int64_t at_ms;        // the writer's clock (diagnostics)
  std::uint32_t by;          // kReleasedBy*: who wrote it
  std::uint32_t node;        // a hash of the released leader's node name (diagnostics)
  std::uint32_t version;     // kOwnerReleaseVersion (0 only in the all-zero line)
  std::uint8_t reserved[24];
  std::uint32_t crc;
};
inline constexpr std::uint32_t kOwnerReleaseVersion = 1;
inline constexpr std::uint32_t kReleasedByLeader = 1;  // the leader itself, stepping down
inline constexpr std::uint32_t kReleasedByAgent = 2;   // its node's agent, after it died
inline constexpr std::uint64_t kOwnerReleaseOffset = kOwnerFenceOffset - sizeof(OwnerReleaseLine);
static_assert(sizeof(DomainHeader) <= kOwnerReleaseOffset);

// Writer: a single orchestrator (no [etcd]; docs/orchestrator.md "One orchestrator per
// domain"). One line in the header's page, just before the release line: the mark a single
// owner leaves where an orchestrator on another machine, which cannot see its locks, reads it.
// It writes `kSingleServing` (sealed, flushed, fenced) before its first other store of a run,
// then reads the fence line; it bumps `seq` after every owner batch; and it writes
// `kSingleReleased` once it stores nothing more (stopped, or yielding to an elected leader
// whose epoch it found in the fence line), after writing the domain range back from its
// machine's caches, as an elected leader's release does. An elected candidate writes its fence
// line, then reads this line, and takes the domain over only when it is not `kSingleServing`
// (each side writes its own line before it reads the other's, so of two that start together
// at least one sees the other). All zero (valid: never marked) until a single orchestrator
// writes it; zero padding before, like the fence line, so kDomainVersion stays 1.
struct alignas(64) SingleOwnerLine {
  std::uint64_t seq;        // owner batches of this run so far; 0 with state 0: never marked
  std::int64_t started_ms;  // the owner's clock when this run marked the domain (its identity)
  std::int64_t at_ms;       // the owner's clock at this write (diagnostics)
  std::uint32_t state;      // kSingle*
  std::uint32_t pid;        // the owner's process id (messages)
  std::uint32_t period_ms;  // how often seq moves while it serves (its owner period)
  std::uint32_t version;    // kSingleOwnerVersion (0 only in the all-zero line)
  char host[20];            // its host name, truncated, NUL-padded (messages)
  std::uint32_t crc;
};
inline constexpr std::uint32_t kSingleOwnerVersion = 1;
inline constexpr std::uint32_t kSingleServing = 1;   // it owns the domain now
inline constexpr std::uint32_t kSingleReleased = 2;  // it stopped; every store of it is in memory
inline constexpr std::uint64_t kSingleOwnerOffset = kOwnerReleaseOffset - sizeof(SingleOwnerLine);
static_assert(sizeof(DomainHeader) <= kSingleOwnerOffset);

// Writer: the domain's owner (a single orchestrator, or the elected leader), once. One line in
// the header's page, just before the single owner's mark: the domain's publish secret, which
// keys every chain key that leaves the domain (KV events, the directory summary: K' =
// HMAC-SHA256(secret, ...), docs/kv_events.md "What a subscriber can learn"). The first owner
// that finds the line all zero (or torn: a writer died writing it, so nothing was keyed with
// it) fills `secret` from getrandom and writes it (sealed, flushed, fenced) before anything
// leaves; it never changes after, so every owner of the domain, single or elected, on any
// machine, keys alike. The secret's text form is its 64 lowercase hex digits: what a reader
// (a router) is given as its publish file. Hosts of the domain can read it, as they can read
// the blocks themselves; nothing outside the domain can. All zero (valid: no key yet) until
// written; zero padding before, like the fence line, so kDomainVersion stays 1.
struct alignas(64) DomainKeyLine {
  std::uint8_t secret[32];
  std::int64_t created_ms;  // the writer's clock (diagnostics)
  std::uint32_t version;    // kDomainKeyVersion (0 only in the all-zero line)
  std::uint8_t reserved[16];
  std::uint32_t crc;
};
inline constexpr std::uint32_t kDomainKeyVersion = 1;
inline constexpr std::uint64_t kDomainKeyOffset = kSingleOwnerOffset - sizeof(DomainKeyLine);
static_assert(sizeof(DomainHeader) <= kDomainKeyOffset);

// Writer: host h.
struct alignas(64) HostRow {
  std::uint64_t incarnation;  // 0: never joined
  std::uint64_t heartbeat;    // bumped by Heartbeat(); the owner times its changes
  std::uint64_t ring_tail;    // requests posted so far
  std::uint64_t return_head;  // returned blocks taken so far
  std::uint8_t reserved[28];
  std::uint32_t crc;
};

enum class RequestOp : std::uint32_t { kPublish = 1, kRetire = 2 };

// Writer: host h. Two lines; slot (seq - 1) % ring_slots.
struct alignas(64) RequestSlot {
  std::uint64_t seq;  // 1, 2, ...: which request this slot holds
  std::uint64_t incarnation;
  std::uint64_t ns;
  std::uint64_t key[2];
  std::uint64_t parent[2];
  BlockRef ref;
  std::uint32_t op;  // RequestOp
  std::uint8_t reserved[28];
  std::uint32_t crc;
};

// Writer: the owner. Slot (seq - 1) % ring_slots of host h's return ring.
struct alignas(64) ReturnSlot {
  std::uint64_t seq;
  BlockRef ref;
  std::uint8_t reserved[28];
  std::uint32_t crc;
};

// Writer: host h. A lease on (entry, entry_gen) while `held`; the owner times changes of
// lease_seq on its own clock.
struct alignas(64) LeaseRow {
  std::uint64_t incarnation;
  std::uint64_t lease_seq;
  std::uint32_t entry;
  std::uint32_t entry_gen;
  std::uint32_t held;
  std::uint8_t reserved[32];
  std::uint32_t crc;
};

enum class EntryState : std::uint8_t { kEmpty = 0, kPublished = 1, kRetired = 2, kTombstone = 3 };
// IndexEntry::publisher of an entry the owner found torn when it opened the domain: retired,
// its key and block unknown (the block leaks); freed once no lease row names the entry.
inline constexpr std::uint8_t kQuarantined = 0xFF;  // never a host id (max_hosts <= 255)
// IndexEntry::publisher of an entry the owner published itself (PrefixOwner::PublishOwn): an
// object in a region of the pool that no host's arena holds (the LMCache coordinator's region),
// its BlockRef a region ref (prefix.h, RegionRef). Never a host id: PublishOwn needs a domain of
// at most 254 hosts. Reclaimed without a return; the owner's process is told (TakeReclaimedOwn).
inline constexpr std::uint8_t kOwnerPublisher = 0xFE;

// Writer: the owner. One line.
struct alignas(64) IndexEntry {
  std::uint64_t key[2];
  std::uint64_t ns;
  BlockRef ref;
  std::uint32_t entry_gen;
  std::uint8_t state;      // EntryState
  std::uint8_t publisher;  // host id
  // Of this slot as a probe start, whatever the entry's own state: every published or
  // retired entry whose key starts probing here lies within the probe_len slots from here,
  // so a lookup stops after them. 0: not known (domains written before it existed), probe
  // until an EMPTY entry. The owner raises it before it writes an entry farther out and
  // lowers it only after that entry is gone (docs/coherence.md, "Probe lengths").
  std::uint16_t probe_len;
  std::uint8_t reserved[4];
  std::uint32_t crc;
};

static_assert(sizeof(OwnerHostLine) == 64 && sizeof(HostRow) == 64 && sizeof(ReturnSlot) == 64);
static_assert(sizeof(OwnerClockLine) == 64 && offsetof(OwnerHostLine, crc) == 60);
static_assert(sizeof(OwnerFenceLine) == 64 && offsetof(OwnerFenceLine, crc) == 60 &&
              offsetof(OwnerFenceLine, state_gen) == 40);
static_assert(sizeof(OwnerReleaseLine) == 64 && offsetof(OwnerReleaseLine, crc) == 60);
static_assert(sizeof(SingleOwnerLine) == 64 && offsetof(SingleOwnerLine, crc) == 60);
static_assert(sizeof(DomainKeyLine) == 64 && offsetof(DomainKeyLine, crc) == 60);
static_assert(sizeof(LeaseRow) == 64 && sizeof(IndexEntry) == 64 && sizeof(RequestSlot) == 128);
static_assert(offsetof(IndexEntry, crc) == 60 && offsetof(LeaseRow, crc) == 60);

// CRC of a line record: over every byte before its trailing crc field.
template <typename T>
std::uint32_t LineCrc(const T& r) {
  static_assert(std::is_trivially_copyable_v<T>);
  return Crc32c(&r, offsetof(T, crc));
}
template <typename T>
void SealLine(T& r) {
  r.crc = LineCrc(r);
}
// A zero line (never written) also counts as valid: it is the initial state.
template <typename T>
bool LineValid(const T& r) {
  if (r.crc == LineCrc(r)) return true;
  const auto* p = reinterpret_cast<const unsigned char*>(&r);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_DOMAIN_LAYOUT_H_
