// libcxlkv.so alone (no C++ module linked beside it): cxlkv_domain_join("orchestrator:...")
// joins a pooled domain through a running cxlkv-orchestrator.
#include <cstdio>
#include <string>

#include "cxlkv/cxlkv.h"
#include "gtest/gtest.h"
#include "orchestrator_process.h"

namespace cxlkv::testing {
namespace {

// What cxlkvctl reports for a host (the operator's view, through the control plane).
std::string HostLine(const OrchestratorProcess& o, unsigned host) {
  const std::string cmd = std::string(CXLKV_CTL_BIN) + " hosts --socket " + o.socket;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  char line[512];
  std::string found;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    unsigned id = 0;
    if (std::sscanf(line, "%u", &id) == 1 && id == host) found = line;
  }
  pclose(p);
  return found;
}

TEST(CApiOrchestrator, JoinsThroughTheOrchestrator) {
  OrchestratorProcess o("lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
                        "grace_ms = 20\ncapacity_lease_ms = 1000\n");
  o.Start();
  cxlkv_domain* d = nullptr;
  const std::string spec = "orchestrator:" + o.socket;
  ASSERT_EQ(cxlkv_domain_join(spec.c_str(), 2, &d), CXLKV_OK) << cxlkv_last_error();
  EXPECT_NE(HostLine(o, 2).find("live"), std::string::npos) << HostLine(o, 2);
  EXPECT_EQ(cxlkv_domain_heartbeat(d, nullptr, nullptr), CXLKV_OK);
  cxlkv_domain_leave(d);
  EXPECT_NE(HostLine(o, 2).find("left"), std::string::npos) << HostLine(o, 2);
  cxlkv_domain* bad = nullptr;
  EXPECT_EQ(cxlkv_domain_join(spec.c_str(), 7, &bad), CXLKV_E_PERMISSION)
      << "host 7 is not below max_hosts 4";
  EXPECT_NE(std::string(cxlkv_last_error()).find("not allowed"), std::string::npos)
      << cxlkv_last_error();
}

}  // namespace
}  // namespace cxlkv::testing
