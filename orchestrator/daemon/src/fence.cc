// The fence line: read with retries, written sealed, flushed and fenced.
#include "fence.h"

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

}  // namespace cxlkv::orchestrator
