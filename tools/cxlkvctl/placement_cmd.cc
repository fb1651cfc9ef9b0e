// `cxlkvctl calibrate` and `cxlkvctl explain`: measure the tier figures, and show the placement
// rule deciding for one block (from flags, or for a prefix out of a reuse stats file).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/spec.h"
#include "cxlkv/tier/calibrate.h"
#include "cxlkv/tier/placement.h"
#include "cxlkv/tier/reuse_tracker.h"

namespace cxlkv::ctl {
namespace {

[[noreturn]] void Fail(absl::string_view cmd, absl::string_view msg, int code = kExitError) {
  std::cerr << "cxlkvctl " << cmd << ": " << msg << "\n";
  throw CLI::RuntimeError(code);
}

void Flush(absl::string_view cmd) {
  std::cout.flush();
  if (!std::cout) Fail(cmd, "stdout: write failed (closed pipe or full disk?)");
}

std::string Rate(double bytes_per_s) { return absl::StrFormat("%.3g GB/s", bytes_per_s * 1e-9); }
std::string Time(double s) {
  if (s < 1e-6) return absl::StrFormat("%.3g ns", s * 1e9);
  if (s < 1e-3) return absl::StrFormat("%.3g us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.3g ms", s * 1e3);
  return absl::StrFormat("%.3g s", s);
}

// ---- calibrate ------------------------------------------------------------------------------

struct CalibrateArgs {
  std::string dir;
  std::string region;
  std::string out;
  double budget_ms = 2000;
  bool json = false;
};

void RunCalibrate(const CalibrateArgs& a) {
  tier::CalibrateOptions o;
  if (!(a.budget_ms >= 100 && a.budget_ms <= 600000)) {
    Fail("calibrate", absl::StrCat("--budget-ms: ", a.budget_ms, " is outside [100, 600000]"),
         kExitUsage);
  }
  o.budget_s = a.budget_ms * 1e-3;
  std::unique_ptr<pool::Region> region;
  if (!a.region.empty()) {
    auto r = pool::OpenRegion(a.region);
    if (!r.ok()) Fail("calibrate", absl::StrCat("--region: ", r.status().message()));
    region = std::move(*r);
  }
  auto c = tier::Calibrate(region.get(), a.dir, o);
  if (!c.ok()) Fail("calibrate", c.status().message());
  if (!a.out.empty()) {
    if (auto s = tier::SaveCalibration(*c, a.out); !s.ok())
      Fail("calibrate", absl::StrCat("--out: ", s.message()));
  }
  if (a.json) {
    std::cout << tier::CalibrationToJson(*c) << "\n";
  } else {
    std::cout << absl::StrFormat("calibration: %.2f s, %s\n", c->duration_s, c->measured_at);
    if (c->memory) {
      const tier::MemoryCalibration& m = *c->memory;
      std::cout << absl::StrFormat(
          "memory  %s (%s): read %s, write %s, latency %s  [%s range, %s copies]\n", m.source,
          m.tier, Rate(m.read_bytes_per_s), Rate(m.write_bytes_per_s), Time(m.latency_s),
          base::FormatBytes(m.bytes), base::FormatBytes(m.block_bytes));
    }
    if (c->nvme) {
      const tier::NvmeCalibration& n = *c->nvme;
      std::cout << absl::StrFormat(
          "nvme    %s: 4 KiB read at QD1 %s mean (p50 %s); %s reads x%u: %s; 4 KiB x%u: %.0f IOPS  "
          "[%s scratch file, O_DIRECT]\n",
          n.dir, Time(n.latency_qd1_s), Time(n.latency_qd1_p50_s), base::FormatBytes(n.io_bytes),
          n.depth, Rate(n.read_bytes_per_s), n.depth, n.iops, base::FormatBytes(n.file_bytes));
    }
    if (!a.out.empty())
      std::cout << "saved to " << a.out << " (domain.toml: placement.calibration)\n";
  }
  Flush("calibrate");
}

// ---- explain --------------------------------------------------------------------------------

struct ExplainArgs {
  std::string prefix;
  std::string config;
  std::string calibration;
  std::string stats;
  std::string size;
  std::string reuse_ms;
  std::string tokens;
  std::string queue_depth = "0";
  std::string occupancy = "0";
  std::string retention = "inf";
  std::string ns;
  bool json = false;
};

[[noreturn]] void BadFlag(absl::string_view flag, absl::string_view value, absl::string_view fix) {
  Fail("explain", absl::StrCat(flag, ": '", value, "' ", fix), kExitUsage);
}

std::uint32_t ParseCount(absl::string_view flag, const std::string& v, std::uint32_t max) {
  std::uint32_t n = 0;
  if (!absl::SimpleAtoi(v, &n) || n > max) {
    BadFlag(flag, v, absl::StrCat("is not a whole number in [0, ", max, "]"));
  }
  return n;
}

double ParseFraction(absl::string_view flag, absl::string_view v) {
  double f = 0;
  if (!absl::SimpleAtod(v, &f) || !(f >= 0 && f <= 1)) {
    BadFlag(flag, v, "is not a fraction in [0, 1] (used / capacity, e.g. 0.85)");
  }
  return f;
}

void RunExplain(const ExplainArgs& a) {
  auto cfg = orchestrator::LoadConfig(a.config);
  if (!cfg.ok()) Fail("explain", absl::StrCat("--config: ", cfg.status().message()));
  tier::PlacementParams params = cfg->placement.params;

  // Figures: the configuration's, replaced by a calibration (--calibration, else the config's).
  const std::string cal_path = a.calibration.empty() ? cfg->placement.calibration : a.calibration;
  std::vector<std::string> cal_changes;
  if (!cal_path.empty()) {
    auto cal = tier::LoadCalibration(cal_path);
    if (!cal.ok()) {
      Fail("explain", absl::StrCat(a.calibration.empty() ? "placement.calibration (config): "
                                                         : "--calibration: ",
                                   cal.status().message()));
    }
    cal_changes = tier::ApplyCalibration(*cal, &params);
  }
  auto rule = tier::PlacementRule::Create(params);
  if (!rule.ok()) {
    Fail("explain",
         absl::StrCat("calibration made the parameters invalid: ", rule.status().message()));
  }

  tier::BlockInputs in;
  nlohmann::json prefix_json;
  std::string prefix_text;
  if (!a.prefix.empty()) {
    if (a.stats.empty()) {
      Fail("explain", "PREFIX needs --stats FILE (the reuse stats file the tracker saved)",
           kExitUsage);
    }
    if (!a.reuse_ms.empty()) {
      BadFlag("--reuse-ms", a.reuse_ms,
              "cannot be given with PREFIX: the interval comes from --stats");
    }
    auto key = coherence::ParseKey(a.prefix);
    if (!key.ok()) Fail("explain", absl::StrCat("PREFIX: ", key.status().message()), kExitUsage);
    auto loaded = tier::ReuseTracker::Load(a.stats);
    if (!loaded.ok()) Fail("explain", absl::StrCat("--stats: ", loaded.status().message()));
    auto st = loaded->tracker.Find(*key);
    if (!st) {
      Fail("explain", absl::StrCat("prefix ", coherence::FormatKey(*key), " is not in ", a.stats,
                                   " (", loaded->tracker.size(),
                                   " prefixes tracked; it was never used, or was replaced)"));
    }
    in.size_bytes = st->size_bytes;
    in.tokens = st->tokens;
    in.reuse_interval_s = loaded->tracker.ExpectedIntervalS(*key, loaded->saved_at_ns);
    const double idle = loaded->saved_at_ns > st->last_seen_ns
                            ? static_cast<double>(loaded->saved_at_ns - st->last_seen_ns) * 1e-9
                            : 0.0;
    prefix_text = absl::StrCat(
        "prefix ", coherence::FormatKey(*key), " (", a.stats, "): ", st->uses,
        " uses, EWMA interval ",
        std::isinf(st->ewma_interval_s) ? "none (used once)" : Time(st->ewma_interval_s),
        ", last use ", Time(idle), " before the file was saved\n");
    prefix_json = {
        {"key", coherence::FormatKey(*key)},
        {"stats_file", a.stats},
        {"uses", st->uses},
        {"ewma_interval_s", std::isinf(st->ewma_interval_s) ? nlohmann::json(nullptr)
                                                            : nlohmann::json(st->ewma_interval_s)},
        {"idle_s", idle},
        {"size_bytes", st->size_bytes},
        {"tokens", st->tokens}};
    if (in.size_bytes == 0 && a.size.empty()) {
      Fail("explain", "the stats file has no size for this prefix; pass --size BYTES", kExitUsage);
    }
  } else {
    if (!a.stats.empty())
      BadFlag("--stats", a.stats, "needs a PREFIX argument (hex key) to look up");
    if (a.size.empty())
      Fail("explain", "--size BYTES is required (or give PREFIX and --stats)", kExitUsage);
    if (a.reuse_ms.empty()) {
      Fail("explain",
           "--reuse-ms MS is required (or give PREFIX and --stats); use inf for a block never "
           "reused",
           kExitUsage);
    }
    double ms = 0;
    if (a.reuse_ms == "inf" || a.reuse_ms == "never") {
      ms = tier::kNoReuse;
    } else if (!absl::SimpleAtod(a.reuse_ms, &ms) || !(ms >= 0) || std::isnan(ms)) {
      BadFlag("--reuse-ms", a.reuse_ms,
              "is not a number of milliseconds >= 0 (e.g. 250, or inf for a block never reused)");
    }
    in.reuse_interval_s = ms * 1e-3;
  }
  if (!a.size.empty()) {
    auto size = base::ParseSize(a.size);
    if (!size.ok() || *size == 0) {
      BadFlag("--size", a.size, "is not a block size in bytes (e.g. 1310720000, 5M or 1G)");
    }
    in.size_bytes = *size;
  }
  if (!a.tokens.empty()) in.tokens = ParseCount("--tokens", a.tokens, 1u << 30);
  in.queue_depth = ParseCount("--queue-depth", a.queue_depth, 1u << 20);
  {
    std::vector<absl::string_view> parts = absl::StrSplit(a.occupancy, ',');
    if (parts.size() > 2) {
      BadFlag("--occupancy", a.occupancy, "takes one fraction, or two (cxl-expanded,cxl-pooled)");
    }
    in.occupancy[0] = ParseFraction("--occupancy", parts[0]);
    in.occupancy[1] = parts.size() == 2 ? ParseFraction("--occupancy", parts[1]) : in.occupancy[0];
  }
  {
    std::vector<absl::string_view> parts = absl::StrSplit(a.retention, ',');
    if (parts.size() > 2) {
      BadFlag("--retention-s", a.retention,
              "takes one time, or two (cxl-expanded,cxl-pooled), in seconds or inf");
    }
    auto seconds = [&](absl::string_view v) {
      double t = 0;
      if (v == "inf") return tier::kNoReuse;
      if (!absl::SimpleAtod(v, &t) || !(t >= 0) || std::isinf(t)) {
        BadFlag("--retention-s", v,
                "is not a number of seconds >= 0, or inf for a tier that is not evicting "
                "(e.g. 42.5)");
      }
      return t;
    };
    in.retention_s[0] = seconds(parts[0]);
    in.retention_s[1] = parts.size() == 2 ? seconds(parts[1]) : in.retention_s[0];
  }
  if (!a.ns.empty()) {
    auto pin = cfg->PinLevelOf(a.ns);
    if (!pin.ok())
      Fail("explain", absl::StrCat("--namespace: ", pin.status().message()), kExitUsage);
    in.pin_level = *pin;
  }

  tier::Explanation why;
  rule->Decide(in, &why);
  if (a.json) {
    nlohmann::json j = nlohmann::json::parse(why.ToJson(-1));
    j["config"] = a.config;
    j["calibration"] = cal_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(cal_path);
    j["calibrated"] = cal_changes;
    if (!a.ns.empty()) j["namespace"] = a.ns;
    if (!prefix_json.is_null()) j["prefix"] = prefix_json;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << prefix_text;
    if (!a.ns.empty()) std::cout << "namespace " << a.ns << ": pin level " << in.pin_level << "\n";
    std::cout << "parameters: " << a.config;
    if (!cal_path.empty()) std::cout << ", figures from calibration " << cal_path;
    std::cout << "\n";
    for (const std::string& c : cal_changes) std::cout << "  " << c << "\n";
    std::cout << why.ToText();
  }
  Flush("explain");
}

}  // namespace

void AddPlacementCommands(CLI::App& app) {
  auto ca = std::make_shared<CalibrateArgs>();
  CLI::App* cal = app.add_subcommand(
      "calibrate",
      "Measure memory copy bandwidth and latency (on --region, else anonymous DRAM) and NVMe "
      "read latency, bandwidth and IOPS (O_DIRECT, in --dir) within --budget-ms");
  cal->add_option("--dir", ca->dir,
                  "Directory on the NVMe file system for a scratch file (removed)")
      ->required()
      ->type_name("DIR");
  cal->add_option("--region", ca->region,
                  "Memory source to measure (overwritten! e.g. file:/dev/shm/cal?size=256M); "
                  "a source holding an arena is refused")
      ->type_name("SPEC");
  cal->add_option("--out", ca->out, "Save the figures as JSON (placement.calibration reads it)")
      ->type_name("FILE");
  cal->add_option("--budget-ms", ca->budget_ms, "Time for the whole run (default 2000)");
  cal->add_flag("--json", ca->json, "Print JSON instead of text");
  cal->callback([ca] { RunCalibrate(*ca); });

  auto ea = std::make_shared<ExplainArgs>();
  CLI::App* ex = app.add_subcommand(
      "explain",
      "Show the placement rule deciding for one block: every input, figure and the deciding "
      "clause. Either --size and --reuse-ms, or PREFIX (hex key) with --stats");
  ex->add_option("PREFIX", ea->prefix, "Prefix key, 32 hex digits (high word first)");
  ex->add_option("--config", ea->config, "domain.toml ([placement] and [[namespace]])")
      ->required()
      ->type_name("FILE");
  ex->add_option("--calibration", ea->calibration,
                 "Calibration JSON (cxlkvctl calibrate --out); default: placement.calibration")
      ->type_name("FILE");
  ex->add_option("--stats", ea->stats, "Reuse stats file the ReuseTracker saved (with PREFIX)")
      ->type_name("FILE");
  ex->add_option("--size", ea->size, "Block size in bytes (K/M/G suffixes are binary)")
      ->type_name("BYTES");
  ex->add_option("--reuse-ms", ea->reuse_ms, "Expected reuse interval in ms, or inf")
      ->type_name("MS");
  ex->add_option("--tokens", ea->tokens,
                 "Prefill tokens a hit saves (default: unknown, never drop)")
      ->type_name("N");
  ex->add_option("--queue-depth", ea->queue_depth, "Prefills queued on the GPU (default 0)")
      ->type_name("Q");
  ex->add_option("--occupancy", ea->occupancy,
                 "CXL occupancy, used/capacity: F for both tiers or E,P (default 0)")
      ->type_name("F");
  ex->add_option("--retention-s", ea->retention,
                 "How long an unused block lasts in CXL before the tier evicts it (the idle age "
                 "of its LRU victims): T for both tiers or E,P; finite means the tier evicts by "
                 "itself and occupancy adds no price (default inf)")
      ->type_name("T");
  ex->add_option("--namespace", ea->ns, "tenant/model/layout from the config (its pin level)")
      ->type_name("NS");
  ex->add_flag("--json", ea->json, "Print JSON instead of text");
  ex->callback([ea] { RunExplain(*ea); });
}

}  // namespace cxlkv::ctl
