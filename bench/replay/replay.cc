// The replay engine: one request at a time through the index, the arena, the NVMe store and
// the placement rule. See replay.h for what is real and what is modeled.
#include "replay.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/nvme_store.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/reuse_tracker.h"

namespace cxlkv::replay {
namespace {

namespace co = cxlkv::coherence;
using allocator::BlockAllocator;
using allocator::BlockHandle;
using co::PrefixKey;

struct KeyHash {
  std::size_t operator()(const PrefixKey& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};

// The trace's time, in the milliseconds the index's leases and heartbeats use.
class ReplayClock final : public co::Clock {
 public:
  std::int64_t NowMs() override { return now_ms_; }
  void Set(double t_s) {
    now_ms_ = std::max(now_ms_, static_cast<std::int64_t>(t_s * 1e3) + 1000);
  }

 private:
  std::int64_t now_ms_ = 1000;
};

// What prefill would have computed for a block: a stream derived from its key only, so a
// copy read back from any tier can be checked against it.
void FillBlock(const PrefixKey& key, std::byte* dst, std::size_t n) {
  std::uint64_t x = (key.lo ^ (key.hi << 1 | key.hi >> 63)) | 1;
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(dst + i, &x, 8);
  }
}

// 4 KiB-aligned scratch blocks (O_DIRECT reads and writes go straight to them).
class Buffers {
 public:
  explicit Buffers(std::uint64_t block_bytes) : bytes_(block_bytes) {}
  std::byte* Get(std::size_t i) {
    while (blocks_.size() <= i) {
      blocks_.emplace_back(static_cast<std::byte*>(std::aligned_alloc(4096, bytes_)));
    }
    return blocks_[i].get();
  }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::uint64_t bytes_;
  std::vector<std::unique_ptr<std::byte, FreeDeleter>> blocks_;
};

std::uint32_t NextPow2(std::uint64_t v) {
  std::uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

class Engine {
 public:
  Engine(const Trace& trace, const ReplayOptions& o)
      : trace_(trace), o_(o), moved_(o.profile.MovedBlockBytes()),
        modeled_(o.profile.ModeledBlockBytes()), scratch_(moved_), nvme_bufs_(moved_),
        put_bufs_(moved_) {}
  ~Engine() { Teardown(); }

  absl::Status Setup();
  absl::Status Run(ReplayResult* r);

 private:
  struct CxlEntry {
    co::Namespace ns;
    BlockHandle h;
    std::uint32_t depth;  // 1 + the block's position in its chain
    std::int64_t moved_ns;
    std::list<PrefixKey>::iterator lru;
  };
  struct NvmeEntry {
    std::int64_t moved_ns;
    std::list<PrefixKey>::iterator lru;
  };
  bool UsesCxl() const {
    return o_.policy == Policy::kRule || o_.policy == Policy::kCxlLru ||
           o_.policy == Policy::kLruSpill;
  }
  bool UsesNvme() const {
    return o_.policy == Policy::kRule || o_.policy == Policy::kNvmeLru ||
           o_.policy == Policy::kLruSpill;
  }
  std::string Path(const std::string& dir, const char* what) const {
    return absl::StrCat(dir, "/cxlkv-", o_.tag, "-", what, "-", ::getpid());
  }
  void Teardown();
  absl::Status Pump();
  absl::Status ServeRequest(const Request& q, ReplayResult* r);
  absl::Status LookupCxl(const Request& q, std::span<const PrefixKey> keys, std::size_t* got,
                         bool* stop, ReplayResult* r);
  absl::Status LookupNvme(std::span<const PrefixKey> keys, std::size_t* got, ReplayResult* r,
                          std::vector<std::pair<PrefixKey, std::size_t>>* read);
  // `chain`/`pos`: the request's chain and the block's place in it. A block with no reuse
  // history of its own takes its nearest ancestor's expected interval (a turn's new blocks
  // come back with the conversation that reuses its parents).
  pool::Decision Decide(const PrefixKey& key, std::size_t depth, double occupancy_delta = 0,
                        std::span<const PrefixKey> chain = {}, std::size_t pos = 0);
  // Stores a block whose bytes are in `data` in the CXL tier (publishes it).
  absl::Status PutCxl(co::Namespace ns, const PrefixKey& key, const PrefixKey& parent,
                      std::size_t depth, const std::byte* data, ReplayResult* r);
  // Queues an NVMe write (flushed by FlushNvme); makes room at NVMe capacity first.
  absl::Status PutNvme(const PrefixKey& key, const std::byte* data, ReplayResult* r);
  absl::Status FlushNvme(ReplayResult* r);
  absl::Status DeleteNvme(const PrefixKey& key);
  // Evicts CXL blocks, least recently used first, until at most `target` are resident.
  absl::Status EvictCxl(std::uint32_t target, ReplayResult* r);
  double CxlOccupancy() const {
    return o_.cxl_blocks ? static_cast<double>(cxl_.size()) / o_.cxl_blocks : 1.0;
  }
  std::int64_t NowNs() const { return static_cast<std::int64_t>(now_s_ * 1e9); }
  bool CoolingDown(std::int64_t moved_ns) const {
    return o_.policy == Policy::kRule &&
           static_cast<double>(NowNs() - moved_ns) < o_.params.cooldown_s * 1e9;
  }
  absl::Status Check(const PrefixKey& key, const std::byte* data, ReplayResult* r) {
    if (!o_.verify) return absl::OkStatus();
    FillBlock(key, scratch_.Get(0), moved_);
    if (std::memcmp(scratch_.Get(0), data, moved_) != 0) ++r->verify_failures;
    return absl::OkStatus();
  }

  const Trace& trace_;
  const ReplayOptions& o_;
  const std::uint64_t moved_, modeled_;
  ReplayClock clock_;
  double now_s_ = 0;
  std::uint32_t queue_depth_ = 0;
  std::string arena_path_, domain_path_;
  std::unique_ptr<BlockAllocator> alloc_;
  std::unique_ptr<pool::Region> domain_region_;
  std::unique_ptr<co::DirectMem> mem_;
  std::unique_ptr<co::PrefixOwner> owner_;
  std::unique_ptr<co::PrefixHost> host_;
  std::unique_ptr<pool::NvmeStore> store_;
  std::optional<pool::PlacementRule> rule_;
  std::optional<pool::ReuseTracker> tracker_;
  absl::flat_hash_map<PrefixKey, CxlEntry, KeyHash> cxl_;
  std::list<PrefixKey> cxl_lru_;  // front: most recent
  absl::flat_hash_map<PrefixKey, NvmeEntry, KeyHash> nvme_;
  std::list<PrefixKey> nvme_lru_;
  std::uint64_t awaiting_return_ = 0;  // retired blocks not yet handed back by the owner
  std::uint64_t freed_ = 0;
  std::uint64_t inherited_ = 0;
  Buffers scratch_, nvme_bufs_, put_bufs_;
  pool::NvmeBatch batch_;
  std::vector<PrefixKey> pending_put_keys_;
};

absl::Status Engine::Setup() {
  if (moved_ == 0 || o_.profile.scale == 0) return absl::InvalidArgumentError("empty profile");
  if (UsesCxl()) {
    if (o_.cxl_blocks == 0) return absl::InvalidArgumentError("cxl_blocks must be > 0");
    // The arena: cxl_blocks blocks of the moved size, plus room for its metadata.
    arena_path_ = Path(o_.shm_dir, "arena");
    const std::uint64_t stride = (moved_ + 4095) / 4096 * 4096;
    // Slack beyond cxl_blocks holds blocks retired but not yet handed back by the owner;
    // residency is capped at cxl_blocks by the engine, never by the slack.
    const std::uint64_t slack = std::min<std::uint64_t>(2048, o_.cxl_blocks);
    std::uint64_t bytes = (std::uint64_t{o_.cxl_blocks} + slack) * stride + (8ull << 20) +
                          std::uint64_t{o_.cxl_blocks} * 64;
    bytes = (bytes + (2ull << 20) - 1) / (2ull << 20) * (2ull << 20);
    ::unlink(arena_path_.c_str());
    auto region = pool::OpenRegion(absl::StrCat("file:", arena_path_, "?size=", bytes));
    if (!region.ok()) return region.status();
    pool::FormatOptions fo;
    fo.classes = {pool::ClassSpec{0, moved_, 1}};
    fo.force = true;
    auto arena = pool::Arena::Format(std::move(*region), fo);
    if (!arena.ok()) return arena.status();
    if ((*arena)->total_blocks() < o_.cxl_blocks) {
      return absl::InternalError(absl::StrCat("arena ", arena_path_, " holds ",
                                              (*arena)->total_blocks(), " blocks, fewer than ",
                                              o_.cxl_blocks));
    }
    auto alloc = BlockAllocator::Create(std::move(*arena));
    if (!alloc.ok()) return alloc.status();
    alloc_ = std::move(*alloc);

    // The index: a domain in shared memory, the owner and one host in this process. Leases and
    // heartbeats run on the trace's clock, so their TTLs are in simulated time; grace 0 lets
    // a retired block come back as soon as no lease names it.
    co::DomainGeometry g;
    g.max_hosts = 2;
    g.index_entries = NextPow2(std::max<std::uint64_t>(4096, std::uint64_t{o_.cxl_blocks} * 2));
    g.lease_rows = 1024;
    g.ring_slots = 256;
    g.lease_ttl_ms = 600000;
    g.host_ttl_ms = 600000;
    g.grace_ms = 0;
    domain_path_ = Path(o_.shm_dir, "domain");
    ::unlink(domain_path_.c_str());
    const std::uint64_t dbytes = (co::DomainBytes(g) + 4095) / 4096 * 4096;
    auto dom = pool::OpenRegion(absl::StrCat("file:", domain_path_, "?size=", dbytes));
    if (!dom.ok()) return dom.status();
    domain_region_ = std::move(*dom);
    mem_ = std::make_unique<co::DirectMem>(domain_region_->addr(), domain_region_->size_bytes());
    if (auto st = co::FormatDomain(*mem_, g); !st.ok()) return st;
    auto owner = co::PrefixOwner::Open(*mem_, clock_);
    if (!owner.ok()) return owner.status();
    owner_ = std::move(*owner);
    auto host = co::PrefixHost::Join(*mem_, clock_, 0);
    if (!host.ok()) return host.status();
    host_ = std::move(*host);
  }
  if (UsesNvme()) {
    if (o_.nvme_dir.empty() || o_.nvme_blocks == 0) {
      return absl::InvalidArgumentError("an NVMe policy needs nvme_dir and nvme_blocks");
    }
    std::error_code ec;
    std::filesystem::remove_all(o_.nvme_dir, ec);
    pool::NvmeStoreOptions so;
    so.dir = o_.nvme_dir;
    so.payload_bytes = moved_;
    // Slack over nvme_blocks: deleted slots are retired in the background.
    const std::uint64_t slot = (moved_ + 4095) / 4096 * 4096 + 4096;
    so.capacity_bytes = (std::uint64_t{o_.nvme_blocks} + o_.nvme_blocks / 4 + 256) * slot;
    so.grow_bytes = 16ull << 20;
    auto store = pool::NvmeStore::Open(so);
    if (!store.ok()) return store.status();
    store_ = std::move(*store);
  }
  if (o_.policy == Policy::kRule) {
    auto rule = pool::PlacementRule::Create(o_.params);
    if (!rule.ok()) return rule.status();
    rule_.emplace(std::move(*rule));
  }
  auto tracker = pool::ReuseTracker::Create(pool::ReuseTrackerOptions{1u << 20, 0.25});
  if (!tracker.ok()) return tracker.status();
  tracker_.emplace(std::move(*tracker));
  return absl::OkStatus();
}

void Engine::Teardown() {
  host_.reset();
  owner_.reset();
  mem_.reset();
  domain_region_.reset();
  alloc_.reset();
  if (store_) store_->Drain();
  store_.reset();
  if (o_.keep_files) return;
  if (!arena_path_.empty()) ::unlink(arena_path_.c_str());
  if (!domain_path_.empty()) ::unlink(domain_path_.c_str());
  if (!o_.nvme_dir.empty() && UsesNvme()) {
    std::error_code ec;
    std::filesystem::remove_all(o_.nvme_dir, ec);
  }
}

// Heartbeat, one owner round (applies publishes and retires, reclaims, hands blocks back),
// heartbeat again to collect; returned blocks are freed in the arena.
absl::Status Engine::Pump() {
  if (!host_) return absl::OkStatus();
  std::vector<co::BlockRef> back;
  if (auto st = host_->Heartbeat(&back); !st.ok()) return st;
  owner_->Step();
  if (auto st = host_->Heartbeat(&back); !st.ok()) return st;
  for (const co::BlockRef& ref : back) {
    const auto fr = alloc_->Free(BlockHandle{ref.index, ref.generation});
    if (fr != allocator::FreeResult::kOk) {
      return absl::InternalError(absl::StrCat("a block the owner returned (index ", ref.index,
                                              ") did not free: ",
                                              allocator::FreeResultName(fr)));
    }
    ++freed_;
    if (awaiting_return_ > 0) --awaiting_return_;
  }
  return absl::OkStatus();
}

pool::Decision Engine::Decide(const PrefixKey& key, std::size_t depth, double occupancy_delta,
                              std::span<const PrefixKey> chain, std::size_t pos) {
  pool::BlockInputs in;
  in.size_bytes = modeled_;
  const auto now = static_cast<std::uint64_t>(NowNs());
  in.reuse_interval_s = tracker_->ExpectedIntervalS(key, now);
  if (o_.inherit_reuse && std::isinf(in.reuse_interval_s)) {
    for (std::size_t up = 1; up <= std::min<std::size_t>(pos, 64); ++up) {
      const double parent = tracker_->ExpectedIntervalS(chain[pos - up], now);
      if (!std::isinf(parent)) {
        in.reuse_interval_s = parent;
        ++inherited_;
        break;
      }
    }
  }
  in.tokens = o_.profile.tokens_per_block;
  if (o_.rule_prefix_tokens) in.tokens *= static_cast<std::uint32_t>(depth);
  in.queue_depth = queue_depth_;
  in.occupancy = {std::min(1.0, CxlOccupancy() + occupancy_delta), 1.0};
  return rule_->Decide(in);
}

absl::Status Engine::LookupCxl(const Request& q, std::span<const PrefixKey> keys,
                               std::size_t* got, bool* stop, ReplayResult* r) {
  *got = 0;
  *stop = false;
  std::vector<co::Lease> leases;
  absl::StatusOr<std::size_t> n = host_->AcquireChain(q.ns, keys, &leases);
  if (absl::IsUnavailable(n.status())) {
    if (auto st = Pump(); !st.ok()) return st;
    leases.clear();
    n = host_->AcquireChain(q.ns, keys, &leases);
  }
  if (!n.ok()) {
    if (absl::IsNotFound(n.status())) return absl::OkStatus();
    return n.status();
  }
  std::size_t ok = 0;
  for (std::size_t j = 0; j < leases.size(); ++j) {
    const co::Lease& l = leases[j];
    auto it = cxl_.find(keys[j]);
    if (it == cxl_.end() || it->second.h.index != l.ref.index ||
        it->second.h.generation != l.ref.generation) {
      ++r->index_mismatches;
      *stop = true;
      break;
    }
    allocator::BlockRef ref;
    std::memcpy(ref.arena.data(), l.ref.arena, 16);
    ref.index = l.ref.index;
    ref.generation = l.ref.generation;
    auto addr = alloc_->Resolve(ref);
    if (!addr.ok()) return addr.status();
    std::byte* dst = scratch_.Get(1);
    co::Invalidate(*addr, moved_);
    std::memcpy(dst, *addr, moved_);
    if (!host_->ValidateAfterCopy(l).ok()) {
      ++r->copies_discarded;
      *stop = true;
      break;
    }
    if (auto st = Check(keys[j], dst, r); !st.ok()) return st;
    cxl_lru_.splice(cxl_lru_.begin(), cxl_lru_, it->second.lru);
    ++ok;
  }
  host_->ReleaseAll(leases);
  r->cxl_read.blocks += ok;
  *got = ok;
  return absl::OkStatus();
}

absl::Status Engine::LookupNvme(std::span<const PrefixKey> keys, std::size_t* got,
                                ReplayResult* r,
                                std::vector<std::pair<PrefixKey, std::size_t>>* read) {
  *got = 0;
  std::size_t run = 0;
  while (run < keys.size() && run < 256 && !cxl_.contains(keys[run]) &&
         store_->Contains(keys[run])) {
    ++run;
  }
  if (run == 0) return absl::OkStatus();
  std::vector<void*> dests(run);
  const std::size_t base = read->size();
  for (std::size_t j = 0; j < run; ++j) dests[j] = nvme_bufs_.Get(base + j);
  pool::NvmeBatch batch;
  if (auto st = store_->Prefetch(keys.first(run), dests, moved_, batch); !st.ok()) return st;
  store_->Wait(batch);
  std::size_t ok = 0;
  for (; ok < run; ++ok) {
    if (!batch.status(ok).ok() || batch.bytes(ok) != moved_) {
      ++r->nvme_read_errors;
      break;
    }
    if (auto st = Check(keys[ok], static_cast<std::byte*>(dests[ok]), r); !st.ok()) return st;
    read->emplace_back(keys[ok], base + ok);
    auto it = nvme_.find(keys[ok]);
    if (it != nvme_.end()) nvme_lru_.splice(nvme_lru_.begin(), nvme_lru_, it->second.lru);
  }
  r->nvme_read.blocks += ok;
  *got = ok;
  return absl::OkStatus();
}

absl::Status Engine::EvictCxl(std::uint32_t target, ReplayResult* r) {
  auto it = cxl_lru_.end();
  while (cxl_.size() > target && it != cxl_lru_.begin()) {
    --it;
    const PrefixKey key = *it;
    CxlEntry& e = cxl_.at(key);
    if (CoolingDown(e.moved_ns)) {
      ++r->cooldown_holds;
      continue;
    }
    bool demote = o_.policy == Policy::kLruSpill;
    if (o_.policy == Policy::kRule) {
      // Re-decide the victim as if it were not in CXL: drop or NVMe (a victim the rule would
      // keep in CXL goes to NVMe: the watermark needs the room).
      const pool::Decision d = Decide(key, e.depth);
      ++r->clauses[static_cast<int>(d.clause)];
      demote = d.tier != pool::Tier::kDrop;
    }
    if (demote) {
      std::byte* addr = alloc_->Addr(e.h);
      if (auto st = PutNvme(key, addr, r); !st.ok()) return st;  // copies the bytes out now
      ++r->demotions;
      r->cxl_read.blocks += 1;
    } else {
      ++r->evicted_dropped;
    }
    absl::Status st;
    for (int tries = 0; tries < 1000; ++tries) {
      st = host_->Retire(e.ns, key);
      if (!absl::IsUnavailable(st)) break;
      if (auto ps = Pump(); !ps.ok()) return ps;
    }
    if (!st.ok()) return st;
    ++awaiting_return_;
    it = cxl_lru_.erase(it);
    cxl_.erase(key);
  }
  // The retired blocks come back through the owner at the next Pump(); the arena's slack
  // holds new blocks meanwhile (PutCxl pumps if it runs out).
  return absl::OkStatus();
}

absl::Status Engine::PutCxl(co::Namespace ns, const PrefixKey& key, const PrefixKey& parent,
                            std::size_t depth, const std::byte* data, ReplayResult* r) {
  BlockHandle h = alloc_->Alloc(0);
  for (int rounds = 0; !h.valid() && awaiting_return_ > 0 && rounds < 1000; ++rounds) {
    if (auto st = Pump(); !st.ok()) return st;  // wait for retired blocks to come back
    h = alloc_->Alloc(0);
  }
  if (!h.valid()) {
    return absl::InternalError(absl::StrCat("CXL arena full below capacity: ",
                                            alloc_->ExplainAllocFailure(0).message()));
  }
  co::CopyNt(alloc_->Addr(h), data, moved_);
  co::BlockRef ref{};
  std::memcpy(ref.arena, alloc_->arena().uuid().data(), 16);
  ref.index = h.index;
  ref.generation = h.generation;
  absl::Status st;
  for (int tries = 0; tries < 1000; ++tries) {
    st = host_->Publish(ns, key, parent, ref, [&] { return alloc_->Persist(h).ok(); });
    if (!absl::IsUnavailable(st)) break;
    if (auto ps = Pump(); !ps.ok()) return ps;
  }
  if (!st.ok()) return st;
  cxl_lru_.push_front(key);
  cxl_.emplace(key, CxlEntry{ns, h, static_cast<std::uint32_t>(depth), NowNs(), cxl_lru_.begin()});
  r->cxl_write.blocks += 1;
  return absl::OkStatus();
}

absl::Status Engine::DeleteNvme(const PrefixKey& key) {
  auto it = nvme_.find(key);
  if (it == nvme_.end()) return absl::OkStatus();
  nvme_lru_.erase(it->second.lru);
  nvme_.erase(it);
  // A put of this key may still be queued: flushed before the delete, so the delete wins.
  auto q = std::find(pending_put_keys_.begin(), pending_put_keys_.end(), key);
  if (q != pending_put_keys_.end()) return absl::OkStatus();  // FlushNvme drops it
  return store_->Delete(key);
}

absl::Status Engine::PutNvme(const PrefixKey& key, const std::byte* data, ReplayResult* r) {
  while (nvme_.size() >= o_.nvme_blocks && !nvme_lru_.empty()) {
    const PrefixKey victim = nvme_lru_.back();
    if (auto st = DeleteNvme(victim); !st.ok()) return st;
    ++r->nvme_evicted;
  }
  std::byte* buf = put_bufs_.Get(pending_put_keys_.size());
  std::memcpy(buf, data, moved_);
  pending_put_keys_.push_back(key);
  nvme_lru_.push_front(key);
  nvme_.emplace(key, NvmeEntry{NowNs(), nvme_lru_.begin()});
  if (pending_put_keys_.size() >= 128) return FlushNvme(r);
  return absl::OkStatus();
}

absl::Status Engine::FlushNvme(ReplayResult* r) {
  if (pending_put_keys_.empty()) return absl::OkStatus();
  batch_.Clear();
  std::size_t n = 0;
  for (std::size_t i = 0; i < pending_put_keys_.size(); ++i) {
    if (!nvme_.contains(pending_put_keys_[i])) continue;  // evicted before it was written
    batch_.AddPut(pending_put_keys_[i], put_bufs_.Get(i), moved_);
    ++n;
  }
  pending_put_keys_.clear();
  if (n == 0) return absl::OkStatus();
  if (auto st = store_->Submit(batch_); !st.ok()) return st;
  store_->Wait(batch_);
  if (auto st = batch_.first_error(); !st.ok()) return st;
  r->nvme_write.blocks += n;
  return absl::OkStatus();
}

absl::Status Engine::ServeRequest(const Request& q, ReplayResult* r) {
  clock_.Set(q.arrival_s);
  now_s_ = q.arrival_s;
  if (auto st = Pump(); !st.ok()) return st;
  const std::uint32_t tpb = o_.profile.tokens_per_block;
  // Chain keys of every full block of prompt + answer (the answer's blocks are written after).
  std::vector<std::uint32_t> all = q.prompt;
  all.insert(all.end(), q.output.begin(), q.output.end());
  const std::size_t n_all = all.size() / tpb;
  const std::size_t n = q.prompt.size() / tpb;
  std::vector<PrefixKey> keys(n_all);
  PrefixKey parent{};
  for (std::size_t b = 0; b < n_all; ++b) {
    parent = co::ChainKey(q.ns, parent, std::span<const std::uint32_t>(all).subspan(b * tpb, tpb));
    keys[b] = parent;
  }
  const auto now_ns = static_cast<std::uint64_t>(NowNs());
  for (std::size_t b = 0; b < n; ++b) tracker_->Record(keys[b], now_ns, modeled_, tpb);

  // Look up: CXL runs through the index, NVMe runs through the store, until neither has the
  // next block.
  std::size_t i = 0, cxl_hits = 0, nvme_hits = 0, nvme_runs = 0;
  std::vector<std::pair<PrefixKey, std::size_t>> nvme_read;  // key, buffer
  while (i < n) {
    std::size_t got = 0;
    bool stop = false;
    if (UsesCxl()) {
      if (auto st = LookupCxl(q, std::span<const PrefixKey>(keys).subspan(i, n - i), &got,
                              &stop, r);
          !st.ok()) {
        return st;
      }
      cxl_hits += got;
      i += got;
      if (stop) break;
    }
    std::size_t from_nvme = 0;
    if (UsesNvme() && i < n) {
      if (auto st = LookupNvme(std::span<const PrefixKey>(keys).subspan(i, n - i), &from_nvme, r,
                               &nvme_read);
          !st.ok()) {
        return st;
      }
      if (from_nvme > 0) ++nvme_runs;
      nvme_hits += from_nvme;
      i += from_nvme;
    }
    if (got == 0 && from_nvme == 0) break;
  }
  const std::size_t hits = i;
  r->lookup_blocks += n;
  r->cxl_hits += cxl_hits;
  r->nvme_hits += nvme_hits;
  r->misses += n - hits;
  r->wl_blocks[static_cast<int>(q.workload)] += n;
  r->wl_hits[static_cast<int>(q.workload)] += hits;
  r->prompt_tokens += q.prompt.size();

  // Modeled TTFT: fetches, then prefill of every token not covered by a hit, slowed by the
  // prefills queued ahead (the rule's own recompute model).
  const pool::PlacementParams& p = o_.params;
  const double mb = static_cast<double>(modeled_);
  double ttft = 0;
  if (cxl_hits > 0) {
    ttft += p.cxl[0].figures.latency_s + static_cast<double>(cxl_hits) * mb /
                                             p.cxl[0].figures.read_bytes_per_s;
  }
  if (nvme_hits > 0) {
    ttft += static_cast<double>(nvme_runs) * p.nvme.latency_s +
            static_cast<double>(nvme_hits) * mb / p.nvme.read_bytes_per_s;
  }
  const double miss_tokens = static_cast<double>(q.prompt.size() - hits * tpb);
  ttft += miss_tokens / p.prefill_tokens_per_s * (1.0 + p.queue_depth_weight * queue_depth_);
  r->ttft_s.push_back(ttft);
  r->queue_depth.push_back(queue_depth_);

  // Promotions of the NVMe hits (after the first token: off the request's critical path).
  if (o_.policy == Policy::kRule || o_.policy == Policy::kLruSpill) {
    for (const auto& [key, buf] : nvme_read) {
      auto ne = nvme_.find(key);
      if (ne == nvme_.end()) continue;
      const auto pos = static_cast<std::size_t>(
          std::find(keys.begin(), keys.end(), key) - keys.begin());
      if (o_.policy == Policy::kRule) {
        const pool::Decision d = Decide(key, pos + 1, 1.0 / o_.cxl_blocks, keys, pos);
        ++r->clauses[static_cast<int>(d.clause)];
        if (d.tier != pool::Tier::kCxlExpanded) continue;
        if (CoolingDown(ne->second.moved_ns)) {
          ++r->cooldown_holds;
          continue;
        }
        if (static_cast<double>(cxl_.size() + 1) > o_.params.high_watermark * o_.cxl_blocks) {
          const auto low = static_cast<std::uint32_t>(o_.params.low_watermark * o_.cxl_blocks);
          if (auto st = EvictCxl(low, r); !st.ok()) return st;
          if (cxl_.size() >= o_.cxl_blocks) continue;
        }
      } else if (cxl_.size() >= o_.cxl_blocks) {
        if (auto st = EvictCxl(o_.cxl_blocks - 1, r); !st.ok()) return st;
      }
      // The parent for the publish: the key before it in this request's chain.
      const PrefixKey par = pos > 0 ? keys[pos - 1] : PrefixKey{};
      if (auto st = DeleteNvme(key); !st.ok()) return st;
      if (auto st = PutCxl(q.ns, key, par, pos + 1, nvme_bufs_.Get(buf), r); !st.ok()) return st;
      ++r->promotions;
    }
  }

  // Recomputed blocks (prompt misses and the answer) are written per policy.
  if (o_.policy != Policy::kRecompute) {
    for (std::size_t b = hits; b < n_all; ++b) {
      const PrefixKey& key = keys[b];
      if (cxl_.contains(key) || nvme_.contains(key)) {
        ++r->already_resident;
        continue;
      }
      std::byte* data = scratch_.Get(2);
      FillBlock(key, data, moved_);
      const PrefixKey par = b > 0 ? keys[b - 1] : PrefixKey{};
      pool::Tier tier = pool::Tier::kCxlExpanded;
      if (o_.policy == Policy::kNvmeLru) tier = pool::Tier::kNvme;
      if (o_.policy == Policy::kRule) {
        if (b >= n) tracker_->Record(key, now_ns, modeled_, tpb);  // produced now
        const pool::Decision d = Decide(key, b + 1, 1.0 / o_.cxl_blocks, keys, b);
        ++r->clauses[static_cast<int>(d.clause)];
        tier = d.tier == pool::Tier::kCxlPooled ? pool::Tier::kCxlExpanded : d.tier;
        if (tier == pool::Tier::kCxlExpanded &&
            static_cast<double>(cxl_.size() + 1) > o_.params.high_watermark * o_.cxl_blocks) {
          const auto low = static_cast<std::uint32_t>(o_.params.low_watermark * o_.cxl_blocks);
          if (auto st = EvictCxl(low, r); !st.ok()) return st;
          if (cxl_.size() >= o_.cxl_blocks) tier = pool::Tier::kNvme;  // all cooling down
        }
      } else if (tier == pool::Tier::kCxlExpanded && cxl_.size() >= o_.cxl_blocks) {
        if (auto st = EvictCxl(o_.cxl_blocks - 1, r); !st.ok()) return st;
      }
      if (tier == pool::Tier::kCxlExpanded) {
        if (auto st = PutCxl(q.ns, key, par, b + 1, data, r); !st.ok()) return st;
        ++r->placed_cxl;
      } else if (tier == pool::Tier::kNvme) {
        if (auto st = PutNvme(key, data, r); !st.ok()) return st;
        ++r->placed_nvme;
      } else {
        ++r->placed_drop;
      }
    }
  }
  if (store_) {
    if (auto st = FlushNvme(r); !st.ok()) return st;
  }
  if (auto st = Pump(); !st.ok()) return st;  // publishes applied before the next request
  r->occupancy.push_back(Occupancy{q.arrival_s, static_cast<std::uint32_t>(cxl_.size()),
                                   static_cast<std::uint32_t>(nvme_.size())});
  return absl::OkStatus();
}

absl::Status Engine::Run(ReplayResult* r) {
  // Queue depth at an arrival: earlier requests whose first token is still ahead.
  std::priority_queue<double, std::vector<double>, std::greater<>> done_at;
  for (const Request& q : trace_.requests) {
    while (!done_at.empty() && done_at.top() <= q.arrival_s) done_at.pop();
    queue_depth_ = static_cast<std::uint32_t>(done_at.size());
    if (auto st = ServeRequest(q, r); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("request ", q.id, " (", WorkloadName(q.workload),
                                                  "): ", st.message()));
    }
    done_at.push(q.arrival_s + r->ttft_s.back());
    ++r->requests;
  }
  if (store_) store_->Drain();
  // Bytes: every block counted above moved moved_ bytes; modeled ones are modeled_ bytes.
  for (TierBytes* t : {&r->cxl_read, &r->cxl_write, &r->nvme_read, &r->nvme_write}) {
    t->moved_bytes = t->blocks * moved_;
    t->modeled_bytes = t->blocks * modeled_;
  }
  r->cxl_resident_end = static_cast<std::uint32_t>(cxl_.size());
  r->nvme_resident_end = static_cast<std::uint32_t>(nvme_.size());
  r->blocks_freed = freed_;
  r->inherited_reuse = inherited_;
  if (owner_) {
    r->owner_published = owner_->stats().published;
    r->owner_reclaimed = owner_->stats().reclaimed;
    const pool::ArenaUsage u = alloc_->arena().Usage();
    r->arena_persisted_end = u.classes.empty() ? 0 : u.classes[0].persisted;
  }
  if (store_) {
    const pool::NvmeStats s = store_->Stats();
    r->store_puts = s.puts;
    r->store_gets = s.gets;
    r->store_deletes = s.deletes;
    r->store_data_loss = s.data_loss;
    r->store_blocks_end = s.blocks;
  }
  return absl::OkStatus();
}

}  // namespace

std::uint64_t ModelProfile::MovedBlockBytes() const {
  if (scale == 0) return 0;
  const std::uint64_t b = ModeledBlockBytes() / scale;
  return std::max<std::uint64_t>(4096, (b + 4095) / 4096 * 4096);
}

absl::string_view PolicyName(Policy p) noexcept {
  switch (p) {
    case Policy::kRule: return "rule";
    case Policy::kCxlLru: return "cxl-lru";
    case Policy::kNvmeLru: return "nvme-lru";
    case Policy::kLruSpill: return "lru-spill";
    case Policy::kRecompute: return "recompute";
  }
  return "?";
}

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  for (int i = 0; i < kPolicyCount; ++i) {
    if (PolicyName(static_cast<Policy>(i)) == name) return static_cast<Policy>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "policy '", name, "': expected rule, cxl-lru, nvme-lru, lru-spill or recompute"));
}

absl::StatusOr<ReplayResult> RunReplay(const Trace& trace, const ReplayOptions& options) {
  ReplayResult r;
  r.trace = trace.name;
  r.policy = options.policy;
  const auto t0 = std::chrono::steady_clock::now();
  {
    Engine e(trace, options);
    if (auto st = e.Setup(); !st.ok()) return st;
    if (auto st = e.Run(&r); !st.ok()) return st;
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  rank = std::clamp<std::size_t>(rank, 1, v.size());
  return v[rank - 1];
}

}  // namespace cxlkv::replay
