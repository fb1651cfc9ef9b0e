// cxlkvctl: the operator's command line for cxlkv. main() only builds the CLI11 app and maps
// outcomes to exit codes (0 ok, 1 error, 2 usage); each subcommand lives in its own file
// and registers itself through commands.h.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.h"

// CLI11 reports through exceptions; they all stop here, inside this one binary.
int main(int argc, char** argv) try {
  CLI::App app{"cxlkvctl: inspect and manage cxlkv CXL memory pools", "cxlkvctl"};
  app.require_subcommand(1);
  // Options defined on `app` may also follow the subcommand's own arguments.
  app.fallthrough();

  cxlkv::ctl::AddTopologyCommand(app);
  cxlkv::ctl::AddArenaCommand(app);
  cxlkv::ctl::AddDomainCommands(app);
  cxlkv::ctl::AddPlacementCommands(app);
  cxlkv::ctl::AddWhereCommand(app);
  cxlkv::ctl::AddPublishKeyCommand(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // a command failed and already said why
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {  // usage error: CLI11 prints what was wrong
    app.exit(e);
    return cxlkv::ctl::kExitUsage;
  }
  return cxlkv::ctl::kExitOk;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cxlkvctl: internal error: %s\n", e.what());
  return cxlkv::ctl::kExitError;
}
