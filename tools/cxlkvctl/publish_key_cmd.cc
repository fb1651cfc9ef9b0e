// cxlkvctl publish-key --config domain.toml [--out FILE]: the domain's publish secret, for the
// routers that match its KV events and its directory summary (docs/kv_events.md "What a
// subscriber can learn"). Read from the domain itself (coherence::DomainKeyLine, which its
// first owner created), so it needs a host of the domain, not a running orchestrator.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "commands.h"
#include "cxlkv/base/file.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::ctl {
namespace {

struct PublishKeyArgs {
  std::string config;
  std::string out;
};

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "cxlkvctl publish-key: %s\n", msg.c_str());
  throw CLI::RuntimeError(kExitError);
}

void Run(const PublishKeyArgs& a) {
  auto cfg = orchestrator::LoadConfig(a.config);
  if (!cfg.ok()) Fail(absl::StrCat("--config: ", cfg.status().message()));
  const orchestrator::Config& c = *cfg;
  if (c.keys.unkeyed) {
    Fail(absl::StrCat(a.config, ": keys.unkeyed = true: chain keys leave domain '", c.name,
                      "' unkeyed, so there is no key to hand out (drop keys.unkeyed to key them "
                      "with the domain's own secret)"));
  }
  if (!c.keys.publish_file.empty()) {
    Fail(absl::StrCat(a.config, ": domain '", c.name,
                      "' keys its chain keys with keys.publish_file '", c.keys.publish_file,
                      "': give routers that file"));
  }
  auto spec = pool::ParseSourceSpec(c.prefix_domain);
  if (!spec.ok()) Fail(absl::StrCat("domain.prefix_domain: ", spec.status().message()));
  // Never creates or resizes anything: a missing domain is an error, not a new region.
  auto region = pool::OpenExistingRegion(*spec);
  if (absl::IsNotFound(region.status())) {
    Fail(absl::StrCat("domain.prefix_domain '", c.prefix_domain,
                      "' does not exist: check the path, or start the domain's orchestrator once "
                      "(it creates the domain and its key)"));
  }
  if (!region.ok()) Fail(absl::StrCat("domain.prefix_domain: ", region.status().message()));
  coherence::DirectMem mem((*region)->addr(), (*region)->size_bytes());
  if (auto h = coherence::ReadDomainHeader(mem); !h.ok()) {
    Fail(absl::StrCat("domain.prefix_domain '", c.prefix_domain, "': ", h.status().message(),
                      " (start the domain's orchestrator once: it formats the domain and creates "
                      "its key)"));
  }
  auto key = coherence::ReadDomainKey(mem);
  if (!key.ok()) {
    Fail(absl::StrCat("domain.prefix_domain '", c.prefix_domain, "': ", key.status().message()));
  }
  if (key->empty()) {
    Fail(absl::StrCat("domain '", c.name,
                      "' has no publish key yet: its owner creates it when it opens the domain "
                      "(start its orchestrator, or wait for its leader's takeover)"));
  }
  if (a.out.empty()) {
    std::printf("%s\n", key->c_str());
    return;
  }
  // Mode 600, as the orchestrator's token and key files must be.
  if (auto st = base::ReplaceFile(a.out, *key + "\n", 0600); !st.ok()) {
    Fail(absl::StrCat("--out: ", st.message()));
  }
}

}  // namespace

void AddPublishKeyCommand(CLI::App& app) {
  auto a = std::make_shared<PublishKeyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "publish-key",
      "The domain's publish secret (64 hex digits), with which routers match its KV events and "
      "directory summary");
  cmd->add_option("--config", a->config, "the domain's domain.toml")->required();
  cmd->add_option("--out", a->out,
                  "write it to FILE (mode 600, replaced whole) instead of standard output");
  cmd->callback([a] { Run(*a); });
}

}  // namespace cxlkv::ctl
