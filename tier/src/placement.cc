// The placement rule: precomputation, the decision, and its explanation (text and JSON).
#include "cxlkv/tier/placement.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cxlkv::tier {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr const char* kCxlKey[kCxlTierCount] = {"cxl_expanded", "cxl_pooled"};

// "placement.<key>: <value><unit> is out of range [lo, hi]" with value and bounds shown in the
// key's own unit (`scale` converts SI to it).
absl::Status Range(absl::string_view key, double v, double lo, double hi, double scale = 1,
                   bool lo_open = false) {
  const bool ok = lo_open ? (v > lo && v <= hi) : (v >= lo && v <= hi);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("placement.", key, ": ", v * scale,
                                                 " is out of range ", lo_open ? "(" : "[",
                                                 lo * scale, ", ", hi * scale, "]"));
}

// Seconds with a unit chosen for reading: "250 ns", "93.7 ms", "11.2 s", "inf".
std::string Secs(double s) {
  if (std::isinf(s)) return "inf";
  if (std::isnan(s)) return "nan";
  const double a = std::fabs(s);
  if (a == 0) return "0 s";
  if (a < 1e-6) return absl::StrFormat("%.3g ns", s * 1e9);
  if (a < 1e-3) return absl::StrFormat("%.3g us", s * 1e6);
  if (a < 1) return absl::StrFormat("%.3g ms", s * 1e3);
  return absl::StrFormat("%.3g s", s);
}

std::string Num(double v) {
  if (std::isinf(v)) return "inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.4g", v);
}

nlohmann::json J(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

absl::string_view ClauseName(Clause clause) noexcept {
  switch (clause) {
    case Clause::kPinned:
      return "pinned";
    case Clause::kRecomputeCheaper:
      return "recompute-cheaper";
    case Clause::kBelowBreakEven:
      return "below-break-even";
    case Clause::kTtftForced:
      return "ttft-forced";
    case Clause::kCxlFull:
      return "cxl-full";
    case Clause::kAboveBreakEven:
      return "above-break-even";
  }
  return "?";
}

absl::Status PlacementParams::Validate() const {
  bool any = false;
  for (int t = 0; t < kCxlTierCount; ++t) {
    if (!cxl[t].present) continue;
    any = true;
    const std::string k = kCxlKey[t];
    if (auto s = Range(k + "_latency_ns", cxl[t].figures.latency_s, 0, 1e-3, 1e9); !s.ok())
      return s;
    if (auto s = Range(k + "_read_gbps", cxl[t].figures.read_bytes_per_s, 0, 1e13, 1e-9, true);
        !s.ok()) {
      return s;
    }
    if (auto s = Range(k + "_cost_per_gb", cxl[t].cost_per_gb, 0, 1e6, 1, true); !s.ok()) return s;
  }
  if (!any) {
    return absl::InvalidArgumentError(
        "placement.cxl_tiers: at least one CXL tier (\"expanded\" or \"pooled\") is needed");
  }
  if (auto s = Range("nvme_latency_us", nvme.latency_s, 0, 1, 1e6); !s.ok()) return s;
  if (auto s = Range("nvme_read_gbps", nvme.read_bytes_per_s, 0, 1e13, 1e-9, true); !s.ok())
    return s;
  if (auto s = Range("nvme_iops", nvme_iops, 0, 1e9); !s.ok()) return s;
  if (auto s = Range("nvme_cost_per_gb", nvme_cost_per_gb, 0, 1e6, 1, true); !s.ok()) return s;
  if (auto s = Range("nvme_drive_size", nvme_drive_bytes, 0, 1e18, 1, true); !s.ok()) return s;
  if (auto s = Range("ttft_budget_ms", ttft_budget_s, 0, 1e3, 1e3, true); !s.ok()) return s;
  if (auto s = Range("recompute_tokens_per_s", prefill_tokens_per_s, 0, 1e9, 1, true); !s.ok())
    return s;
  if (auto s = Range("queue_depth_weight", queue_depth_weight, 0, 1e3); !s.ok()) return s;
  if (auto s = Range("low_watermark", low_watermark, 0, 1); !s.ok()) return s;
  if (auto s = Range("high_watermark", high_watermark, 0, 1); !s.ok()) return s;
  if (!(low_watermark < high_watermark)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.high_watermark: ", high_watermark, " must be above low_watermark (",
        low_watermark, "); the band between them is the pressure ramp and the hysteresis"));
  }
  if (auto s = Range("pressure_max_factor", pressure_max_factor, 1, 1e6); !s.ok()) return s;
  if (auto s = Range("reuse_horizon_s", reuse_horizon_s, 0, 1e9, 1, true); !s.ok()) return s;
  if (auto s = Range("pin_level", pin_level, 0, 3); !s.ok()) return s;
  if (auto s = Range("cooldown_ms", cooldown_s, 0, 86400, 1e3); !s.ok()) return s;
  return absl::OkStatus();
}

PlacementRule::PlacementRule(const PlacementParams& p) : params_(p) {
  for (int t = 0; t < kCxlTierCount; ++t) {
    cxl_present_[t] = p.cxl[t].present;
    cxl_price_per_byte_[t] = p.cxl[t].cost_per_gb * 1e-9;
    cxl_inv_bw_[t] = p.cxl[t].present ? 1.0 / p.cxl[t].figures.read_bytes_per_s : kInf;
  }
  nvme_price_per_byte_ = p.nvme_cost_per_gb * 1e-9;
  nvme_inv_bw_ = 1.0 / p.nvme.read_bytes_per_s;
  const double unit_price = p.nvme_cost_per_gb * 1e-9 * p.nvme_drive_bytes;
  nvme_unit_price_per_byte_bw_ = unit_price / p.nvme.read_bytes_per_s;
  nvme_unit_price_per_io_ = p.nvme_iops > 0 ? unit_price / p.nvme_iops : 0;
  s_per_token_ = 1.0 / p.prefill_tokens_per_s;
  pressure_slope_ = (p.pressure_max_factor - 1.0) / (p.high_watermark - p.low_watermark);
  pressure_tail_ = p.pressure_max_factor * (1.0 - p.high_watermark);
}

absl::StatusOr<PlacementRule> PlacementRule::Create(const PlacementParams& params) {
  if (auto s = params.Validate(); !s.ok()) return s;
  return PlacementRule(params);
}

double PlacementRule::PressureFactor(double o) const noexcept {
  if (!(o < 1.0)) return kInf;  // full (or NaN)
  if (o <= params_.low_watermark) return 1.0;
  if (o <= params_.high_watermark) return 1.0 + (o - params_.low_watermark) * pressure_slope_;
  return pressure_tail_ / (1.0 - o);
}

double PlacementRule::BreakEvenS(Tier cxl_tier, std::uint64_t size_bytes,
                                 double occupancy) const noexcept {
  const int t = static_cast<int>(cxl_tier);
  if (t >= kCxlTierCount || !cxl_present_[t]) return 0;
  const double f = PressureFactor(occupancy);
  if (std::isinf(f)) return 0;
  const double s = static_cast<double>(size_bytes);
  const double denom = s * (cxl_price_per_byte_[t] * f - nvme_price_per_byte_);
  if (!(denom > 0)) return kInf;
  return (s * nvme_unit_price_per_byte_bw_ + nvme_unit_price_per_io_) / denom;
}

template <bool kExplain>
Decision PlacementRule::DecideImpl(const BlockInputs& in, Explanation* why) const noexcept {
  const double size = static_cast<double>(in.size_bytes);
  const double interval = in.reuse_interval_s;

  // The CXL tier: the lowest effective cost (cost × pressure) among those with room whose fetch
  // meets the TTFT budget, else the fastest with room; ties: the faster one (lower index). When
  // every tier is full (a pinned block still goes to CXL), the same choice by base cost.
  std::array<double, kCxlTierCount> f{kInf, kInf};
  std::array<double, kCxlTierCount> eff{kInf, kInf};
  std::array<double, kCxlTierCount> fetch{kInf, kInf};
  std::array<bool, kCxlTierCount> evicts{false, false};
  int c = -1, fastest = -1, cheapest = -1, c_full = -1, fastest_full = -1, cheapest_full = -1;
  for (int t = 0; t < kCxlTierCount; ++t) {
    if (!cxl_present_[t]) continue;
    // A tier that evicts by itself (retention known) has no occupancy pressure; a full tier
    // is full either way.
    f[t] = PressureFactor(in.occupancy[t]);
    const double ret = in.retention_s[t];
    if (!std::isnan(ret) && !std::isinf(ret) && f[t] < kInf) {
      evicts[t] = true;
      f[t] = 1.0;
    }
    eff[t] = cxl_price_per_byte_[t] * f[t];
    fetch[t] = params_.cxl[t].figures.latency_s + size * cxl_inv_bw_[t];
    const bool meets = fetch[t] <= params_.ttft_budget_s;
    if (fastest_full < 0 || fetch[t] < fetch[fastest_full]) fastest_full = t;
    if (cheapest_full < 0 || cxl_price_per_byte_[t] < cxl_price_per_byte_[cheapest_full]) {
      cheapest_full = t;
    }
    if (meets && (c_full < 0 || cxl_price_per_byte_[t] < cxl_price_per_byte_[c_full])) c_full = t;
    if (!(eff[t] < kInf)) continue;  // full
    if (cheapest < 0 || eff[t] < eff[cheapest]) cheapest = t;
    if (fastest < 0 || fetch[t] < fetch[fastest]) fastest = t;
    if (meets && (c < 0 || eff[t] < eff[c])) c = t;
  }
  const bool available = cheapest >= 0;
  if (!available) c = c_full >= 0 ? c_full : fastest_full;
  if (c < 0) c = fastest;
  const bool choice_by_ttft = c != (available ? cheapest : cheapest_full);
  const Tier cxl_tier = static_cast<Tier>(c);
  const double fetch_cxl = fetch[c];

  const double fetch_nvme = params_.nvme.latency_s + size * nvme_inv_bw_;
  const double recompute =
      in.tokens == 0 ? kInf
                     : static_cast<double>(in.tokens) * s_per_token_ *
                           (1.0 + params_.queue_depth_weight * static_cast<double>(in.queue_depth));

  // I* = P_nvme × (S / B + 1 / IOPS) / (S × (c_cxl × f − c_nvme)).
  double break_even = 0;
  if (available) {
    const double denom = size * (eff[c] - nvme_price_per_byte_);
    break_even =
        denom > 0 ? (size * nvme_unit_price_per_byte_bw_ + nvme_unit_price_per_io_) / denom : kInf;
  }
  const bool pinned = params_.pin_level > 0 && in.pin_level >= params_.pin_level;
  const bool below = interval < break_even;
  const bool ttft = fetch_nvme > params_.ttft_budget_s;
  const bool horizon = interval <= params_.reuse_horizon_s;
  const bool eligible = available && (below || (ttft && horizon));
  const double best_fetch = eligible ? std::min(fetch_cxl, fetch_nvme) : fetch_nvme;

  Decision d;
  if (pinned) {
    d = {cxl_tier, Clause::kPinned};
  } else if (recompute < best_fetch) {
    d = {Tier::kDrop, Clause::kRecomputeCheaper};
  } else if (eligible) {
    d = {cxl_tier, below ? Clause::kBelowBreakEven : Clause::kTtftForced};
  } else if (!available) {
    d = {Tier::kNvme, Clause::kCxlFull};
  } else {
    d = {Tier::kNvme, Clause::kAboveBreakEven};
  }

  if constexpr (kExplain) {
    if (why != nullptr) {
      why->inputs = in;
      why->params = params_;
      for (int t = 0; t < kCxlTierCount; ++t) {
        why->fetch_s[t] = fetch[t];
        why->pressure[t] = f[t];
        why->tier_evicts[t] = evicts[t];
        why->effective_cost_per_gb[t] = cxl_present_[t] ? params_.cxl[t].cost_per_gb * f[t] : kInf;
      }
      why->fetch_s[2] = fetch_nvme;
      why->recompute_s = recompute;
      why->cxl_choice = cxl_tier;
      why->cxl_available = available;
      why->cxl_choice_by_ttft = choice_by_ttft;
      why->nvme_busy_s =
          size * nvme_inv_bw_ + (params_.nvme_iops > 0 ? 1.0 / params_.nvme_iops : 0);
      why->break_even_s = break_even;
      why->pinned = pinned;
      why->below_break_even = below;
      why->ttft_exceeded = ttft;
      why->within_horizon = horizon;
      why->cxl_eligible = eligible;
      why->decision = d;
    }
  }
  return d;
}

Decision PlacementRule::Decide(const BlockInputs& in) const noexcept {
  return DecideImpl<false>(in, nullptr);
}

Decision PlacementRule::Decide(const BlockInputs& in, Explanation* why) const noexcept {
  return why == nullptr ? DecideImpl<false>(in, nullptr) : DecideImpl<true>(in, why);
}

// ---- explanation ------------------------------------------------------------------------------

namespace {

struct ClauseLine {
  Clause clause;
  bool applies;
  std::string detail;
};

// One line per clause, in evaluation order, saying whether its condition holds and why.
std::vector<ClauseLine> ClauseLines(const Explanation& e) {
  const PlacementParams& p = e.params;
  const double best_fetch = e.cxl_eligible
                                ? std::min(e.fetch_s[static_cast<int>(e.cxl_choice)], e.fetch_s[2])
                                : e.fetch_s[2];
  std::vector<ClauseLine> out;
  out.push_back({Clause::kPinned, e.pinned,
                 p.pin_level == 0 ? "pin override off (pin_level 0)"
                                  : absl::StrCat("namespace pin level ", e.inputs.pin_level,
                                                 e.pinned ? " >= " : " < ", p.pin_level)});
  out.push_back(
      {Clause::kRecomputeCheaper, e.recompute_s < best_fetch,
       absl::StrCat("recompute ", Secs(e.recompute_s), e.recompute_s < best_fetch ? " < " : " >= ",
                    e.cxl_eligible ? "fastest eligible fetch " : "NVMe fetch ", Secs(best_fetch))});
  out.push_back({Clause::kBelowBreakEven, e.below_break_even,
                 absl::StrCat("reuse interval ", Secs(e.inputs.reuse_interval_s),
                              e.below_break_even ? " < " : " >= ", "break-even ",
                              Secs(e.break_even_s), " (", TierName(e.cxl_choice), ")")});
  out.push_back(
      {Clause::kTtftForced, e.cxl_available && e.ttft_exceeded && e.within_horizon,
       absl::StrCat("NVMe fetch ", Secs(e.fetch_s[2]), e.ttft_exceeded ? " > " : " <= ",
                    "TTFT budget ", Secs(p.ttft_budget_s), "; reuse interval ",
                    e.within_horizon ? "within" : "beyond", " horizon ", Secs(p.reuse_horizon_s))});
  out.push_back({Clause::kCxlFull, !e.cxl_available,
                 e.cxl_available ? absl::StrCat(TierName(e.cxl_choice), " has room")
                                 : "no CXL tier has room (occupancy >= 1)"});
  out.push_back({Clause::kAboveBreakEven, true, "otherwise: NVMe"});
  return out;
}

}  // namespace

std::string Explanation::ToText() const {
  const PlacementParams& p = params;
  std::string s = absl::StrCat("placement: ", TierName(decision.tier), " (",
                               ClauseName(decision.clause), ")\n");
  absl::StrAppend(&s, "inputs:\n");
  absl::StrAppendFormat(&s, "  size              %d B (%.4g GB)\n", inputs.size_bytes,
                        static_cast<double>(inputs.size_bytes) * 1e-9);
  absl::StrAppend(&s, "  reuse interval    ", Secs(inputs.reuse_interval_s),
                  std::isinf(inputs.reuse_interval_s) ? " (no reuse seen)" : "", "\n");
  absl::StrAppend(&s, "  tokens            ", inputs.tokens,
                  inputs.tokens == 0 ? " (unknown: recompute not considered)" : "", "\n");
  absl::StrAppend(&s, "  queue depth       ", inputs.queue_depth, "\n");
  absl::StrAppend(&s, "  occupancy         cxl-expanded ", Num(inputs.occupancy[0]),
                  ", cxl-pooled ", Num(inputs.occupancy[1]), "\n");
  absl::StrAppend(&s, "  retention         cxl-expanded ", Secs(inputs.retention_s[0]),
                  ", cxl-pooled ", Secs(inputs.retention_s[1]),
                  " (how long an unused block lasts before eviction; inf: not evicting)\n");
  absl::StrAppend(&s, "  pin level         ", inputs.pin_level, "\n");
  absl::StrAppend(&s, "tiers:\n");
  absl::StrAppendFormat(&s, "  %-13s %-9s %-10s %-8s %-9s %-12s %s\n", "tier", "latency",
                        "read GB/s", "cost/GB", "pressure", "eff.cost/GB", "fetch");
  for (int t = 0; t < kCxlTierCount; ++t) {
    const CxlTierParams& c = p.cxl[t];
    if (!c.present) {
      absl::StrAppendFormat(&s, "  %-13s (not configured)\n", TierName(static_cast<Tier>(t)));
      continue;
    }
    absl::StrAppendFormat(&s, "  %-13s %-9s %-10s %-8s %-9s %-12s %s\n",
                          TierName(static_cast<Tier>(t)), Secs(c.figures.latency_s),
                          Num(c.figures.read_bytes_per_s * 1e-9), Num(c.cost_per_gb),
                          Num(pressure[t]), Num(effective_cost_per_gb[t]), Secs(fetch_s[t]));
  }
  absl::StrAppendFormat(&s, "  %-13s %-9s %-10s %-8s %-9s %-12s %s\n", "nvme",
                        Secs(p.nvme.latency_s), Num(p.nvme.read_bytes_per_s * 1e-9),
                        Num(p.nvme_cost_per_gb), "-", "-", Secs(fetch_s[2]));
  absl::StrAppend(&s, "figures:\n");
  absl::StrAppend(&s, "  recompute         ", inputs.tokens, " tokens / ",
                  Num(p.prefill_tokens_per_s), " tokens/s x (1 + ", Num(p.queue_depth_weight),
                  " x ", inputs.queue_depth, ") = ", Secs(recompute_s), "\n");
  absl::StrAppend(&s, "  CXL tier          ", TierName(cxl_choice),
                  !cxl_available ? " (every CXL tier is full)"
                  : cxl_choice_by_ttft
                      ? " (a cheaper CXL tier's fetch would exceed the TTFT budget)"
                      : " (lowest cost x pressure)",
                  "\n");
  absl::StrAppend(&s, "  nvme busy/fetch   S/B + 1/IOPS = ", Secs(nvme_busy_s), "\n");
  const int c = static_cast<int>(cxl_choice);
  absl::StrAppend(&s, "  break-even I*     P_nvme x busy / (S x (c_cxl x f - c_nvme)) = ",
                  Num(p.nvme_cost_per_gb * p.nvme_drive_bytes * 1e-9), " x ", Secs(nvme_busy_s),
                  " / (", Num(static_cast<double>(inputs.size_bytes) * 1e-9), " GB x (",
                  Num(p.cxl[c].cost_per_gb), " x ", Num(pressure[c]), " - ",
                  Num(p.nvme_cost_per_gb), ")) = ", Secs(break_even_s), " (", TierName(cxl_choice),
                  ")\n");
  if (cxl_available && tier_evicts[c]) {
    absl::StrAppend(&s, "  pressure          f = 1: ", TierName(cxl_choice),
                    " evicts by itself (an unused block lasts ", Secs(inputs.retention_s[c]),
                    "), so occupancy ", Num(inputs.occupancy[c]), " adds no price\n");
  } else {
    absl::StrAppend(&s, "  pressure          f(occupancy ", Num(inputs.occupancy[c]), ")\n");
  }
  absl::StrAppend(&s, "  TTFT budget       ", Secs(p.ttft_budget_s), "; reuse horizon ",
                  Secs(p.reuse_horizon_s), "; watermarks ", Num(p.low_watermark), "/",
                  Num(p.high_watermark), " (max factor ", Num(p.pressure_max_factor),
                  "); cool-down ", Secs(p.cooldown_s), "\n");
  absl::StrAppend(&s, "clauses (in order; the first that applies decides):\n");
  int n = 1;
  for (const ClauseLine& l : ClauseLines(*this)) {
    const bool decided = l.clause == decision.clause;
    absl::StrAppendFormat(&s, "  %d %-18s %-4s %s%s\n", n++, ClauseName(l.clause),
                          l.applies ? "yes" : "no", l.detail, decided ? "  <= decides" : "");
    if (decided) break;
  }
  return s;
}

std::string Explanation::ToJson(int indent) const {
  using nlohmann::json;
  const PlacementParams& p = params;
  json tiers = json::array();
  for (int t = 0; t < kCxlTierCount; ++t) {
    const CxlTierParams& c = p.cxl[t];
    tiers.push_back({{"tier", TierName(static_cast<Tier>(t))},
                     {"present", c.present},
                     {"latency_s", c.figures.latency_s},
                     {"read_bytes_per_s", c.figures.read_bytes_per_s},
                     {"cost_per_gb", c.cost_per_gb},
                     {"occupancy", J(inputs.occupancy[t])},
                     {"retention_s", J(inputs.retention_s[t])},
                     {"pressure", J(pressure[t])},
                     {"pressure_from", tier_evicts[t] ? "eviction" : "occupancy"},
                     {"effective_cost_per_gb", J(effective_cost_per_gb[t])},
                     {"fetch_s", J(fetch_s[t])}});
  }
  tiers.push_back({{"tier", "nvme"},
                   {"present", true},
                   {"latency_s", p.nvme.latency_s},
                   {"read_bytes_per_s", p.nvme.read_bytes_per_s},
                   {"iops", p.nvme_iops},
                   {"cost_per_gb", p.nvme_cost_per_gb},
                   {"drive_bytes", p.nvme_drive_bytes},
                   {"fetch_s", J(fetch_s[2])}});
  json clauses = json::array();
  for (const ClauseLine& l : ClauseLines(*this)) {
    clauses.push_back({{"clause", ClauseName(l.clause)},
                       {"applies", l.applies},
                       {"decides", l.clause == decision.clause},
                       {"detail", l.detail}});
    if (l.clause == decision.clause) break;
  }
  json j = {
      {"decision", {{"tier", TierName(decision.tier)}, {"clause", ClauseName(decision.clause)}}},
      {"inputs",
       {{"size_bytes", inputs.size_bytes},
        {"reuse_interval_s", J(inputs.reuse_interval_s)},
        {"tokens", inputs.tokens},
        {"queue_depth", inputs.queue_depth},
        {"occupancy",
         {{"cxl-expanded", J(inputs.occupancy[0])}, {"cxl-pooled", J(inputs.occupancy[1])}}},
        {"retention_s",
         {{"cxl-expanded", J(inputs.retention_s[0])}, {"cxl-pooled", J(inputs.retention_s[1])}}},
        {"pin_level", inputs.pin_level}}},
      {"params",
       {{"ttft_budget_s", p.ttft_budget_s},
        {"prefill_tokens_per_s", p.prefill_tokens_per_s},
        {"queue_depth_weight", p.queue_depth_weight},
        {"low_watermark", p.low_watermark},
        {"high_watermark", p.high_watermark},
        {"pressure_max_factor", p.pressure_max_factor},
        {"reuse_horizon_s", p.reuse_horizon_s},
        {"pin_level", p.pin_level},
        {"cooldown_s", p.cooldown_s}}},
      {"tiers", tiers},
      {"figures",
       {{"recompute_s", J(recompute_s)},
        {"nvme_fetch_s", J(fetch_s[2])},
        {"nvme_busy_s", J(nvme_busy_s)},
        {"break_even_s", J(break_even_s)},
        {"cxl_choice", TierName(cxl_choice)},
        {"cxl_available", cxl_available},
        {"cxl_choice_by_ttft", cxl_choice_by_ttft},
        {"below_break_even", below_break_even},
        {"ttft_exceeded", ttft_exceeded},
        {"within_horizon", within_horizon},
        {"cxl_eligible", cxl_eligible},
        {"pinned", pinned}}},
      {"clauses", clauses},
  };
  return j.dump(indent);
}

}  // namespace cxlkv::tier
