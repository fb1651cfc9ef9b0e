// `cxlkvctl topology`: prints what CXL, DAX and NUMA memory this host has and which pool
// sources cxlkv can use, as tables or (--json) as the stable JSON the tests read.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "cxlkv/pool/topology.h"

namespace cxlkv::ctl {
namespace {

struct TopologyArgs {
  bool json = false;
  std::vector<std::string> declared_shared;
};

void RunTopology(const TopologyArgs& args) {
  pool::DiscoverOptions opts;
  opts.declared_shared = args.declared_shared;
  absl::StatusOr<pool::Topology> topo = pool::DiscoverTopology(opts);
  if (!topo.ok()) {
    std::cerr << "cxlkvctl topology: " << topo.status().message() << "\n";
    throw CLI::RuntimeError(kExitError);
  }
  std::cout << (args.json ? pool::TopologyToJson(*topo, 2) + "\n" : pool::TopologyToText(*topo));
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "cxlkvctl topology: stdout: write failed (closed pipe or full disk?)\n";
    throw CLI::RuntimeError(kExitError);
  }
}

}  // namespace

void AddTopologyCommand(CLI::App& app) {
  auto args = std::make_shared<TopologyArgs>();
  CLI::App* cmd =
      app.add_subcommand("topology",
                         "Show CXL buses, ports, memdevs, regions, DAX devices, NUMA nodes and the "
                         "pool sources cxlkv can use (expanded or switch-pooled)");
  cmd->add_flag("--json", args->json, "Print stable JSON (sizes in bytes) instead of tables");
  cmd->add_option("--declared-shared", args->declared_shared,
                  "Treat this source spec (e.g. devdax:/dev/dax0.0) as switch-pooled; repeatable")
      ->type_name("SPEC");
  cmd->callback([args] { RunTopology(*args); });
}

}  // namespace cxlkv::ctl
