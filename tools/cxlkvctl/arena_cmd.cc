// `cxlkvctl arena format|info|recover SPEC`: create and inspect KV arenas.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace cxlkv::ctl {
namespace {

[[noreturn]] void Die(const absl::Status& st) {
  std::fprintf(stderr, "cxlkvctl arena: %s\n", std::string(st.message()).c_str());
  throw CLI::RuntimeError(kExitError);
}

// "16,64:3" -> classes of 16 tokens (weight 1) and 64 tokens (weight 3).
std::vector<pool::ClassSpec> ParseClasses(const std::string& text) {
  std::vector<pool::ClassSpec> out;
  if (text.empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> tw = absl::StrSplit(item, ':');
    pool::ClassSpec c;
    if (tw.size() > 2 || !absl::SimpleAtoi(tw[0], &c.tokens_per_block) || c.tokens_per_block == 0 ||
        (tw.size() == 2 && (!absl::SimpleAtoi(tw[1], &c.weight) || c.weight == 0))) {
      Die(absl::InvalidArgumentError("--classes '" + text +
                                     "': expected TOKENS[:WEIGHT],... e.g. 16,64:2"));
    }
    out.push_back(c);
  }
  return out;
}

nlohmann::json Describe(const pool::ArenaHeader& h, const pool::ArenaUsage& u,
                        const std::string& spec) {
  pool::Uuid uuid;
  std::memcpy(uuid.data(), h.uuid, uuid.size());
  nlohmann::json classes = nlohmann::json::array();
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    const pool::ClassUsage& cu = u.classes[c];
    classes.push_back({{"class", c},
                       {"block_bytes", cu.block_bytes},
                       {"stride_bytes", cu.stride_bytes},
                       {"tokens_per_block", h.classes[c].tokens_per_block},
                       {"blocks", cu.total},
                       {"free", cu.free},
                       {"cached", cu.cached},
                       {"allocated", cu.allocated},
                       {"persisted", cu.persisted},
                       {"largest_free_run", cu.largest_free_run}});
  }
  return {{"spec", spec},
          {"uuid", pool::UuidToString(uuid)},
          {"version", h.head.version},
          {"created_unix_ns", h.created_unix_ns},
          {"region_bytes", h.region_bytes},
          {"metadata_bytes", h.metadata_bytes},
          {"metadata_percent",
           100.0 * static_cast<double>(h.metadata_bytes) / static_cast<double>(h.region_bytes)},
          {"layout", pool::KvLayout::FromRecord(h.layout).ToString()},
          {"owner_slots", h.owner_slots},
          {"owners_active", u.owners_active},
          {"classes", classes}};
}

void Print(const nlohmann::json& j, bool json) {
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("arena %s on %s\n", j["uuid"].get<std::string>().c_str(),
              j["spec"].get<std::string>().c_str());
  std::printf("  layout %s, %s region, metadata %.4f%%, %u/%u owners active\n",
              j["layout"].get<std::string>().c_str(),
              base::FormatBytes(j["region_bytes"].get<std::uint64_t>()).c_str(),
              j["metadata_percent"].get<double>(), j["owners_active"].get<unsigned>(),
              j["owner_slots"].get<unsigned>());
  std::printf("  CLASS  BLOCK      BLOCKS    FREE  CACHED  ALLOC  PERSIST  LARGEST-FREE-RUN\n");
  for (const auto& c : j["classes"]) {
    std::printf("  %-5u  %-9s  %6u  %6u  %6u  %5u  %7u  %u\n", c["class"].get<unsigned>(),
                base::FormatBytes(c["block_bytes"].get<std::uint64_t>()).c_str(),
                c["blocks"].get<unsigned>(), c["free"].get<unsigned>(), c["cached"].get<unsigned>(),
                c["allocated"].get<unsigned>(), c["persisted"].get<unsigned>(),
                c["largest_free_run"].get<unsigned>());
  }
}

}  // namespace

void AddArenaCommand(CLI::App& app) {
  CLI::App* arena = app.add_subcommand("arena", "Format, inspect and recover KV arenas");
  arena->require_subcommand(1);

  struct FormatArgs {
    std::string spec, layout = "llama3-70b", classes;
    std::uint32_t owner_slots = 256;
    bool force = false, json = false;
  };
  auto fa = std::make_shared<FormatArgs>();
  CLI::App* fmt = arena->add_subcommand("format", "Format a new arena on a source");
  fmt->add_option("spec", fa->spec, "source spec, e.g. file:/dev/shm/pool0?size=8G")->required();
  fmt->add_option("--layout", fa->layout, "KV layout preset or L=,H=,D=,B=,T=")
      ->capture_default_str();
  fmt->add_option("--classes", fa->classes, "size classes TOKENS[:WEIGHT],... (default: T)");
  fmt->add_option("--owner-slots", fa->owner_slots, "processes that may attach at once")
      ->capture_default_str();
  fmt->add_flag("--force", fa->force, "overwrite an arena or foreign data (never one in use)");
  fmt->add_flag("--json", fa->json, "print the new arena as JSON");
  fmt->callback([fa] {
    auto layout = pool::ParseKvLayout(fa->layout);
    if (!layout.ok()) Die(layout.status());
    auto spec = pool::ParseSourceSpec(fa->spec);
    if (!spec.ok()) Die(spec.status());
    pool::FormatOptions o;
    o.layout = *layout;
    o.classes = ParseClasses(fa->classes);
    o.owner_slots = fa->owner_slots;
    o.force = fa->force;
    // A file this command creates is removed again when the format fails (the region too
    // small, a bad class list): a failed format leaves nothing it created. OpenRegion removes
    // one it created itself when the open fails.
    struct stat before {};
    const bool creates =
        spec->kind == pool::SourceKind::kFile && ::stat(spec->path.c_str(), &before) != 0;
    auto region = pool::OpenRegion(*spec);
    if (!region.ok()) Die(region.status());
    auto a = pool::Arena::Format(std::move(*region), o);
    if (!a.ok()) {
      if (creates) ::unlink(spec->path.c_str());
      Die(a.status());
    }
    Print(Describe((*a)->header(), (*a)->Usage(), fa->spec), fa->json);
  });

  struct InfoArgs {
    std::string spec;
    bool json = false;
  };
  auto ia = std::make_shared<InfoArgs>();
  CLI::App* info =
      arena->add_subcommand("info", "Validate an arena and show its usage (read-only)");
  info->add_option("spec", ia->spec, "source spec")->required();
  info->add_flag("--json", ia->json, "JSON output");
  info->callback([ia] {
    auto spec = pool::ParseSourceSpec(ia->spec);
    if (!spec.ok()) Die(spec.status());
    // Read-only: never creates, extends or writes the file, whatever size= says.
    auto region = pool::OpenExistingRegion(*spec);
    if (!region.ok()) Die(region.status());
    pool::ArenaHeader h;
    const auto& r = **region;
    if (auto st = pool::ValidateHeaderBytes(r.addr(), r.size_bytes(), r.name(), &h); !st.ok())
      Die(st);
    if (auto st = pool::ValidateMap(h, r.addr(), r.name()); !st.ok()) Die(st);
    Print(Describe(h, pool::ScanUsage(h, r.addr()), ia->spec), ia->json);
  });

  auto ra = std::make_shared<std::string>();
  CLI::App* rec =
      arena->add_subcommand("recover", "Return the blocks of dead processes and repair free hints");
  rec->add_option("spec", *ra, "source spec")->required();
  rec->callback([ra] {
    auto region = pool::OpenRegion(*ra);
    if (!region.ok()) Die(region.status());
    auto a = pool::Arena::Open(std::move(*region));  // Open runs Recover()
    if (!a.ok()) Die(a.status());
    const pool::RecoveryReport again = (*a)->Recover();
    const pool::ArenaUsage u = (*a)->Usage();
    std::uint64_t free_blocks = 0;
    for (const auto& c : u.classes) free_blocks += c.free;
    std::printf("recovered; %llu blocks free, %u owners active (this one included)%s\n",
                static_cast<unsigned long long>(free_blocks), u.owners_active,
                again.owners_reclaimed ? " (more dead owners found on a second pass)" : "");
  });
}

}  // namespace cxlkv::ctl
