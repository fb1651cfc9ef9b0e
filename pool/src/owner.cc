#include "owner.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "cxlkv/coherence/crc32c.h"

namespace cxlkv::pool::internal {
namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::uint64_t HashText(const std::string& s) { return XXH3_64bits(s.data(), s.size()); }

// Field 22 of /proc/PID/stat (start time in clock ticks since boot); 0 if unreadable.
// *state gets field 3 (R, S, D, Z, X, ...), or '?'.
std::uint64_t StartTicks(std::uint32_t pid, char* state = nullptr) {
  if (state != nullptr) *state = '?';
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%u/stat", pid);
  const std::string stat = ReadSmallFile(path);
  // The command name (field 2) may contain spaces and parentheses: skip to the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  if (state != nullptr && close + 2 < stat.size()) *state = stat[close + 2];
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

std::uint32_t IdentityCrc(const OwnerSlot& s) {
  const std::uint64_t f[5] = {s.start_ticks, s.boot_id_hash, s.machine_hash, s.pidns_ino,
                              s.attached_unix_ns};
  return coherence::Crc32c(f, sizeof(f));
}

}  // namespace

Identity SelfIdentity() {
  static const std::uint64_t boot = HashText(ReadSmallFile("/proc/sys/kernel/random/boot_id"));
  // A machine is named by /etc/machine-id, else the DMI product uuid. Without either (a
  // minimal VM, an initramfs) two hosts can look alike by hostname, so the boot id stands in:
  // the owner then is never judged dead across hosts, at the price of also not across
  // reboots of this host (`cxlkvctl arena recover` reports such slots as live).
  static const std::uint64_t machine = [] {
    std::string id = ReadSmallFile("/etc/machine-id");
    if (id.empty()) id = ReadSmallFile("/sys/class/dmi/id/product_uuid");
    if (id.empty()) return boot;
    return HashText(id);
  }();
  Identity self;
  self.pid = static_cast<std::uint32_t>(::getpid());
  self.start_ticks = StartTicks(self.pid);
  self.boot_id_hash = boot;
  self.machine_hash = machine;
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0) self.pidns_ino = st.st_ino;
  return self;
}

void StampSlot(OwnerSlot& slot, const Identity& self) {
  slot.start_ticks = self.start_ticks;
  slot.boot_id_hash = self.boot_id_hash;
  slot.machine_hash = self.machine_hash;
  slot.pidns_ino = self.pidns_ino;
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  slot.attached_unix_ns = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
                          static_cast<std::uint64_t>(ts.tv_nsec);
  slot.crc = IdentityCrc(slot);
}

bool PidIsGone(std::uint32_t pid) {
  if (pid == 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

bool OwnerIsDead(const OwnerSlot& slot, std::uint64_t word, const Identity& self) {
  const std::uint32_t pid = SlotWordPid(word);
  switch (SlotWordState(word)) {
    case kSlotFree:
      return false;
    case kSlotClaiming:
    case kSlotReclaiming:
      return PidIsGone(pid);
    case kSlotActive:
      break;
    default:
      return false;
  }
  if (slot.crc != IdentityCrc(slot)) return PidIsGone(pid);  // identity torn: PID alone
  if (slot.machine_hash != self.machine_hash) return false;  // another host: not ours
  if (slot.boot_id_hash != self.boot_id_hash) return true;   // this host, earlier boot
  if (slot.pidns_ino != self.pidns_ino) return false;        // cannot see its PIDs
  if (PidIsGone(pid)) return true;
  char state = '?';
  const std::uint64_t ticks = StartTicks(pid, &state);
  if (state == 'Z' || state == 'X') return true;   // exited, not yet reaped
  return ticks != 0 && ticks != slot.start_ticks;  // PID reused by another process
}

}  // namespace cxlkv::pool::internal
