// EventSink in a build without KV events (libzmq, cppzmq or msgpack-cxx missing at configure
// time, or CXLKV_WITH_KV_EVENTS=OFF): an [events] endpoint is refused with the way to get them.
#include "event_sink.h"

namespace cxlkv::orchestrator {

absl::StatusOr<std::unique_ptr<EventSink>> MakeEventSink(const Config& c) {
  if (!c.events.enabled()) return std::unique_ptr<EventSink>();
  return absl::FailedPreconditionError(
      "events.endpoint is set, but this cxlkv-orchestrator was built without KV events "
      "(libzmq, cppzmq and msgpack-cxx were missing): install libzmq3-dev cppzmq-dev "
      "libmsgpack-cxx-dev (scripts/deps does) and rebuild, or drop events.endpoint");
}

}  // namespace cxlkv::orchestrator
