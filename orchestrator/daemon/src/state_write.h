// A state write of unknown outcome (orchestrator HA, docs/ha.md "A write of unknown outcome";
// private to the daemon): what the leader concludes from the domain's state key read back
// after a guarded write whose reply was lost.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_STATE_WRITE_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_STATE_WRITE_H_

#include <cstdint>
#include <string>

namespace cxlkv::orchestrator {

enum class UnknownWrite {
  kLanded,         // the key holds this write: answer the change, guard the next write by it
  kDidNotLand,     // the key is as the write's guard saw it: refuse and undo the change
  kAnotherWriter,  // anything else: someone else wrote the key; this leader's view is stale
};

// `text`: what the write put; `seen`: the key's mod revision the write was guarded by (0: the
// key was absent); `back_revision` and `back_value`: the key read back (0 and "": absent).
// The read failing too leaves the outcome unknown: that is the caller's (the next guard tells).
UnknownWrite ResolveUnknownWrite(const std::string& text, std::int64_t seen,
                                 std::int64_t back_revision, const std::string& back_value);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_STATE_WRITE_H_
