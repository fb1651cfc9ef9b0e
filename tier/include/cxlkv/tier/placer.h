// cxlkv/tier/placer.h — the placement policy: what the rule is told about a block, and its answer.
//
// PlacementRule (placement.h) is a pure function of a block's inputs. A Placer owns what
// those inputs come from and decides with it:
//   reuse    a ReuseTracker (per-key EWMA of the reuse interval, reuse_tracker.h); for a block
//            with no history of its own (new, or seen once) the namespace's prior
//            (NamespaceReuse: how often and how soon that namespace's new blocks came back),
//            and while the namespace has too little history, the expected interval of the
//            block's nearest ancestor in its request's chain (a turn's new blocks come back
//            with the conversation that reuses its parents)
//   pressure the CXL tiers' occupancy and, once a tier evicts by itself, its retention (how
//            long an unused block lasts there: TierManager::RetentionS), both given by the
//            caller per decision in a TierState
//   victims  a watermark victim is re-decided with every CXL tier full: the watermark needs
//            the room, so the answer is kNvme, or kDrop when recomputing beats an NVMe fetch
// Typical use (bench/replay is a complete driver): RecordUse() for every block a request
// uses or produces, in trace order; Decide() for a block about to be placed or promoted;
// DecideVictim() from TierOptions::victim_tier.
//
// Time is the caller's clock in nanoseconds (monotonic in a server, the trace's clock in a
// replay); the Placer never reads a clock, so its decisions are reproducible.
// Thread-safety: none; one thread (or the caller's lock) per Placer, like the tracker it owns.
// Cost: a Decide() is two or three tracker look-ups (one 192-byte bucket each), one hash-map
// look-up for the prior, at most max_ancestors look-ups for the chain, and the rule.
#ifndef CXLKV_TIER_PLACER_H_
#define CXLKV_TIER_PLACER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/tier/placement.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "cxlkv/tier/tier.h"

namespace cxlkv::tier {

struct PlacerOptions {
  PlacementParams params;       // the rule's (domain.toml [placement], calibrated)
  ReuseTrackerOptions tracker;  // per-key reuse history
  // A block without history of its own takes its namespace's prior first.
  bool namespace_prior = true;
  NamespaceReuseOptions prior;
  // ... and, when that gives nothing, its nearest ancestor's expected interval, looking at
  // most max_ancestors blocks up the chain (0: never).
  bool inherit_from_chain = true;
  std::uint32_t max_ancestors = 64;
};

// One block to decide. `chain` is the request's chain of keys, root first, with `key` at
// chain[pos] (only chain[0..pos) is read: the block's ancestors); empty when unknown (a
// watermark victim, say).
struct PlacementQuery {
  coherence::Namespace ns = 0;
  coherence::PrefixKey key;
  std::uint64_t size_bytes = 0;  // the block's bytes (as the rule prices them)
  std::uint32_t tokens = 0;      // prefill tokens a hit saves (0: unknown, never dropped)
  int pin_level = 0;             // the namespace's [[namespace]] pin
  std::span<const coherence::PrefixKey> chain;
  std::size_t pos = 0;
};

// The tiers as they are now, from the caller (a TierManager's Stats() and RetentionS()).
struct TierState {
  // used / capacity per CXL tier, counting the block being placed; 1 (or more): full or
  // absent.
  std::array<double, kCxlTierCount> occupancy = {1, 1};
  // BlockInputs::retention_s: finite once the tier evicts its LRU blocks by itself.
  std::array<double, kCxlTierCount> retention_s = {kNoReuse, kNoReuse};
  std::uint32_t queue_depth = 0;  // prefills queued on the GPU that would recompute
};

// Where a block's expected reuse interval came from.
enum class ReuseSource : std::uint8_t {
  kOwn,       // the tracker's history of this key (or its idle time)
  kPrior,     // no history of its own: the namespace prior
  kAncestor,  // no history, no prior: the nearest ancestor with a finite interval
  kNone,      // nothing known: kNoReuse
};

struct ReuseEstimate {
  double interval_s = kNoReuse;
  ReuseSource source = ReuseSource::kNone;
};

struct PlacerStats {
  std::uint64_t decisions = 0;             // Decide() and DecideVictim() calls
  std::uint64_t victims = 0;               // of them, DecideVictim()
  std::uint64_t from_prior = 0;            // decisions whose interval came from the namespace prior
  std::uint64_t from_ancestor = 0;         // ... from an ancestor in the chain
  std::array<std::uint64_t, 6> clauses{};  // outcomes by Clause
};

class Placer {
 public:
  // kInvalidArgument as PlacementParams::Validate(), ReuseTracker::Create() and
  // NamespaceReuse::Create() (naming the field and its range).
  static absl::StatusOr<Placer> Create(const PlacerOptions& options);

  Placer(Placer&&) noexcept = default;
  Placer& operator=(Placer&&) noexcept = default;

  // One use of `key` (looked up, hit or produced) at now_ns: the tracker folds in the
  // interval since its last use, and the namespace prior counts a first use as a new block
  // and a second as a reuse. Call once per use, in time order. O(1).
  void RecordUse(coherence::Namespace ns, const coherence::PrefixKey& key, std::uint64_t now_ns,
                 std::uint64_t size_bytes, std::uint32_t tokens) noexcept;

  // The reuse interval the rule is given for q at now_ns, and its source: the key's own
  // (ReuseTracker::ExpectedIntervalS); if that is infinite because the key has no history
  // (fewer than two uses — not a history gone idle), the namespace prior; if still infinite,
  // the nearest of the max_ancestors blocks before q.pos with a finite interval. Const: no
  // counters move.
  ReuseEstimate ExpectedReuse(const PlacementQuery& q, std::uint64_t now_ns) const noexcept;
  // The rule's inputs for q: ExpectedReuse plus q's and the state's fields.
  BlockInputs Inputs(const PlacementQuery& q, const TierState& state,
                     std::uint64_t now_ns) const noexcept;

  // Where q should go now: the rule's decision on Inputs(q, state, now_ns). `why` (may be
  // null) receives every figure. Counts the outcome in stats(). Never fails.
  Decision Decide(const PlacementQuery& q, const TierState& state, std::uint64_t now_ns,
                  Explanation* why = nullptr) noexcept;
  // A watermark victim (TierOptions::victim_tier): decided as Decide() with every CXL tier
  // full, so kNvme (NVMe, or the rule would keep it in CXL: the watermark needs the room) or
  // kDrop (recomputing beats an NVMe fetch). Never returns a CXL tier.
  Tier DecideVictim(const PlacementQuery& q, const TierState& state, std::uint64_t now_ns) noexcept;

  const PlacerStats& stats() const noexcept { return stats_; }
  const PlacementRule& rule() const noexcept { return rule_; }
  const ReuseTracker& tracker() const noexcept { return tracker_; }
  // nullptr when options.namespace_prior is false.
  const NamespaceReuse* prior() const noexcept { return prior_ ? &*prior_ : nullptr; }
  const PlacerOptions& options() const noexcept { return options_; }

 private:
  Placer(const PlacerOptions& options, PlacementRule rule, ReuseTracker tracker,
         std::optional<NamespaceReuse> prior);

  PlacerOptions options_;
  PlacementRule rule_;
  ReuseTracker tracker_;
  std::optional<NamespaceReuse> prior_;
  PlacerStats stats_;
};

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_PLACER_H_
