// cxlkv_tier_explain's text and JSON (cxlkv.h): where a key is, its reuse history, its last
// move with the placement rule's inputs and verdict then, and the verdict if decided now, from
// the tier's ExplainReport (tier/tiered_store.h). Rendering only: the report is the store's.
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "capi_internal.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/tier/tiered_store.h"
#include "nlohmann/json.hpp"

namespace cxlkv::capi {
namespace {

namespace ti = ::cxlkv::tier;

const char* ResidenceName(ti::Outcome o) {
  switch (o) {
    case ti::Outcome::kMissing:
      return "missing";
    case ti::Outcome::kCxl:
      return "cxl";
    case ti::Outcome::kNvme:
      return "nvme";
    case ti::Outcome::kDemoting:
      return "demoting";
    case ti::Outcome::kPromoting:
      return "promoting";
    case ti::Outcome::kDropped:
      return "dropped";
  }
  return "?";
}

std::string Seconds(double s) {
  if (std::isinf(s)) return "inf";
  if (s < 1e-3) return absl::StrFormat("%.1f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.1f ms", s * 1e3);
  return absl::StrFormat("%.2f s", s);
}

nlohmann::json JsonSeconds(double s) {
  return std::isfinite(s) ? nlohmann::json(s) : nlohmann::json(nullptr);
}

std::string Indent(const std::string& text) {
  std::string out = "  " + absl::StrReplaceAll(text, {{"\n", "\n  "}});
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (!out.empty() && out.back() != '\n') out.push_back('\n');
  return out;
}

}  // namespace

std::string RenderExplain(const ti::ExplainReport& e, bool json) {
  const std::string key_hex = cxlkv::coherence::FormatKey(e.key);
  nlohmann::json j;
  std::string text;
  j["key"] = key_hex;
  j["tier"] = e.store;
  j["config"] = e.config;
  j["residence"] = ResidenceName(ti::OutcomeOf(e.where));
  absl::StrAppend(&text, "key ", key_hex, " in ", e.store, " (placement config: ", e.config, ")\n");
  // Where it is.
  if (e.cxl_block) {
    j["cxl_block"] = {{"index", e.cxl_block->index}, {"generation", e.cxl_block->generation}};
    absl::StrAppend(&text, "where: in CXL, block ", e.cxl_block->index, " generation ",
                    e.cxl_block->generation, "\n");
  } else if (e.nvme) {
    j["nvme"] = {{"file", e.nvme->file}, {"slot", e.nvme->slot}, {"offset", e.nvme->offset}};
    absl::StrAppend(&text, "where: on NVMe, ", e.nvme->file, " slot ", e.nvme->slot, " (offset ",
                    e.nvme->offset, ")\n");
  } else if (e.where.has_value() && *e.where != ti::Residence::kCxl &&
             *e.where != ti::Residence::kNvme) {
    absl::StrAppend(&text, "where: ", ti::ResidenceName(*e.where), " (I/O in flight)\n");
  } else if (!e.where.has_value()) {
    absl::StrAppend(&text, "where: not held by this tier\n");
  }
  if (e.promotion) {
    const ti::PromoteCheck& c = *e.promotion;
    j["promotion"] = {{"verdict", ti::PromoteVerdictName(c.verdict)},
                      {"demoted_ms_ago", c.demoted_ms_ago},
                      {"retry_after_ms", c.retry_after_ms}};
    absl::StrAppend(&text, "promotion now: ", ti::PromoteVerdictName(c.verdict));
    if (c.verdict == ti::PromoteVerdict::kCoolingDown) {
      absl::StrAppend(&text, " (demoted ", c.demoted_ms_ago, " ms ago; retry in ", c.retry_after_ms,
                      " ms; placement.cooldown_ms sets it)");
    }
    absl::StrAppend(&text, "\n");
  }
  // Its reuse history.
  if (e.reuse) {
    j["reuse"] = {{"uses", e.reuse->uses},
                  {"ewma_interval_s", JsonSeconds(e.reuse->ewma_interval_s)},
                  {"last_use_s_ago", e.idle_s}};
    absl::StrAppend(
        &text, "reuse: ", e.reuse->uses, e.reuse->uses == 1 ? " use" : " uses",
        " recorded, EWMA interval ",
        std::isinf(e.reuse->ewma_interval_s) ? "none yet" : Seconds(e.reuse->ewma_interval_s),
        ", last use ", Seconds(e.idle_s), " ago\n");
  } else {
    j["reuse"] = nullptr;
    absl::StrAppend(&text,
                    "reuse: no use recorded (cxlkv_tier_use, or place with "
                    "CXLKV_TIER_RECORD_USE, records them)\n");
  }
  // Its last move, with the rule's inputs and verdict then.
  if (!e.has_last) {
    j["last_move"] = nullptr;
    j["now"] = nullptr;
    absl::StrAppend(&text, e.where.has_value()
                               ? "last move: none by this tier (found on NVMe when it opened)\n"
                               : "last move: none remembered (never placed here, or forgotten)\n");
    return json ? j.dump(2) + "\n" : text;
  }
  const ti::LastMove& mv = e.last;
  nlohmann::json m = {{"event", ti::MoveEventName(mv.event)},
                      {"s_ago", e.last_s_ago},
                      {"by_rule", mv.by_rule},
                      {"namespace", absl::StrFormat("0x%016x", e.ns)},
                      {"tokens", e.tokens},
                      {"pin", e.pin}};
  absl::StrAppend(&text, "last move, ", Seconds(e.last_s_ago),
                  " ago: ", ti::MoveEventName(mv.event));
  if (!mv.note.empty()) {
    m["note"] = mv.note;
    absl::StrAppend(&text, " (", mv.note, ")");
  }
  if (mv.by_rule) {
    m["reuse_source"] = ti::ReuseSourceName(mv.source);
    m["verdict"] = {{"tier", ti::TierName(mv.decision.tier)},
                    {"clause", ti::ClauseName(mv.decision.clause)}};
    m["explanation"] = nlohmann::json::parse(e.last_why.ToJson(-1));
    absl::StrAppend(&text, ": the rule chose ", ti::TierName(mv.decision.tier), " (",
                    ti::ClauseName(mv.decision.clause), "; reuse interval from ",
                    ti::ReuseSourceName(mv.source), ")\n", Indent(e.last_why.ToText()));
  } else {
    absl::StrAppend(&text, " (not the rule's decision)\n");
  }
  j["last_move"] = std::move(m);
  if (!e.has_now) {
    j["now"] = nullptr;
    return json ? j.dump(2) + "\n" : text;
  }
  j["now"] = {
      {"reuse_source", ti::ReuseSourceName(e.now_reuse.source)},
      {"verdict", {{"tier", ti::TierName(e.now.tier)}, {"clause", ti::ClauseName(e.now.clause)}}},
      {"explanation", nlohmann::json::parse(e.now_why.ToJson(-1))}};
  absl::StrAppend(
      &text, "if decided now: ", ti::TierName(e.now.tier), " (", ti::ClauseName(e.now.clause),
      "; reuse interval ", Seconds(e.now_reuse.interval_s), " from ",
      ti::ReuseSourceName(e.now_reuse.source), ", break-even ", Seconds(e.now_why.break_even_s),
      ", CXL occupancy ", absl::StrFormat("%.3f", e.now_occupancy), ")\n");
  return json ? j.dump(2) + "\n" : text;
}

}  // namespace cxlkv::capi
