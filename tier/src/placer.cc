// Placer: the placement rule fed by the reuse tracker, the namespace prior, the request's
// chain and the tiers' pressure (placer.h).
#include "cxlkv/tier/placer.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace cxlkv::tier {
namespace {

BlockInputs MakeInputs(const PlacementQuery& q, const TierState& state, double interval_s) {
  BlockInputs in;
  in.size_bytes = q.size_bytes;
  in.reuse_interval_s = interval_s;
  in.tokens = q.tokens;
  in.queue_depth = state.queue_depth;
  in.occupancy = state.occupancy;
  in.retention_s = state.retention_s;
  in.pin_level = q.pin_level;
  return in;
}

}  // namespace

absl::StatusOr<Placer> Placer::Create(const PlacerOptions& options) {
  auto rule = PlacementRule::Create(options.params);
  if (!rule.ok()) return rule.status();
  auto tracker = ReuseTracker::Create(options.tracker);
  if (!tracker.ok()) return tracker.status();
  std::optional<NamespaceReuse> prior;
  if (options.namespace_prior) {
    auto p = NamespaceReuse::Create(options.prior);
    if (!p.ok()) return p.status();
    prior.emplace(std::move(*p));
  }
  return Placer(options, *rule, std::move(*tracker), std::move(prior));
}

Placer::Placer(const PlacerOptions& options, PlacementRule rule, ReuseTracker tracker,
               std::optional<NamespaceReuse> prior)
    : options_(options), rule_(rule), tracker_(std::move(tracker)), prior_(std::move(prior)) {}

void Placer::RecordUse(coherence::Namespace ns, const coherence::PrefixKey& key,
                       std::uint64_t now_ns, std::uint64_t size_bytes,
                       std::uint32_t tokens) noexcept {
  const RecordOutcome o = tracker_.Record(key, now_ns, size_bytes, tokens);
  if (prior_) prior_->Observe(ns, o);
}

ReuseEstimate Placer::ExpectedReuse(const PlacementQuery& q, std::uint64_t now_ns) const noexcept {
  ReuseEstimate e{tracker_.ExpectedIntervalS(q.key, now_ns), ReuseSource::kOwn};
  if (!std::isinf(e.interval_s)) return e;
  e.source = ReuseSource::kNone;
  if (prior_) {
    // Only a key without history of its own takes the prior; one whose history went idle
    // keeps its own (finite) figure above, so this is the unknown or once-seen key.
    const std::optional<ReuseStats> st = tracker_.Find(q.key);
    if (!st || st->uses < 2) {
      e.interval_s = prior_->ExpectedIntervalS(q.ns);
      if (!std::isinf(e.interval_s)) {
        e.source = ReuseSource::kPrior;
        return e;
      }
    }
  }
  if (options_.inherit_from_chain && !q.chain.empty()) {
    const std::size_t pos = std::min(q.pos, q.chain.size());
    const std::size_t up_max = std::min<std::size_t>(pos, options_.max_ancestors);
    for (std::size_t up = 1; up <= up_max; ++up) {
      const double parent = tracker_.ExpectedIntervalS(q.chain[pos - up], now_ns);
      if (!std::isinf(parent)) return ReuseEstimate{parent, ReuseSource::kAncestor};
    }
  }
  return e;
}

BlockInputs Placer::Inputs(const PlacementQuery& q, const TierState& state,
                           std::uint64_t now_ns) const noexcept {
  return MakeInputs(q, state, ExpectedReuse(q, now_ns).interval_s);
}

Decision Placer::Decide(const PlacementQuery& q, const TierState& state, std::uint64_t now_ns,
                        Explanation* why) noexcept {
  const ReuseEstimate reuse = ExpectedReuse(q, now_ns);
  const BlockInputs in = MakeInputs(q, state, reuse.interval_s);
  if (reuse.source == ReuseSource::kPrior) ++stats_.from_prior;
  if (reuse.source == ReuseSource::kAncestor) ++stats_.from_ancestor;
  const Decision d = rule_.Decide(in, why);
  ++stats_.decisions;
  ++stats_.clauses[static_cast<std::size_t>(d.clause)];
  return d;
}

Tier Placer::DecideVictim(const PlacementQuery& q, const TierState& state,
                          std::uint64_t now_ns) noexcept {
  TierState full = state;
  full.occupancy.fill(1.0);
  ++stats_.victims;
  return Decide(q, full, now_ns).tier == Tier::kDrop ? Tier::kDrop : Tier::kNvme;
}

}  // namespace cxlkv::tier
