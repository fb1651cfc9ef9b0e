// Fuzzes every reader of the shared domain tables on corrupted bytes: the domain header,
// index entries (host lookups and the owner's load), owner lines, host rows, request rings,
// return rings and lease rows (owner scans). When the first byte is odd the input is laid
// under a freshly sealed header of a small geometry, so the fuzzer reaches the tables.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cxlkv/coherence/prefix.h"

using namespace cxlkv::coherence;

namespace {
class FixedClock final : public Clock {
 public:
  std::int64_t NowMs() override { return now += 50; }
  std::int64_t now = 0;
};
}  // namespace

// CXLKV_FUZZ_WRITE_SEED=PATH writes a domain image with published entries, leases and
// pending requests (first byte odd: the fuzz target reseals its header) and exits.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("CXLKV_FUZZ_WRITE_SEED");
  if (path == nullptr) return 0;
  const DomainGeometry g{4, 16, 4, 4, 100, 100, 10};
  std::vector<std::uint64_t> image(DomainBytes(g) / 8 + 1);
  DirectMem mem(reinterpret_cast<std::byte*>(image.data()), image.size() * 8);
  FixedClock clock;
  if (!FormatDomain(mem, g).ok()) std::abort();
  auto owner = std::move(*PrefixOwner::Open(mem, clock));
  auto a = std::move(*PrefixHost::Join(mem, clock, 0));
  auto b = std::move(*PrefixHost::Join(mem, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  for (std::uint32_t t = 0; t < 6; ++t) {
    BlockRef r{};
    r.index = t;
    (void)a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, r);
  }
  owner->Step();
  for (std::uint32_t t = 0; t < 3; ++t) {
    (void)b->Heartbeat(nullptr);
    (void)b->LookupAndAcquire(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)));
  }
  const std::uint32_t t = 9;
  (void)a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, BlockRef{});
  reinterpret_cast<unsigned char*>(image.data())[0] |= 1;  // keep the reseal path
  std::FILE* f = std::fopen(path, "wb");
  if (f == nullptr) std::abort();
  std::fwrite(image.data(), 1, DomainBytes(g), f);
  std::fclose(f);
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const DomainGeometry g{4, 16, 4, 4, 100, 100, 10};
  const std::size_t need = DomainBytes(g);
  std::vector<std::uint64_t> image((std::max(size, need) + 7) / 8);
  auto* base = reinterpret_cast<std::byte*>(image.data());
  std::memcpy(base, data, size);
  DirectMem mem(base, image.size() * 8);
  if (data[0] & 1) {
    // A valid header over the fuzzer's tables.
    std::vector<std::uint64_t> scratch(image.size());
    DirectMem fresh(reinterpret_cast<std::byte*>(scratch.data()), scratch.size() * 8);
    if (!FormatDomain(fresh, g).ok()) return 0;
    std::memcpy(base, scratch.data(), sizeof(DomainHeader));
  }
  if (!ReadDomainHeader(mem).ok()) return 0;
  FixedClock clock;
  auto owner = PrefixOwner::Open(mem, clock);
  auto host = PrefixHost::Join(mem, clock, data[1] % 4);
  if (host.ok()) {
    PrefixKey key{0, 0};
    std::memcpy(&key, data + 2, std::min<std::size_t>(size - 2, sizeof(key)));
    const Namespace ns = size > 20 ? data[18] | (std::uint64_t{data[19]} << 8) : 1;
    if (auto hit = (*host)->Lookup(ns, key)) (void)(*host)->Acquire(*hit);
    std::vector<BlockRef> back;
    (void)(*host)->Heartbeat(&back);
  }
  if (owner.ok()) {
    (*owner)->Step();
    (*owner)->Evict(4);
  }
  return 0;
}
