// LMCache's memory coordinator over a region of the pool: the logic and the state file.
#include "cxlkv/coordinator/coordinator.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/pool/region.h"
#include "nlohmann/json.hpp"

namespace cxlkv::coordinator {
namespace {

using json = nlohmann::json;

std::string RandomHex128() {
  std::random_device rd;
  std::string s;
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 4; ++i) {
    std::uint32_t w = rd();
    for (int j = 0; j < 8; ++j) {
      s.push_back(kHex[w & 0xF]);
      w >>= 4;
    }
  }
  return s;
}

// The canonical form of a key inside a namespace (fields joined by a byte no field holds).
std::string Canonical(const std::string& ns, const ObjectKey& k) {
  return absl::StrCat(ns, "\x1f", k.chunk_hash_hex, "\x1f", k.model_name, "\x1f", k.kv_rank,
                      "\x1f", k.object_group_id, "\x1f", k.cache_salt);
}

json KeyJson(const ObjectKey& k) {
  return json{{"chunk_hash_hex", k.chunk_hash_hex},
              {"model_name", k.model_name},
              {"kv_rank", k.kv_rank},
              {"object_group_id", k.object_group_id},
              {"cache_salt", k.cache_salt}};
}

ObjectKey KeyFrom(const json& j) {
  ObjectKey k;
  k.chunk_hash_hex = j.at("chunk_hash_hex").get<std::string>();
  k.model_name = j.at("model_name").get<std::string>();
  k.kv_rank = j.at("kv_rank").get<std::int64_t>();
  k.object_group_id = j.at("object_group_id").get<std::int64_t>();
  k.cache_salt = j.at("cache_salt").get<std::string>();
  return k;
}

bool TakeFrom(std::map<std::uint64_t, std::uint64_t>* free, std::uint64_t bytes,
              std::uint64_t* offset) {
  for (auto it = free->begin(); it != free->end(); ++it) {
    if (it->second < bytes) continue;
    *offset = it->first;
    const std::uint64_t rest = it->second - bytes;
    const std::uint64_t at = it->first + bytes;
    free->erase(it);
    if (rest > 0) free->emplace(at, rest);
    return true;
  }
  return false;
}

void GiveBack(std::map<std::uint64_t, std::uint64_t>* free, std::uint64_t offset,
              std::uint64_t bytes) {
  auto [it, inserted] = free->emplace(offset, bytes);
  (void)inserted;
  auto next = std::next(it);
  if (next != free->end() && it->first + it->second == next->first) {
    it->second += next->second;
    free->erase(next);
  }
  if (it != free->begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free->erase(it);
    }
  }
}

std::uint64_t FreeBytes(const std::map<std::uint64_t, std::uint64_t>& free) {
  std::uint64_t n = 0;
  for (const auto& [o, l] : free) n += l;
  return n;
}

absl::Status StaleEpoch() {
  return absl::FailedPreconditionError(
      "stale_epoch: request epoch does not match the coordinator region epoch (GET /v1/region)");
}

}  // namespace

std::uint32_t DtypeBytes(const std::string& name) {
  static const std::map<std::string, std::uint32_t> kBytes = {
      {"bool", 1},    {"uint8", 1},    {"int8", 1},     {"float8_e4m3fn", 1},
      {"float8_e5m2", 1}, {"int16", 2}, {"float16", 2}, {"bfloat16", 2},
      {"int32", 4},   {"float32", 4},  {"int64", 8},    {"float64", 8}};
  auto it = kBytes.find(name);
  return it == kBytes.end() ? 0 : it->second;
}

absl::StatusOr<std::uint64_t> LayoutBytes(const Layout& l) {
  if (l.shapes.size() != l.dtypes.size()) {
    return absl::InvalidArgumentError("layout: shapes and dtypes must align");
  }
  unsigned __int128 total = 0;
  for (std::size_t i = 0; i < l.shapes.size(); ++i) {
    const std::uint32_t b = DtypeBytes(l.dtypes[i]);
    if (b == 0) return absl::InvalidArgumentError(absl::StrCat("unknown wire dtype '", l.dtypes[i], "'"));
    unsigned __int128 n = b;
    for (std::int64_t d : l.shapes[i]) {
      if (d < 0) return absl::InvalidArgumentError("layout: dimensions must be non-negative");
      n *= static_cast<std::uint64_t>(d);
      if (n > (static_cast<unsigned __int128>(1) << 62)) {
        return absl::InvalidArgumentError("layout: size overflows");
      }
    }
    total += n;
    if (total > (static_cast<unsigned __int128>(1) << 62)) {
      return absl::InvalidArgumentError("layout: size overflows");
    }
  }
  return static_cast<std::uint64_t>(total);
}

absl::Status CheckKey(const ObjectKey& k) {
  const std::string& h = k.chunk_hash_hex;
  bool ok = h.size() % 2 == 0;
  for (char ch : h) ok = ok && ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'));
  if (!ok) {
    return absl::InvalidArgumentError(
        "encoded object key must use its canonical representation (chunk_hash_hex: lower-case "
        "hex of even length)");
  }
  return absl::OkStatus();
}

Coordinator::Coordinator(const CoordinatorConfig& c, std::uint64_t region_offset) : c_(c) {
  region_.region_id = c.region_id;
  region_.layout_id = c.layout_id;
  region_.region_offset = region_offset;
  region_.capacity_bytes = c.region_bytes;
  region_.alignment_bytes = c.alignment_bytes;
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorConfig& c,
                                                               std::uint64_t region_offset,
                                                               std::int64_t now_ms) {
  std::unique_ptr<Coordinator> co(new Coordinator(c, region_offset));
  absl::MutexLock l(&co->mu_);
  std::ifstream in(c.state_file, std::ios::binary);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    if (auto st = co->LoadLocked(ss.str(), now_ms); !st.ok()) return st;
    co->restored_ = true;
    return co;
  }
  if (errno != ENOENT) {
    return absl::PermissionDeniedError(
        absl::StrCat("lmcache.state_file ", c.state_file, ": cannot read: ", pool::ErrnoText(errno)));
  }
  co->region_.region_epoch = RandomHex128();
  co->free_.emplace(0, c.region_bytes);
  if (auto st = co->SaveLocked(); !st.ok()) return st;
  return co;
}

std::string Coordinator::NamespaceOf(const std::string& tenant) const {
  return absl::StrCat(tenant, "/lmcache/", c_.layout_id);
}

absl::Status Coordinator::CheckEpoch(const std::string& epoch) const {
  if (epoch != region_.region_epoch) return StaleEpoch();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::optional<Grant>>> Coordinator::Reserve(
    const std::string& tenant, const std::string& epoch, const std::vector<ReserveItem>& items,
    std::int64_t now_ms) {
  if (auto st = CheckEpoch(epoch); !st.ok()) return st;
  const std::string ns = NamespaceOf(tenant);
  std::vector<std::string> ids;
  std::vector<std::uint64_t> lengths;
  std::set<std::string> seen;
  for (const ReserveItem& it : items) {
    if (auto st = CheckKey(it.key); !st.ok()) return st;
    auto len = LayoutBytes(it.layout);
    if (!len.ok()) return len.status();
    if (*len == 0) return absl::InvalidArgumentError("write layouts must describe a positive size");
    ids.push_back(Canonical(ns, it.key));
    if (!seen.insert(ids.back()).second) {
      return absl::InvalidArgumentError("a write batch must not contain duplicate keys");
    }
    lengths.push_back(*len);
  }
  const std::uint64_t align = c_.alignment_bytes;
  absl::MutexLock l(&mu_);
  std::uint64_t total = 0;
  std::vector<bool> wanted(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    wanted[i] = objects_.find(ids[i]) == objects_.end();
    if (wanted[i]) total += (lengths[i] + align - 1) / align * align;
  }
  auto refuse = [&](const std::string& why) {
    ++stats_.out_of_space;
    return absl::ResourceExhaustedError(absl::StrCat("out_of_space: ", why));
  };
  if (total > c_.region_bytes) {
    return refuse(absl::StrCat("write batch of ", total, " bytes does not fit in the shared region (",
                               c_.region_bytes, " bytes)"));
  }
  auto quota_it = c_.quotas.find(tenant);
  const bool has_quota = quota_it != c_.quotas.end();
  std::uint64_t tenant_used = stats_.tenant_used_bytes[tenant];
  if (has_quota && total > quota_it->second) {
    return refuse(absl::StrCat("write batch of ", total, " bytes is larger than tenant '", tenant,
                               "''s quota (", quota_it->second, " bytes)"));
  }
  // Eviction candidates: VALID, no read lease, least recently used first.
  std::vector<std::pair<std::uint64_t, const std::string*>> cands;
  for (const auto& [id, o] : objects_) {
    if (!o.writing && o.lease_until_ms <= now_ms) cands.emplace_back(o.touched, &id);
  }
  std::sort(cands.begin(), cands.end());
  std::vector<const std::string*> evict;
  std::vector<bool> used(cands.size(), false);
  std::map<std::uint64_t, std::uint64_t> free = free_;
  auto evict_one = [&](std::size_t ci) {
    const Object& o = objects_.at(*cands[ci].second);
    used[ci] = true;
    evict.push_back(cands[ci].second);
    GiveBack(&free, o.handle.offset, o.alloc_bytes);
    if (o.tenant == tenant) tenant_used -= o.alloc_bytes;
  };
  // At the quota: only the tenant's own objects make room.
  if (has_quota) {
    for (std::size_t ci = 0; ci < cands.size() && tenant_used + total > quota_it->second; ++ci) {
      if (objects_.at(*cands[ci].second).tenant == tenant) evict_one(ci);
    }
    if (tenant_used + total > quota_it->second) {
      return refuse(absl::StrCat("tenant '", tenant, "' is at its quota (", quota_it->second,
                                 " bytes, ", tenant_used, " in use or leased)"));
    }
  }
  // Then space: the domain's policy over every tenant's (a quota'd tenant: its own only).
  std::vector<std::uint64_t> offsets(items.size(), 0);
  std::size_t next = 0;
  while (true) {
    if (FreeBytes(free) >= total) {
      std::map<std::uint64_t, std::uint64_t> trial = free;
      bool fits = true;
      for (std::size_t i = 0; i < items.size() && fits; ++i) {
        if (!wanted[i]) continue;
        fits = TakeFrom(&trial, (lengths[i] + align - 1) / align * align, &offsets[i]);
      }
      if (fits) {
        free = std::move(trial);
        break;
      }
    }
    while (next < cands.size() &&
           (used[next] || (has_quota && objects_.at(*cands[next].second).tenant != tenant))) {
      ++next;
    }
    if (next == cands.size()) {
      return refuse(absl::StrCat("write batch of ", total,
                                 " bytes does not fit: the rest of the region is written, "
                                 "being written or read-leased"));
    }
    evict_one(next);
  }
  // Commit (undone if the state file cannot be written).
  const auto saved_objects = objects_;
  const auto saved_free = free_;
  const Stats saved_stats = stats_;
  const std::uint64_t saved_gen = next_generation_;
  for (const std::string* id : evict) {
    Object& o = objects_.at(*id);
    stats_.tenant_used_bytes[o.tenant] -= o.alloc_bytes;
    stats_.evicted_bytes += o.handle.length;
    ++stats_.evicted;
    objects_.erase(*id);
  }
  free_ = std::move(free);
  std::vector<std::optional<Grant>> grants(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!wanted[i]) continue;
    Object o;
    o.tenant = tenant;
    o.key = items[i].key;
    o.layout = items[i].layout;
    o.handle = {offsets[i], lengths[i], next_generation_++};
    o.alloc_bytes = (lengths[i] + align - 1) / align * align;
    o.writing = true;
    o.token = RandomHex128();
    o.expires_ms = now_ms + c_.reservation_ttl_ms;
    stats_.tenant_used_bytes[tenant] += o.alloc_bytes;
    ++stats_.reserved;
    grants[i] = Grant{o.key, o.token, o.handle, o.layout};
    objects_.emplace(ids[i], std::move(o));
  }
  if (auto st = SaveLocked(); !st.ok()) {
    objects_ = saved_objects;
    free_ = saved_free;
    stats_ = saved_stats;
    next_generation_ = saved_gen;
    return st;
  }
  return grants;
}

absl::Status Coordinator::CheckRefsLocked(const std::string& tenant,
                                          const std::vector<ReservationRef>& refs,
                                          std::int64_t now_ms, std::vector<std::string>* ids) {
  const std::string ns = NamespaceOf(tenant);
  std::set<std::string> tokens;
  for (const ReservationRef& r : refs) {
    if (auto st = CheckKey(r.key); !st.ok()) return st;
    if (!tokens.insert(r.token).second) {
      return absl::AbortedError("invalid_reservation: duplicate write reservation");
    }
    std::string id = Canonical(ns, r.key);
    auto it = objects_.find(id);
    if (it == objects_.end() || !it->second.writing || it->second.token != r.token) {
      return absl::AbortedError("invalid_reservation: reservation does not own the write");
    }
    if (it->second.expires_ms <= now_ms) {
      return absl::AbortedError(absl::StrCat(
          "invalid_reservation: the reservation expired (lmcache.reservation_ttl_ms = ",
          c_.reservation_ttl_ms, "); its space is reclaimed"));
    }
    ids->push_back(std::move(id));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Finish(const std::string& tenant, const std::string& epoch,
                                 const std::vector<ReservationRef>& refs, std::int64_t now_ms) {
  if (auto st = CheckEpoch(epoch); !st.ok()) return st;
  absl::MutexLock l(&mu_);
  std::vector<std::string> ids;
  if (auto st = CheckRefsLocked(tenant, refs, now_ms, &ids); !st.ok()) return st;
  const auto saved_objects = objects_;
  const Stats saved_stats = stats_;
  const std::uint64_t saved_touch = touch_seq_;
  for (const std::string& id : ids) {
    Object& o = objects_.at(id);
    o.writing = false;
    o.token.clear();
    o.touched = ++touch_seq_;
    o.lease_until_ms = 0;
    ++stats_.finished;
  }
  if (auto st = SaveLocked(); !st.ok()) {
    objects_ = saved_objects;
    stats_ = saved_stats;
    touch_seq_ = saved_touch;
    return st;
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Abort(const std::string& tenant, const std::string& epoch,
                                const std::vector<ReservationRef>& refs, std::int64_t now_ms) {
  if (auto st = CheckEpoch(epoch); !st.ok()) return st;
  absl::MutexLock l(&mu_);
  std::vector<std::string> ids;
  if (auto st = CheckRefsLocked(tenant, refs, now_ms, &ids); !st.ok()) return st;
  const auto saved_objects = objects_;
  const auto saved_free = free_;
  const Stats saved_stats = stats_;
  for (const std::string& id : ids) {
    const Object& o = objects_.at(id);
    GiveBack(&free_, o.handle.offset, o.alloc_bytes);
    stats_.tenant_used_bytes[o.tenant] -= o.alloc_bytes;
    ++stats_.aborted;
    objects_.erase(id);
  }
  if (auto st = SaveLocked(); !st.ok()) {
    objects_ = saved_objects;
    free_ = saved_free;
    stats_ = saved_stats;
    return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::optional<Hit>>> Coordinator::Lookup(
    const std::string& tenant, const std::string& epoch, const std::vector<ObjectKey>& keys,
    std::int64_t now_ms) {
  if (auto st = CheckEpoch(epoch); !st.ok()) return st;
  const std::string ns = NamespaceOf(tenant);
  std::vector<std::string> ids;
  std::set<std::string> seen;
  for (const ObjectKey& k : keys) {
    if (auto st = CheckKey(k); !st.ok()) return st;
    ids.push_back(Canonical(ns, k));
    if (!seen.insert(ids.back()).second) {
      return absl::InvalidArgumentError("a lookup batch must not contain duplicate keys");
    }
  }
  absl::MutexLock l(&mu_);
  std::vector<std::optional<Hit>> hits(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto it = objects_.find(ids[i]);
    if (it == objects_.end() || it->second.writing) continue;
    Object& o = it->second;
    // The read lease: the reader copies after this reply; eviction waits for it. Soft state:
    // a restart grants every object a fresh one (Open).
    o.lease_until_ms = std::max(o.lease_until_ms, now_ms + c_.read_lease_ms);
    o.touched = ++touch_seq_;
    hits[i] = Hit{o.key, o.handle, o.layout};
  }
  return hits;
}

absl::StatusOr<std::uint32_t> Coordinator::Expire(std::int64_t now_ms) {
  absl::MutexLock l(&mu_);
  std::vector<std::string> gone;
  for (const auto& [id, o] : objects_) {
    if (o.writing && o.expires_ms <= now_ms) gone.push_back(id);
  }
  if (gone.empty()) return 0u;
  const auto saved_objects = objects_;
  const auto saved_free = free_;
  const Stats saved_stats = stats_;
  for (const std::string& id : gone) {
    const Object& o = objects_.at(id);
    GiveBack(&free_, o.handle.offset, o.alloc_bytes);
    stats_.tenant_used_bytes[o.tenant] -= o.alloc_bytes;
    ++stats_.expired;
    objects_.erase(id);
  }
  if (auto st = SaveLocked(); !st.ok()) {
    objects_ = saved_objects;
    free_ = saved_free;
    stats_ = saved_stats;
    return st;
  }
  return static_cast<std::uint32_t>(gone.size());
}

Stats Coordinator::stats() const {
  absl::MutexLock l(&mu_);
  Stats s = stats_;
  s.used_bytes = c_.region_bytes - FreeBytes(free_);
  s.object_count = objects_.size();
  s.writing = 0;
  for (const auto& [id, o] : objects_) s.writing += o.writing ? 1 : 0;
  return s;
}

// ---- the state file -------------------------------------------------------------------------
// One JSON document, then a line "crc32c <hex>" over it. Written whole on every change: temp
// file, fdatasync, rename, fsync of the directory.

std::string Coordinator::SerializeLocked() const {
  json objs = json::array();
  for (const auto& [id, o] : objects_) {
    objs.push_back(json{{"tenant", o.tenant},
                        {"key", KeyJson(o.key)},
                        {"shapes", o.layout.shapes},
                        {"dtypes", o.layout.dtypes},
                        {"offset", o.handle.offset},
                        {"length", o.handle.length},
                        {"generation", o.handle.generation},
                        {"alloc_bytes", o.alloc_bytes},
                        {"writing", o.writing},
                        {"token", o.token},
                        {"touched", o.touched}});
  }
  json doc{{"format", "cxlkv-lmcache-coordinator"},
           {"version", 1},
           {"region_id", region_.region_id},
           {"layout_id", region_.layout_id},
           {"region_offset", region_.region_offset},
           {"capacity_bytes", region_.capacity_bytes},
           {"alignment_bytes", region_.alignment_bytes},
           {"region_epoch", region_.region_epoch},
           {"next_generation", next_generation_},
           {"touch_seq", touch_seq_},
           {"objects", objs}};
  std::string text = doc.dump();
  const std::uint32_t crc = coherence::Crc32c(text.data(), text.size());
  absl::StrAppend(&text, "\ncrc32c ", absl::Hex(crc, absl::kZeroPad8), "\n");
  return text;
}

absl::Status Coordinator::LoadLocked(const std::string& text, std::int64_t now_ms) {
  const std::string& path = c_.state_file;
  auto loss = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(
        "lmcache.state_file ", path, ": ", what,
        "; the coordinator will not start on it (nothing is discarded). Stop every LMCache "
        "server mapping the region, then move the file away to reset the region"));
  };
  const std::size_t nl = text.rfind("\ncrc32c ");
  if (nl == std::string::npos) return loss("no crc32c line (torn or not a coordinator state file)");
  const std::string body = text.substr(0, nl);
  const std::string want = absl::StrCat(
      "crc32c ", absl::Hex(coherence::Crc32c(body.data(), body.size()), absl::kZeroPad8), "\n");
  if (text.substr(nl + 1) != want) return loss("crc32c mismatch");
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return loss("not JSON");
  try {
    if (doc.at("format") != "cxlkv-lmcache-coordinator" || doc.at("version") != 1) {
      return loss("unknown format or version");
    }
    auto mismatch = [&](absl::string_view key, const std::string& was, const std::string& is) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lmcache.state_file ", path, " describes another region: ", key, " was ", was,
          ", the configuration says ", is,
          ". Put the old value back, or, to start the region afresh (every LMCache server "
          "re-validates), stop every LMCache server mapping it and move the file away"));
    };
    const auto u = [&](const char* k) { return doc.at(k).get<std::uint64_t>(); };
    if (doc.at("region_id") != region_.region_id) {
      return mismatch("region_id", doc.at("region_id").get<std::string>(), region_.region_id);
    }
    if (doc.at("layout_id") != region_.layout_id) {
      return mismatch("layout_id", doc.at("layout_id").get<std::string>(), region_.layout_id);
    }
    if (u("region_offset") != region_.region_offset) {
      return mismatch("region_offset", absl::StrCat(u("region_offset")),
                      absl::StrCat(region_.region_offset));
    }
    if (u("capacity_bytes") != region_.capacity_bytes) {
      return mismatch("region_size", absl::StrCat(u("capacity_bytes")),
                      absl::StrCat(region_.capacity_bytes));
    }
    if (u("alignment_bytes") != region_.alignment_bytes) {
      return mismatch("alignment", absl::StrCat(u("alignment_bytes")),
                      absl::StrCat(region_.alignment_bytes));
    }
    region_.region_epoch = doc.at("region_epoch").get<std::string>();
    next_generation_ = u("next_generation");
    touch_seq_ = u("touch_seq");
    objects_.clear();
    free_.clear();
    free_.emplace(0, region_.capacity_bytes);
    stats_ = Stats{};
    for (const json& j : doc.at("objects")) {
      Object o;
      o.tenant = j.at("tenant").get<std::string>();
      o.key = KeyFrom(j.at("key"));
      o.layout.shapes = j.at("shapes").get<std::vector<std::vector<std::int64_t>>>();
      o.layout.dtypes = j.at("dtypes").get<std::vector<std::string>>();
      o.handle = {j.at("offset").get<std::uint64_t>(), j.at("length").get<std::uint64_t>(),
                  j.at("generation").get<std::uint64_t>()};
      o.alloc_bytes = j.at("alloc_bytes").get<std::uint64_t>();
      o.writing = j.at("writing").get<bool>();
      o.token = j.at("token").get<std::string>();
      o.touched = j.at("touched").get<std::uint64_t>();
      // Timers restart at now: conservative (a writer may still be writing, a reader reading).
      o.expires_ms = now_ms + c_.reservation_ttl_ms;
      o.lease_until_ms = now_ms + c_.read_lease_ms;
      if (o.handle.offset + o.alloc_bytes > region_.capacity_bytes ||
          o.alloc_bytes < o.handle.length || o.handle.generation >= next_generation_) {
        return loss("an object outside the region or with a generation not yet handed out");
      }
      // Its space must be free in what is rebuilt so far: no two objects overlap.
      const std::uint64_t rel = o.handle.offset;
      auto it = free_.upper_bound(rel);
      if (it == free_.begin()) return loss("overlapping objects");
      --it;
      if (it->first + it->second < rel + o.alloc_bytes) return loss("overlapping objects");
      const std::uint64_t a = it->first, len = it->second;
      free_.erase(it);
      if (rel > a) free_.emplace(a, rel - a);
      if (a + len > rel + o.alloc_bytes) free_.emplace(rel + o.alloc_bytes, a + len - rel - o.alloc_bytes);
      stats_.tenant_used_bytes[o.tenant] += o.alloc_bytes;
      const std::string id = Canonical(NamespaceOf(o.tenant), o.key);
      if (!objects_.emplace(id, std::move(o)).second) return loss("a key listed twice");
    }
  } catch (const json::exception& e) {
    return loss(absl::StrCat("malformed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::SaveLocked() {
  const std::string text = SerializeLocked();
  const std::string& path = c_.state_file;
  const std::string tmp = path + ".tmp";
  auto fail = [&](const char* what) {
    return absl::InternalError(
        absl::StrCat("lmcache.state_file: ", what, " ", tmp, ": ", pool::ErrnoText(errno)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fail("cannot create");
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return fail("cannot write");
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fdatasync(fd) != 0) {
    ::close(fd);
    return fail("cannot sync");
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename");
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return fail("cannot open the directory of");
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return fail("cannot fsync the directory of");
  return absl::OkStatus();
}

}  // namespace cxlkv::coordinator
