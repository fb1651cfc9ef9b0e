// The replay engine: one request at a time through the index and a tier::TieredStore (the
// arena, the NVMe store and the policy, the store's strategy). See replay.h for what is real
// and what is modeled.
#include "replay.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/tier/tiered_store.h"

namespace cxlkv::replay {
namespace {

namespace co = cxlkv::coherence;
using co::PrefixKey;
using tier::BlockHandle;

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
  // A block published in the index (resident in CXL): what retiring it needs.
  struct Published {
    co::Namespace ns;
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
  void Teardown();
  absl::Status Pump();
  absl::Status ServeRequest(const Request& q, ReplayResult* r);
  absl::Status LookupCxl(const Request& q, std::span<const PrefixKey> keys, std::size_t* got,
                         bool* stop, ReplayResult* r);
  // The leading run of keys on NVMe from chain[first]: the store's prefetch promotes those the
  // policy wants in CXL, the rest (and those no CXL block was free for) are read into buffers.
  absl::Status LookupNvme(const Request& q, std::span<const PrefixKey> chain, std::size_t first,
                          std::size_t* got, ReplayResult* r);
  // TieredStoreOptions::on_cxl: a block entering CXL is published in the index (a promoted
  // one is checked first).
  absl::Status OnCxl(const tier::CxlEntry& e);
  // TieredStoreOptions::release_cxl: a published block is retired (its arena block comes back
  // through the owner once no lease names it); a staging block is handed back at once.
  void ReleaseCxl(const PrefixKey& key, BlockHandle h);
  // TieredStoreOptions::reclaim: waits one owner round for retired blocks to come back.
  bool Reclaim();
  std::int64_t NowNs() const { return static_cast<std::int64_t>(now_s_ * 1e9); }
  void Check(const PrefixKey& key, const std::byte* data, ReplayResult* r) {
    if (!o_.verify) return;
    FillBlock(key, scratch_.Get(0), moved_);
    if (std::memcmp(scratch_.Get(0), data, moved_) != 0) ++r->verify_failures;
  }
  tier::StoreRequest Req(const Request& q, std::span<const PrefixKey> chain,
                         std::size_t first) const {
    tier::StoreRequest s;
    s.ns = q.ns;
    s.chain = chain;
    s.first = first;
    s.queue_depth = queue_depth_;
    return s;
  }

  const Trace& trace_;
  const ReplayOptions& o_;
  const std::uint64_t moved_, modeled_;
  ReplayClock clock_;
  double now_s_ = 0;
  std::uint32_t queue_depth_ = 0;
  ReplayResult* result_ = nullptr;  // the run's, for the hooks' checks
  std::string arena_path_, domain_path_;
  std::unique_ptr<pool::Region> domain_region_;
  std::unique_ptr<co::DirectMem> mem_;
  std::unique_ptr<co::PrefixOwner> owner_;
  std::unique_ptr<co::PrefixHost> host_;
  std::unique_ptr<tier::TieredStore> store_;  // null for recompute
  absl::flat_hash_map<PrefixKey, Published, KeyHash> published_;
  std::uint64_t awaiting_return_ = 0;  // retired blocks not yet handed back by the owner
  std::uint64_t freed_ = 0;
  absl::Status callback_error_;  // the first failure inside a hook the store calls
  Buffers scratch_, nvme_bufs_;
};

tier::Strategy StrategyOf(Policy p) {
  switch (p) {
    case Policy::kCxlLru:
      return tier::Strategy::kCxlLru;
    case Policy::kNvmeLru:
      return tier::Strategy::kNvmeLru;
    case Policy::kLruSpill:
      return tier::Strategy::kLruSpill;
    default:
      return tier::Strategy::kRule;
  }
}

absl::Status Engine::Setup() {
  if (moved_ == 0 || o_.profile.scale == 0) return absl::InvalidArgumentError("empty profile");
  if (!UsesTiers()) return absl::OkStatus();
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
  const std::uint64_t slack =
      std::max<std::uint64_t>(512, std::min<std::uint64_t>(2048, o_.cxl_blocks));
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

  // The store: the policy is its strategy (every policy but recompute has an NVMe store;
  // cxl-lru never writes to it).
  std::error_code ec;
  std::filesystem::remove_all(o_.nvme_dir, ec);
  tier::TieredStoreOptions so;
  so.name = absl::StrCat("replay ", PolicyName(o_.policy));
  so.strategy = StrategyOf(o_.policy);
  so.cxl_tier = tier::Tier::kCxlExpanded;
  so.cxl_blocks = o_.cxl_blocks;
  so.nvme_blocks = UsesNvme() ? o_.nvme_blocks : 0;
  so.nvme.dir = o_.nvme_dir;
  so.nvme.capacity_bytes = tier::NvmeBytesFor(UsesNvme() ? o_.nvme_blocks : 16, moved_);
  so.nvme.grow_bytes = 16ull << 20;
  so.placer.params = o_.params;
  so.placer.tracker = tier::ReuseTrackerOptions{1u << 20, 0.25};
  so.placer.namespace_prior = o_.ns_prior;
  so.placer.inherit_from_chain = o_.inherit_reuse;
  so.rule_block_bytes = modeled_;
  so.tokens_per_block = o_.profile.tokens_per_block;
  so.prefix_tokens = o_.rule_prefix_tokens;
  so.retention_pressure = o_.retention_pressure;
  so.chain_recency = o_.chain_recency;
  // A staged block whose write failed was never published: dropped, recomputed when needed.
  so.keep_failed_nvme_writes = false;
  so.now_ns = [this] { return NowNs(); };
  so.on_cxl = [this](const tier::CxlEntry& e) { return OnCxl(e); };
  so.release_cxl = [this](const PrefixKey& k, BlockHandle h) { ReleaseCxl(k, h); };
  so.reclaim = [this] { return Reclaim(); };
  auto store = tier::TieredStore::Open(std::move(*arena), std::move(so), "replay options");
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  return absl::OkStatus();
}

void Engine::Teardown() {
  host_.reset();
  owner_.reset();
  mem_.reset();
  domain_region_.reset();
  // Frees the CXL blocks it still tracks (their index is gone) and drains the store.
  store_.reset();
  if (o_.keep_files) return;
  if (!arena_path_.empty()) ::unlink(arena_path_.c_str());
  if (!domain_path_.empty()) ::unlink(domain_path_.c_str());
  if (!o_.nvme_dir.empty() && UsesTiers()) {
    std::error_code ec;
    std::filesystem::remove_all(o_.nvme_dir, ec);
  }
}

// Heartbeat, one owner round (applies publishes and retires, reclaims, hands blocks back),
// heartbeat again to collect; returned blocks go back to the store's arena.
absl::Status Engine::Pump() {
  if (!host_) return absl::OkStatus();
  std::vector<co::BlockRef> back;
  if (auto st = host_->Heartbeat(&back); !st.ok()) return st;
  owner_->Step();
  if (auto st = host_->Heartbeat(&back); !st.ok()) return st;
  for (const co::BlockRef& ref : back) {
    if (auto st = store_->ReturnBlock(BlockHandle{ref.index, ref.generation}); !st.ok()) {
      return absl::InternalError(
          absl::StrCat("a block the owner returned (index ", ref.index, "): ", st.message()));
    }
    ++freed_;
    if (awaiting_return_ > 0) --awaiting_return_;
  }
  return absl::OkStatus();
}

bool Engine::Reclaim() {
  if (awaiting_return_ == 0) return false;
  if (auto st = Pump(); !st.ok()) {
    if (callback_error_.ok()) callback_error_ = st;
    return false;
  }
  return true;
}

void Engine::ReleaseCxl(const PrefixKey& key, BlockHandle h) {
  auto it = published_.find(key);
  if (it == published_.end()) {  // a staging block of an NVMe placement: nobody saw it
    if (!store_->ReturnBlock(h).ok() && callback_error_.ok()) {
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

absl::Status Engine::OnCxl(const tier::CxlEntry& e) {
  if (e.promoted) Check(e.key, e.addr, result_);
  co::BlockRef ref{};
  std::memcpy(ref.arena, store_->arena_uuid().data(), 16);
  ref.index = e.block.index;
  ref.generation = e.block.generation;
  absl::Status st;
  for (int tries = 0; tries < 1000; ++tries) {
    st = host_->Publish(e.ns, e.key, e.parent, ref, [&] { return store_->Persist(e.block).ok(); });
    if (!absl::IsUnavailable(st)) break;
    if (auto ps = Pump(); !ps.ok()) return ps;
  }
  if (!st.ok()) return st;
  published_.emplace(e.key, Published{e.ns});
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
    // The index and the store must agree on the block; the pin keeps it in CXL while it is
    // copied out (and marks it most recently used).
    const tier::StoreLocation held = store_->Lookup(keys[j]);
    if (!held.block || held.block->index != l.ref.index ||
        held.block->generation != l.ref.generation) {
      ++r->index_mismatches;
      *stop = true;
      break;
    }
    auto addr = store_->Acquire(keys[j]);
    if (!addr.ok()) return addr.status();
    std::byte* dst = scratch_.Get(1);
    const absl::Status copied = host_->CopyOut(l, *addr, dst, moved_);
    store_->Release(keys[j]);
    if (!copied.ok()) {
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
         store_->Lookup(chain[first + run]).where == tier::Residence::kNvme) {
    ++run;
  }
  if (run == 0) return absl::OkStatus();
  // The fetch is the promotion (one read either way): the store promotes what the policy
  // wants in CXL; the rest is read without promotion.
  auto ticket = store_->Prefetch(Req(q, chain.first(first + run), first));
  if (!ticket.ok()) return ticket.status();
  std::vector<tier::KeyResult> res;
  if (auto st = store_->Wait(*ticket, &res); !st.ok()) return st;
  std::vector<PrefixKey> read;
  std::vector<std::size_t> read_pos;
  bool promoting = false;
  for (std::size_t j = 0; j < run; ++j) {
    if (res[j].outcome == tier::Outcome::kNvme && res[j].status.ok()) {  // kept on NVMe
      read.push_back(chain[first + j]);
      read_pos.push_back(first + j);
    } else {
      promoting = true;
    }
  }
  std::size_t bad = run;  // the first position of the run that did not come back
  for (std::size_t j = 0; j < run; ++j) {
    const tier::KeyResult& k = res[j];
    if (k.outcome == tier::Outcome::kNvme && k.status.ok()) continue;
    if (absl::IsResourceExhausted(k.status)) {  // no CXL block free then: read it instead
      read.push_back(chain[first + j]);
      read_pos.push_back(first + j);
      continue;
    }
    if (!k.status.ok() && k.outcome == tier::Outcome::kCxl) return k.status;  // not published
    if (!k.status.ok() || k.outcome != tier::Outcome::kCxl) {
      ++r->nvme_read_errors;
      bad = std::min(bad, j);
      continue;
    }
    ++r->promotions;
    r->nvme_read.blocks += 1;
    r->cxl_write.blocks += 1;
  }
  // The store ran the watermarks after the promotions; one owner round applies the publishes
  // and the victims' retires, so the index the rest of this lookup reads agrees with the tiers.
  if (promoting) {
    if (auto st = Pump(); !st.ok()) return st;
  }
  if (!read.empty()) {
    std::vector<void*> dests(read.size());
    for (std::size_t j = 0; j < read.size(); ++j) dests[j] = nvme_bufs_.Get(j);
    std::vector<tier::KeyResult> rr;
    (void)store_->Read(read, dests, moved_, &rr);
    for (std::size_t j = 0; j < read.size(); ++j) {
      if (!rr[j].status.ok()) {
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

absl::Status Engine::ServeRequest(const Request& q, ReplayResult* r) {
  clock_.Set(q.arrival_s);
  now_s_ = q.arrival_s;
  if (auto st = Pump(); !st.ok()) return st;
  const std::uint32_t tpb = o_.profile.tokens_per_block;
  // The answer's blocks are written after the prompt's.
  const std::vector<PrefixKey> keys = ChainKeys(q, tpb);
  const std::size_t n = q.prompt.size() / tpb;
  const std::span<const PrefixKey> prompt_keys = std::span<const PrefixKey>(keys).first(n);
  if (store_) store_->Use(Req(q, prompt_keys, 0));  // one use of every prompt block

  // Look up: CXL runs through the index, NVMe runs through the store, until neither has the
  // next block.
  std::size_t i = 0, cxl_hits = 0, nvme_hits = 0, nvme_runs = 0;
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

  // Recomputed blocks (prompt misses and the answer) are placed by the store's strategy; the
  // answer's were produced now (a use each). Every block placed is really written.
  if (store_) {
    tier::StoreRequest req = Req(q, keys, hits);
    req.record_use_from = n;
    std::vector<tier::KeyResult> res;
    (void)store_->Place(
        req,
        [&](std::size_t j) -> const void* {
          std::byte* data = scratch_.Get(2);  // what prefill computed
          FillBlock(keys[hits + j], data, moved_);
          return data;
        },
        &res);
    if (!callback_error_.ok()) return callback_error_;
    for (const tier::KeyResult& k : res) {
      if (!k.status.ok()) return k.status;
      if (k.already_held) {
        ++r->already_resident;
      } else if (k.outcome == tier::Outcome::kCxl) {
        ++r->placed_cxl;
        r->cxl_write.blocks += 1;
      } else if (k.outcome == tier::Outcome::kNvme) {
        ++r->placed_nvme;
        r->nvme_write.blocks += 1;
      } else {
        ++r->placed_drop;
      }
    }
  }
  if (auto st = Pump(); !st.ok()) return st;  // publishes applied before the next request
  if (store_) {
    const tier::TierStats s = store_->ManagerStats();
    r->occupancy.push_back(Occupancy{q.arrival_s, static_cast<std::uint32_t>(s.cxl_blocks),
                                     static_cast<std::uint32_t>(s.nvme_blocks)});
  } else {
    r->occupancy.push_back(Occupancy{q.arrival_s, 0, 0});
  }
  return absl::OkStatus();
}

absl::Status Engine::Run(ReplayResult* r) {
  result_ = r;
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
  if (store_) {
    store_->DrainNvme();
    const tier::TieredStoreStats s = store_->Stats();
    if (o_.policy == Policy::kRule) {
      r->inherited_reuse = s.placer.from_ancestor;
      r->prior_reuse = s.placer.from_prior;
      r->clauses = s.placer.clauses;
    }
    r->cooldown_holds = s.cooldown_holds;
    const tier::TierStats& t = s.tiers;
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
    const pool::ArenaUsage u = store_->ArenaUsage();
    r->arena_persisted_end = u.classes.empty() ? 0 : u.classes[0].persisted;
    r->store_puts = s.nvme.puts;
    r->store_gets = s.nvme.gets;
    r->store_deletes = s.nvme.deletes;
    r->store_data_loss = s.nvme.data_loss;
    r->store_blocks_end = s.nvme.blocks;
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
