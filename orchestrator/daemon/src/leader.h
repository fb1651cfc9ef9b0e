// What daemon.cc (Open) and leader.cc (the takeover) share, private to the daemon.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_LEADER_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_LEADER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/orchestrator/config.h"

namespace cxlkv::orchestrator {

// Formats the prefix domain (all tables empty) after checking that it fits.
absl::Status FormatPrefixDomain(coherence::Mem& mem, const Config& c, std::uint64_t region_bytes);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_LEADER_H_
