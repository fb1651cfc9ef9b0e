// The cross-domain directory's summary record (directory.h), as a reader gets it from etcd
// where any client with write access could have put it: DecodeSummary must refuse or accept
// without reading out of bounds, and an accepted record must answer lookups and encode back
// to the same bytes. When the first byte is odd the trailing CRC32C is recomputed before
// decoding, so the fuzzer gets past the checksum to the field checks.
// CXLKV_FUZZ_WRITE_SEED=PATH writes a valid small record as a seed and exits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/orchestrator/directory.h"

namespace dir = ::cxlkv::orchestrator::directory;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("CXLKV_FUZZ_WRITE_SEED");
  if (path == nullptr) return 0;
  dir::Summary s;
  s.domain = "rack-1";
  s.epoch = 7;
  s.published = 2;
  s.anchors = 2;
  s.filter = dir::BloomFilter(dir::SizeFor(16, 0.01));
  s.filter.Add({1, 2});
  s.filter.Add({3, 4});
  const std::string rec = dir::EncodeSummary(s);
  std::FILE* f = std::fopen(path, "wb");
  if (f == nullptr) std::abort();
  std::fwrite(rec.data(), 1, rec.size(), f);
  std::fclose(f);
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (size > 4 && (data[0] & 1) != 0) {
    const std::uint32_t crc = cxlkv::coherence::Crc32c(bytes.data(), size - 4);
    std::memcpy(&bytes[size - 4], &crc, 4);
  }
  auto s = dir::DecodeSummary(bytes);
  if (!s.ok()) return 0;
  const cxlkv::coherence::PrefixKey k{size, bytes.empty() ? 0u : std::uint64_t{data[0]}};
  (void)s->filter.MayContain(k);
  (void)dir::IsAnchor(k, s->anchor_every);
  if (dir::EncodeSummary(*s) != bytes) __builtin_trap();
  return 0;
}
