// cxlkvctl subcommands: one Add*Command per subcommand, each defined in its own
// tools/cxlkvctl/<name>_cmd.cc, so engineers add subcommands without touching each other's
// files.
//
// To add a subcommand: declare `void AddFooCommand(CLI::App& app);` below, define it in
// foo_cmd.cc (add the file to tools/CMakeLists.txt), and call it from main.cc.
//
// Contract for every Add*Command: it registers one subcommand on `app` whose callback runs
// the command. On success the callback returns normally (exit 0). On failure it prints one
// message to stderr naming the object and the fix, then throws CLI::RuntimeError(1); main()
// turns that into exit code 1. Usage errors are CLI11 parse errors: exit code 2.
#ifndef CXLKV_TOOLS_CXLKVCTL_COMMANDS_H_
#define CXLKV_TOOLS_CXLKVCTL_COMMANDS_H_

namespace CLI {
class App;
}  // namespace CLI

namespace cxlkv::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// `cxlkvctl topology [--json] [--declared-shared SPEC]...`: CXL, DAX and NUMA discovery.
void AddTopologyCommand(CLI::App& app);

// `cxlkvctl arena format|info|recover SPEC`: create, inspect (read-only) and recover arenas.
void AddArenaCommand(CLI::App& app);

// `cxlkvctl status|hosts|extents|prefixes|drain HOST|evict NS [--json] [--socket PATH]`:
// the orchestrator's view of a CXL domain.
void AddDomainCommands(CLI::App& app);

// `cxlkvctl calibrate --dir D [--region SPEC] [--out FILE] [--json]`: measure tier figures;
// `cxlkvctl explain --config F (--size B --reuse-ms MS | PREFIX --stats FILE) [...] [--json]`:
// the placement rule's decision for one block with every input and the deciding clause.
void AddPlacementCommands(CLI::App& app);

// `cxlkvctl where PREFIX [--etcd EPS [--cluster C] | --socket EPS] [--json]`: which CXL domains
// may hold a prefix (the cross-domain prefix directory, docs/ha.md).
void AddWhereCommand(CLI::App& app);

// `cxlkvctl publish-key --config F [--out FILE]`: the domain's publish secret, read from the
// domain, for routers that match its KV events and directory summary (docs/kv_events.md).
void AddPublishKeyCommand(CLI::App& app);

}  // namespace cxlkv::ctl

#endif  // CXLKV_TOOLS_CXLKVCTL_COMMANDS_H_
