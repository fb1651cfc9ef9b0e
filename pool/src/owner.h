// Owner identity and liveness for arena owner slots (private to pool/).
#ifndef CXLKV_POOL_SRC_OWNER_H_
#define CXLKV_POOL_SRC_OWNER_H_

#include <cstdint>

#include "cxlkv/pool/layout.h"

namespace cxlkv::pool::internal {

struct Identity {
  std::uint32_t pid = 0;
  std::uint64_t start_ticks = 0;
  std::uint64_t boot_id_hash = 0;
  std::uint64_t machine_hash = 0;
  std::uint64_t pidns_ino = 0;
};

// This process, read now (pid changes across fork).
Identity SelfIdentity();

// Writes the identity fields and their CRC into a slot this process has claimed.
void StampSlot(OwnerSlot& slot, const Identity& self);

// True if the owner recorded in `slot` (whose state word is `word`) is certainly dead:
// a process on this machine and boot that no longer exists or whose PID was reused, or a
// process of this machine from an earlier boot. Owners on other machines or in other PID
// namespaces are never judged dead here.
bool OwnerIsDead(const OwnerSlot& slot, std::uint64_t word, const Identity& self);

// True if the process `pid` does not exist (used for claiming and reclaiming states).
bool PidIsGone(std::uint32_t pid);

}  // namespace cxlkv::pool::internal

#endif  // CXLKV_POOL_SRC_OWNER_H_
