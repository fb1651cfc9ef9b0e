// cxlkvctl where PREFIX: which CXL domains may hold a prefix, from the cross-domain prefix
// directory (docs/ha.md). Reads etcd directly (--etcd, in a build with the etcd client) or asks
// an orchestrator that runs with [etcd] (--socket, the default; any domain's, standby or
// leader). PREFIX is the chain key in hex as the tools print it (cxlkvctl prefixes, explain).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "cxlkv/orchestrator/directory_client.h"
#include "cxlkv/orchestrator/token.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "nlohmann/json.hpp"
#include "where.h"

namespace cxlkv::ctl {
namespace {

namespace orch = ::cxlkv::orchestrator;

struct WhereOptions {
  std::string prefix;
  std::string etcd;  // comma-separated host:port; empty: ask an orchestrator
  std::string cluster = "default";
  std::string socket;  // orchestrator endpoints, comma-separated
  std::vector<std::string> key_files;  // with --etcd: publish secrets of keyed domains
  bool json = false;
};

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "cxlkvctl where: %s\n", msg.c_str());
  throw CLI::RuntimeError(kExitError);
}

void Run(const WhereOptions& o) {
  auto key = coherence::ParseKey(o.prefix);
  if (!key.ok()) Fail(absl::StrCat("PREFIX '", o.prefix, "': ", key.status().message()));
  orch::WhereResult r;
  if (!o.etcd.empty()) {
    std::vector<std::string> secrets;
    for (const std::string& f : o.key_files) {
      auto s = orch::ReadTokenFile(f, "--key-file");
      if (!s.ok()) Fail(std::string(s.status().message()));
      secrets.push_back(*std::move(s));
    }
    auto got = WhereViaEtcd(o.etcd, o.cluster, secrets, *key);
    if (!got.ok()) Fail(std::string(got.status().message()));
    r = *std::move(got);
  } else {
    auto client = orch::DirectoryClient::Connect(o.socket);
    if (!client.ok()) Fail(std::string(client.status().message()));
    auto got = (*client)->Where(*key);
    if (!got.ok()) Fail(std::string(got.status().message()));
    r = *std::move(got);
  }
  std::vector<std::string> holders;
  for (const auto& d : r.domains) {
    if (d.may_hold) holders.push_back(d.domain);
  }
  if (o.json) {
    nlohmann::json j;
    j["prefix"] = coherence::FormatKey(*key);
    j["revision"] = r.revision;
    j["may_hold"] = holders;
    j["domains"] = nlohmann::json::array();
    for (const auto& d : r.domains) {
      j["domains"].push_back({{"domain", d.domain},
                              {"may_hold", d.may_hold},
                              {"anchor", d.anchor},
                              {"published", d.published},
                              {"fp_rate", d.fp_rate},
                              {"epoch", d.epoch},
                              {"age_ms", d.age_ms},
                              {"filter_bytes", d.filter_bytes},
                              {"keyed", d.keyed},
                              {"key_held", d.key_held}});
    }
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("prefix %s: %s\n", coherence::FormatKey(*key).c_str(),
              holders.empty()
                  ? "no domain holds it"
                  : absl::StrCat("may be held by ", absl::StrJoin(holders, ", ")).c_str());
  std::printf("%-20s %-9s %-10s %-9s %-11s %-8s %s\n", "DOMAIN", "MAY_HOLD", "PUBLISHED", "FP_RATE",
              "FILTER", "AGE_MS", "EPOCH");
  for (const auto& d : r.domains) {
    std::printf("%-20s %-9s %-10llu %-9.2g %-11llu %-8lld %lld\n", d.domain.c_str(),
                !d.key_held  ? "no-key"
                : !d.anchor  ? "not-anchor"
                : d.may_hold ? "yes"
                             : "no",
                static_cast<unsigned long long>(d.published), d.fp_rate,
                static_cast<unsigned long long>(d.filter_bytes), static_cast<long long>(d.age_ms),
                static_cast<long long>(d.epoch));
  }
}

}  // namespace

void AddWhereCommand(CLI::App& app) {
  auto o = std::make_shared<WhereOptions>();
  const char* env = std::getenv("CXLKV_ORCHESTRATOR_SOCKET");
  o->socket = env != nullptr ? env : "/run/cxlkv/orchestrator.sock";
  CLI::App* c = app.add_subcommand(
      "where", "which CXL domains may hold a prefix (the cross-domain directory in etcd)");
  c->add_option("PREFIX", o->prefix, "the chain key, hex (as cxlkvctl prefixes prints it)")
      ->required();
  c->add_option("--etcd", o->etcd, "read etcd directly: host:port[,host:port...]");
  c->add_option("--cluster", o->cluster, "with --etcd: the etcd.cluster name (default: default)");
  c->add_option("--key-file", o->key_files,
                "with --etcd: a keyed domain's keys.publish_file (repeatable); a keyed domain "
                "whose secret is not given answers no-key");
  c->add_option("--socket", o->socket,
                "ask this orchestrator (any with [etcd]): path, unix:PATH or tcp:HOST:PORT, "
                "several separated by commas (default: $CXLKV_ORCHESTRATOR_SOCKET)");
  c->add_flag("--json", o->json, "one JSON object");
  c->callback([o] { Run(*o); });
}

}  // namespace cxlkv::ctl
