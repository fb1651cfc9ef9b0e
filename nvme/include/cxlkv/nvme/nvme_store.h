// cxlkv/nvme/nvme_store.h — the NVMe tier: KV blocks in O_DIRECT files driven by io_uring.
//
// NvmeStore keeps whole KV blocks, each under a 128-bit key (a coherence::PrefixKey), in
// fixed-size slots of one file in a directory on a local file system (ext4, xfs; tmpfs also
// works from Linux 6.6). Format and crash rule: nvme_layout.h and docs/nvme.md. In short:
// a block and its checksummed header are written in one O_DIRECT write to a free slot, never
// over a live one; the old slot of a replaced or deleted key is then retired (its header
// overwritten with zeros). Open checks every slot header's CRC32C and indexes each live
// block with its payload's XXH3; a Get reads the payload alone (not its 4 KiB header: at QD 1
// those bytes were ~5 % of a 64 KiB read) and checks it against the XXH3 in the index, which
// is the hash of what this store wrote there. A block that fails is reported (kDataLoss
// naming file, offset and key) and dropped from the index, never returned. A header damaged
// behind an open store's back returns no wrong data (the payload is still checked); the
// next Open finds it and drops the block. After a crash (kill -9 or power loss) every key reads
// back a version that was written completely, or is missing.
//
// Key types:
//   NvmeStore   one store directory, opened by one process at a time (flock on the meta file)
//   NvmeBatch   Puts, Gets and Deletes submitted together: one io_uring_submit per batch
//               (a batch larger than the queue depth goes in several) and one completion
// Async use: fill a batch, Submit it (with an optional callback), then Wait or Poll. Sync use:
// Put / Get / Delete. The index (key -> slot) lives in memory and is rebuilt at Open by
// scanning the slot headers.
//
// Thread-safety: every NvmeStore method may be called from any thread. There is no background
// thread: completions are reaped by whichever thread is in Wait, Poll, Drain or a Submit that
// waits for room, one thread at a time; a batch's callback runs on that thread, outside the
// store's lock (it may Submit). A batch is owned by the caller; while it is in flight (from
// Submit until done()) it, and every buffer named in it, must stay alive and untouched.
#ifndef CXLKV_NVME_NVME_STORE_H_
#define CXLKV_NVME_NVME_STORE_H_

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/nvme/nvme_layout.h"

struct io_uring;

namespace cxlkv::nvme {

// Blocks are named by the prefix protocol's key (coherence/key.h), hashed as every
// in-process map of them is.
using NvmeKey = coherence::PrefixKey;
using NvmeKeyHash = coherence::PrefixKeyHash;
// Errors name keys in their one text form, coherence::FormatKey.

struct NvmeStoreOptions {
  // Directory of the store; created if missing. Must be on a file system with O_DIRECT.
  std::string dir;
  // Largest block a slot holds (the KV block size). A store keeps the value it was created
  // with; opening it with another is kInvalidArgument. Up to kNvmeMaxPayloadBytes.
  std::uint64_t payload_bytes = 0;
  // Limit on the bytes of the slots file (slots are payload rounded to 4 KiB + a 4 KiB
  // header). 0: no limit but the file system's free space.
  std::uint64_t capacity_bytes = 0;
  // io_uring submission queue entries; also the most I/Os in flight at once.
  std::uint32_t queue_depth = 64;
  // The slots file grows in steps of this many bytes, reserved with fallocate so a full file
  // system is found when growing (kResourceExhausted), not in the middle of a write.
  std::uint64_t grow_bytes = 64ull << 20;
  // false: no fallocate; writes past the end extend the file (and may fail with ENOSPC).
  bool preallocate = true;
  // Open reads every live slot's payload and checks it, not only the headers.
  bool verify_payloads_on_open = false;
  // Each write is RWF_DSYNC: complete means on stable media, at some cost in bandwidth.
  // Without it a completed write survives a process crash but may be lost on power failure
  // (it then reads back as missing, never as wrong data); Sync() makes everything durable.
  bool dsync = false;
  // Where a Get's read lands. Some disks pay per 4 KiB page of the buffer a read fills — a
  // virtio disk's host walks one descriptor per physically separate page, and on the
  // development VM a 256 KiB read into 4 KiB pages took 2.2x as long as one into a 2 MiB page
  // (bench/RESULTS.md). Staging reads the block into a store buffer in 2 MiB pages, checks it
  // there and copies it out. kAuto measures both at Open (NvmeOpenReport::read_probe_*) and
  // stages only where that is >= 10 % faster; kAlways / kNever force it. A destination added
  // with AddDirectDestination is always read directly.
  enum class ReadStaging : std::uint8_t { kAuto, kAlways, kNever };
  ReadStaging read_staging = ReadStaging::kAuto;
  // Most bytes of staging buffers the store holds (each is the block rounded up to 2 MiB,
  // kept per I/O slot and reused); a Get that finds none free reads directly.
  std::uint64_t staging_bytes = 64ull << 20;
};

// What Open found. `problems` names each slot that was dropped (file, offset, why), up to 64.
struct NvmeOpenReport {
  std::uint64_t slots_scanned = 0;
  std::uint64_t blocks_indexed = 0;
  std::uint64_t superseded = 0;  // older versions of a key, retired
  std::uint64_t corrupt = 0;     // slots whose header (or payload, when verified) failed
  std::vector<std::string> problems;
  // ReadStaging::kAuto's measurement: median time of a read of read_probe_bytes into 4 KiB
  // pages (direct) and into 2 MiB pages plus the copy out (staged), from a probe file in the
  // store's directory (removed again). Zero where nothing was measured (the option was not
  // kAuto, or the probe failed: then reads go direct and read_probe_error says why).
  std::uint64_t read_probe_bytes = 0;
  double read_probe_direct_us = 0;
  double read_probe_staged_us = 0;
  std::string read_probe_error;
  bool reads_staged = false;  // what the store decided
};

struct NvmeStats {
  std::uint64_t blocks = 0;          // keys in the index
  std::uint64_t payload_bytes = 0;   // sum of their payload lengths
  std::uint64_t slots_in_file = 0;   // slots the file has room for now
  std::uint64_t slots_free = 0;      // of those, free
  std::uint64_t capacity_slots = 0;  // the configured limit, in slots (0: none)
  std::uint64_t in_flight = 0;       // I/Os submitted and not yet reaped
  std::uint64_t submit_calls = 0;    // io_uring_submit calls that sent at least one I/O
  std::uint64_t puts = 0, gets = 0, deletes = 0;  // completed OK
  std::uint64_t data_loss = 0;                    // blocks dropped because a read failed its checks
  std::uint64_t out_of_space = 0;                 // puts refused with kResourceExhausted
  std::uint64_t tombstones = 0;                   // retired slots overwritten with a zero header
  std::uint64_t staged_gets = 0;    // gets read through a staging buffer (ReadStaging)
  std::uint64_t staging_bytes = 0;  // staging memory held now
};

enum class NvmeOpKind : std::uint8_t { kPut, kGet, kDelete };

class NvmeStore;

// A set of operations submitted together. Reusable: Clear() it once done().
class NvmeBatch {
 public:
  using Callback = absl::AnyInvocable<void(NvmeBatch&)>;

  NvmeBatch() = default;
  NvmeBatch(const NvmeBatch&) = delete;
  NvmeBatch& operator=(const NvmeBatch&) = delete;

  // Stores `bytes` (1 .. payload_bytes) from `data` under key, replacing any older version.
  // data need not be aligned; when it is 4 KiB aligned and bytes a multiple of 4 KiB it is
  // written directly, otherwise through a bounce buffer.
  void AddPut(const NvmeKey& key, const void* data, std::uint64_t bytes);
  // Reads key's block into dest, which holds capacity_bytes. Direct into dest when dest is
  // 4 KiB aligned and the block a multiple of 4 KiB that fits, else through a bounce buffer.
  // On any error dest's first min(capacity, block) bytes are unspecified (zeroed on kDataLoss).
  void AddGet(const NvmeKey& key, void* dest, std::uint64_t capacity_bytes);
  // Removes key. The index forgets it at once; its slot is retired in the background.
  void AddDelete(const NvmeKey& key);
  void Clear();

  std::size_t size() const noexcept { return ops_.size(); }
  // True once every op has completed (acquire: results are then visible).
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }
  NvmeOpKind kind(std::size_t i) const { return ops_[i].kind; }
  const NvmeKey& key(std::size_t i) const { return ops_[i].key; }
  // Per op, once done(): OK, or kNotFound (get/delete of an absent key), kResourceExhausted
  // (put: store or file system full), kDataLoss (get: the block failed its checks and was
  // dropped), kInvalidArgument (bad size), or the I/O error.
  const absl::Status& status(std::size_t i) const { return ops_[i].status; }
  // Gets: the block's length. Puts: bytes stored.
  std::uint64_t bytes(std::size_t i) const { return ops_[i].result_bytes; }
  // The first op error, or OK.
  absl::Status first_error() const;

 private:
  friend class NvmeStore;
  struct Op {
    NvmeOpKind kind;
    NvmeKey key;
    const void* src = nullptr;
    void* dest = nullptr;
    std::uint64_t bytes = 0;  // put: length; get: dest capacity
    absl::Status status;
    std::uint64_t result_bytes = 0;
    std::uint64_t put_xxh3 = 0;  // put: the payload's hash, computed by Submit outside the lock
  };
  // One op inline: the synchronous wrappers build a one-op batch per call without a heap
  // allocation.
  absl::InlinedVector<Op, 1> ops_;
  std::atomic<bool> done_{true};
  std::size_t pending_ = 0;  // ops not yet completed; the store's lock guards it in flight
  Callback callback_;
};

class NvmeStore {
 public:
  // Opens (or creates) the store in options.dir and rebuilds the index from the slot
  // headers. Errors name the directory or file and the fix: kFailedPrecondition (no O_DIRECT
  // on that file system; store in use by another process; io_uring unavailable),
  // kInvalidArgument (bad options; payload_bytes differs from the store's), kDataLoss
  // (meta file corrupt), kPermissionDenied, kResourceExhausted. Cost: one header read per slot
  // in the file (batched at queue depth), or one full slot read with verify_payloads_on_open.
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Open(const NvmeStoreOptions& options,
                                                         NvmeOpenReport* report = nullptr);
  // Waits for everything in flight (callbacks run), then closes the files.
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Submits every op of the batch: ops that need no I/O (missing keys, full store, deletes)
  // complete at once; the others are written to the ring and sent with one io_uring_submit
  // (more when the batch exceeds the queue depth: Submit then waits for room, reaping
  // completions). `done` runs once, when the last op completes, on the reaping thread (or in
  // Submit, if nothing needed I/O). kFailedPrecondition if the batch is already in flight.
  absl::Status Submit(NvmeBatch& batch, NvmeBatch::Callback done = nullptr);
  // A batch of Gets: keys[i] into dests[i], each holding dest_bytes. Clears batch first.
  absl::Status Prefetch(std::span<const NvmeKey> keys, std::span<void* const> dests,
                        std::uint64_t dest_bytes, NvmeBatch& batch,
                        NvmeBatch::Callback done = nullptr);
  // Blocks until batch.done(), reaping completions meanwhile.
  void Wait(NvmeBatch& batch);
  // Reaps whatever has completed without blocking; returns the number of I/Os reaped.
  std::size_t Poll();
  // Blocks until nothing is in flight, background retirements included.
  void Drain();

  // Synchronous wrappers (one-op batch + Wait).
  absl::Status Put(const NvmeKey& key, const void* data, std::uint64_t bytes);
  absl::StatusOr<std::uint64_t> Get(const NvmeKey& key, void* dest, std::uint64_t capacity_bytes);
  absl::Status Delete(const NvmeKey& key);

  // Gets into [base, base + bytes) are read directly even where the store stages reads: for
  // memory already in large pages (a device-dax arena, hugetlbfs), where staging would only
  // add a copy. Ranges may overlap; they stay for the store's life.
  void AddDirectDestination(const void* base, std::uint64_t bytes);
  // Whether this store stages Gets into destinations not added above (see ReadStaging).
  bool stages_reads() const noexcept { return stage_reads_; }

  bool Contains(const NvmeKey& key) const;
  // Every key in the index (a copy; O(blocks)). For callers that rebuild their own view of
  // the tier after a restart.
  std::vector<NvmeKey> Keys() const;
  // Where key's block lies: for tools, messages and tests.
  struct Location {
    std::string file;
    std::uint64_t slot = 0;
    std::uint64_t offset = 0;  // of the slot's header; the payload follows 4 KiB later
    std::uint64_t payload_bytes = 0;
  };
  absl::StatusOr<Location> Locate(const NvmeKey& key) const;
  // fdatasync of the slots file: every completed write is on stable media afterwards.
  absl::Status Sync();
  NvmeStats Stats() const;

  const std::string& dir() const noexcept { return dir_; }
  const std::string& slots_path() const noexcept { return slots_path_; }
  std::uint64_t payload_bytes() const noexcept { return payload_bytes_; }
  std::uint64_t slot_bytes() const noexcept { return slot_bytes_; }

 private:
  struct Io;
  struct Completion {
    Io* io;
    int res;
  };
  struct IndexEntry {
    std::uint64_t slot;
    std::uint64_t seq;
    std::uint64_t payload_bytes;
    std::uint64_t payload_xxh3;  // as in the slot's header: what a Get checks the payload by
  };
  enum class SlotState : std::uint8_t { kFree, kWriting, kLive, kRetiring, kRetirePending };
  struct Slot {
    SlotState state = SlotState::kFree;
    std::uint32_t readers = 0;  // gets in flight: retirement waits for them
  };

  NvmeStore() = default;
  absl::Status Init(const NvmeStoreOptions& options, NvmeOpenReport* report);
  absl::Status OpenMeta(const NvmeStoreOptions& options);
  absl::Status OpenSlots();
  absl::Status Scan(bool verify_payloads, NvmeOpenReport* report);
  // ReadStaging::kAuto: times reads into 4 KiB and 2 MiB pages and sets stage_reads_.
  void CalibrateReads(NvmeOpenReport* report);
  // Lends io a staging buffer (back to the pool in FreeIo), within the budget; null when none.
  std::byte* Stage(Io* io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::uint64_t StagingBufferBytes() const;
  bool IsDirectDestination(const void* p, std::uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReadSlotSync(std::uint64_t slot, std::byte* buf, std::uint64_t bytes);
  absl::Status WriteSync(std::uint64_t offset, const std::byte* buf, std::uint64_t bytes);

  Io* NewIo() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeIo(Io* io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a free slot, growing the file within the limit. kResourceExhausted when neither.
  absl::StatusOr<std::uint64_t> TakeSlot(const NvmeKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Grow(const NvmeKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Retire(std::uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IssueTombstones() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prepares the SQE for io; false when the ring has no room (the caller submits and waits).
  bool Queue(Io* io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SubmitQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteOp(NvmeBatch* batch, std::size_t i, absl::Status status, std::uint64_t bytes,
                  std::vector<NvmeBatch*>* finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One fewer op outstanding; the batch is finished (done, or its callback due) at zero.
  void ReleaseOne(NvmeBatch* batch, std::vector<NvmeBatch*>* finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Holding the reaper role: reaps (blocking for one if `block`), applies, gives the role
  // back and runs finished callbacks. Returns I/Os reaped.
  std::size_t Reap(bool block) ABSL_LOCKS_EXCLUDED(mu_);
  void Verify(Io* io, int res) const;
  void Apply(const Completion& c, std::vector<NvmeBatch*>* finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until some I/O completes (reaping it if no other thread is) or `until` holds.
  void WaitProgress(std::uint64_t seen_reaped) ABSL_LOCKS_EXCLUDED(mu_);
  void RunCallbacks(std::vector<NvmeBatch*>& finished) ABSL_LOCKS_EXCLUDED(mu_);
  std::string SlotName(std::uint64_t slot) const;

  std::string dir_;
  std::string meta_path_;
  std::string slots_path_;
  int dir_fd_ = -1;  // holds the flock that keeps other processes out
  int slots_fd_ = -1;
  std::uint8_t uuid_[16] = {};
  std::uint64_t payload_bytes_ = 0;
  std::uint64_t payload_span_bytes_ = 0;  // payload capacity rounded to 4 KiB
  std::uint64_t slot_bytes_ = 0;
  std::uint64_t capacity_slots_ = 0;  // 0: unlimited
  std::uint64_t grow_slots_ = 1;
  std::uint32_t queue_depth_ = 0;
  bool preallocate_ = true;
  int write_flags_ = 0;  // RWF_DSYNC or 0
  bool stage_reads_ = false;
  std::uint64_t staging_limit_ = 0;
  std::unique_ptr<io_uring> ring_;

  // Everything below is guarded by mu_ (base::Mutex: a std::mutex, which ThreadSanitizer
  // understands, with the annotations clang checks; docs/architecture.md). NewIo, FreeIo,
  // TakeSlot, Grow, Retire, IssueTombstones, Queue, SubmitQueued, CompleteOp, ReleaseOne and
  // Apply run with mu_ held; Reap, WaitProgress and RunCallbacks without it.
  // cv_ is notified whenever reaping_, in_flight_, reaped_ or a batch's done() changes.
  mutable base::Mutex mu_;
  base::CondVar cv_;
  bool reaping_ ABSL_GUARDED_BY(mu_) = false;  // one thread reads the completion queue
  std::uint64_t reaped_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint32_t unsubmitted_ ABSL_GUARDED_BY(mu_) = 0;  // SQEs prepared, not yet submitted
  std::uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<NvmeKey, IndexEntry, NvmeKeyHash> index_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);  // size = slots the file has room for
  std::vector<std::uint64_t> free_slots_ ABSL_GUARDED_BY(mu_);  // LIFO
  std::vector<std::uint64_t> tombstone_queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Io*> io_free_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Io>> io_all_ ABSL_GUARDED_BY(mu_);
  // StagingBufferBytes() each; stats_.staging_bytes in all.
  std::vector<std::byte*> staging_free_ ABSL_GUARDED_BY(mu_);
  std::byte* zero_header_ = nullptr;  // 4 KiB of zeros, the tombstone (set by Init, then read)
  // [begin, end) of destinations read into directly (AddDirectDestination).
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> direct_ranges_ ABSL_GUARDED_BY(mu_);
  NvmeStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cxlkv::nvme

#endif  // CXLKV_NVME_NVME_STORE_H_
