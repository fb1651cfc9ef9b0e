// The [placement] section of domain.toml, parsed with toml++ (placement_config.h).
#include "cxlkv/tier/placement_config.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/toml_reader.h"

namespace cxlkv::tier {

absl::StatusOr<PlacementConfig> ParsePlacementConfig(absl::string_view text,
                                                     absl::string_view source_name) {
  absl::StatusOr<toml::table> parsed = base::ParseToml(text, source_name);
  if (!parsed.ok()) return parsed.status();
  const toml::table& root = *parsed;
  PlacementConfig c;
  const toml::node* section = root.get("placement");
  // Without the table the defaults stand (they pass the checks below).
  const base::TomlReader p(source_name);
  using H = base::TomlReader::Handler;
  PlacementParams& pp = c.params;
  // Each key's line, for the cross-key checks below.
  std::map<std::string, std::uint64_t> lines;
  auto at = [&](const toml::node& v, const std::string& kk) {
    lines[kk] = static_cast<std::uint64_t>(v.source().begin.line);
  };
  // A number in the key's unit, stored in SI units (value × scale).
  auto real = [&](double* out, double lo, double hi, double scale) {
    return H([&p, &at, out, lo, hi, scale](const toml::node& v, const std::string& kk) {
      at(v, kk);
      double x = 0;
      if (auto st = p.Real(v, kk, &x, lo, hi); !st.ok()) return st;
      *out = x * scale;
      return absl::OkStatus();
    });
  };
  absl::Status st;
  // One key per line, in domain.example.toml's order.
  // clang-format off
  if (section != nullptr) { st = p.Table(*section, "placement", {
    {"ttft_budget_ms", real(&pp.ttft_budget_s, 1, 1e6, 1e-3)},
    {"recompute_tokens_per_s", real(&pp.prefill_tokens_per_s, 1, 1e9, 1)},
    {"queue_depth_weight", real(&pp.queue_depth_weight, 0, 1000, 1)},
    {"cxl_tiers", H([&](const toml::node& v, const std::string& kk) {
       at(v, kk);
       const toml::array* a = v.as_array();
       if (a == nullptr || a->empty()) {
         return p.Error(v, kk, "expected a non-empty array such as [\"expanded\", \"pooled\"]");
       }
       for (auto& t : pp.cxl) t.present = false;
       for (const toml::node& e : *a) {
         if (!e.is_string()) return p.Error(e, kk, "expected \"expanded\" or \"pooled\"");
         auto tier = ParseCxlTier(std::string(*e.value<std::string_view>()));
         if (!tier.ok()) return p.Error(e, kk, tier.status().message());
         CxlTierParams& t = pp.cxl[static_cast<int>(*tier)];
         if (t.present) return p.Error(e, kk, "a tier is listed twice");
         t.present = true;
       }
       return absl::OkStatus();
     })},
    {"cxl_expanded_latency_ns", real(&pp.cxl[0].figures.latency_s, 1, 1e6, 1e-9)},
    {"cxl_expanded_read_gbps", real(&pp.cxl[0].figures.read_bytes_per_s, 0.001, 1e4, 1e9)},
    {"cxl_expanded_cost_per_gb", real(&pp.cxl[0].cost_per_gb, 1e-6, 1e6, 1)},
    {"cxl_pooled_latency_ns", real(&pp.cxl[1].figures.latency_s, 1, 1e6, 1e-9)},
    {"cxl_pooled_read_gbps", real(&pp.cxl[1].figures.read_bytes_per_s, 0.001, 1e4, 1e9)},
    {"cxl_pooled_cost_per_gb", real(&pp.cxl[1].cost_per_gb, 1e-6, 1e6, 1)},
    {"nvme_latency_us", real(&pp.nvme.latency_s, 0.1, 1e6, 1e-6)},
    {"nvme_read_gbps", real(&pp.nvme.read_bytes_per_s, 0.001, 1e4, 1e9)},
    {"nvme_iops", real(&pp.nvme_iops, 0, 1e9, 1)},
    {"nvme_cost_per_gb", real(&pp.nvme_cost_per_gb, 1e-6, 1e6, 1)},
    {"nvme_drive_size", H([&](const toml::node& v, const std::string& kk) {
       at(v, kk);
       std::uint64_t bytes = 0;
       if (auto s2 = p.Size(v, kk, &bytes); !s2.ok()) return s2;
       pp.nvme_drive_bytes = static_cast<double>(bytes);
       return absl::OkStatus();
     })},
    {"low_watermark", real(&pp.low_watermark, 0, 1, 1)},
    {"high_watermark", real(&pp.high_watermark, 0, 1, 1)},
    {"pressure_max_factor", real(&pp.pressure_max_factor, 1, 1e6, 1)},
    {"reuse_horizon_s", real(&pp.reuse_horizon_s, 1, 1e9, 1)},
    {"pin_level", H([&](const toml::node& v, const std::string& kk) {
       at(v, kk);
       std::uint32_t level = 0;
       auto s2 = p.U32(v, kk, &level, 0, 3);
       pp.pin_level = static_cast<int>(level);
       return s2;
     })},
    {"cooldown_ms", real(&pp.cooldown_s, 0, 86400000, 1e-3)},
    {"calibration", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.calibration); })},
    {"tracker_entries", H([&](auto& v, auto& kk) {
       return p.U32(v, kk, &c.reuse_tracker.entries, 64, 1 << 26);
     })},
    {"reuse_ewma_alpha", H([&](auto& v, auto& kk) {
       return p.Real(v, kk, &c.reuse_tracker.alpha, 0.001, 1);
     })},
  }); }
  // clang-format on
  if (!st.ok()) return st;
  // The rule's cross-key checks ("placement.<key>: what"), reported at the key's line.
  if (absl::Status ps = pp.Validate(); !ps.ok()) {
    const std::string msg(ps.message());
    const std::size_t colon = msg.find(": ");
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", msg));
    }
    const std::string key = msg.substr(0, colon);
    auto line = lines.find(key);
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, line == lines.end() ? "" : absl::StrCat(":", line->second),
                     ": key '", key, "'", msg.substr(colon)));
  }
  return c;
}

}  // namespace cxlkv::tier
