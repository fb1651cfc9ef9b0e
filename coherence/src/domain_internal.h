// Offsets of the domain's lines and the probe start of a key (private to coherence/).
#ifndef CXLKV_COHERENCE_SRC_DOMAIN_INTERNAL_H_
#define CXLKV_COHERENCE_SRC_DOMAIN_INTERNAL_H_

#include <cstdint>

#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/prefix.h"

namespace cxlkv::coherence::internal {

inline std::uint64_t OwnerLineOff(const DomainHeader& h, std::uint32_t host) {
  return h.owner_area_offset + std::uint64_t{host} * kLine;
}
inline std::uint64_t HostRowOff(const DomainHeader& h, std::uint32_t host) {
  return h.host_rows_offset + std::uint64_t{host} * kLine;
}
inline std::uint64_t RequestSlotOff(const DomainHeader& h, std::uint32_t host, std::uint64_t seq) {
  return h.request_rings_offset +
         (std::uint64_t{host} * h.ring_slots + (seq - 1) % h.ring_slots) * sizeof(RequestSlot);
}
inline std::uint64_t ReturnSlotOff(const DomainHeader& h, std::uint32_t host, std::uint64_t seq) {
  return h.return_rings_offset +
         (std::uint64_t{host} * h.ring_slots + (seq - 1) % h.ring_slots) * sizeof(ReturnSlot);
}
inline std::uint64_t LeaseRowOff(const DomainHeader& h, std::uint32_t host, std::uint32_t row) {
  return h.lease_rows_offset + (std::uint64_t{host} * h.lease_rows + row) * sizeof(LeaseRow);
}
inline std::uint64_t EntryOff(const DomainHeader& h, std::uint32_t i) {
  return h.index_offset + std::uint64_t{i} * sizeof(IndexEntry);
}
inline std::uint32_t ProbeStart(const DomainHeader& h, Namespace ns, const PrefixKey& key) {
  return static_cast<std::uint32_t>((key.lo ^ (ns * 0x9E3779B97F4A7C15ull)) &
                                    (h.index_entries - 1));
}
inline bool KeyMatches(const IndexEntry& e, Namespace ns, const PrefixKey& key) {
  return e.ns == ns && e.key[0] == key.lo && e.key[1] == key.hi;
}

// Reads a line record written by another host: Invalidate, read, check the CRC; retries a
// torn or half-visible record a few times. False if it never validated.
template <typename T>
bool ReadShared(Mem& mem, std::uint64_t off, T* out) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    mem.Invalidate(off, sizeof(T));
    mem.Read(off, out, sizeof(T));
#ifdef CXLKV_FAULT_NO_CRC_CHECK  // defined only by a fault-injection test build
    return true;
#endif
    if (LineValid(*out)) return true;
  }
  return false;
}

// Seals and writes a record of this host's, flushes it, and fences (a store fence: what
// follows is a store that makes the record reachable, or nothing). Where a later load must
// not pass the record (rule 4), the writer's next read of another writer's line is an
// Invalidate or a FullFence, whose mfence keeps every load behind it.
template <typename T>
void WriteShared(Mem& mem, std::uint64_t off, T r) {
  SealLine(r);
  mem.Write(off, &r, sizeof(T));
  mem.Flush(off, sizeof(T));
  mem.Fence();
}

}  // namespace cxlkv::coherence::internal

#endif  // CXLKV_COHERENCE_SRC_DOMAIN_INTERNAL_H_
