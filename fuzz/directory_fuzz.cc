// The cross-domain directory's summary record (directory.h), as a reader gets it from etcd
// where any client with write access could have put it: DecodeSummary must refuse or accept
// without reading out of bounds, and an accepted record must answer lookups and encode back
// to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cxlkv/orchestrator/directory.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace dir = ::cxlkv::orchestrator::directory;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto s = dir::DecodeSummary(bytes);
  if (!s.ok()) return 0;
  const cxlkv::coherence::PrefixKey k{size, bytes.empty() ? 0u : std::uint64_t{data[0]}};
  (void)s->filter.MayContain(k);
  (void)dir::IsAnchor(k, s->anchor_every);
  if (dir::EncodeSummary(*s) != bytes) __builtin_trap();
  return 0;
}
