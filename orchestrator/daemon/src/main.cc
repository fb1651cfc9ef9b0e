// cxlkv-orchestrator --config domain.toml [--validate] [--new-domain]
#include <signal.h>

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"

// An exception escaping main (CLI11, the standard library: a bug or memory exhaustion) ends the
// program through std::terminate, which names it: the wanted end, so nothing catches it here.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
  CLI::App app{"cxlkv-orchestrator: the pool orchestrator of one CXL domain"};
  std::string config_path;
  bool validate = false;
  app.add_option("--config", config_path, "the domain's TOML configuration")->required();
  app.add_flag("--validate", validate, "check the configuration and exit");
  cxlkv::orchestrator::OpenOptions open;
  app.add_flag("--new-domain", open.new_domain,
               "the first start of a new domain: create its state file (refused when it exists; "
               "without this flag a missing state file stops the daemon)");
  CLI11_PARSE(app, argc, argv);

  auto config = cxlkv::orchestrator::LoadConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "cxlkv-orchestrator: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  if (validate) {
    // Everything that needs no device and changes nothing; the start checks it again.
    if (auto st = cxlkv::orchestrator::CheckConfigOnHost(*config); !st.ok()) {
      std::fprintf(stderr, "cxlkv-orchestrator: %s\n", std::string(st.message()).c_str());
      return 2;
    }
    std::printf("%s: valid (domain '%s', pool %s, %zu namespaces)\n", config_path.c_str(),
                config->name.c_str(), config->pool.c_str(), config->namespaces.size());
    return 0;
  }
  // Signals are taken by sigwait below, never delivered to the RPC threads.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto o = cxlkv::orchestrator::Orchestrator::Open(*config, open);
  if (!o.ok()) {
    std::fprintf(stderr, "cxlkv-orchestrator: %s\n", std::string(o.status().message()).c_str());
    return 1;
  }
  if (auto st = (*o)->Start(); !st.ok()) {
    std::fprintf(stderr, "cxlkv-orchestrator: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  {
    const cxlkv::orchestrator::Orchestrator::StatusView view = (*o)->status();
    const std::string tcp =
        config->tcp.empty()
            ? std::string()
            : absl::StrCat(" and tcp:", config->tcp.substr(0, config->tcp.rfind(':')), ":",
                           (*o)->tcp_port(),
                           config->tls_cert.empty() ? " (token)" : " (token, TLS)");
    if (config->etcd.enabled()) {
      std::printf(
          "cxlkv-orchestrator: domain '%s' up as a candidate (etcd %s, session ttl %u s): rpc "
          "unix:%s%s, metrics %s; serving once elected\n",
          config->etcd.domain.c_str(), config->etcd.endpoints[0].c_str(), config->etcd.ttl_s,
          config->socket.c_str(), tcp.c_str(),
          config->metrics_listen.empty() ? "off" : config->metrics_listen.c_str());
    } else {
      std::printf(
          "cxlkv-orchestrator: domain '%s' up: rpc unix:%s%s, metrics %s, %zu extents of %llu MiB, "
          "%u restored from %s\n",
          config->name.c_str(), config->socket.c_str(), tcp.c_str(),
          config->metrics_listen.empty() ? "off" : config->metrics_listen.c_str(),
          view.extents.size(), static_cast<unsigned long long>(config->extent_bytes >> 20),
          view.recovered_extents, config->state_file.c_str());
    }
  }
  std::fflush(stdout);
  // A signal stops it; so does an HA candidate that found it must never lead (fatal()).
  const timespec poll{0, 100'000'000};
  while (true) {
    const int sig = sigtimedwait(&set, nullptr, &poll);
    if (sig > 0) {
      std::printf("cxlkv-orchestrator: signal %d, stopping\n", sig);
      (*o)->Stop();
      return 0;
    }
    if (absl::Status fatal = (*o)->fatal(); !fatal.ok()) {
      std::fprintf(stderr, "cxlkv-orchestrator: exiting: %s\n",
                   std::string(fatal.message()).c_str());
      (*o)->Stop();
      return 1;
    }
  }
}
