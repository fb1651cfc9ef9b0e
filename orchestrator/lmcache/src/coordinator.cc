// LMCache's memory coordinator over a region of the pool: the logic and the state file.
#include "cxlkv/orchestrator/lmcache/coordinator.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/base/file.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/pool/region.h"
#include "nlohmann/json.hpp"
#include "wire.h"

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
  return absl::StrCat(ns, "\x1f", IndexName(k));
}

// An object's bytes in the region: its length rounded up to the alignment.
std::uint64_t AlignUp(std::uint64_t length, std::uint64_t align) {
  return (length + align - 1) / align * align;
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

// Takes [rel, rel + bytes) out of the free map; false if any of it is not free.
bool Carve(std::map<std::uint64_t, std::uint64_t>* free, std::uint64_t rel, std::uint64_t bytes) {
  auto it = free->upper_bound(rel);
  if (it == free->begin()) return false;
  --it;
  if (it->first + it->second < rel + bytes) return false;
  const std::uint64_t a = it->first, len = it->second;
  free->erase(it);
  if (rel > a) free->emplace(a, rel - a);
  if (a + len > rel + bytes) free->emplace(rel + bytes, a + len - rel - bytes);
  return true;
}

// A batch's key: checked, its id appended; a key twice in one batch is refused.
absl::Status AddKeyId(const std::string& ns, const ObjectKey& k, absl::string_view batch,
                      std::set<std::string>* seen, std::vector<std::string>* ids) {
  if (auto st = CheckKey(k); !st.ok()) return st;
  ids->push_back(Canonical(ns, k));
  if (!seen->insert(ids->back()).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", batch, " batch must not contain duplicate keys"));
  }
  return absl::OkStatus();
}

// Copies the journal's last seq into *out when the locked section it is declared in ends.
class NoteSeq {
 public:
  NoteSeq(std::uint64_t* out, const std::uint64_t& seq) : out_(out), seq_(seq) {}
  ~NoteSeq() { *out_ = seq_; }
  NoteSeq(const NoteSeq&) = delete;
  NoteSeq& operator=(const NoteSeq&) = delete;

 private:
  std::uint64_t* out_;
  const std::uint64_t& seq_;
};

absl::Status StaleEpoch() {
  return absl::FailedPreconditionError(
      "stale_epoch: request epoch does not match the coordinator region epoch (GET /v1/region)");
}

}  // namespace

std::uint32_t DtypeBytes(const std::string& name) {
  static const std::map<std::string, std::uint32_t> kBytes = {
      {"bool", 1},        {"uint8", 1},   {"int8", 1},    {"float8_e4m3fn", 1},
      {"float8_e5m2", 1}, {"int16", 2},   {"float16", 2}, {"bfloat16", 2},
      {"int32", 4},       {"float32", 4}, {"int64", 8},   {"float64", 8}};
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
    if (b == 0)
      return absl::InvalidArgumentError(absl::StrCat("unknown wire dtype '", l.dtypes[i], "'"));
    // Every dimension is checked (a negative one is 422 even after a 0 or a huge one), the
    // product saturating at kLayoutTooLarge; a 0 anywhere makes the tensor empty.
    bool zero = false, large = false;
    unsigned __int128 n = b;
    for (std::int64_t d : l.shapes[i]) {
      if (d < 0) return absl::InvalidArgumentError("layout: dimensions must be non-negative");
      if (d == 0) zero = true;
      if (zero || large) continue;
      n *= static_cast<std::uint64_t>(d);
      if (n > kLayoutTooLarge) large = true;
    }
    if (!zero) total += large ? kLayoutTooLarge : n;
    if (total > kLayoutTooLarge) total = kLayoutTooLarge;
  }
  return static_cast<std::uint64_t>(total);
}

Coordinator::Coordinator(const CoordinatorConfig& c, std::uint64_t region_offset,
                         std::unique_ptr<StateStore> store)
    : c_(c), store_(std::move(store)) {
  if (c_.evict_ahead_bytes == CoordinatorConfig::kEvictAheadDefault) {
    c_.evict_ahead_bytes = c_.region_bytes / 64;  // as ResolveCoordinatorConfig
  }
  region_.region_id = c.region_id;
  region_.layout_id = c.layout_id;
  region_.region_offset = region_offset;
  region_.capacity_bytes = c.region_bytes;
  region_.alignment_bytes = c.alignment_bytes;
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorConfig& c,
                                                               std::uint64_t region_offset,
                                                               std::int64_t now_ms) {
  return Open(c, region_offset, now_ms, FileStateStore(c.state_file));
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorConfig& c,
                                                               std::uint64_t region_offset,
                                                               std::int64_t now_ms,
                                                               std::unique_ptr<StateStore> store) {
  std::unique_ptr<Coordinator> co(new Coordinator(c, region_offset, std::move(store)));
  base::MutexLock l(co->mu_);
  co->free_.emplace(0, c.region_bytes);
  auto loaded = co->store_->Load();
  if (!loaded.ok()) return loaded.status();
  if (loaded->has_value()) {
    if (auto st = co->LoadLocked((*loaded)->snapshot, (*loaded)->journal, now_ms); !st.ok()) {
      return st;
    }
    co->restored_ = true;
  } else {
    co->region_.region_epoch = RandomHex128();
  }
  // A fresh snapshot and an empty journal (a restart compacts what it replayed).
  if (auto st = co->CompactLocked(); !st.ok()) return st;
  return co;
}

std::string Coordinator::NamespaceOf(const std::string& tenant) const {
  return absl::StrCat(tenant, "/lmcache/", c_.layout_id);
}

int Coordinator::PinOf(const std::string& tenant) const {
  auto it = c_.pins.find(NamespaceOf(tenant));
  return it == c_.pins.end() ? 0 : it->second;
}

absl::Status Coordinator::CheckEpoch(const std::string& epoch) const {
  if (epoch != region_.region_epoch) return StaleEpoch();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::optional<Grant>>> Coordinator::Reserve(
    const std::string& tenant, const std::string& epoch, const std::vector<ReserveItem>& items,
    std::int64_t now_ms) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(c_.index_wait_ms);
  bool waited = false;
  while (true) {
    std::uint64_t need = 0, released = 0;
    bool wait = false;
    auto grants = ReserveUnsynced(tenant, epoch, items, now_ms, &need, &wait, &released);
    // A refusal too may reveal a change (a null grant: another writer's reservation).
    if (auto st = WaitDurable(need); !st.ok()) return st;
    if (!wait) return grants;
    // The batch fits once evicted ranges come back from the domain's index (their entries
    // retired, reclaimed when no host's lease names them and the grace has passed).
    base::MutexLock l(mu_);
    if (!waited) ++stats_.index_waits;
    waited = true;
    while (released_ == released) {
      if (!released_cv_.WaitUntil(mu_, deadline) && released_ == released) {
        ++stats_.out_of_space;
        return absl::ResourceExhaustedError(absl::StrCat(
            "out_of_space: the batch fits only once ", held_bytes_,
            " evicted bytes come back from the domain's prefix index, where hosts still lease "
            "them (or their grace period runs); not within lmcache.index_wait_ms (",
            c_.index_wait_ms, " ms): retry"));
      }
    }
  }
}

absl::Status Coordinator::Finish(const std::string& tenant, const std::string& epoch,
                                 const std::vector<ReservationRef>& refs, std::int64_t now_ms) {
  std::uint64_t need = 0;
  absl::Status st = FinishOrAbortUnsynced(true, tenant, epoch, refs, now_ms, &need);
  if (auto wst = WaitDurable(need); !wst.ok()) return wst;
  return st;
}

absl::Status Coordinator::Abort(const std::string& tenant, const std::string& epoch,
                                const std::vector<ReservationRef>& refs, std::int64_t now_ms) {
  std::uint64_t need = 0;
  absl::Status st = FinishOrAbortUnsynced(false, tenant, epoch, refs, now_ms, &need);
  if (auto wst = WaitDurable(need); !wst.ok()) return wst;
  return st;
}

absl::StatusOr<std::vector<std::optional<Hit>>> Coordinator::Lookup(
    const std::string& tenant, const std::string& epoch, const std::vector<ObjectKey>& keys,
    std::int64_t now_ms) {
  std::uint64_t need = 0;
  auto hits = LookupUnsynced(tenant, epoch, keys, now_ms, &need);
  // A hit may be an object whose finish is not durable yet: not before it is.
  if (auto st = WaitDurable(need); !st.ok()) return st;
  return hits;
}

absl::StatusOr<std::uint32_t> Coordinator::Expire(std::int64_t now_ms) {
  std::uint64_t need = 0;
  auto n = ExpireUnsynced(now_ms, &need);
  if (!n.ok() || *n == 0) return n;
  if (auto st = WaitDurable(need); !st.ok()) return st;
  return n;
}

absl::Status Coordinator::WaitDurable(std::uint64_t seq) {
  base::MutexLock l(sync_mu_);
  while (true) {
    if (!sync_error_.ok()) return sync_error_;
    if (synced_seq_ >= seq) return absl::OkStatus();
    if (syncing_) {
      // Another caller's sync is running: it may cover this record too (it started after the
      // record was appended), or the next one will.
      while (syncing_) sync_done_.Wait(sync_mu_);
      continue;
    }
    // This caller syncs for everyone whose record is appended by now.
    syncing_ = true;
    sync_mu_.Unlock();
    std::uint64_t target = 0;
    {
      base::MutexLock m(mu_);
      target = journal_seq_;
    }
    const absl::Status st = store_->Sync();
    sync_mu_.Lock();
    syncing_ = false;
    sync_done_.NotifyAll();
    ++syncs_;
    if (!st.ok()) {
      // The changes are applied in memory and cannot be made durable: nothing more is
      // acknowledged (a restart reloads what is on disk; no reply revealed the rest).
      sync_error_ = absl::InternalError(
          absl::StrCat(store_->journal_where(), ": cannot make the journal durable: ", st.message(),
                       "; the coordinator acknowledges nothing more: restart the orchestrator"));
      return sync_error_;
    }
    synced_seq_ = std::max(synced_seq_, target);
  }
}

absl::StatusOr<std::vector<std::optional<Grant>>> Coordinator::ReserveUnsynced(
    const std::string& tenant, const std::string& epoch, const std::vector<ReserveItem>& items,
    std::int64_t now_ms, std::uint64_t* need, bool* wait, std::uint64_t* released) {
  if (auto st = CheckEpoch(epoch); !st.ok()) return st;
  const std::string ns = NamespaceOf(tenant);
  std::vector<std::string> ids;
  std::vector<std::uint64_t> lengths;
  std::set<std::string> seen;
  for (const ReserveItem& it : items) {
    if (auto st = AddKeyId(ns, it.key, "write", &seen, &ids); !st.ok()) return st;
    auto len = LayoutBytes(it.layout);
    if (!len.ok()) return len.status();
    if (*len == 0) return absl::InvalidArgumentError("write layouts must describe a positive size");
    lengths.push_back(*len);
  }
  const std::uint64_t align = c_.alignment_bytes;
  base::MutexLock l(mu_);
  const NoteSeq note(need, journal_seq_);  // what this call may reveal, at its end
  *released = released_;
  std::uint64_t total = 0;
  std::vector<bool> wanted(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    wanted[i] = objects_.find(ids[i]) == objects_.end();
    // Saturating: a layout of kLayoutTooLarge bytes makes the batch too large (507).
    if (wanted[i]) total = std::min(total + AlignUp(lengths[i], align), kLayoutTooLarge);
  }
  auto refuse = [&](const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++stats_.out_of_space;
    return absl::ResourceExhaustedError(absl::StrCat("out_of_space: ", why));
  };
  if (total > c_.region_bytes) {
    return refuse(absl::StrCat("write batch of ", total,
                               " bytes does not fit in the shared region (", c_.region_bytes,
                               " bytes)"));
  }
  auto quota_it = c_.quotas.find(tenant);
  const bool has_quota = quota_it != c_.quotas.end();
  std::uint64_t tenant_used = stats_.tenant_used_bytes[tenant];
  if (has_quota && total > quota_it->second) {
    return refuse(absl::StrCat("write batch of ", total, " bytes is larger than tenant '", tenant,
                               "''s quota (", quota_it->second, " bytes)"));
  }
  // Eviction candidates: VALID objects, lowest pin level first, then least recently used
  // (lru_), skipping those
  // under a read lease; walked only as far as the batch needs.
  std::vector<const std::string*> cands;
  auto lru_it = lru_.begin();
  auto more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (; lru_it != lru_.end(); ++lru_it) {
      const Object& o = objects_.at(std::get<2>(*lru_it));
      if (o.lease_until_ms <= now_ms) {
        cands.push_back(&std::get<2>(*lru_it));
        ++lru_it;
        return true;
      }
    }
    return false;
  };
  std::vector<const std::string*> evict;
  std::vector<bool> used;
  // Two views of the space: free now, and free once every range the index still names (held
  // now, or of an indexed object evicted here: `pending`) has come back. The second is built
  // only when the first is not enough (it copies every held range).
  std::map<std::uint64_t, std::uint64_t> free = free_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> pending;
  std::uint64_t free_bytes = c_.region_bytes - used_bytes_;
  std::uint64_t soon_bytes = free_bytes + held_bytes_;
  auto evict_one = [&](std::size_t ci) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Object& o = objects_.at(*cands[ci]);
    used[ci] = true;
    evict.push_back(cands[ci]);
    soon_bytes += o.alloc_bytes;
    if (o.in_index) {
      pending.emplace_back(o.handle.offset, o.alloc_bytes);
    } else {
      GiveBack(&free, o.handle.offset, o.alloc_bytes);
      free_bytes += o.alloc_bytes;
    }
    if (o.tenant == tenant) tenant_used -= o.alloc_bytes;
  };
  auto free_soon = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::map<std::uint64_t, std::uint64_t> soon = free;
    for (const auto& [off, h] : held_) GiveBack(&soon, off, h.alloc_bytes);
    for (const auto& [off, bytes] : pending) GiveBack(&soon, off, bytes);
    return soon;
  };
  auto fits_in = [&](const std::map<std::uint64_t, std::uint64_t>& space, std::uint64_t bytes,
                     std::map<std::uint64_t, std::uint64_t>* taken, std::vector<std::uint64_t>* at)
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       if (bytes < total) return false;
                       std::map<std::uint64_t, std::uint64_t> trial = space;
                       for (std::size_t i = 0; i < items.size(); ++i) {
                         if (!wanted[i]) continue;
                         std::uint64_t off = 0;
                         if (!TakeFrom(&trial, AlignUp(lengths[i], align), &off)) return false;
                         if (at != nullptr) (*at)[i] = off;
                       }
                       if (taken != nullptr) *taken = std::move(trial);
                       return true;
                     };
  auto candidate = [&](std::size_t ci) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (ci >= cands.size()) {
      if (!more()) return false;
      used.push_back(false);
    }
    return true;
  };
  // Past what the batch needs, once the region is full and the index is on: more candidates
  // (the policy's next ones, of the tenant's own when it has a quota) until `left` plus what
  // they free reaches evict_ahead_bytes.
  auto evict_ahead = [&](std::uint64_t left) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!index_attached_) return;
    for (std::size_t ci = 0; left < c_.evict_ahead_bytes && candidate(ci); ++ci) {
      const Object& o = objects_.at(*cands[ci]);
      if (used[ci] || !o.in_index || (has_quota && o.tenant != tenant)) continue;
      evict_one(ci);
      left += o.alloc_bytes;
    }
  };
  // At the quota: only the tenant's own objects make room.
  if (has_quota && tenant_used + total > quota_it->second) {
    for (std::size_t ci = 0; tenant_used + total > quota_it->second && candidate(ci); ++ci) {
      if (objects_.at(*cands[ci]).tenant == tenant) evict_one(ci);
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
    if (fits_in(free, free_bytes, &free, &offsets)) break;
    if (soon_bytes >= total && fits_in(free_soon(), soon_bytes, nullptr, nullptr)) {
      // It fits once the index lets ranges go: the evictions so far are made (journaled, their
      // entries retired) and the caller waits for IndexReleased, then tries again.
      *wait = true;
      evict_ahead(soon_bytes - total);
      if (evict.empty()) return std::vector<std::optional<Grant>>{};
      Change ch;
      for (const std::string* id : evict) ch.dels.push_back(*id);
      ch.next_generation = next_generation_;
      ch.touch_seq = touch_seq_;
      std::uint64_t bytes = 0;
      for (const std::string& id : ch.dels) bytes += objects_.at(id).handle.length;
      if (auto st = CommitLocked(ch); !st.ok()) return st;
      stats_.evicted += ch.dels.size();
      stats_.evicted_bytes += bytes;
      return std::vector<std::optional<Grant>>{};
    }
    while (candidate(next) &&
           (used[next] || (has_quota && objects_.at(*cands[next]).tenant != tenant))) {
      ++next;
    }
    if (!candidate(next)) {
      return refuse(absl::StrCat("write batch of ", total,
                                 " bytes does not fit: the rest of the region is written, "
                                 "being written or read-leased"));
    }
    evict_one(next);
  }
  // Evicting ahead keeps the next reserves from waiting on the index (indexed objects only:
  // anything else frees at once when needed): a low-water mark of free and returning bytes.
  evict_ahead(soon_bytes - total);
  // The change, journaled before it is applied: a failed write changes nothing.
  Change ch;
  for (const std::string* id : evict) ch.dels.push_back(*id);
  std::uint64_t gen = next_generation_;
  std::vector<std::optional<Grant>> grants(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!wanted[i]) continue;
    Object o;
    o.tenant = tenant;
    o.key = items[i].key;
    o.layout = items[i].layout;
    o.handle = {offsets[i], lengths[i], gen++};
    o.alloc_bytes = AlignUp(lengths[i], align);
    o.writing = true;
    o.token = RandomHex128();
    o.expires_ms = now_ms + c_.reservation_ttl_ms;
    grants[i] = Grant{o.key, o.token, o.handle, o.layout};
    ch.puts.emplace_back(ids[i], std::move(o));
  }
  ch.next_generation = gen;
  ch.touch_seq = touch_seq_;
  for (const std::string& id : ch.dels) {
    ++stats_.evicted;
    stats_.evicted_bytes += objects_.at(id).handle.length;
  }
  if (auto st = CommitLocked(ch); !st.ok()) {
    stats_.evicted -= ch.dels.size();
    return st;
  }
  stats_.reserved += ch.puts.size();
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

absl::Status Coordinator::FinishOrAbortUnsynced(bool finish, const std::string& tenant,
                                                const std::string& epoch,
                                                const std::vector<ReservationRef>& refs,
                                                std::int64_t now_ms, std::uint64_t* need) {
  if (auto st = CheckEpoch(epoch); !st.ok()) return st;
  base::MutexLock l(mu_);
  const NoteSeq note(need, journal_seq_);  // what this call may reveal, at its end
  std::vector<std::string> ids;
  if (auto st = CheckRefsLocked(tenant, refs, now_ms, &ids); !st.ok()) return st;
  Change ch;
  ch.touch_seq = touch_seq_;
  ch.next_generation = next_generation_;
  if (finish) {
    for (const std::string& id : ids) {
      Object o = objects_.at(id);
      o.writing = false;
      o.token.clear();
      o.touched = ++ch.touch_seq;
      o.lease_until_ms = 0;
      ch.puts.emplace_back(id, std::move(o));
    }
  } else {
    ch.dels = std::move(ids);
  }
  if (auto st = CommitLocked(ch); !st.ok()) return st;
  if (finish) {
    stats_.finished += ch.puts.size();
  } else {
    stats_.aborted += ch.dels.size();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::optional<Hit>>> Coordinator::LookupUnsynced(
    const std::string& tenant, const std::string& epoch, const std::vector<ObjectKey>& keys,
    std::int64_t now_ms, std::uint64_t* need) {
  if (auto st = CheckEpoch(epoch); !st.ok()) return st;
  const std::string ns = NamespaceOf(tenant);
  std::vector<std::string> ids;
  std::set<std::string> seen;
  for (const ObjectKey& k : keys) {
    if (auto st = AddKeyId(ns, k, "lookup", &seen, &ids); !st.ok()) return st;
  }
  std::vector<std::optional<Hit>> hits(keys.size());
  // A lookup of any size (LMCache has no limit), max_batch keys under one hold of the lock, so
  // a large one does not stall reserves and finishes. Each hit is answered as of its chunk;
  // a reader re-validates after its copy anyway (docs/lmcache.md "Eviction under pressure").
  constexpr std::size_t kLookupChunkKeys = 4096;  // max_batch 0: no limit on batches
  const std::size_t chunk = c_.max_batch != 0 ? c_.max_batch : kLookupChunkKeys;
  for (std::size_t first = 0; first < keys.size(); first += chunk) {
    base::MutexLock l(mu_);
    const NoteSeq note(need, journal_seq_);  // what it may reveal; the last chunk's is the most
    for (std::size_t i = first; i < std::min(keys.size(), first + chunk); ++i) {
      auto it = objects_.find(ids[i]);
      if (it == objects_.end() || it->second.writing) continue;
      Object& o = it->second;
      // The read lease: the reader copies after this reply; eviction waits for it. Soft
      // state: a restart grants every object a fresh one (Open).
      o.lease_until_ms = std::max(o.lease_until_ms, now_ms + c_.read_lease_ms);
      const int pin = PinOf(o.tenant);
      lru_.erase({pin, o.touched, it->first});
      o.touched = ++touch_seq_;
      lru_.emplace(pin, o.touched, it->first);
      hits[i] = Hit{o.key, o.handle, o.layout};
    }
  }
  return hits;
}

absl::StatusOr<std::uint32_t> Coordinator::ExpireUnsynced(std::int64_t now_ms,
                                                          std::uint64_t* need) {
  base::MutexLock l(mu_);
  const NoteSeq note(need, journal_seq_);  // what this call may reveal, at its end
  std::vector<std::string> gone;
  for (const std::string& id : writing_) {
    if (objects_.at(id).expires_ms <= now_ms) gone.push_back(id);
  }
  if (gone.empty()) return 0u;
  Change ch;
  ch.dels = std::move(gone);
  ch.next_generation = next_generation_;
  ch.touch_seq = touch_seq_;
  if (auto st = CommitLocked(ch); !st.ok()) return st;
  stats_.expired += ch.dels.size();
  return static_cast<std::uint32_t>(ch.dels.size());
}

// ---- the domain's prefix index ----------------------------------------------------------------

coherence::Namespace Coordinator::IndexNamespace(const std::string& tenant) const {
  return coordinator::IndexNamespace(tenant, c_.layout_id);
}

std::uint32_t Coordinator::RegionTag() const {
  return coherence::Crc32c(region_.region_id.data(), region_.region_id.size());
}

void Coordinator::OfferToIndexLocked(Object& o, const std::string& tenant) {
  if (!index_attached_ || o.in_index) return;
  auto ref = coherence::RegionRef(
      coherence::RegionObject{o.handle.offset, o.handle.length, o.handle.generation, RegionTag()});
  if (!ref.ok()) {
    ++stats_.index_skipped;  // 4 GiB or more: served over HTTP only
    return;
  }
  o.in_index = true;
  ++stats_.indexed;
  const coherence::Namespace ns = IndexNamespace(tenant);
  index_ops_.push_back(IndexOp{true, ns, IndexKey(ns, o.key), *ref});
}

void Coordinator::HoldLocked(const Object& o) {
  held_[o.handle.offset] = Held{o.alloc_bytes, o.handle.generation};
  held_bytes_ += o.alloc_bytes;
  used_bytes_ += o.alloc_bytes;  // still taken, by nobody's object
  const coherence::Namespace ns = IndexNamespace(o.tenant);
  index_ops_.push_back(IndexOp{false, ns, IndexKey(ns, o.key), {}});
}

void Coordinator::AttachIndex(const std::vector<coherence::PrefixOwner::OwnEntry>& own) {
  base::MutexLock l(mu_);
  index_attached_ = c_.index;
  if (!index_attached_) return;
  const std::uint32_t tag = RegionTag();
  for (const auto& e : own) {
    const auto ro = coherence::AsRegionObject(e.ref);
    if (!ro.has_value() || ro->region_tag != tag) {
      // Another region's (region_id changed): nothing of ours; gone from the index anyway.
      if (e.published) index_ops_.push_back(IndexOp{false, e.ns, e.key, {}});
      continue;
    }
    auto at = by_offset_.find(ro->offset);
    if (at != by_offset_.end()) {
      Object& o = objects_.at(at->second);
      if (!o.writing && o.handle.generation == ro->generation && !o.in_index) {
        o.in_index = true;  // published before the restart (or retired: released later)
        ++stats_.indexed;
        continue;
      }
    }
    // An object evicted before a restart, or a region reset: its range stays the index's until
    // the entry is reclaimed.
    const std::uint64_t bytes = AlignUp(ro->length, c_.alignment_bytes);
    if (ro->offset + bytes <= c_.region_bytes && Carve(&free_, ro->offset, bytes)) {
      held_[ro->offset] = Held{bytes, ro->generation};
      held_bytes_ += bytes;
      used_bytes_ += bytes;
    } else {
      std::fprintf(stderr,
                   "cxlkv-orchestrator: lmcache: the domain's index names region bytes %llu+%llu "
                   "(generation %llu) that this coordinator's state has granted again: the "
                   "index and the coordinator's state do not belong together (restored from "
                   "different times?); the entry is retired\n",
                   static_cast<unsigned long long>(ro->offset),
                   static_cast<unsigned long long>(ro->length),
                   static_cast<unsigned long long>(ro->generation));
    }
    if (e.published) index_ops_.push_back(IndexOp{false, e.ns, e.key, {}});
  }
  for (auto& [id, o] : objects_) {
    if (!o.writing) OfferToIndexLocked(o, o.tenant);
  }
}

std::vector<Coordinator::IndexOp> Coordinator::TakeIndexOps() {
  base::MutexLock l(mu_);
  std::vector<IndexOp> out;
  out.swap(index_ops_);
  return out;
}

void Coordinator::IndexReleased(const std::vector<coherence::BlockRef>& refs) {
  if (refs.empty()) return;
  base::MutexLock l(mu_);
  const std::uint32_t tag = RegionTag();
  bool freed = false;
  for (const coherence::BlockRef& ref : refs) {
    const auto ro = coherence::AsRegionObject(ref);
    if (!ro.has_value() || ro->region_tag != tag) continue;
    auto h = held_.find(ro->offset);
    if (h != held_.end() && h->second.generation == ro->generation) {
      GiveBack(&free_, h->first, h->second.alloc_bytes);
      held_bytes_ -= h->second.alloc_bytes;
      used_bytes_ -= h->second.alloc_bytes;
      held_.erase(h);
      freed = true;
      continue;
    }
    // Still a finished object here: the index evicted it under its own pressure, or refused it
    // (counted as skipped: served over HTTP only from now on).
    auto at = by_offset_.find(ro->offset);
    if (at == by_offset_.end()) continue;
    Object& o = objects_.at(at->second);
    if (o.in_index && o.handle.generation == ro->generation) {
      o.in_index = false;
      --stats_.indexed;
      ++stats_.index_skipped;
    }
  }
  if (freed) {
    ++released_;
    released_cv_.NotifyAll();
  }
}

Stats Coordinator::stats() const {
  base::MutexLock l(mu_);
  Stats s = stats_;
  s.held_bytes = held_bytes_;
  s.used_bytes = used_bytes_;
  s.object_count = objects_.size();
  s.writing = writing_.size();
  s.journal_records = journal_seq_;
  base::MutexLock sl(sync_mu_);
  s.syncs = syncs_;
  return s;
}

// ---- the state file -------------------------------------------------------------------------
// A snapshot (state_file: one JSON document, then "crc32c <hex>") and a journal beside it
// (state_file + ".journal": one line per change, "<JSON>\t<crc32c hex>", fdatasync'd before the
// reply). The snapshot names the last journal record it includes, so a crash between writing a
// new snapshot and emptying the journal replays nothing twice. A torn last journal line is a
// change whose reply was never sent: dropped. Anything else that does not check stops Open.

namespace {

json ObjectJson(const std::string& tenant, const ObjectKey& key, const Layout& layout,
                const Handle& h, std::uint64_t alloc_bytes, bool writing, const std::string& token,
                std::uint64_t touched) {
  return json{{"tenant", tenant},           {"key", KeyJson(key)},
              {"shapes", layout.shapes},    {"dtypes", layout.dtypes},
              {"offset", h.offset},         {"length", h.length},
              {"generation", h.generation}, {"alloc_bytes", alloc_bytes},
              {"writing", writing},         {"token", token},
              {"touched", touched}};
}

// Every write of the state file and its journal names the setting in its error.
absl::Status InStateFile(const absl::Status& st) {
  if (st.ok()) return st;
  return absl::InternalError(absl::StrCat("lmcache.state_file: ", st.message()));
}

}  // namespace

Coordinator::~Coordinator() = default;

void Coordinator::IndexLocked(const std::string& id, const Object& o, bool add) {
  if (add) {
    by_offset_[o.handle.offset] = id;
    used_bytes_ += o.alloc_bytes;
    stats_.tenant_used_bytes[o.tenant] += o.alloc_bytes;
    if (o.writing) {
      writing_.insert(id);
    } else {
      lru_.emplace(PinOf(o.tenant), o.touched, id);
    }
  } else {
    by_offset_.erase(o.handle.offset);
    if (o.in_index) --stats_.indexed;
    used_bytes_ -= o.alloc_bytes;
    stats_.tenant_used_bytes[o.tenant] -= o.alloc_bytes;
    writing_.erase(id);
    lru_.erase({PinOf(o.tenant), o.touched, id});
  }
}

absl::Status Coordinator::ApplyLocked(const Change& ch) {
  for (const std::string& id : ch.dels) {
    auto it = objects_.find(id);
    if (it == objects_.end()) continue;
    IndexLocked(id, it->second, false);
    if (it->second.in_index) {
      HoldLocked(it->second);  // hosts may lease it through the index: back when it lets go
    } else {
      GiveBack(&free_, it->second.handle.offset, it->second.alloc_bytes);
    }
    objects_.erase(it);
  }
  for (const auto& [id, o] : ch.puts) {
    auto it = objects_.find(id);
    if (it != objects_.end()) {
      IndexLocked(id, it->second, false);
      if (it->second.handle.offset == o.handle.offset && it->second.alloc_bytes == o.alloc_bytes) {
        const bool was_writing = it->second.writing;
        it->second = o;  // the same object, changed (finished)
        IndexLocked(id, o, true);
        if (was_writing && !o.writing) OfferToIndexLocked(it->second, o.tenant);
        continue;
      }
      if (it->second.in_index) {
        HoldLocked(it->second);
      } else {
        GiveBack(&free_, it->second.handle.offset, it->second.alloc_bytes);
      }
      objects_.erase(it);
    }
    if (o.handle.offset + o.alloc_bytes > c_.region_bytes || o.alloc_bytes < o.handle.length ||
        !Carve(&free_, o.handle.offset, o.alloc_bytes)) {
      return absl::DataLossError(absl::StrCat("object at ", o.handle.offset, " (", o.alloc_bytes,
                                              " bytes) overlaps another or leaves the region"));
    }
    IndexLocked(id, o, true);
    objects_.emplace(id, o);
  }
  next_generation_ = std::max(next_generation_, ch.next_generation);
  touch_seq_ = std::max(touch_seq_, ch.touch_seq);
  return absl::OkStatus();
}

absl::Status Coordinator::CommitLocked(const Change& ch) {
  json puts = json::array();
  for (const auto& [id, o] : ch.puts) {
    json j = ObjectJson(o.tenant, o.key, o.layout, o.handle, o.alloc_bytes, o.writing, o.token,
                        o.touched);
    j["id"] = id;
    puts.push_back(std::move(j));
  }
  const json rec{{"seq", journal_seq_ + 1},
                 {"puts", puts},
                 {"dels", ch.dels},
                 {"next_generation", ch.next_generation},
                 {"touch_seq", ch.touch_seq}};
  const std::string body = rec.dump();
  const std::string line = absl::StrCat(
      body, "\t", absl::Hex(coherence::Crc32c(body.data(), body.size()), absl::kZeroPad8), "\n");
  if (auto st = store_->Append(journal_seq_ + 1, line); !st.ok()) {
    return absl::InternalError(absl::StrCat("cannot append to ", store_->journal_where(), ": ",
                                            st.message(), " (nothing changed)"));
  }
  ++journal_seq_;
  ++journal_records_;
  if (auto ast = ApplyLocked(ch); !ast.ok()) {
    // A live change that does not fit the free map is a bug, not bad input.
    std::fprintf(stderr, "cxlkv-orchestrator: lmcache: BUG: %s\n",
                 std::string(ast.message()).c_str());
    std::abort();
  }
  if (journal_records_ >= std::max<std::uint64_t>(1024, 2 * objects_.size())) {
    if (auto cst = CompactLocked(); !cst.ok()) {
      std::fprintf(stderr,
                   "cxlkv-orchestrator: lmcache: compaction failed (the journal keeps "
                   "every change; retried later): %s\n",
                   std::string(cst.message()).c_str());
    }
  }
  return absl::OkStatus();
}

std::string Coordinator::SerializeLocked() const {
  json objs = json::array();
  for (const auto& [id, o] : objects_) {
    objs.push_back(ObjectJson(o.tenant, o.key, o.layout, o.handle, o.alloc_bytes, o.writing,
                              o.token, o.touched));
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
           {"journal_seq", journal_seq_},
           {"objects", objs}};
  std::string text = doc.dump();
  const std::uint32_t crc = coherence::Crc32c(text.data(), text.size());
  absl::StrAppend(&text, "\ncrc32c ", absl::Hex(crc, absl::kZeroPad8), "\n");
  return text;
}

absl::Status Coordinator::LoadLocked(const std::string& text, const std::string& journal,
                                     std::int64_t now_ms) {
  const std::string path = store_->where();
  auto loss = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", what,
        "; the coordinator will not start on it (nothing is discarded). Stop every LMCache "
        "server mapping the region, then move the file and its .journal away to reset the "
        "region"));
  };
  const std::size_t nl = text.rfind("\ncrc32c ");
  if (nl == std::string::npos) return loss("no crc32c line (torn or not a coordinator state file)");
  const std::string body = text.substr(0, nl);
  const std::string want = absl::StrCat(
      "crc32c ", absl::Hex(coherence::Crc32c(body.data(), body.size()), absl::kZeroPad8), "\n");
  if (text.substr(nl + 1) != want) return loss("crc32c mismatch");
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return loss("not JSON");
  auto object_of = [](const json& j) {
    Object o;
    o.tenant = j.at("tenant").get<std::string>();
    o.key = KeyFromJson(j.at("key"));
    o.layout.shapes = j.at("shapes").get<std::vector<std::vector<std::int64_t>>>();
    o.layout.dtypes = j.at("dtypes").get<std::vector<std::string>>();
    o.handle = {j.at("offset").get<std::uint64_t>(), j.at("length").get<std::uint64_t>(),
                j.at("generation").get<std::uint64_t>()};
    o.alloc_bytes = j.at("alloc_bytes").get<std::uint64_t>();
    o.writing = j.at("writing").get<bool>();
    o.token = j.at("token").get<std::string>();
    o.touched = j.at("touched").get<std::uint64_t>();
    return o;
  };
  try {
    if (doc.at("format") != "cxlkv-lmcache-coordinator" || doc.at("version") != 1) {
      return loss("unknown format or version");
    }
    auto mismatch = [&](absl::string_view key, const std::string& was, const std::string& is) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " describes another region: ", key, " was ", was, ", the configuration says ", is,
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
    journal_seq_ = u("journal_seq");
    Change snap;
    snap.next_generation = u("next_generation");
    snap.touch_seq = u("touch_seq");
    for (const json& j : doc.at("objects")) {
      Object o = object_of(j);
      std::string id = Canonical(NamespaceOf(o.tenant), o.key);
      snap.puts.emplace_back(std::move(id), std::move(o));
    }
    if (auto st = ApplyLocked(snap); !st.ok()) return loss(st.message());
    if (objects_.size() != snap.puts.size()) return loss("a key listed twice");
    // The journal: records after the snapshot's, in order.
    std::size_t pos = 0;
    int line_no = 0;
    while (pos < journal.size()) {
      ++line_no;
      const std::size_t end = journal.find('\n', pos);
      const bool last = end == std::string::npos || end + 1 == journal.size();
      const std::string line =
          journal.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      pos = end == std::string::npos ? journal.size() : end + 1;
      const std::size_t tab = line.rfind('\t');
      const bool intact =
          end != std::string::npos && tab != std::string::npos &&
          line.substr(tab + 1) ==
              absl::StrCat(absl::Hex(coherence::Crc32c(line.data(), tab), absl::kZeroPad8));
      if (!intact) {
        if (last) break;  // torn by a crash mid-append: its reply was never sent
        return loss(absl::StrCat(store_->journal_where(), ":", line_no, ": a damaged record"));
      }
      const json rec = json::parse(line.substr(0, tab), nullptr, false);
      if (rec.is_discarded())
        return loss(absl::StrCat(store_->journal_where(), ":", line_no, ": not JSON"));
      const std::uint64_t seq = rec.at("seq").get<std::uint64_t>();
      if (seq <= journal_seq_) continue;  // already in the snapshot
      if (seq != journal_seq_ + 1) {
        return loss(absl::StrCat(store_->journal_where(), ":", line_no, ": record ", seq, " after ",
                                 journal_seq_));
      }
      Change ch;
      for (const json& j : rec.at("puts"))
        ch.puts.emplace_back(j.at("id").get<std::string>(), object_of(j));
      ch.dels = rec.at("dels").get<std::vector<std::string>>();
      ch.next_generation = rec.at("next_generation").get<std::uint64_t>();
      ch.touch_seq = rec.at("touch_seq").get<std::uint64_t>();
      if (auto st = ApplyLocked(ch); !st.ok()) {
        return loss(absl::StrCat(store_->journal_where(), ":", line_no, ": ", st.message()));
      }
      journal_seq_ = seq;
    }
  } catch (const json::exception& e) {
    return loss(absl::StrCat("malformed: ", e.what()));
  }
  for (auto& [id, o] : objects_) {
    if (o.handle.generation >= next_generation_) {
      return loss("an object with a generation not yet handed out");
    }
    // Timers restart at now: conservative (a writer may still be writing, a reader reading).
    o.expires_ms = now_ms + c_.reservation_ttl_ms;
    o.lease_until_ms = now_ms + c_.read_lease_ms;
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CompactLocked() {
  if (auto st = store_->Compact(SerializeLocked(), journal_seq_); !st.ok()) return st;
  journal_records_ = 0;
  // The snapshot holds every record so far, durably.
  base::MutexLock sl(sync_mu_);
  synced_seq_ = std::max(synced_seq_, journal_seq_);
  return absl::OkStatus();
}

// ---- the state file and its journal ---------------------------------------------------------

namespace {

class FileStore : public StateStore {
 public:
  explicit FileStore(std::string path) : path_(std::move(path)), journal_(path_ + ".journal") {}
  ~FileStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::StatusOr<std::optional<Loaded>> Load() override {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      if (errno == ENOENT) return std::optional<Loaded>();
      return absl::PermissionDeniedError(
          absl::StrCat(where(), ": cannot read: ", base::ErrnoText(errno)));
    }
    Loaded out;
    std::stringstream ss;
    ss << in.rdbuf();
    out.snapshot = ss.str();
    if (std::ifstream jin(journal_, std::ios::binary); jin) {
      std::stringstream js;
      js << jin.rdbuf();
      out.journal = js.str();
    }
    return std::optional<Loaded>(std::move(out));
  }

  absl::Status Append(std::uint64_t /*seq*/, const std::string& record) override {
    absl::Status st = InStateFile(base::WriteAll(fd_, record, journal_));
    if (!st.ok()) {
      // A partial line is cut off so the next record starts clean.
      if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) broken_ = true;
      return st;
    }
    bytes_ += record.size();
    return absl::OkStatus();
  }

  absl::Status Compact(const std::string& text, std::uint64_t /*seq*/) override {
    if (broken_) {
      return absl::InternalError(absl::StrCat(
          journal_, " could not be cut after a failed append; restart the orchestrator"));
    }
    auto fail = [&](const char* what, int err) {
      return absl::InternalError(
          absl::StrCat("lmcache.state_file: ", what, " ", journal_, ": ", base::ErrnoText(err)));
    };
    if (auto st = InStateFile(base::ReplaceFile(path_, text, 0600)); !st.ok()) return st;
    // The snapshot holds every record: the journal starts empty.
    if (fd_ < 0) {
      fd_ = ::open(journal_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (fd_ < 0) return fail("cannot open the journal", errno);
    }
    if (::ftruncate(fd_, 0) != 0 || ::fdatasync(fd_) != 0) {
      return fail("cannot empty the journal", errno);
    }
    if (auto st = InStateFile(base::SyncParentDir(journal_)); !st.ok()) return st;
    bytes_ = 0;
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fdatasync(fd_) != 0) return absl::InternalError(base::ErrnoText(errno));
    return absl::OkStatus();
  }

  std::string where() const override { return "lmcache.state_file " + path_; }
  std::string journal_where() const override { return journal_; }

 private:
  std::string path_, journal_;
  int fd_ = -1;
  std::uint64_t bytes_ = 0;  // the journal's length
  bool broken_ = false;      // a failed append could not be cut off
};

}  // namespace

std::unique_ptr<StateStore> FileStateStore(const std::string& path) {
  return std::make_unique<FileStore>(path);
}

}  // namespace cxlkv::coordinator
