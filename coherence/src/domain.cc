// Prefix keys, namespaces, and the domain header: format and validation.
#include <sys/random.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/prefix.h"

namespace cxlkv::coherence {
namespace {

// RegionRef's mark in arena[6]: an arena id (an RFC 4122 version-4 UUID) has 0x4? there.
constexpr std::uint8_t kRegionRefMark = 0xE0;

std::uint32_t RoundUpPow2(std::uint32_t v) {
  std::uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

DomainHeader Plan(const DomainGeometry& g) {
  DomainHeader h{};
  h.max_hosts = g.max_hosts;
  h.index_entries = RoundUpPow2(g.index_entries);
  h.lease_rows = g.lease_rows;
  h.ring_slots = g.ring_slots;
  h.lease_ttl_ms = g.lease_ttl_ms;
  h.host_ttl_ms = g.host_ttl_ms;
  h.grace_ms = g.grace_ms;
  std::uint64_t at = 4096;
  h.owner_area_offset = at;
  at += std::uint64_t{h.max_hosts} * kLine;
  h.host_rows_offset = at;
  at += std::uint64_t{h.max_hosts} * kLine;
  h.request_rings_offset = at;
  at += std::uint64_t{h.max_hosts} * h.ring_slots * sizeof(RequestSlot);
  h.return_rings_offset = at;
  at += std::uint64_t{h.max_hosts} * h.ring_slots * sizeof(ReturnSlot);
  h.lease_rows_offset = at;
  at += std::uint64_t{h.max_hosts} * h.lease_rows * sizeof(LeaseRow);
  h.index_offset = at;
  at += std::uint64_t{h.index_entries} * sizeof(IndexEntry);
  h.end_offset = at;
  return h;
}

absl::Status CheckGeometry(const DomainHeader& h, std::uint64_t mem_bytes) {
  auto bad = [](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("domain header: ", what,
                                            "; the region is not a valid cxlkv domain"));
  };
  if (h.max_hosts == 0 || h.max_hosts > 255) return bad("max_hosts out of 1..255");
  if (h.index_entries == 0 || (h.index_entries & (h.index_entries - 1)) != 0 ||
      h.index_entries > (1u << 26)) {
    return bad("index_entries not a power of two up to 2^26");
  }
  if (h.lease_rows == 0 || h.lease_rows > (1u << 20)) return bad("lease_rows out of range");
  if (h.ring_slots == 0 || h.ring_slots > (1u << 16)) return bad("ring_slots out of range");
  if (h.lease_ttl_ms == 0 || h.host_ttl_ms == 0) return bad("zero TTL");
  const DomainHeader expect = Plan(DomainGeometry{h.max_hosts, h.index_entries, h.lease_rows,
                                                  h.ring_slots, h.lease_ttl_ms, h.host_ttl_ms,
                                                  h.grace_ms});
  if (h.owner_area_offset != expect.owner_area_offset ||
      h.host_rows_offset != expect.host_rows_offset ||
      h.request_rings_offset != expect.request_rings_offset ||
      h.return_rings_offset != expect.return_rings_offset ||
      h.lease_rows_offset != expect.lease_rows_offset || h.index_offset != expect.index_offset ||
      h.end_offset != expect.end_offset) {
    return bad("table offsets do not follow from the geometry");
  }
  if (h.end_offset > mem_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "domain needs ", h.end_offset, " bytes but the region has ", mem_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

Namespace MakeNamespace(absl::string_view tenant, absl::string_view model,
                        absl::string_view kv_layout) {
  // Length-prefixed so ("ab","c") and ("a","bc") differ.
  std::string buf;
  for (absl::string_view part : {tenant, model, kv_layout}) {
    const auto n = static_cast<std::uint32_t>(part.size());
    buf.append(reinterpret_cast<const char*>(&n), sizeof(n));
    buf.append(part.data(), part.size());
  }
  const Namespace ns = XXH3_64bits(buf.data(), buf.size());
  return ns == 0 ? 1 : ns;  // 0 marks an empty entry
}

PrefixKey ChainKey(Namespace ns, const PrefixKey& parent, std::span<const std::uint32_t> tokens) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, &ns, sizeof(ns));
  XXH3_128bits_update(st, &parent.lo, sizeof(parent.lo));
  XXH3_128bits_update(st, &parent.hi, sizeof(parent.hi));
  XXH3_128bits_update(st, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  PrefixKey k{h.low64, h.high64};
  if (k.lo == 0 && k.hi == 0) k.lo = 1;  // the zero key is the root, never a block
  return k;
}

std::uint64_t DomainBytes(const DomainGeometry& g) { return Plan(g).end_offset; }

absl::Status FormatDomain(Mem& mem, const DomainGeometry& g) {
  if (g.max_hosts == 0 || g.max_hosts > 255 || g.lease_rows == 0 || g.ring_slots == 0 ||
      g.index_entries == 0 || g.lease_ttl_ms == 0 || g.host_ttl_ms == 0) {
    return absl::InvalidArgumentError(
        "domain geometry: max_hosts must be 1..255 and every table size and TTL > 0");
  }
  DomainHeader h = Plan(g);
  if (auto st = CheckGeometry(h, mem.size_bytes()); !st.ok()) return st;
  // Tables first (all zero = empty), header last: a half-formatted domain has no header.
  const std::vector<std::byte> zero(1 << 16);
  for (std::uint64_t off = 0; off < h.end_offset; off += zero.size()) {
    mem.Write(off, zero.data(), std::min<std::uint64_t>(zero.size(), h.end_offset - off));
  }
  mem.Flush(0, h.end_offset);
  mem.Fence();
  Seal(h, kDomainMagic, kDomainVersion, 1);
  mem.Write(0, &h, sizeof(h));
  mem.Flush(0, sizeof(h));
  mem.Fence();
  return absl::OkStatus();
}

absl::StatusOr<DomainHeader> ReadDomainHeader(Mem& mem) {
  if (mem.size_bytes() < 4096) return absl::InvalidArgumentError("region too small for a domain");
  DomainHeader h;
  mem.Invalidate(0, sizeof(h));
  mem.Read(0, &h, sizeof(h));
  if (auto st = Check(h, kDomainMagic, kDomainVersion, kDomainVersion, "domain header"); !st.ok()) {
    return st;
  }
  if (auto st = CheckGeometry(h, mem.size_bytes()); !st.ok()) return st;
  return h;
}

namespace {

// A key's text form: its secret's bytes in lowercase hex.
std::string KeyText(const DomainKeyLine& l) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(l.secret), sizeof(l.secret)));
}

}  // namespace

absl::StatusOr<std::string> ReadDomainKey(Mem& mem) {
  if (mem.size_bytes() < 4096) return absl::InvalidArgumentError("region too small for a domain");
  DomainKeyLine l{};
  for (int attempt = 0; attempt < 8; ++attempt) {
    // Written once by the domain's owner, maybe on another host: drop our copy first.
    mem.Invalidate(kDomainKeyOffset, sizeof(l));
    mem.Read(kDomainKeyOffset, &l, sizeof(l));
    if (!LineValid(l)) continue;               // torn: being written, or its writer died writing it
    if (l.version == 0) return std::string();  // the all-zero line: no key yet
    if (l.version != kDomainKeyVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the domain's publish key line has version ", l.version, ", this build reads ",
          kDomainKeyVersion, ": a newer cxlkv wrote it; run that version"));
    }
    return KeyText(l);
  }
  return absl::DataLossError(
      "the domain's publish key line is torn (its writer died writing it); the domain's owner "
      "writes a new one when it opens the domain");
}

absl::StatusOr<std::string> CreateDomainKey(Mem& mem, std::int64_t now_ms) {
  if (mem.size_bytes() < 4096) return absl::InvalidArgumentError("region too small for a domain");
  DomainKeyLine l{};
  std::size_t got = 0;
  while (got < sizeof(l.secret)) {
    const ssize_t n = ::getrandom(l.secret + got, sizeof(l.secret) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("getrandom for the domain's publish key: ",
                       std::error_code(errno, std::generic_category()).message()));
    }
    got += static_cast<std::size_t>(n);
  }
  l.created_ms = now_ms;
  l.version = kDomainKeyVersion;
  SealLine(l);
  mem.Write(kDomainKeyOffset, &l, sizeof(l));
  mem.Flush(kDomainKeyOffset, sizeof(l));
  // Before anything keyed with it leaves the domain: another owner (a successor, another
  // machine) that reads the line later finds this key, not an empty line it would replace.
  mem.Fence();
  DomainKeyLine back{};
  mem.Read(kDomainKeyOffset, &back, sizeof(back));
  if (std::memcmp(&back, &l, sizeof(l)) != 0) {
    return absl::UnavailableError(
        "the domain's publish key was not stored (this orchestrator may no longer write the "
        "domain)");
  }
  return KeyText(l);
}

absl::StatusOr<BlockRef> RegionRef(const RegionObject& o) {
  if (o.offset >= (std::uint64_t{1} << 48)) {
    return absl::InvalidArgumentError(
        absl::StrCat("region object offset ", o.offset, " is not below 2^48"));
  }
  if (o.length == 0 || o.length > 0xFFFFFFFFull) {
    return absl::InvalidArgumentError(
        absl::StrCat("region object length ", o.length, " is not in 1..2^32-1"));
  }
  if (o.generation == 0) return absl::InvalidArgumentError("region object generation 0");
  BlockRef r{};
  for (int b = 0; b < 6; ++b) r.arena[b] = static_cast<std::uint8_t>(o.offset >> (8 * b));
  r.arena[6] = kRegionRefMark;
  for (int b = 0; b < 8; ++b) r.arena[8 + b] = static_cast<std::uint8_t>(o.generation >> (8 * b));
  r.index = static_cast<std::uint32_t>(o.length);
  r.generation = o.region_tag;
  return r;
}

std::optional<RegionObject> AsRegionObject(const BlockRef& ref) {
  if (ref.arena[6] != kRegionRefMark || ref.arena[7] != 0 || ref.index == 0) return std::nullopt;
  RegionObject o;
  for (int b = 0; b < 6; ++b) o.offset |= std::uint64_t{ref.arena[b]} << (8 * b);
  for (int b = 0; b < 8; ++b) o.generation |= std::uint64_t{ref.arena[8 + b]} << (8 * b);
  if (o.generation == 0) return std::nullopt;
  o.length = ref.index;
  o.region_tag = ref.generation;
  return o;
}

}  // namespace cxlkv::coherence
