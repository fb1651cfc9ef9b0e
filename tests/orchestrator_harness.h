// OrchestratorProcess plus a control-plane stub (gRPC) to ask the daemon what it knows.
#ifndef CXLKV_TESTS_ORCHESTRATOR_HARNESS_H_
#define CXLKV_TESTS_ORCHESTRATOR_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "orchestrator.grpc.pb.h"
#include "orchestrator_process.h"

namespace cxlkv::testing {

namespace opb = ::cxlkv::orchestrator::v1;

class OrchestratorHarness : public OrchestratorProcess {
 public:
  using OrchestratorProcess::OrchestratorProcess;

  std::unique_ptr<opb::Orchestrator::Stub> Stub() const {
    return opb::Orchestrator::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  }
  opb::HostsReply Hosts() const {
    grpc::ClientContext ctx;
    opb::HostsReply r;
    EXPECT_TRUE(Stub()->Hosts(&ctx, opb::HostsRequest{}, &r).ok());
    return r;
  }
  opb::StatusReply Status() const {
    grpc::ClientContext ctx;
    opb::StatusReply r;
    EXPECT_TRUE(Stub()->Status(&ctx, opb::StatusRequest{}, &r).ok());
    return r;
  }
  std::string HostState(std::uint32_t id) const {
    const opb::HostsReply r = Hosts();
    for (const auto& h : r.hosts()) {
      if (h.host_id() == id) return h.state();
    }
    return "absent";
  }

};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_ORCHESTRATOR_HARNESS_H_
