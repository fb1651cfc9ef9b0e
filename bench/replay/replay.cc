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
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/nvme/nvme_store.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/tier/placer.h"
#include "cxlkv/tier/tier_manager.h"

namespace cxlkv::replay {
namespace {

namespace co = cxlkv::coherence;
using allocator::BlockAllocator;
using allocator::BlockHandle;
using co::PrefixKey;

using KeyHash = co::PrefixKeyHash;

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

// Chain keys of every full block of the request's prompt + answer, root first.
std::vector<PrefixKey> ChainKeys(const Request& q, std::uint32_t tpb) {
  std::vector<std::uint32_t> all = q.prompt;
  all.insert(all.end(), q.output.begin(), q.output.end());
  std::vector<PrefixKey> keys(all.size() / tpb);
  PrefixKey parent{};
  for (std::size_t b = 0; b < keys.size(); ++b) {
    parent = co::ChainKey(q.ns, parent, std::span<const std::uint32_t>(all).subspan(b * tpb, tpb));
    keys[b] = parent;
  }
  return keys;
}

// Modeled TTFT: the fetches, then the prefill of every token no hit covers, slowed by the
// prefills queued ahead (the rule's own recompute model).
double ModeledTtft(const tier::PlacementParams& p, double block_bytes, std::size_t cxl_hits,
                   std::size_t nvme_hits, std::size_t nvme_runs, double miss_tokens,
                   std::uint32_t queue_depth) {
  double ttft = 0;
  if (cxl_hits > 0) {
    ttft += p.cxl[0].figures.latency_s +
            static_cast<double>(cxl_hits) * block_bytes / p.cxl[0].figures.read_bytes_per_s;
  }
  if (nvme_hits > 0) {
    ttft += static_cast<double>(nvme_runs) * p.nvme.latency_s +
            static_cast<double>(nvme_hits) * block_bytes / p.nvme.read_bytes_per_s;
  }
  return ttft + miss_tokens / p.prefill_tokens_per_s *
                    (1.0 + p.queue_depth_weight * static_cast<double>(queue_depth));
}

// Queue depth at an arrival: earlier requests whose first token is still ahead.
class PrefillQueue {
 public:
  std::uint32_t DepthAt(double arrival_s) {
    while (!done_at_.empty() && done_at_.top() <= arrival_s) done_at_.pop();
    return static_cast<std::uint32_t>(done_at_.size());
  }
  void Add(double first_token_s) { done_at_.push(first_token_s); }

 private:
  std::priority_queue<double, std::vector<double>, std::greater<>> done_at_;
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
        modeled_(o.profile.ModeledBlockBytes()), scratch_(moved_), nvme_bufs_(moved_) {}
  ~Engine() { Teardown(); }

  absl::Status Setup();
  absl::Status Run(ReplayResult* r);

 private:
  // A block published in the index (resident in CXL): what retiring it and re-deciding it
  // as a watermark victim need.
  struct Published {
    co::Namespace ns;
    std::uint32_t depth;  // 1 + the block's position in its chain
  };
  bool UsesTiers() const { return o_.policy != Policy::kRecompute; }
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
  BlockAllocator& Alloc() const { return tier_->allocator(); }
  void Teardown();
  absl::Status Pump();
  absl::Status ServeRequest(const Request& q, ReplayResult* r);
  absl::Status LookupCxl(const Request& q, std::span<const PrefixKey> keys, std::size_t* got,
                         bool* stop, ReplayResult* r);
  // The leading run of keys on NVMe: read into buffers (stays there) or promoted into CXL,
  // per policy. `first`: the run's position in the request's chain.
  absl::Status LookupNvme(const Request& q, std::span<const PrefixKey> chain, std::size_t first,
                          std::size_t* got, ReplayResult* r);
  // The Placer's decision for a block of depth `depth` (1 + its place in its chain);
  // `chain`/`pos`: the request's chain and the block's place in it (a block without history
  // may take an ancestor's reuse interval). `occupancy_delta`: CXL occupancy the placement
  // itself adds.
  tier::Decision Decide(co::Namespace ns, const PrefixKey& key, std::size_t depth,
                        double occupancy_delta, std::span<const PrefixKey> chain = {},
                        std::size_t pos = 0);
  // What the Placer needs of the tiers now: CXL occupancy (plus occupancy_delta; one CXL
  // tier, the pooled one absent), its retention (o_.retention_pressure), the queue depth.
  tier::TierState State(double occupancy_delta) const;
  tier::PlacementQuery Query(co::Namespace ns, const PrefixKey& key, std::size_t depth) const;
  // A CXL block for a new block's bytes: waits for retired blocks to come back if needed.
  absl::StatusOr<BlockHandle> AllocCxl();
  // Publishes a CXL-resident block in the index under (ns, key, parent).
  absl::Status Publish(co::Namespace ns, const PrefixKey& key, const PrefixKey& parent,
                       std::size_t depth, BlockHandle h);
  // TierOptions::release_cxl: a published block is retired (its arena block comes back
  // through the owner once no lease names it); a staging block is freed.
  void ReleaseCxl(const PrefixKey& key, BlockHandle h);
  // Where a watermark victim goes (TierOptions::victim_tier): the Placer re-decides it.
  tier::Tier VictimTier(const PrefixKey& key);
  // Writes the queued NVMe placements in one batch.
  absl::Status FlushNvme(ReplayResult* r);
  double CxlOccupancy() const {
    return o_.cxl_blocks ? static_cast<double>(tier_->Stats().cxl_blocks) / o_.cxl_blocks : 1.0;
  }
  std::int64_t NowNs() const { return static_cast<std::int64_t>(now_s_ * 1e9); }
  void Check(const PrefixKey& key, const std::byte* data, ReplayResult* r) {
    if (!o_.verify) return;
    FillBlock(key, scratch_.Get(0), moved_);
    if (std::memcmp(scratch_.Get(0), data, moved_) != 0) ++r->verify_failures;
  }

  const Trace& trace_;
  const ReplayOptions& o_;
  const std::uint64_t moved_, modeled_;
  ReplayClock clock_;
  double now_s_ = 0;
  std::uint32_t queue_depth_ = 0;
  std::string arena_path_, domain_path_;
  std::unique_ptr<pool::Region> domain_region_;
  std::unique_ptr<co::DirectMem> mem_;
  std::unique_ptr<co::PrefixOwner> owner_;
  std::unique_ptr<co::PrefixHost> host_;
  std::unique_ptr<tier::TierManager> tier_;
  std::optional<tier::Placer> placer_;  // the rule policy's
  absl::flat_hash_map<PrefixKey, Published, KeyHash> published_;
  std::uint64_t awaiting_return_ = 0;  // retired blocks not yet handed back by the owner
  std::uint64_t freed_ = 0;
  // One use of a block: the Placer's tracker (per key) and namespace prior learn from it.
  void RecordUse(co::Namespace ns, const PrefixKey& key, std::uint64_t now_ns) {
    if (placer_) placer_->RecordUse(ns, key, now_ns, modeled_, o_.profile.tokens_per_block);
  }
  absl::Status callback_error_;  // the first failure inside a TierManager callback
  Buffers scratch_, nvme_bufs_;
  std::vector<PrefixKey> pending_keys_;  // new blocks queued for NVMe, in staging blocks
  std::vector<BlockHandle> pending_blocks_;
};

absl::Status Engine::Setup() {
  if (moved_ == 0 || o_.profile.scale == 0) return absl::InvalidArgumentError("empty profile");
  if (UsesTiers()) {
    if (o_.cxl_blocks == 0) return absl::InvalidArgumentError("cxl_blocks must be > 0");
    if (o_.nvme_dir.empty() || (UsesNvme() && o_.nvme_blocks == 0)) {
      return absl::InvalidArgumentError("the tiers need nvme_dir and nvme_blocks");
    }
    // The arena: cxl_blocks blocks of the moved size, plus room for its metadata. Slack beyond
    // cxl_blocks holds blocks retired but not yet handed back by the owner, promotions in
    // flight and new blocks staged for NVMe; residency is capped at cxl_blocks by the
    // watermarks, never by the slack.
    arena_path_ = Path(o_.shm_dir, "arena");
    const std::uint64_t stride = (moved_ + 4095) / 4096 * 4096;
    const std::uint64_t slack = std::max<std::uint64_t>(512, std::min<std::uint64_t>(2048, o_.cxl_blocks));
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

    // The NVMe store (every policy but recompute has one; cxl-lru never writes to it).
    std::error_code ec;
    std::filesystem::remove_all(o_.nvme_dir, ec);
    nvme::NvmeStoreOptions so;
    so.dir = o_.nvme_dir;
    so.payload_bytes = moved_;
    // Slack over nvme_blocks: deleted slots are retired in the background.
    const std::uint64_t nvme_blocks = UsesNvme() ? o_.nvme_blocks : 16;
    const std::uint64_t slot = (moved_ + 4095) / 4096 * 4096 + 4096;
    so.capacity_bytes = (nvme_blocks + nvme_blocks / 4 + 256) * slot;
    so.grow_bytes = 16ull << 20;
    auto store = nvme::NvmeStore::Open(so);
    if (!store.ok()) return store.status();

    // The TierManager moves the blocks; the policy is in its options and in ServeRequest.
    tier::TierOptions to;
    to.size_class = 0;
    to.auto_enforce = true;
    to.now_ms = [this] { return NowNs() / 1000000; };
    to.release_cxl = [this](const PrefixKey& k, BlockHandle h) { ReleaseCxl(k, h); };
    to.nvme_capacity_blocks = UsesNvme() ? o_.nvme_blocks : 0;
    to.cooldown_ms = 0;
    switch (o_.policy) {
      case Policy::kRule: {
        const auto high = static_cast<std::uint64_t>(o_.params.high_watermark * o_.cxl_blocks);
        to.high_watermark_blocks = std::max<std::uint64_t>(1, high);
        to.low_watermark_blocks = std::min<std::uint64_t>(
            to.high_watermark_blocks,
            static_cast<std::uint64_t>(o_.params.low_watermark * o_.cxl_blocks));
        to.cooldown_ms = static_cast<std::int64_t>(o_.params.cooldown_s * 1e3);
        to.victim_tier = [this](const PrefixKey& k) { return VictimTier(k); };
        break;
      }
      case Policy::kCxlLru:
        to.high_watermark_blocks = to.low_watermark_blocks = o_.cxl_blocks;
        to.victim_tier = [](const PrefixKey&) { return tier::Tier::kDrop; };
        break;
      case Policy::kLruSpill:
        to.high_watermark_blocks = to.low_watermark_blocks = o_.cxl_blocks;
        break;
      default:  // nvme-lru: CXL only stages new blocks for their NVMe write
        break;
    }
    auto m = tier::TierManager::Create(std::move(*alloc), std::move(*store), std::move(to));
    if (!m.ok()) return m.status();
    tier_ = std::move(*m);
  }
  if (o_.policy == Policy::kRule) {
    tier::PlacerOptions po;
    po.params = o_.params;
    po.tracker = tier::ReuseTrackerOptions{1u << 20, 0.25};
    po.namespace_prior = o_.ns_prior;
    po.inherit_from_chain = o_.inherit_reuse;
    auto placer = tier::Placer::Create(po);
    if (!placer.ok()) return placer.status();
    placer_.emplace(std::move(*placer));
  }
  return absl::OkStatus();
}

void Engine::Teardown() {
  host_.reset();
  owner_.reset();
  mem_.reset();
  domain_region_.reset();
  // Frees the CXL blocks it still tracks (their index is gone) and drains the store.
  tier_.reset();
  if (o_.keep_files) return;
  if (!arena_path_.empty()) ::unlink(arena_path_.c_str());
  if (!domain_path_.empty()) ::unlink(domain_path_.c_str());
  if (!o_.nvme_dir.empty() && UsesTiers()) {
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
    const auto fr = Alloc().Free(BlockHandle{ref.index, ref.generation});
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

tier::TierState Engine::State(double occupancy_delta) const {
  tier::TierState s;
  s.occupancy = {std::min(1.0, CxlOccupancy() + occupancy_delta), 1.0};
  if (o_.retention_pressure) s.retention_s[0] = tier_->RetentionS();
  s.queue_depth = queue_depth_;
  return s;
}

tier::PlacementQuery Engine::Query(co::Namespace ns, const PrefixKey& key,
                                   std::size_t depth) const {
  tier::PlacementQuery q;
  q.ns = ns;
  q.key = key;
  q.size_bytes = modeled_;
  q.tokens = o_.profile.tokens_per_block;
  if (o_.rule_prefix_tokens) q.tokens *= static_cast<std::uint32_t>(depth);
  return q;
}

tier::Decision Engine::Decide(co::Namespace ns, const PrefixKey& key, std::size_t depth,
                              double occupancy_delta, std::span<const PrefixKey> chain,
                              std::size_t pos) {
  tier::PlacementQuery q = Query(ns, key, depth);
  q.chain = chain;
  q.pos = pos;
  return placer_->Decide(q, State(occupancy_delta), static_cast<std::uint64_t>(NowNs()));
}

tier::Tier Engine::VictimTier(const PrefixKey& key) {
  // The namespace and depth it was published under (a staging block: neither known).
  auto it = published_.find(key);
  const std::size_t depth = it != published_.end() ? it->second.depth : 1;
  const co::Namespace ns = it != published_.end() ? it->second.ns : co::Namespace{};
  return placer_->DecideVictim(Query(ns, key, depth), State(0),
                               static_cast<std::uint64_t>(NowNs()));
}

void Engine::ReleaseCxl(const PrefixKey& key, BlockHandle h) {
  auto it = published_.find(key);
  if (it == published_.end()) {  // a staging block of an NVMe placement: nobody saw it
    if (Alloc().Free(h) != allocator::FreeResult::kOk && callback_error_.ok()) {
      callback_error_ = absl::InternalError("a staged NVMe block did not free");
    }
    return;
  }
  const co::Namespace ns = it->second.ns;
  published_.erase(it);
  absl::Status st;
  for (int tries = 0; tries < 1000; ++tries) {
    st = host_->Retire(ns, key);
    if (!absl::IsUnavailable(st)) break;
    if (auto ps = Pump(); !ps.ok()) st = ps;
  }
  if (!st.ok()) {
    if (callback_error_.ok()) callback_error_ = st;
    return;
  }
  ++awaiting_return_;  // the owner hands it back once no lease names it (Pump frees it)
}

absl::StatusOr<BlockHandle> Engine::AllocCxl() {
  BlockHandle h = Alloc().Alloc(0);
  for (int rounds = 0; !h.valid() && awaiting_return_ > 0 && rounds < 1000; ++rounds) {
    if (auto st = Pump(); !st.ok()) return st;  // wait for retired blocks to come back
    h = Alloc().Alloc(0);
  }
  if (!h.valid()) {
    return absl::InternalError(absl::StrCat("CXL arena full below capacity: ",
                                            Alloc().ExplainAllocFailure(0).message()));
  }
  return h;
}

absl::Status Engine::Publish(co::Namespace ns, const PrefixKey& key, const PrefixKey& parent,
                             std::size_t depth, BlockHandle h) {
  co::BlockRef ref{};
  std::memcpy(ref.arena, Alloc().arena().uuid().data(), 16);
  ref.index = h.index;
  ref.generation = h.generation;
  absl::Status st;
  for (int tries = 0; tries < 1000; ++tries) {
    st = host_->Publish(ns, key, parent, ref, [&] { return Alloc().Persist(h).ok(); });
    if (!absl::IsUnavailable(st)) break;
    if (auto ps = Pump(); !ps.ok()) return ps;
  }
  if (!st.ok()) return st;
  published_.emplace(key, Published{ns, static_cast<std::uint32_t>(depth)});
  return absl::OkStatus();
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
    // The index and the TierManager must agree on the block; the pin keeps it in CXL while
    // it is copied out (and marks it most recently used).
    const std::optional<BlockHandle> held = tier_->CxlBlock(keys[j]);
    if (!held || held->index != l.ref.index || held->generation != l.ref.generation) {
      ++r->index_mismatches;
      *stop = true;
      break;
    }
    auto addr = tier_->Acquire(keys[j]);
    if (!addr.ok()) return addr.status();
    std::byte* dst = scratch_.Get(1);
    co::Invalidate(*addr, moved_);
    std::memcpy(dst, *addr, moved_);
    tier_->Release(keys[j]);
    if (!host_->ValidateAfterCopy(l).ok()) {
      ++r->copies_discarded;
      *stop = true;
      break;
    }
    Check(keys[j], dst, r);
    ++ok;
  }
  host_->ReleaseAll(leases);
  r->cxl_read.blocks += ok;
  *got = ok;
  return absl::OkStatus();
}

absl::Status Engine::LookupNvme(const Request& q, std::span<const PrefixKey> chain,
                                std::size_t first, std::size_t* got, ReplayResult* r) {
  *got = 0;
  std::size_t run = 0;
  while (first + run < chain.size() && run < 256 &&
         tier_->Where(chain[first + run]) == tier::Residence::kNvme) {
    ++run;
  }
  if (run == 0) return absl::OkStatus();
  // Which of the run to promote into CXL (the fetch is the promotion: one read either way).
  std::vector<PrefixKey> promote, read;
  std::vector<std::size_t> read_pos;
  for (std::size_t j = 0; j < run; ++j) {
    const std::size_t pos = first + j;
    const PrefixKey& key = chain[pos];
    bool up = o_.policy == Policy::kLruSpill;
    if (o_.policy == Policy::kRule) {
      const tier::Decision d = Decide(q.ns, key, pos + 1, 1.0 / o_.cxl_blocks, chain, pos);
      if (tier::IsCxl(d.tier)) {
        const tier::PromoteCheck c = tier_->CheckPromote(key);
        if (c.verdict == tier::PromoteVerdict::kCoolingDown) ++r->cooldown_holds;
        up = c.allowed();
      }
    }
    if (up) {
      promote.push_back(key);
    } else {
      read.push_back(key);
      read_pos.push_back(pos);
    }
  }
  std::size_t bad = run;  // the first position of the run that did not come back
  if (!promote.empty()) {
    tier::PromotionBatch batch;
    if (auto st = tier_->Prefetch(promote, batch); !st.ok()) return st;
    tier_->Wait(batch);
    for (std::size_t j = 0; j < promote.size(); ++j) {
      const PrefixKey& key = promote[j];
      const std::size_t pos =
          static_cast<std::size_t>(std::find(chain.begin(), chain.end(), key) - chain.begin());
      const absl::Status& st = batch.status(j);
      if (absl::IsResourceExhausted(st)) {  // no CXL block free now: read it instead
        read.push_back(key);
        read_pos.push_back(pos);
        continue;
      }
      if (!st.ok()) {
        ++r->nvme_read_errors;
        bad = std::min(bad, pos - first);
        continue;
      }
      const std::optional<BlockHandle> h = tier_->CxlBlock(key);
      if (!h) return absl::InternalError("a promoted block is not in CXL");
      Check(key, Alloc().Addr(*h), r);
      if (auto ps = Publish(q.ns, key, pos > 0 ? chain[pos - 1] : PrefixKey{}, pos + 1, *h);
          !ps.ok()) {
        return ps;
      }
      ++r->promotions;
      r->nvme_read.blocks += 1;
      r->cxl_write.blocks += 1;
    }
    // Promotions raise residency: the watermarks run after them, as after any placement.
    // Then one owner round applies the publishes and the victims' retires, so the index the
    // rest of this lookup reads agrees with the tiers again.
    if (auto w = tier_->EnforceWatermarks(); !w.ok()) return w.status();
    if (auto st = Pump(); !st.ok()) return st;
  }
  if (!read.empty()) {
    std::vector<void*> dests(read.size());
    for (std::size_t j = 0; j < read.size(); ++j) dests[j] = nvme_bufs_.Get(j);
    std::vector<absl::Status> res;
    (void)tier_->Read(read, dests, moved_, &res);
    for (std::size_t j = 0; j < read.size(); ++j) {
      if (!res[j].ok()) {
        ++r->nvme_read_errors;
        bad = std::min(bad, read_pos[j] - first);
        continue;
      }
      Check(read[j], static_cast<const std::byte*>(dests[j]), r);
      r->nvme_read.blocks += 1;
    }
  }
  if (!callback_error_.ok()) return callback_error_;
  *got = bad;  // hits are the leading run that came back
  return absl::OkStatus();
}

absl::Status Engine::FlushNvme(ReplayResult* r) {
  if (pending_keys_.empty()) return absl::OkStatus();
  std::vector<absl::Status> res;
  (void)tier_->Place(pending_keys_, pending_blocks_, tier::Tier::kNvme, &res);
  for (std::size_t i = 0; i < pending_keys_.size(); ++i) {
    if (res[i].ok()) {
      ++r->nvme_write.blocks;
      ++r->placed_nvme;
    } else if (tier_->Where(pending_keys_[i]) == tier::Residence::kCxl) {
      // The write failed (disk full): the staged block stays in CXL, unpublished; drop it —
      // the block is recomputed when needed again.
      if (auto st = tier_->Move(pending_keys_[i], tier::Tier::kDrop); !st.ok()) return st;
      ++r->placed_drop;
    } else {
      return res[i];
    }
  }
  pending_keys_.clear();
  pending_blocks_.clear();
  return callback_error_;
}

absl::Status Engine::ServeRequest(const Request& q, ReplayResult* r) {
  clock_.Set(q.arrival_s);
  now_s_ = q.arrival_s;
  if (auto st = Pump(); !st.ok()) return st;
  const std::uint32_t tpb = o_.profile.tokens_per_block;
  // The answer's blocks are written after the prompt's.
  const std::vector<PrefixKey> keys = ChainKeys(q, tpb);
  const std::size_t n_all = keys.size();
  const std::size_t n = q.prompt.size() / tpb;
  const auto now_ns = static_cast<std::uint64_t>(NowNs());
  for (std::size_t b = 0; b < n; ++b) RecordUse(q.ns, keys[b], now_ns);

  // Look up: CXL runs through the index, NVMe runs through the TierManager, until neither has
  // the next block.
  std::size_t i = 0, cxl_hits = 0, nvme_hits = 0, nvme_runs = 0;
  const std::span<const PrefixKey> prompt_keys = std::span<const PrefixKey>(keys).first(n);
  while (UsesTiers() && i < n) {
    std::size_t got = 0;
    bool stop = false;
    if (UsesCxl()) {
      if (auto st = LookupCxl(q, prompt_keys.subspan(i), &got, &stop, r); !st.ok()) return st;
      cxl_hits += got;
      i += got;
      if (stop) break;
    }
    std::size_t from_nvme = 0;
    if (UsesNvme() && i < n) {
      if (auto st = LookupNvme(q, prompt_keys, i, &from_nvme, r); !st.ok()) return st;
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

  const double miss_tokens = static_cast<double>(q.prompt.size() - hits * tpb);
  const double ttft = ModeledTtft(o_.params, static_cast<double>(modeled_), cxl_hits, nvme_hits,
                                  nvme_runs, miss_tokens, queue_depth_);
  r->ttft_s.push_back(ttft);
  r->queue_depth.push_back(queue_depth_);

  // Recomputed blocks (prompt misses and the answer) are placed per policy.
  if (UsesTiers()) {
    for (std::size_t b = hits; b < n_all; ++b) {
      const PrefixKey& key = keys[b];
      if (tier_->Where(key).has_value()) {
        ++r->already_resident;
        continue;
      }
      tier::Tier dest =
          o_.policy == Policy::kNvmeLru ? tier::Tier::kNvme : tier::Tier::kCxlExpanded;
      if (o_.policy == Policy::kRule) {
        if (b >= n) RecordUse(q.ns, key, now_ns);  // produced now
        dest = Decide(q.ns, key, b + 1, 1.0 / o_.cxl_blocks, keys, b).tier;
      }
      if (dest == tier::Tier::kDrop) {
        ++r->placed_drop;
        continue;
      }
      auto h = AllocCxl();
      if (!h.ok()) return h.status();
      std::byte* data = scratch_.Get(2);  // what prefill computed
      FillBlock(key, data, moved_);
      if (dest == tier::Tier::kNvme) {  // staged in CXL for the NVMe write
        std::memcpy(Alloc().Addr(*h), data, moved_);
        pending_keys_.push_back(key);
        pending_blocks_.push_back(*h);
        if (pending_keys_.size() >= 128) {
          if (auto st = FlushNvme(r); !st.ok()) return st;
        }
        continue;
      }
      co::CopyNt(Alloc().Addr(*h), data, moved_);
      if (auto st = Publish(q.ns, key, b > 0 ? keys[b - 1] : PrefixKey{}, b + 1, *h); !st.ok()) {
        return st;
      }
      // The manager's watermarks run here: victims are re-decided (rule), dropped (cxl-lru)
      // or demoted (lru-spill) and retired from the index through release_cxl.
      if (auto st = tier_->Place(key, *h, dest); !st.ok()) return st;
      if (!callback_error_.ok()) return callback_error_;
      ++r->placed_cxl;
      r->cxl_write.blocks += 1;
    }
    if (auto st = FlushNvme(r); !st.ok()) return st;
    if (o_.chain_recency) tier_->Touch(keys);
  }
  if (auto st = Pump(); !st.ok()) return st;  // publishes applied before the next request
  if (tier_) {
    const tier::TierStats s = tier_->Stats();
    r->occupancy.push_back(Occupancy{q.arrival_s, static_cast<std::uint32_t>(s.cxl_blocks),
                                     static_cast<std::uint32_t>(s.nvme_blocks)});
  } else {
    r->occupancy.push_back(Occupancy{q.arrival_s, 0, 0});
  }
  return absl::OkStatus();
}

absl::Status Engine::Run(ReplayResult* r) {
  PrefillQueue queue;
  for (const Request& q : trace_.requests) {
    queue_depth_ = queue.DepthAt(q.arrival_s);
    if (auto st = ServeRequest(q, r); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("request ", q.id, " (", WorkloadName(q.workload),
                                                  "): ", st.message()));
    }
    queue.Add(q.arrival_s + r->ttft_s.back());
    ++r->requests;
  }
  r->blocks_freed = freed_;
  if (placer_) {
    r->inherited_reuse = placer_->stats().from_ancestor;
    r->prior_reuse = placer_->stats().from_prior;
    r->clauses = placer_->stats().clauses;
  }
  if (tier_) {
    tier_->store().Drain();
    const tier::TierStats t = tier_->Stats();
    // Demotions read CXL and write NVMe.
    r->demotions = t.demotions;
    r->cxl_read.blocks += t.demotions;
    r->nvme_write.blocks += t.demotions;
    r->evicted_dropped = t.victims_dropped;
    r->nvme_evicted = t.nvme_evicted;
    r->cxl_resident_end = static_cast<std::uint32_t>(t.cxl_blocks);
    r->nvme_resident_end = static_cast<std::uint32_t>(t.nvme_blocks);
    r->owner_published = owner_->stats().published;
    r->owner_reclaimed = owner_->stats().reclaimed;
    const pool::ArenaUsage u = Alloc().arena().Usage();
    r->arena_persisted_end = u.classes.empty() ? 0 : u.classes[0].persisted;
    const nvme::NvmeStats s = tier_->store().Stats();
    r->store_puts = s.puts;
    r->store_gets = s.gets;
    r->store_deletes = s.deletes;
    r->store_data_loss = s.data_loss;
    r->store_blocks_end = s.blocks;
  }
  // Bytes: every block counted above moved moved_ bytes; modeled ones are modeled_ bytes.
  for (TierBytes* t : {&r->cxl_read, &r->cxl_write, &r->nvme_read, &r->nvme_write}) {
    t->moved_bytes = t->blocks * moved_;
    t->modeled_bytes = t->blocks * modeled_;
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

std::vector<double> UnlimitedCxlTtft(const Trace& trace, const ReplayOptions& options) {
  const std::uint32_t tpb = options.profile.tokens_per_block;
  const auto block_bytes = static_cast<double>(options.profile.ModeledBlockBytes());
  absl::flat_hash_set<PrefixKey, KeyHash> computed;  // every block any earlier request made
  PrefillQueue queue;
  std::vector<double> ttft;
  ttft.reserve(trace.requests.size());
  for (const Request& q : trace.requests) {
    const std::uint32_t depth = queue.DepthAt(q.arrival_s);
    const std::vector<PrefixKey> keys = ChainKeys(q, tpb);
    const std::size_t n = q.prompt.size() / tpb;
    std::size_t hits = 0;
    while (hits < n && computed.contains(keys[hits])) ++hits;
    ttft.push_back(ModeledTtft(options.params, block_bytes, hits, 0, 0,
                               static_cast<double>(q.prompt.size() - hits * tpb), depth));
    queue.Add(q.arrival_s + ttft.back());
    computed.insert(keys.begin(), keys.end());
  }
  return ttft;
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
