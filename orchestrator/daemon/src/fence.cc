// The fence line, the release line and the single owner's mark: read with retries, written
// sealed, flushed and fenced; the release after the domain's write-back.
#include "fence.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

bool ReadFenceLine(co::Mem& mem, co::OwnerFenceLine* out) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    // Written by another host (an earlier or a rival leader): drop our copy first.
    mem.Invalidate(co::kOwnerFenceOffset, sizeof(*out));
    mem.Read(co::kOwnerFenceOffset, out, sizeof(*out));
    if (co::LineValid(*out)) return true;
  }
  return false;
}

void WriteFenceLine(co::Mem& mem, const co::OwnerFenceLine& l) {
  co::OwnerFenceLine line = l;
  line.version = co::kOwnerFenceVersion;
  co::SealLine(line);
  mem.Write(co::kOwnerFenceOffset, &line, sizeof(line));
  mem.Flush(co::kOwnerFenceOffset, sizeof(line));
  // Ordered before every later store of this leader (rings, index, the next batch): a host
  // or a rival that sees any of those also sees this line.
  mem.Fence();
}

bool ReadReleaseLine(co::Mem& mem, co::OwnerReleaseLine* out) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    // Written by another host (a deposed leader or its agent): drop our copy first.
    mem.Invalidate(co::kOwnerReleaseOffset, sizeof(*out));
    mem.Read(co::kOwnerReleaseOffset, out, sizeof(*out));
    if (co::LineValid(*out)) return true;
  }
  return false;
}

void WriteBackDomain(co::Mem& mem, std::uint64_t len) {
  // In chunks, so no length overflows.
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 20;
  for (std::uint64_t off = 0; off < len; off += kChunk) {
    mem.Flush(off, static_cast<std::size_t>(std::min(kChunk, len - off)));
  }
  mem.Fence();
}

bool ReadSingleOwnerLine(co::Mem& mem, co::SingleOwnerLine* out) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    // Written by another host (a single orchestrator there): drop our copy first.
    mem.Invalidate(co::kSingleOwnerOffset, sizeof(*out));
    mem.Read(co::kSingleOwnerOffset, out, sizeof(*out));
    if (co::LineValid(*out)) return true;
  }
  return false;
}

void WriteSingleOwnerLine(co::Mem& mem, const co::SingleOwnerLine& l) {
  co::SingleOwnerLine line = l;
  line.version = co::kSingleOwnerVersion;
  co::SealLine(line);
  mem.Write(co::kSingleOwnerOffset, &line, sizeof(line));
  mem.Flush(co::kSingleOwnerOffset, sizeof(line));
  // Ordered before this owner's later stores: a reader on another machine that sees any of
  // them (an index entry, a ring) also sees this mark.
  mem.Fence();
}

std::string DescribeSingleOwner(const co::SingleOwnerLine& l) {
  const std::string host(l.host, strnlen(l.host, sizeof(l.host)));
  return absl::StrCat("a single cxlkv-orchestrator (no [etcd]) on host '", host, "', pid ", l.pid);
}

std::int64_t SingleOwnerStillAfterMs(const co::SingleOwnerLine& l) {
  return std::clamp<std::int64_t>(std::int64_t{20} * l.period_ms, 200, 1000);
}

bool SingleOwnerAdvances(co::Mem& mem, const co::SingleOwnerLine& seen, std::int64_t wait_ms,
                         co::SingleOwnerLine* now) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  *now = seen;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!ReadSingleOwnerLine(mem, now)) continue;  // torn: being written, look again
    if (std::memcmp(now, &seen, sizeof(seen)) != 0) return true;
  }
  return false;
}

void ReleaseTerm(co::Mem& mem, std::uint64_t len, const co::OwnerReleaseLine& l) {
  // 1. Every dirty line of the domain on this machine goes to memory: the term's stores that
  // were made but not yet written back (a process stopped or killed between a store and its
  // clwb) land now, not after a successor's stores. In chunks, so no length overflows.
  // (WriteBackDomain's steps, spelled out here: the mutation test names this fence.)
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 20;
  for (std::uint64_t off = 0; off < len; off += kChunk) {
    mem.Flush(off, static_cast<std::size_t>(std::min(kChunk, len - off)));
  }
  // 2. Ordered after those write-backs: a successor that sees the release line finds every
  // one of them in memory (it evicts its own copies before it reads, PrefixOwner::Open).
  mem.Fence();
  co::OwnerReleaseLine line = l;
  line.version = co::kOwnerReleaseVersion;
  co::SealLine(line);
  mem.Write(co::kOwnerReleaseOffset, &line, sizeof(line));
  mem.Flush(co::kOwnerReleaseOffset, sizeof(line));
  mem.Fence();
}

bool TermReleased(bool fence_valid, const co::OwnerFenceLine& fence, bool release_valid,
                  const co::OwnerReleaseLine& release,
                  const co::OwnerReleaseLine& release_at_start) {
  if (fence_valid && fence.epoch == 0) return true;  // never owned by an elected leader
  if (!release_valid || release.epoch == 0) return false;
  if (!fence_valid) return std::memcmp(&release, &release_at_start, sizeof(release)) != 0;
  return release.epoch == fence.epoch && release.cluster_id == fence.cluster_id;
}

}  // namespace cxlkv::orchestrator
