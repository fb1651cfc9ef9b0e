// cxlkv/orchestrator/lmcache/coordinator.h — LMCache's memory coordinator (docs/lmcache.md "The
// coordinator") over one region of a cxlkv domain's pool: reservations, finished objects,
// reclamation, eviction, tenants, and a crash-consistent state file.
//
// Key types: ObjectKey (LMCache's EncodedObjectKey, in index_key.h with its rules and its key
// in the prefix index), Layout (shapes and dtype names), Handle ({offset, length, generation};
// offsets are region-relative as LMCache has them: LMCache maps the pool with
// --l1-shared-mapping-offset-bytes = region_offset), and Coordinator. The HTTP side
// (http.h) turns requests into these calls; this file knows nothing of HTTP.
//
// What it adds to LMCache's M0 pool: space comes back (abort, an expired reservation,
// eviction); an object looked up is not evicted for read_lease_ms after the lookup (the
// read lease, on the coordinator's clock); every tenant has a namespace of its own and may
// have a quota; every change is in the state file before the reply that reveals it, so a
// restart keeps every finished object, its handle and the region epoch. The epoch changes only
// when the region's contents are declared gone (a new state file).
//
// Thread-safe (one mutex). Every mutating call appends one record to the state's journal
// before returning (a StateStore: the state file and its journal, or etcd for a domain with
// [etcd]; cost: one write of the batch's size, not the region's), and returns only once its
// record is durable. Durability is a group commit: the records of concurrent calls are
// appended under the mutex and made durable by one fdatasync outside it, by whichever caller
// finds none in progress; a call that reveals state (a lookup) waits the same way for every
// record it could have seen. The journal is folded into a new snapshot once it outgrows the
// object count.
#ifndef CXLKV_ORCHESTRATOR_LMCACHE_COORDINATOR_H_
#define CXLKV_ORCHESTRATOR_LMCACHE_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/lmcache/config.h"
#include "cxlkv/orchestrator/lmcache/index_key.h"

namespace cxlkv::coordinator {

struct Layout {
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::string> dtypes;
  bool operator==(const Layout&) const = default;
};

// Bytes per element of a dtype name LMCache's wire uses (0: unknown).
std::uint32_t DtypeBytes(const std::string& name);
// The layout's size: sum of prod(shape) x dtype bytes, kLayoutTooLarge when it is larger
// (LMCache's sizes are Python integers, which never overflow: such a layout fits no region,
// so its reserve is 507 out_of_space, as LMCache's). kInvalidArgument when shapes and dtypes
// differ in number, a dimension is negative, or a dtype is unknown.
inline constexpr std::uint64_t kLayoutTooLarge = std::uint64_t{1} << 62;
absl::StatusOr<std::uint64_t> LayoutBytes(const Layout& l);

struct Handle {
  std::uint64_t offset = 0;  // in the region; the pool offset is region_offset + offset
  std::uint64_t length = 0;
  std::uint64_t generation = 0;
};

struct ReserveItem {
  ObjectKey key;
  Layout layout;
};
struct Grant {
  ObjectKey key;
  std::string token;
  Handle handle;
  Layout layout;
};
struct ReservationRef {
  ObjectKey key;
  std::string token;
};
struct Hit {
  ObjectKey key;
  Handle handle;
  Layout layout;
};

// The errors LMCache's contract names, as absl codes the HTTP side maps:
//   kFailedPrecondition "stale_epoch: ..."          -> 409 stale_epoch
//   kAborted            "invalid_reservation: ..."  -> 409 invalid_reservation
//   kResourceExhausted  "out_of_space: ..."         -> 507 out_of_space
//   kInvalidArgument                                -> 422
//   kInternal (the state file could not be written) -> 500, nothing changed

struct RegionInfo {
  std::string region_id, layout_id, region_epoch;
  std::uint64_t region_offset = 0, capacity_bytes = 0, alignment_bytes = 0;
};

// Where the coordinator's state lives: a snapshot and the journal of the changes after it.
// Records are "<JSON>\t<crc32c hex>\n" lines, numbered from 1 on (the JSON holds its number;
// the snapshot names the last one it includes). Not thread-safe: the Coordinator calls it
// under its mutex.
class StateStore {
 public:
  struct Loaded {
    std::string snapshot;  // the snapshot's text
    std::string journal;   // the records, in order (a torn last one possible)
  };
  virtual ~StateStore() = default;
  // nullopt: no snapshot (a new region). Errors name the place.
  virtual absl::StatusOr<std::optional<Loaded>> Load() = 0;
  // Record `seq` (the journal's last + 1), durable once Sync returns after it (a store whose
  // writes are durable at once: at once). On an error the record is not there, or (a remote
  // store that lost the reply) may be: the next Append of the same `seq` replaces it, so what
  // a later Load reads is always what the caller applied.
  virtual absl::Status Append(std::uint64_t seq, const std::string& record) = 0;
  // Makes every record appended so far durable (the file store: one fdatasync). The one call
  // not made under the Coordinator's mutex: it may run while Append or Compact does (one
  // Sync at a time), and covers at least what was appended before it started.
  virtual absl::Status Sync() = 0;
  // The snapshot becomes `text`, which includes every record up to `seq`; those records go.
  virtual absl::Status Compact(const std::string& text, std::uint64_t seq) = 0;
  // For messages: "lmcache.state_file /var/lib/cxlkv/d.state.lmcache", or etcd's key; and
  // the journal's ("<state_file>.journal").
  virtual std::string where() const = 0;
  virtual std::string journal_where() const = 0;
};

// The state file (a snapshot: one JSON document and a CRC32C line, replaced by rename) and
// `path`.journal beside it (fdatasync'd appends, cut back after a failed one).
std::unique_ptr<StateStore> FileStateStore(const std::string& path);

struct Stats {
  std::uint64_t used_bytes = 0;    // allocated, alignment padding included
  std::uint64_t object_count = 0;  // WRITING and VALID
  std::uint64_t writing = 0;
  std::uint64_t reserved = 0, finished = 0, aborted = 0;
  std::uint64_t expired = 0;  // reservations reclaimed after reservation_ttl_ms
  std::uint64_t evicted = 0;  // VALID objects evicted for space
  std::uint64_t evicted_bytes = 0;
  std::uint64_t out_of_space = 0;  // batches refused
  std::uint64_t journal_records = 0, syncs = 0;  // appended, and the group commits' syncs
  // The domain's prefix index (Coordinator::AttachIndex): objects published there, evicted
  // bytes waiting for the index to let their ranges go (counted in used_bytes), objects not
  // indexed (a length of 4 GiB or more, or the index refused them), reserves that waited.
  std::uint64_t indexed = 0, held_bytes = 0, index_skipped = 0, index_waits = 0;
  std::map<std::string, std::uint64_t> tenant_used_bytes;
};

class Coordinator {
 public:
  // The region is [region_offset, region_offset + c.region_bytes) of the pool. Loads
  // c.state_file when it exists (kDataLoss when corrupt; kFailedPrecondition, naming both
  // values and the reset, when it describes another region), else starts empty with a new
  // epoch and writes it. Restored reservations get a fresh reservation_ttl_ms and objects a
  // fresh read lease (the writer or a reader may still be at work).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorConfig& c,
                                                           std::uint64_t region_offset,
                                                           std::int64_t now_ms);
  // The same over another store (etcd's, for a domain with [etcd]: docs/lmcache.md
  // "Fail-over").
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorConfig& c,
                                                           std::uint64_t region_offset,
                                                           std::int64_t now_ms,
                                                           std::unique_ptr<StateStore> store);

  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  RegionInfo region() const { return region_; }
  bool restored() const { return restored_; }

  // LMCache's reserve: a grant per item, nullopt where the tenant's key already exists (WRITING
  // or VALID). All or nothing: space for the whole batch, evicting VALID objects without a read
  // lease, lowest pin level first, then least recently finished or looked up (at the tenant's
  // quota only its own), or out_of_space with nothing changed.
  absl::StatusOr<std::vector<std::optional<Grant>>> Reserve(const std::string& tenant,
                                                            const std::string& epoch,
                                                            const std::vector<ReserveItem>& items,
                                                            std::int64_t now_ms);
  absl::Status Finish(const std::string& tenant, const std::string& epoch,
                      const std::vector<ReservationRef>& refs, std::int64_t now_ms);
  // Drops the reservations; their space is free at once (the writer has stopped writing).
  absl::Status Abort(const std::string& tenant, const std::string& epoch,
                     const std::vector<ReservationRef>& refs, std::int64_t now_ms);
  // VALID objects of the tenant; each hit takes a read lease until now + read_lease_ms. Any
  // number of keys (the lock is taken c.max_batch keys at a time, 4,096 when it is 0).
  absl::StatusOr<std::vector<std::optional<Hit>>> Lookup(const std::string& tenant,
                                                         const std::string& epoch,
                                                         const std::vector<ObjectKey>& keys,
                                                         std::int64_t now_ms);
  // Reclaims reservations older than reservation_ttl_ms. Returns how many.
  absl::StatusOr<std::uint32_t> Expire(std::int64_t now_ms);
  Stats stats() const;
  // Namespace of a tenant's keys: "<tenant>/lmcache/<layout_id>" (the [[namespace]] name form).
  std::string NamespaceOf(const std::string& tenant) const;

  // ---- the domain's prefix index (docs/lmcache.md "Keys in the domain's index") ------------
  // With lmcache.index, every finished object is published in the domain's prefix index as an
  // entry of the owner's own (coherence::PrefixOwner::PublishOwn): namespace IndexNamespace
  // (tenant), key IndexKey(ns, key), a region ref of its handle. Hosts then find and lease it by
  // chain lease, without HTTP. Such an object's range, once the object is evicted, is *held*
  // (not free, counted in used_bytes) until the index lets it go: the owner reclaims its entry
  // when no host's lease names it (IndexReleased). The daemon's owner loop carries the ops out
  // (TakeIndexOps) and reports back; this class never touches the index itself.
  struct IndexOp {
    bool publish = false;  // else retire (ns, key)
    coherence::Namespace ns = 0;
    coherence::PrefixKey key;
    coherence::BlockRef ref{};
  };
  // A tenant's namespace in the index, coordinator::IndexNamespace(tenant, layout_id); an
  // object's key there is IndexKey(that namespace, its key) (index_key.h).
  coherence::Namespace IndexNamespace(const std::string& tenant) const;
  // The region tag in this region's refs: CRC32C of region_id.
  std::uint32_t RegionTag() const;
  // Turns the link on, before the coordinator serves (the owner's process calls it once the
  // owner is open): `own` is what the index holds of the owner's entries now. An entry naming
  // no finished object of this coordinator with that handle (its object was evicted before a
  // restart, or the region was reset) is retired and its range held till it is reclaimed;
  // finished objects not in the index are published.
  void AttachIndex(const std::vector<coherence::PrefixOwner::OwnEntry>& own);
  std::vector<IndexOp> TakeIndexOps();
  // Refs the index no longer names (reclaimed, or refused at publish): a held range becomes
  // free; a finished object named by one is no longer in the index (evicted at once later).
  void IndexReleased(const std::vector<coherence::BlockRef>& refs);
  // The namespace's pin level (CoordinatorConfig::pins; 0 when not listed).
  int PinOf(const std::string& tenant) const;

 private:
  struct Object {
    std::string tenant;
    ObjectKey key;
    Layout layout;
    Handle handle;
    std::uint64_t alloc_bytes = 0;  // length rounded up to the alignment
    bool writing = true;
    std::string token;                // writing: the reservation's
    std::int64_t expires_ms = 0;      // writing: reclaimed at this time
    std::int64_t lease_until_ms = 0;  // valid: not evicted before this
    std::uint64_t touched = 0;        // valid: order of the last finish or lookup (LRU)
    bool in_index = false;            // valid: published in the domain's index (soft state)
  };
  // An evicted object's range the index still names: offset -> (bytes, generation).
  struct Held {
    std::uint64_t alloc_bytes = 0;
    std::uint64_t generation = 0;
  };
  // One change: objects put (new or changed) and removed, with the counters after it.
  struct Change {
    std::vector<std::pair<std::string, Object>> puts;
    std::vector<std::string> dels;
    std::uint64_t next_generation = 0, touch_seq = 0;
  };
  Coordinator(const CoordinatorConfig& c, std::uint64_t region_offset,
              std::unique_ptr<StateStore> store);
  absl::Status CheckEpoch(const std::string& epoch) const;
  // The calls above without the wait for durability; *need: the last record they may reveal.
  // *wait: the batch fits only once ranges evicted now (or earlier) come back from the index;
  // *released is IndexReleased's count at the call, to wait for a later one.
  absl::StatusOr<std::vector<std::optional<Grant>>> ReserveUnsynced(
      const std::string& tenant, const std::string& epoch, const std::vector<ReserveItem>& items,
      std::int64_t now_ms, std::uint64_t* need, bool* wait, std::uint64_t* released);
  // Queues the object's publish when the link is on and its handle fits a region ref.
  void OfferToIndexLocked(Object& o, const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HoldLocked(const Object& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinishOrAbortUnsynced(bool finish, const std::string& tenant,
                                     const std::string& epoch,
                                     const std::vector<ReservationRef>& refs, std::int64_t now_ms,
                                     std::uint64_t* need);
  absl::StatusOr<std::vector<std::optional<Hit>>> LookupUnsynced(const std::string& tenant,
                                                                 const std::string& epoch,
                                                                 const std::vector<ObjectKey>& keys,
                                                                 std::int64_t now_ms,
                                                                 std::uint64_t* need);
  absl::StatusOr<std::uint32_t> ExpireUnsynced(std::int64_t now_ms, std::uint64_t* need);
  // Returns once every record up to `seq` is durable (the group commit), or the sync's error.
  absl::Status WaitDurable(std::uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_, sync_mu_);
  // Journals the change (fdatasync), then applies it; on failure nothing changed. Compacts the
  // journal into a new snapshot when it has grown past the objects' count.
  absl::Status CommitLocked(const Change& ch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(const Change& ch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the object to (or removes it from) the indexes and byte counts below.
  void IndexLocked(const std::string& id, const Object& o, bool add)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadLocked(const std::string& snapshot, const std::string& journal,
                          std::int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string SerializeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRefsLocked(const std::string& tenant, const std::vector<ReservationRef>& refs,
                               std::int64_t now_ms, std::vector<std::string>* ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorConfig c_;
  RegionInfo region_;
  bool restored_ = false;
  mutable base::Mutex mu_;
  // Free space: region-relative offset -> length, coalesced.
  std::map<std::uint64_t, std::uint64_t> free_ ABSL_GUARDED_BY(mu_);
  // Objects by namespace + "\x1f" + canonical key.
  std::map<std::string, Object> objects_ ABSL_GUARDED_BY(mu_);
  // VALID objects by (pin level, touched, id): eviction's order. WRITING objects: the reaper's.
  std::set<std::tuple<int, std::uint64_t, std::string>> lru_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> writing_ ABSL_GUARDED_BY(mu_);
  std::uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  std::uint64_t touch_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // The index link (AttachIndex).
  bool index_attached_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<IndexOp> index_ops_ ABSL_GUARDED_BY(mu_);
  std::map<std::uint64_t, Held> held_ ABSL_GUARDED_BY(mu_);
  std::map<std::uint64_t, std::string> by_offset_ ABSL_GUARDED_BY(mu_);  // objects_ by offset
  std::uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;  // IndexReleased calls that freed a range
  base::CondVar released_cv_;                        // notified by IndexReleased
  // Append, Compact and Load under mu_; Sync by the group commit's syncer, without it.
  const std::unique_ptr<StateStore> store_;
  std::uint64_t journal_seq_ ABSL_GUARDED_BY(mu_) = 0;      // the last record written
  std::uint64_t journal_records_ ABSL_GUARDED_BY(mu_) = 0;  // since the snapshot
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // The group commit (taken after mu_, never before it).
  mutable base::Mutex sync_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::uint64_t synced_seq_ ABSL_GUARDED_BY(sync_mu_) = 0;  // durable up to here
  bool syncing_ ABSL_GUARDED_BY(sync_mu_) = false;          // a caller is in Sync now
  base::CondVar sync_done_;                                 // notified when syncing_ clears
  absl::Status sync_error_ ABSL_GUARDED_BY(sync_mu_);       // a failed Sync: every call fails
  std::uint64_t syncs_ ABSL_GUARDED_BY(sync_mu_) = 0;       // Sync calls (Stats::syncs)
};

}  // namespace cxlkv::coordinator

#endif  // CXLKV_ORCHESTRATOR_LMCACHE_COORDINATOR_H_
