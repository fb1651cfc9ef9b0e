// What the leader of a domain tells the world outside it (private to the daemon): its entry
// in the cross-domain prefix directory (a Bloom filter over the published chain keys, kept in
// etcd under the leader's lease; docs/ha.md) and KV events for routers (vLLM's wire format on
// ZMQ; docs/kv_events.md).
//
// One thread. Every events.interval_ms (without events: every 50 ms once a directory write
// could be due) it looks at the prefix owner's counters under the orchestrator's mutex; when
// they moved it copies the published keys (a pass over the owner's in-memory copy of the
// index, under the mutex: 64 bytes read per entry). Outside the mutex it diffs the
// copy against the last one for events (BlockStored for keys that appeared, BlockRemoved for
// keys that went) and, rate-limited to one write per directory.min_interval_ms (and at least
// one per directory.refresh_ms), writes the summary to etcd. Each new term (a takeover, or the
// start of a single orchestrator) opens with AllBlocksCleared and a BlockStored per published
// key, since a router cannot know what a previous leader had announced. A block published and
// retired between two looks produces no event.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_ANNOUNCE_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_ANNOUNCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/orchestrator/config.h"

namespace cxlkv::orchestrator {

class DomainCore;
class HaSession;

struct AnnounceStats {
  std::uint64_t directory_writes = 0, directory_failures = 0;
  std::uint64_t event_batches = 0, events = 0, event_drops = 0;
};

class Announcer {
 public:
  // `ha` is null without [etcd] (no directory then). kInvalidArgument for an events endpoint
  // ZMQ refuses; kFailedPrecondition for [events] in a build without ZMQ/msgpack.
  static absl::StatusOr<std::unique_ptr<Announcer>> Start(DomainCore& core, const Config& c,
                                                          HaSession* ha);
  ~Announcer();
  void Stop();
  AnnounceStats stats() const;

  struct Impl;

 private:
  explicit Announcer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_ANNOUNCE_H_
