// cxlkv/orchestrator/pooled_arenas.h — a host's KV arenas in extents of its domain's pooled
// region, and read access to the arenas other hosts keep there.
//
// Grow() asks the orchestrator for one extent (a capacity lease), maps that window of the
// pool and formats a fresh arena in it: whatever a former holder left there is dead (the
// orchestrator lends an extent again only after the prefix index dropped every block of the
// old arena, docs/orchestrator.md "Extents and the arenas in them"). Shrink() gives it back,
// revoked or not.
//
// Revocation: the host may use an extent only while its lease holds on its own clock
// (HostClient::ExtentValid, which ends before the orchestrator's expiry). A watchdog thread
// checks each extent every 5 ms; when its lease lapsed (the orchestrator unreachable for
// most of a lease, a pause of this host, or this host fenced and rejoined), it replaces the
// extent's mapping in this process with private anonymous memory, so that nothing this process
// still writes there can reach the pool, which may already be lent to another host. The arena's
// contents read as zero from then on (a KV cache loses those blocks); revoked() says so and the C
// API fails every later call on that arena with CXLKV_E_REVOKED.
//
// Giving an extent away (revocation, Shrink, the destructor) always writes back every line
// this host dirtied in it, and fences, before the extent stops being this host's
// (pool/give_away.h): a line evicted later would land in the next holder's arena. Revocation
// swaps first and writes back through a second view of the pages (the process may still be
// running in the window); closing an arena writes its window back as the Region is
// destroyed, before Shrink's RPC. Destroying PooledArenas (leaving the domain) revokes what
// is still held: open arenas are swapped and written back, raw extents' callbacks run.
//
// Resolve() gives the address of a block in any host's extent arena (a published prefix
// block): the extent is mapped read-only-in-spirit (an arena opened read_only: never
// attached, never written) and cached by arena uuid; a miss asks the orchestrator which
// extents are assigned. Copies out of it count only under a validated lease (prefix.h).
//
// Thread-safety: every method may be called from any thread.
#ifndef CXLKV_ORCHESTRATOR_POOLED_ARENAS_H_
#define CXLKV_ORCHESTRATOR_POOLED_ARENAS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/pool/arena.h"

namespace cxlkv::orchestrator {

class PooledArenas {
 public:
  // `client` must outlive this object; its heartbeats must be running (StartHeartbeats).
  explicit PooledArenas(HostClient& client);
  ~PooledArenas();
  PooledArenas(const PooledArenas&) = delete;
  PooledArenas& operator=(const PooledArenas&) = delete;

  struct Grown {
    std::uint32_t extent = 0;
    std::unique_ptr<pool::Arena> arena;
    // Set when the extent was revoked (see above). Lives as long as this PooledArenas.
    const std::atomic<bool>* revoked = nullptr;
  };
  // One more extent with a fresh arena formatted in it (options.force is implied).
  absl::StatusOr<Grown> Grow(const pool::FormatOptions& options);
  // Gives the extent back. Close its arena first (the caller's last use of the memory; the
  // close writes the window back), after Closing(). A revoked extent is given back too (its
  // lease may have lapsed on this host's clock only); OK when the orchestrator had already
  // taken it.
  absl::Status Shrink(std::uint32_t extent);
  // Call before closing the arena of `extent` ahead of Shrink: OnGiveAway's callback is
  // forgotten (waiting for a revocation in progress), since what it ends goes with the
  // arena. (A revocation after the close leaves the window alone: the close wrote it back,
  // and its address may be mapped again for something else.)
  void Closing(std::uint32_t extent);
  // `fn` runs once, before a revocation or the destructor gives the extent away, while its
  // window still maps the extent: end there every use of the memory that bypasses this
  // process's page tables (a GPU registration's pinned pages stay DMA targets after the
  // window is swapped). It runs on the watchdog thread with this object's lock held: it must
  // not call back into PooledArenas. nullptr clears it. (Shrink's caller ends those uses
  // itself, before closing the arena.)
  void OnGiveAway(std::uint32_t extent, std::function<void()> fn);

  // One more extent for memory the caller maps and formats itself (a process heap): its
  // window's source spec. `revoke` is called from the watchdog thread when the lease
  // lapsed, instead of the mapping swap above: by the time it returns, the caller must no
  // longer write the window (it has the rest of the lease, at least a quarter of it,
  // before the orchestrator may lend the extent again). Give it back with Shrink().
  struct RawExtent {
    std::uint32_t extent = 0;
    std::uint64_t length = 0;
    std::string spec;
  };
  absl::StatusOr<RawExtent> GrowRaw(std::function<void(std::uint32_t extent)> revoke);

  // The address of block ref in whichever extent arena holds it (this host's or another's).
  // kNotFound: no assigned extent holds that arena; kFailedPrecondition: it does not hold
  // that block (freed, another generation).
  absl::StatusOr<std::byte*> Resolve(const coherence::BlockRef& ref);
  // Resolve() and the block's size (its class's block bytes), for a reader that must stay
  // inside the block. Errors as Resolve.
  struct BlockSpan {
    std::byte* addr = nullptr;
    std::uint64_t bytes = 0;
  };
  absl::StatusOr<BlockSpan> ResolveBlock(const coherence::BlockRef& ref);

  // Called (from the watchdog thread) after an extent was revoked.
  void OnRevoke(std::function<void(std::uint32_t extent)> fn);
  std::uint64_t revocations() const { return revocations_.load(); }

 private:
  struct Held {
    std::uint64_t region = 0;  // the arena's window (pool::Region::Track); 0 for raw extents
    std::uint64_t length = 0;
    pool::Uuid uuid{};
    std::unique_ptr<std::atomic<bool>> revoked;
    std::function<void(std::uint32_t)> revoke;  // raw extents: the caller's revocation
    std::function<void()> before_give_away;     // OnGiveAway
  };
  struct Peer {
    std::unique_ptr<pool::Arena> arena;  // read-only
  };
  std::string WindowSpec(std::uint64_t offset, std::uint64_t length) const;
  void Watch();
  void RevokeLocked(std::uint32_t extent, Held& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RefreshPeersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  HostClient& client_;
  // Guards the extents held and the peers' arenas (base::Mutex: docs/architecture.md).
  base::Mutex mu_;
  std::map<std::uint32_t, Held> held_ ABSL_GUARDED_BY(mu_);   // by extent index
  std::map<std::uint32_t, Peer> peers_ ABSL_GUARDED_BY(mu_);  // by extent index
  std::function<void(std::uint32_t)> on_revoke_ ABSL_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> revocations_{0};
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_POOLED_ARENAS_H_
