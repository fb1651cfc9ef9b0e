// cxlkv/tier/placement.h — the CXL-vs-NVMe placement rule (docs/placement.md).
//
// For one KV block, PlacementRule::Decide() picks a Tier (tier.h): CXL-expanded, CXL-pooled,
// NVMe, or drop (recompute the prefix on its next use) from the block's size, its expected
// reuse interval, the prefill tokens a hit saves, the prefill queue depth, the CXL tiers'
// occupancy and the namespace's pin level, given the tiers' latency, bandwidth and cost per GB
// (PlacementParams: configured in domain.toml [placement] (placement_config.h), measured by
// calibrate.h). Placer (placer.h) gathers those inputs for a serving process or a replay.
//
// The clauses, in order (the first that applies decides):
//   1. kPinned           pin level >= params.pin_level (> 0): the block stays in CXL.
//   2. kRecomputeCheaper recomputing (tokens / prefill rate × (1 + w × queue depth)) is faster
//                        than fetching from every tier the block may live in: drop.
//   3. kBelowBreakEven   reuse interval < break-even interval I*: CXL.
//   4. kTtftForced       an NVMe fetch would exceed the TTFT budget and the block is expected
//                        back within the reuse horizon: CXL.
//   5. kCxlFull          no CXL tier has room (occupancy >= 1): NVMe.
//   6. kAboveBreakEven   NVMe.
// The break-even interval generalizes the five-minute rule: it is the reuse interval at
// which holding the bytes in CXL costs what re-fetching them from NVMe costs,
//   I* = P_nvme × (S / B_nvme + 1 / IOPS_nvme) / (S × (c_cxl × f(occupancy) − c_nvme))
// with P_nvme the price of the NVMe unit whose bandwidth B_nvme and IOPS the figures give,
// c the cost per byte of each tier and f the pressure factor: 1 below the low watermark,
// rising to pressure_max_factor at the high watermark, unbounded as the tier fills. That
// ramp prices a tier that fills up with nothing leaving it. A tier that evicts its least
// recently used blocks (BlockInputs::retention_s finite) has f = 1 below occupancy 1: a block
// held there occupies it only until it is used or has been idle for the retention T, so both
// its capacity cost and its chance of a hit scale by the same P(next use < T), which cancels
// in the break-even (for memoryless reuse times) — I* stays I*(f = 1), and what a new block
// displaces is a block LRU judged idle for T.
// Between CXL tiers the rule takes the one with the lowest c × f among those with room whose
// fetch meets the TTFT budget, else the fastest with room (ties: the faster one).
//
// Properties the tests check: the outcome never moves to a faster tier as the reuse interval
// grows; nor as the block grows unless the TTFT budget moves it (the larger block is decided by
// kTtftForced, or its CXL tier was chosen for speed: Explanation::cxl_choice_by_ttft); raising
// the occupancy of every CXL tier alike never promotes a block (when every tier's pressure comes
// from the same source: occupancy, or its own eviction).
//
// Thread-safety: a PlacementRule is immutable after Create(); Decide() is const, noexcept,
// allocation-free and safe from any number of threads. Cost: a few tens of floating-point
// operations (bench/placement_benchmark.cc measures it).
#ifndef CXLKV_TIER_PLACEMENT_H_
#define CXLKV_TIER_PLACEMENT_H_

#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/tier/tier.h"

namespace cxlkv::tier {

enum class Clause : std::uint8_t {
  kPinned,
  kRecomputeCheaper,
  kBelowBreakEven,
  kTtftForced,
  kCxlFull,
  kAboveBreakEven,
};

// "pinned", "recompute-cheaper", "below-break-even", "ttft-forced", "cxl-full",
// "above-break-even".
absl::string_view ClauseName(Clause clause) noexcept;

// +inf: no reuse seen (a prefix used once), or unknown.
inline constexpr double kNoReuse = std::numeric_limits<double>::infinity();

// How fast a tier returns a block: fetch time = latency_s + bytes / read_bytes_per_s.
struct TierFigures {
  double latency_s = 0;
  double read_bytes_per_s = 0;
};

struct CxlTierParams {
  bool present = true;
  TierFigures figures;
  double cost_per_gb = 0;  // price of 1 GB (1e9 B) of capacity, any currency (same for all tiers)
};

// Parameters in SI units (seconds, bytes, bytes/s). Names follow domain.toml's [placement]
// keys. Defaults describe a Gen5 server (CXL x16 expander, a switch-attached pool, a Gen5
// NVMe drive); calibration (calibrate.h) replaces the figures it measures.
struct PlacementParams {
  std::array<CxlTierParams, kCxlTierCount> cxl = {
      CxlTierParams{true, {250e-9, 24e9}, 5.0},   // cxl-expanded
      CxlTierParams{true, {500e-9, 18e9}, 4.0}};  // cxl-pooled
  TierFigures nvme = {80e-6, 14e9};
  double nvme_iops = 2.5e6;  // reads/s at depth; one fetch is one read. 0: not counted
  double nvme_cost_per_gb = 0.08;
  double nvme_drive_bytes = 7.68e12;  // the unit (drive or array) the NVMe figures describe
  double ttft_budget_s = 0.5;
  double prefill_tokens_per_s = 10000;  // recompute speed of one prefill; cost/token = 1/this
  double queue_depth_weight = 1.0;      // share of a recompute each queued prefill also waits
  double low_watermark = 0.80;          // CXL occupancy where pressure starts (and hysteresis)
  double high_watermark = 0.95;
  double pressure_max_factor = 4.0;  // CXL cost multiplier at the high watermark
  double reuse_horizon_s = 3600;     // beyond: "not expected back" (no TTFT forcing)
  int pin_level = 2;                 // namespaces pinned at >= this stay in CXL; 0: off
  // Enforced by the TierManager, not by Decide(): the least time a block stays in a tier
  // before it may move again (anti-thrash).
  double cooldown_s = 5;

  // kInvalidArgument naming the field (its domain.toml key) and the accepted range.
  absl::Status Validate() const;
};

struct BlockInputs {
  std::uint64_t size_bytes = 0;
  double reuse_interval_s = kNoReuse;  // expected time to the next use (ReuseTracker)
  std::uint32_t tokens = 0;            // prefill tokens a hit saves; 0: unknown, never dropped
  std::uint32_t queue_depth = 0;       // prefills queued on the GPU that would recompute
  std::array<double, kCxlTierCount> occupancy = {0, 0};  // used / capacity of each CXL tier
  // How long a block left unused lasts in each CXL tier before the tier evicts it: the idle
  // age of its recent LRU victims (Che's characteristic time; TierManager::RetentionS).
  // Finite: the tier evicts its least recently used blocks by itself, and that eviction is the
  // pressure — f = 1 at any occupancy below 1 (see the header comment). +inf or NaN: the tier
  // is not evicting, or nobody says: f comes from occupancy.
  std::array<double, kCxlTierCount> retention_s = {kNoReuse, kNoReuse};
  int pin_level = 0;  // the namespace's [[namespace]] pin
};

struct Decision {
  Tier tier = Tier::kNvme;
  Clause clause = Clause::kAboveBreakEven;
  bool operator==(const Decision&) const = default;
};

// Everything Decide() looked at and computed. Infinite figures print as "inf" (text) and
// null (JSON).
struct Explanation {
  BlockInputs inputs;
  PlacementParams params;
  std::array<double, 3> fetch_s = {0, 0, 0};  // cxl-expanded, cxl-pooled, nvme; inf if absent
  double recompute_s = 0;                     // inf when tokens is 0
  std::array<double, kCxlTierCount> pressure = {1, 1};  // f; inf when full/absent
  // f is 1 because the tier evicts by itself (BlockInputs::retention_s is finite).
  std::array<bool, kCxlTierCount> tier_evicts = {false, false};
  std::array<double, kCxlTierCount> effective_cost_per_gb = {0, 0};  // cost × f
  Tier cxl_choice = Tier::kCxlPooled;  // the CXL tier the block would use
  bool cxl_available = false;          // cxl_choice has room (occupancy < 1)
  bool cxl_choice_by_ttft = false;     // a cheaper CXL tier was passed over: its fetch > budget
  double nvme_busy_s = 0;              // drive time one fetch occupies: S / B + 1 / IOPS
  double break_even_s = 0;             // I* for cxl_choice (0 when no CXL tier has room)
  bool pinned = false;
  bool below_break_even = false;
  bool ttft_exceeded = false;   // NVMe fetch > TTFT budget
  bool within_horizon = false;  // reuse interval <= reuse horizon
  bool cxl_eligible = false;    // CXL by break-even or TTFT, with room
  Decision decision;

  // Multi-line, every input, figure and the deciding clause with its comparison.
  std::string ToText() const;
  // A JSON object (stable keys; see docs/placement.md). indent < 0: one line.
  std::string ToJson(int indent = 2) const;
};

class PlacementRule {
 public:
  // Validates and precomputes. kInvalidArgument as PlacementParams::Validate().
  static absl::StatusOr<PlacementRule> Create(const PlacementParams& params);

  // The placement of one block. A NaN reuse interval counts as "no reuse", NaN occupancy as
  // full. Never fails; `why` (may be null) receives every figure.
  Decision Decide(const BlockInputs& in) const noexcept;
  Decision Decide(const BlockInputs& in, Explanation* why) const noexcept;

  // f(occupancy): 1 up to the low watermark, linear to pressure_max_factor at the high
  // watermark, then max × (1 − high) / (1 − occupancy); +inf from occupancy 1.
  double PressureFactor(double occupancy) const noexcept;
  // I* of `cxl_tier` for a block of `size_bytes` at `occupancy`: +inf when holding in CXL
  // costs no more than NVMe capacity, 0 when the tier is full or absent.
  double BreakEvenS(Tier cxl_tier, std::uint64_t size_bytes, double occupancy) const noexcept;

  const PlacementParams& params() const noexcept { return params_; }

 private:
  explicit PlacementRule(const PlacementParams& params);
  template <bool kExplain>
  Decision DecideImpl(const BlockInputs& in, Explanation* why) const noexcept;

  PlacementParams params_;
  // Precomputed from params_.
  std::array<double, kCxlTierCount> cxl_price_per_byte_{};
  std::array<double, kCxlTierCount> cxl_inv_bw_{};
  std::array<bool, kCxlTierCount> cxl_present_{};
  double nvme_price_per_byte_ = 0;
  double nvme_inv_bw_ = 0;
  double nvme_unit_price_per_byte_bw_ = 0;  // P_nvme / B_nvme
  double nvme_unit_price_per_io_ = 0;       // P_nvme / IOPS
  double s_per_token_ = 0;
  double pressure_slope_ = 0;  // (max − 1) / (high − low)
  double pressure_tail_ = 0;   // max × (1 − high)
};

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_PLACEMENT_H_
