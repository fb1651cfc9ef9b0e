// cxlkv/tier/placement_config.h — the [placement] section of domain.toml.
//
// The placement rule's parameters (placement.h), the reuse tracker's size (reuse_tracker.h)
// and an optional calibration file, read from the [placement] table of a domain.toml
// document (orchestrator/domain.example.toml lists every key). tier/ parses the section
// itself, so the keys, their units and ranges live beside the rule they configure; the
// orchestrator's configuration hands it the document's text and keeps the result.
//
// Parsing is strict, as the rest of domain.toml: an unknown key, a wrong type, an
// out-of-range value or a cross-key rule broken (PlacementParams::Validate) is
// kInvalidArgument "<source>:<line>: key 'placement.<key>': <what>".
// Thread-safety: pure functions; PlacementConfig is a plain value.
#ifndef CXLKV_TIER_PLACEMENT_CONFIG_H_
#define CXLKV_TIER_PLACEMENT_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/tier/placement.h"
#include "cxlkv/tier/reuse_tracker.h"

namespace cxlkv::tier {

struct PlacementConfig {
  // In SI units (ttft_budget_ms -> ttft_budget_s, *_gbps -> bytes/s, *_ns -> s, ...).
  PlacementParams params;
  ReuseTrackerOptions reuse_tracker;  // tracker_entries, reuse_ewma_alpha
  std::string calibration;  // `cxlkvctl calibrate --out` JSON whose figures replace params'
};

// Reads the [placement] table of the TOML document `toml` (other tables are not looked at;
// without the table every field keeps its default). `source_name` names the document in
// errors. kInvalidArgument for TOML that does not parse ("<source>:<line>: <what>") or a bad
// key, as above. Cost: parses the whole document once.
absl::StatusOr<PlacementConfig> ParsePlacementConfig(absl::string_view toml,
                                                     absl::string_view source_name);

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_PLACEMENT_CONFIG_H_
