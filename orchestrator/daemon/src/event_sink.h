// Where the announcer's KV events go (private to the daemon; docs/kv_events.md). events_zmq.cc
// implements it on orchestrator/events (vLLM's wire format on ZMQ PUB); events_off.cc, built
// when libzmq, cppzmq or msgpack-cxx were missing, refuses an [events] endpoint with the way
// to get them.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_EVENT_SINK_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_EVENT_SINK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/orchestrator/config.h"

namespace cxlkv::orchestrator {

struct SinkCounts {
  std::uint64_t batches = 0, events = 0, drops = 0;
};

class EventSink {
 public:
  virtual ~EventSink() = default;
  // One round of news: AllBlocksCleared first when `cleared`, a BlockStored per key of
  // `stored`, one BlockRemoved naming `removed`; split into batches of at most 1,024 events.
  // Adds what was sent and dropped to *counts. Never blocks.
  virtual void Publish(bool cleared, const std::vector<coherence::PrefixKey>& stored,
                       const std::vector<coherence::PrefixKey>& removed, SinkCounts* counts) = 0;
};

// Null (and OK) when events.endpoint is empty. kInvalidArgument for an endpoint ZMQ refuses;
// kFailedPrecondition in a build without KV events.
absl::StatusOr<std::unique_ptr<EventSink>> MakeEventSink(const Config& c);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_EVENT_SINK_H_
